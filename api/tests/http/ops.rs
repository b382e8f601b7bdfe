use crate::support::*;
use serde_json::{json, Value};

#[tokio::test]
async fn health_and_ready_answer_when_postgres_and_redis_are_up() {
    let app = spawn_app().await;
    let health = app
        .client
        .get(app.url("/health"))
        .send()
        .await
        .expect("get");
    assert_eq!(
        (health.status().as_u16(), health.text().await.expect("text")),
        (200, "ok".into())
    );
    let ready = app.client.get(app.url("/ready")).send().await.expect("get");
    assert_eq!(ready.status(), 200);
}

#[tokio::test]
async fn models_are_listed_and_fetched_by_id_with_slashes() {
    let app = spawn_app().await;
    let list: Value = app
        .client
        .get(app.url("/v1/models"))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(list["object"], "list");
    let ids: Vec<&str> = list["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids.len(), 4, "{list}");
    assert!(ids.contains(&THINKER) && ids.contains(&GPT_OSS) && ids.contains(&EMBEDDER));
    let model = list["data"]
        .as_array()
        .and_then(|d| d.iter().find(|m| m["id"] == MODEL))
        .cloned();
    assert_eq!(
        model,
        Some(
            json!({"id": MODEL, "object": "model", "created": 1_700_000_000,
                    "owned_by": "fallow", "max_model_len": CONTEXT, "kind": "chat",
                    "parent": null})
        )
    );
    let one = app
        .client
        .get(app.url(&format!("/v1/models/{MODEL}")))
        .send()
        .await
        .expect("get");
    assert_eq!(one.status(), 200);
    let one: Value = one.json().await.expect("json");
    assert_eq!(one["id"], MODEL);
    let none = app
        .client
        .get(app.url("/v1/models/nope"))
        .send()
        .await
        .expect("get");
    assert_eq!(none.status(), 404);
}

#[tokio::test]
async fn metrics_count_successful_requests() {
    let app = spawn_app().await;
    let request = {
        let client = app.client.clone();
        let url = app.url("/v1/chat/completions");
        tokio::spawn(async move { client.post(url).json(&chat_body()).send().await })
    };
    let job = app.claim_one().await;
    app.answer(&job, &["x"]).await;
    assert_eq!(
        request.await.expect("join").expect("response").status(),
        200
    );
    let text = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .expect("get")
        .text()
        .await
        .expect("text");
    assert!(text.contains("fallow:request_success_total"), "{text}");
    assert!(
        text.contains("fallow:e2e_request_latency_seconds_bucket"),
        "{text}"
    );
}
