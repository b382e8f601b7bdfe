use crate::support::*;
use fallow_scheduler::tenants;
use serde_json::Value;

fn auth_config() -> fallow_api::ApiConfig {
    fallow_api::ApiConfig {
        auth: true,
        ..Default::default()
    }
}

#[tokio::test]
async fn requests_without_or_with_a_bad_key_are_401() {
    let app = spawn_app_with(auth_config()).await;
    let missing = app
        .client
        .get(app.url("/v1/models"))
        .send()
        .await
        .expect("get");
    assert_eq!(missing.status(), 401);
    let body: Value = missing.json().await.expect("json");
    assert_eq!(body["error"]["code"], "invalid_api_key");
    assert_eq!(body["error"]["type"], "authentication_error");

    let bad = app
        .client
        .post(app.url("/v1/chat/completions"))
        .bearer_auth("sk-wrong")
        .json(&chat_body())
        .send()
        .await
        .expect("post");
    assert_eq!(bad.status(), 401);
}

#[tokio::test]
async fn a_valid_key_is_let_in_and_owns_its_completions() {
    let app = spawn_app_with(auth_config()).await;
    let key = tenants::create_key(app.queue.pool(), "acme")
        .await
        .expect("key");
    let other = tenants::create_key(app.queue.pool(), "other")
        .await
        .expect("key");
    let models = app
        .client
        .get(app.url("/v1/models"))
        .bearer_auth(&key)
        .send()
        .await
        .expect("get");
    assert_eq!(models.status(), 200);

    let request = {
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
    app.answer(&job, &["ok"]).await;
    assert_eq!(
        request.await.expect("join").expect("response").status(),
        200
    );

    let url = app.url(&format!(
        "/v1/chat/completions/chatcmpl-{}",
        job.id.simple()
    ));
    let mine = app
        .client
        .get(&url)
        .bearer_auth(&key)
        .send()
        .await
        .expect("get");
    assert_eq!(mine.status(), 200);
    let theirs = app
        .client
        .get(&url)
        .bearer_auth(&other)
        .send()
        .await
        .expect("get");
    assert_eq!(theirs.status(), 404);
}
