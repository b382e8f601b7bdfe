use crate::support::*;
use serde_json::{json, Value};

async fn error_of(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.expect("a JSON error body");
    (status, body["error"].clone())
}

#[tokio::test]
async fn an_unknown_model_is_404_model_not_found() {
    let app = spawn_app().await;
    let body = json!({"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]});
    let (status, error) = error_of(app.post_chat(body).await).await;
    assert_eq!(status, 404);
    assert_eq!(error["code"], "model_not_found");
    assert_eq!(error["param"], "model");
}

#[tokio::test]
async fn malformed_json_is_400_in_the_openai_envelope() {
    let app = spawn_app().await;
    let response = app
        .client
        .post(app.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{\"model\": ")
        .send()
        .await
        .expect("request");
    let (status, error) = error_of(response).await;
    assert_eq!(status, 400);
    assert_eq!(error["type"], "invalid_request_error");
    assert!(error["message"]
        .as_str()
        .is_some_and(|m| m.contains("parse the JSON")));
}

#[tokio::test]
async fn a_wrong_type_or_bad_value_names_the_param() {
    let app = spawn_app().await;
    let mut body = chat_body();
    body["temperature"] = json!("hot");
    let (status, error) = error_of(app.post_chat(body).await).await;
    assert_eq!(
        (status, error["param"].as_str()),
        (400, Some("temperature"))
    );

    let mut body = chat_body();
    body["top_p"] = json!(7);
    let (status, error) = error_of(app.post_chat(body).await).await;
    assert_eq!((status, error["param"].as_str()), (400, Some("top_p")));
    assert!(error["message"]
        .as_str()
        .is_some_and(|m| m.contains("(0, 1]")));

    let mut body = chat_body();
    body["max_tokens"] = json!(CONTEXT + 1);
    let (status, error) = error_of(app.post_chat(body).await).await;
    assert_eq!((status, error["param"].as_str()), (400, Some("max_tokens")));
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_in_the_openai_envelope() {
    let config = fallow_api::ApiConfig {
        max_body_bytes: 1024,
        ..Default::default()
    };
    let app = spawn_app_with(config).await;
    let mut body = chat_body();
    body["messages"][0]["content"] = json!("x".repeat(4096));
    let (status, error) = error_of(app.post_chat(body).await).await;
    assert_eq!(status, 413);
    assert_eq!(error["code"], "payload_too_large");
}

#[tokio::test]
async fn a_full_queue_is_429_with_retry_after() {
    let config = fallow_api::ApiConfig {
        global_queue_limit: 0,
        ..Default::default()
    };
    let app = spawn_app_with(config).await;
    let response = app.post_chat(chat_body()).await;
    assert!(response.headers().get("retry-after").is_some());
    let (status, error) = error_of(response).await;
    assert_eq!(status, 429);
    assert_eq!(error["code"], "rate_limit_exceeded");
}

#[tokio::test]
async fn unknown_routes_and_methods_answer_in_the_envelope() {
    let app = spawn_app().await;
    let (status, error) = error_of(
        app.client
            .get(app.url("/v1/nothing"))
            .send()
            .await
            .expect("get"),
    )
    .await;
    assert_eq!(status, 404);
    assert!(error["message"]
        .as_str()
        .is_some_and(|m| m.contains("/v1/nothing")));
    let wrong = app
        .client
        .get(app.url("/v1/chat/completions"))
        .send()
        .await
        .expect("get");
    let (status, _) = error_of(wrong).await;
    assert_eq!(status, 405);
}

#[tokio::test]
async fn a_tenant_over_its_active_job_limit_is_429() {
    let config = fallow_api::ApiConfig {
        auth: true,
        ..Default::default()
    };
    let app = spawn_app_with(config).await;
    let pool = app.queue.pool();
    let key = fallow_scheduler::tenants::create_key(pool, "tiny")
        .await
        .expect("key");
    fallow_scheduler::tenants::set_max_active_jobs(pool, "tiny", 1)
        .await
        .expect("limit");
    let first = {
        let (client, url, key) = (
            app.client.clone(),
            app.url("/v1/chat/completions"),
            key.clone(),
        );
        tokio::spawn(async move {
            client
                .post(url)
                .bearer_auth(key)
                .json(&chat_body())
                .send()
                .await
        })
    };
    let job = app.claim_one().await;
    let second = app
        .client
        .post(app.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&chat_body())
        .send()
        .await
        .expect("post");
    assert!(second.headers().get("retry-after").is_some());
    let (status, error) = error_of(second).await;
    assert_eq!(status, 429);
    assert!(error["message"]
        .as_str()
        .is_some_and(|m| m.contains("limit is 1")));
    app.answer(&job, &["done"]).await;
    assert_eq!(first.await.expect("join").expect("response").status(), 200);
}

#[tokio::test]
async fn an_unreachable_redis_is_503_and_not_ready() {
    let app = spawn_app_on(fallow_api::ApiConfig::default(), "redis://127.0.0.1:1").await;
    let ready = app.client.get(app.url("/ready")).send().await.expect("get");
    let (status, error) = error_of(ready).await;
    assert_eq!(
        (status, error["code"].as_str()),
        (503, Some("service_unavailable"))
    );
    let (status, _) = error_of(app.post_chat(chat_body()).await).await;
    assert_eq!(status, 503);
}
