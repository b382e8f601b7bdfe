//! The admin API's runner tokens: shown once, refused when malformed or taken, revoked by
//! name, and out of reach of tenant keys.

use crate::support::*;
use serde_json::{json, Value};

const ADMIN: &str = "test-admin-token-0123456789";

#[tokio::test]
async fn an_operator_creates_lists_and_revokes_a_runner_token() {
    let app = spawn_app_with(fallow_api::ApiConfig {
        admin_token: Some(ADMIN.into()),
        ..Default::default()
    })
    .await;
    let call = |method: reqwest::Method, path: &str, body: Option<Value>| {
        let request = app.client.request(method, app.url(path)).bearer_auth(ADMIN);
        match body {
            Some(body) => request.json(&body).send(),
            None => request.send(),
        }
    };
    let post = reqwest::Method::POST;

    let created = call(
        post.clone(),
        "/admin/runner-tokens",
        Some(json!({"name": "lab-1", "pool": "lab", "models": [MODEL]})),
    )
    .await
    .expect("post");
    assert_eq!(created.status().as_u16(), 200);
    let created: Value = created.json().await.expect("json");
    let token = created["token"].as_str().expect("the token, once");
    assert!(token.starts_with("rt-fallow-"), "{created}");
    assert_eq!(
        (&created["name"], &created["pool"], &created["models"]),
        (&json!("lab-1"), &json!("lab"), &json!([MODEL]))
    );

    let taken = call(
        post.clone(),
        "/admin/runner-tokens",
        Some(json!({"name": "lab-1"})),
    )
    .await
    .expect("post");
    assert_eq!(taken.status().as_u16(), 409);
    let taken: Value = taken.json().await.expect("json");
    assert_eq!(taken["error"]["code"], "runner_token_exists");

    for (body, param) in [
        (json!({"name": ""}), "name"),
        (json!({"name": "x", "models": []}), "models"),
        (json!({"name": "x", "models": ["ok", ""]}), "models[1]"),
        (json!({"name": "x", "pool": "a\nb"}), "pool"),
    ] {
        let refused = call(post.clone(), "/admin/runner-tokens", Some(body.clone()))
            .await
            .expect("post");
        assert_eq!(refused.status().as_u16(), 400, "{body}");
        let refused: Value = refused.json().await.expect("json");
        assert_eq!(refused["error"]["param"], param, "{body}");
    }

    let listed: Value = call(reqwest::Method::GET, "/admin/runner-tokens", None)
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    let listed_text = listed.to_string();
    assert_eq!(listed["data"].as_array().map(Vec::len), Some(1), "{listed}");
    assert!(
        !listed_text.contains(token),
        "a list never shows the token: {listed}"
    );

    let revoked = call(post.clone(), "/admin/runner-tokens/lab-1/revoke", None)
        .await
        .expect("post");
    assert_eq!(revoked.status().as_u16(), 200);
    let revoked: Value = revoked.json().await.expect("json");
    assert!(revoked["revoked_at"].is_string(), "{revoked}");
    let again = call(post, "/admin/runner-tokens/lab-1/revoke", None)
        .await
        .expect("post");
    assert_eq!(again.status().as_u16(), 404);

    // A runner token is no admin token.
    let denied = app
        .client
        .get(app.url("/admin/runner-tokens"))
        .bearer_auth(token)
        .send()
        .await
        .expect("get");
    assert_eq!(denied.status().as_u16(), 401);
}
