//! The caps of `api/src/validate/caps.rs` through the real server: a request over one is a
//! 400 naming the field.

use crate::support::*;
use serde_json::{json, Value};

async fn refused_with(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.expect("a JSON error body");
    (status, body["error"]["param"].clone())
}

async fn post(app: &TestApp, path: &str, body: Value) -> reqwest::Response {
    app.client
        .post(app.url(path))
        .json(&body)
        .send()
        .await
        .expect("request")
}

#[tokio::test]
async fn a_chat_request_over_a_cap_is_a_400_naming_the_field() {
    let app = spawn_app().await;
    let cases = [
        ("stop", json!(["x".repeat(513)])),
        (
            "logit_bias",
            Value::Object((0..301).map(|t| (t.to_string(), json!(1))).collect()),
        ),
        ("stop_token_ids", json!((0..257).collect::<Vec<u32>>())),
    ];
    for (field, value) in cases {
        let mut body = chat_body();
        body[field] = value;
        let (status, param) = refused_with(app.post_chat(body).await).await;
        assert_eq!((status, param.as_str()), (400, Some(field)));
    }
    let mut body = chat_body();
    body["messages"] = json!([{"role": "user", "content": "x".repeat((4 << 20) + 1)}]);
    let (status, param) = refused_with(app.post_chat(body).await).await;
    assert_eq!((status, param.as_str()), (400, Some("messages")));
}

#[tokio::test]
async fn completions_and_tokenize_over_the_prompt_cap_are_400s() {
    let app = spawn_app().await;
    let half = "x".repeat(2 << 20);
    let body = json!({"model": MODEL, "prompt": [half.clone(), half.clone() + "x"]});
    let (status, param) = refused_with(post(&app, "/v1/completions", body).await).await;
    assert_eq!((status, param.as_str()), (400, Some("prompt")));
    let body = json!({"model": MODEL, "prompt": half.clone() + &half + "x"});
    let (status, param) = refused_with(post(&app, "/tokenize", body).await).await;
    assert_eq!((status, param.as_str()), (400, Some("prompt")));
}
