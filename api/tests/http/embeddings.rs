//! `/v1/embeddings` against the scripted runner: the job the api enqueues, the answer it
//! builds from the job's vectors (floats, base64, cut to `dimensions`), and every refusal.

use crate::support::*;
use fallow_protocol::job::{Completion, EmbedInput, JobEvent, Task, Usage};
use serde_json::{json, Value};

async fn post(app: &TestApp, body: Value) -> reqwest::Response {
    app.client
        .post(app.url("/v1/embeddings"))
        .json(&body)
        .send()
        .await
        .expect("post")
}

/// Posts `body` and answers its job with `vectors` (3 prompt tokens per vector).
async fn embedded(app: &TestApp, body: Value, vectors: Vec<Vec<f32>>) -> (Value, Vec<EmbedInput>) {
    let (response, inputs) = tokio::join!(post(app, body), async {
        let job = app.claim_for(EMBEDDER).await;
        assert_eq!(job.request.task, Task::Embed);
        let inputs = job.request.embed.clone().expect("embed inputs").inputs;
        let completion = Completion {
            usage: Usage {
                prompt_tokens: 3 * vectors.len() as u32,
                ..Usage::default()
            },
            embeddings: Some(vectors),
            ..Completion::default()
        };
        app.append(job.id, JobEvent::Final { completion }).await;
        inputs
    });
    assert_eq!(response.status(), 200);
    (response.json().await.expect("json"), inputs)
}

#[tokio::test]
async fn a_list_of_inputs_becomes_one_job_and_a_list_of_embeddings() {
    let app = spawn_app().await;
    let body = json!({"model": EMBEDDER, "input": ["hello", [1, 2, 3]]});
    let (answer, inputs) = embedded(
        &app,
        body,
        vec![vec![1.0, 0.0, 0.0, 0.0], vec![0.0, 1.0, 0.0, 0.0]],
    )
    .await;
    assert_eq!(
        inputs,
        vec![
            EmbedInput::Text {
                text: "hello".into()
            },
            EmbedInput::Tokens { ids: vec![1, 2, 3] }
        ]
    );
    assert_eq!(answer["object"], "list");
    assert_eq!(answer["model"], EMBEDDER);
    assert_eq!(answer["data"][1]["object"], "embedding");
    assert_eq!(answer["data"][1]["index"], 1);
    assert_eq!(answer["data"][1]["embedding"], json!([0.0, 1.0, 0.0, 0.0]));
    assert_eq!(
        answer["usage"],
        json!({"prompt_tokens": 6, "total_tokens": 6})
    );
}

#[tokio::test]
async fn base64_holds_the_same_floats_and_dimensions_cuts_and_renormalises() {
    let app = spawn_app().await;
    let body = json!({"model": EMBEDDER, "input": "hi", "encoding_format": "base64",
                      "dimensions": 2});
    let (answer, _) = embedded(&app, body, vec![vec![3.0, 4.0, 12.0, 0.0]]).await;
    let text = answer["data"][0]["embedding"]
        .as_str()
        .expect("a base64 string");
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .expect("base64");
    let floats: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(floats, vec![0.6, 0.8]);
}

#[tokio::test]
async fn bad_inputs_are_refused_naming_their_field() {
    let app = spawn_app().await;
    let too_many: Vec<String> = (0..2049).map(|i| format!("t{i}")).collect();
    for (body, param) in [
        (json!({"input": "hi"}), "model"),
        (json!({"model": EMBEDDER}), "input"),
        (json!({"model": EMBEDDER, "input": ""}), "input"),
        (json!({"model": EMBEDDER, "input": []}), "input"),
        (json!({"model": EMBEDDER, "input": ["a", ""]}), "input[1]"),
        (
            json!({"model": EMBEDDER, "input": ["a", {"x": 1}]}),
            "input[1]",
        ),
        (json!({"model": EMBEDDER, "input": [[1, -2]]}), "input[0]"),
        (json!({"model": EMBEDDER, "input": [[]]}), "input[0]"),
        (json!({"model": EMBEDDER, "input": 7}), "input"),
        (json!({"model": EMBEDDER, "input": too_many}), "input"),
        (
            json!({"model": EMBEDDER, "input": "a", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (
            json!({"model": EMBEDDER, "input": "a", "dimensions": 0}),
            "dimensions",
        ),
        (
            json!({"model": EMBEDDER, "input": "a", "dimensions": 5}),
            "dimensions",
        ),
        (json!({"model": MODEL, "input": "a"}), "model"),
    ] {
        let response = post(&app, body.clone()).await;
        assert_eq!(response.status(), 400, "{body}");
        let error: Value = response.json().await.expect("json");
        assert_eq!(error["error"]["param"], param, "{body}: {error}");
        assert_eq!(error["error"]["type"], "invalid_request_error");
    }
    let unknown = post(&app, json!({"model": "nope", "input": "a"})).await;
    assert_eq!(unknown.status(), 404);
}

#[tokio::test]
async fn an_embedding_model_refuses_chat_and_is_listed_with_its_kind() {
    let app = spawn_app().await;
    let chat = app
        .post_chat(json!({"model": EMBEDDER, "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(chat.status(), 400);
    let error: Value = chat.json().await.expect("json");
    assert_eq!(error["error"]["param"], "model");
    let models: Value = app
        .client
        .get(app.url("/v1/models"))
        .send()
        .await
        .expect("models")
        .json()
        .await
        .expect("json");
    let listed: Vec<&Value> = models["data"].as_array().expect("list").iter().collect();
    let embedder = listed.iter().find(|m| m["id"] == EMBEDDER).expect("listed");
    assert_eq!(embedder["kind"], "embedding");
    assert_eq!(embedder["dimensions"], 4);
    let chat_model = listed.iter().find(|m| m["id"] == MODEL).expect("listed");
    assert_eq!(chat_model["kind"], "chat");
}
