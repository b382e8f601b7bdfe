use crate::support::*;
use fallow_protocol::job::{Completion, JobEvent, Prompt, Task, Tokenized};
use serde_json::{json, Value};

fn post(
    app: &TestApp,
    path: &str,
    body: Value,
) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
    let client = app.client.clone();
    let url = app.url(path);
    tokio::spawn(async move { client.post(url).json(&body).send().await })
}

#[tokio::test]
async fn a_list_of_prompts_becomes_one_raw_job_each_and_one_answer_in_prompt_order() {
    let app = spawn_app().await;
    let request = post(
        &app,
        "/v1/completions",
        json!({"model": MODEL, "prompt": ["first", "second"]}),
    );
    let a = app.claim_one().await;
    let b = app.claim_one().await;
    let (first, second) = match &a.request.input {
        Prompt::Text { text } if text == "first" => (a, b),
        _ => (b, a),
    };
    assert_eq!(
        second.request.input,
        Prompt::Text {
            text: "second".into()
        }
    );
    assert!(first.request.messages.is_empty());
    assert_eq!(first.request.sampling.max_tokens, Some(16));
    // Answered out of order: the response still follows the prompts.
    app.answer(&second, &["two"]).await;
    app.answer(&first, &["o", "ne"]).await;

    let response = request.await.expect("join").expect("response");
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["id"], format!("cmpl-{}", first.id.simple()));
    let choices: Vec<(u64, &str)> = body["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .map(|c| {
            (
                c["index"].as_u64().unwrap_or(99),
                c["text"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(choices, vec![(0, "one"), (1, "two")]);
    assert_eq!(body["usage"]["completion_tokens"], 3);
    assert_eq!(body["usage"]["prompt_tokens"], 18);
}

#[tokio::test]
async fn a_streamed_completion_sends_text_completion_chunks_then_done() {
    let app = spawn_app().await;
    let request = post(
        &app,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "hi", "stream": true, "echo": true}),
    );
    let job = app.claim_one().await;
    assert!(job.request.stream);
    app.answer(&job, &["Hel", "lo"]).await;
    let response = request.await.expect("join").expect("response");
    assert_eq!(response.status(), 200);
    let events = parse_sse(&response.text().await.expect("body"));
    assert_eq!(events.last().map(|e| e.data.as_str()), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(SseEvent::json)
        .collect();
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(text, "hiHello");
    assert_eq!(
        chunks.last().expect("chunks")["choices"][0]["finish_reason"],
        "stop"
    );
}

#[tokio::test]
async fn suffix_is_refused_before_any_job_is_made() {
    let app = spawn_app().await;
    let response = post(
        &app,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "a", "suffix": "b"}),
    )
    .await
    .expect("join")
    .expect("response");
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["param"], "suffix");
}

#[tokio::test]
async fn tokenize_is_a_job_the_runner_answers_with_tokens() {
    let app = spawn_app().await;
    let request = post(
        &app,
        "/tokenize",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
    );
    let job = app.claim_one().await;
    assert_eq!(job.request.task, Task::Tokenize);
    assert_eq!(job.request.input, Prompt::Messages);
    assert!(job.request.add_generation_prompt);
    let completion = Completion {
        tokenized: Some(Tokenized {
            tokens: vec![5, 6, 7],
            text: String::new(),
            max_model_len: 2048,
        }),
        ..Default::default()
    };
    app.append(job.id, JobEvent::Final { completion }).await;
    let response = request.await.expect("join").expect("response");
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("json");
    assert_eq!(
        body,
        json!({"tokens": [5, 6, 7], "count": 3, "max_model_len": 2048})
    );
}

#[tokio::test]
async fn detokenize_is_a_job_too_and_a_runner_error_is_a_400() {
    let app = spawn_app().await;
    let request = post(
        &app,
        "/detokenize",
        json!({"model": MODEL, "tokens": [1, 99999999]}),
    );
    let job = app.claim_one().await;
    assert_eq!(job.request.task, Task::Detokenize);
    app.append(
        job.id,
        JobEvent::Error {
            code: "invalid_request".into(),
            message: "Token id 99999999 (at position 1) is out of range".into(),
        },
    )
    .await;
    let response = request.await.expect("join").expect("response");
    assert_eq!(response.status(), 400);
}
