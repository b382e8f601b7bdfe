//! Local mode is safe by default: a web page can neither post to a local server (bodies
//! need their content type) nor read it through DNS rebinding (the `Host` check).

use crate::support::*;
use fallow_api::{ApiConfig, AppState};
use serde_json::Value;

async fn error_of(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.expect("a JSON error body");
    (status, body["error"].clone())
}

fn port_of(app: &TestApp) -> &str {
    app.base.rsplit(':').next().unwrap_or_default()
}

#[tokio::test]
async fn a_text_plain_post_gets_415_naming_the_expected_type() {
    let app = spawn_app().await;
    let response = app
        .client
        .post(app.url("/v1/chat/completions"))
        .header("content-type", "text/plain")
        .body(chat_body().to_string())
        .send()
        .await
        .expect("request");
    let (status, error) = error_of(response).await;
    assert_eq!(status, 415);
    assert_eq!(error["param"], Value::Null);
    assert_eq!(error["code"], "unsupported_media_type");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains("application/json"), "{message}");
    assert!(message.contains("text/plain"), "{message}");
}

#[tokio::test]
async fn a_json_body_without_a_content_type_gets_415() {
    let app = spawn_app().await;
    let response = app
        .client
        .post(app.url("/tokenize"))
        .body(r#"{"model":"m","prompt":"x"}"#)
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 415);
}

#[tokio::test]
async fn a_file_upload_that_is_not_multipart_gets_415() {
    let app = spawn_app().await;
    let response = app
        .client
        .post(app.url("/v1/files"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("purpose=batch&file=x")
        .send()
        .await
        .expect("request");
    let (status, error) = error_of(response).await;
    assert_eq!(status, 415);
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains("multipart/form-data"), "{message}");
}

#[tokio::test]
async fn json_with_a_charset_is_accepted() {
    let app = spawn_app().await;
    let request = {
        let client = app.client.clone();
        let url = app.url("/v1/chat/completions");
        tokio::spawn(async move {
            client
                .post(url)
                .header("content-type", "Application/JSON; charset=utf-8")
                .body(chat_body().to_string())
                .send()
                .await
        })
    };
    let job = app.claim_one().await;
    app.answer(&job, &["hi"]).await;
    let response = request.await.expect("join").expect("response");
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn a_post_without_a_body_needs_no_content_type() {
    let app = spawn_app_with(ApiConfig {
        admin_open: true,
        ..ApiConfig::default()
    })
    .await;
    let response = app
        .client
        .post(app.url(&format!("/admin/jobs/{}/cancel", uuid::Uuid::new_v4())))
        .send()
        .await
        .expect("request");
    assert_ne!(response.status(), 415);
    assert_ne!(response.status(), 403);
}

#[tokio::test]
async fn a_foreign_host_on_a_loopback_server_gets_403() {
    let app = spawn_app().await;
    let response = app
        .client
        .get(app.url("/v1/models"))
        .header("host", format!("evil.example:{}", port_of(&app)))
        .send()
        .await
        .expect("request");
    let (status, error) = error_of(response).await;
    assert_eq!(status, 403);
    assert_eq!(error["param"], Value::Null);
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains("evil.example"), "{message}");
}

#[tokio::test]
async fn localhost_with_its_port_and_an_allowed_host_are_served() {
    let app = spawn_app_with(ApiConfig {
        allowed_hosts: vec!["fallow.internal".into()],
        ..ApiConfig::default()
    })
    .await;
    for host in [
        format!("localhost:{}", port_of(&app)),
        format!("fallow.internal:{}", port_of(&app)),
        "FALLOW.internal".to_owned(),
    ] {
        let response = app
            .client
            .get(app.url("/v1/models"))
            .header("host", &host)
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 200, "Host: {host}");
    }
}

#[tokio::test]
async fn a_cross_site_origin_gets_403() {
    let app = spawn_app().await;
    let response = app
        .client
        .post(app.url(&format!("/v1/batches/{}/cancel", uuid::Uuid::new_v4())))
        .header("origin", "https://evil.example")
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 403);
    let same_origin = app
        .client
        .get(app.url("/health"))
        .header("origin", app.base.clone())
        .send()
        .await
        .expect("request");
    assert_eq!(same_origin.status(), 200);
}

#[tokio::test]
async fn without_the_check_any_host_is_served() {
    let app = spawn_app_with(ApiConfig {
        check_host: false,
        ..ApiConfig::default()
    })
    .await;
    let response = app
        .client
        .get(app.url("/health"))
        .header("host", "api.example.com")
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn metrics_are_served_on_their_own_listener_under_any_host() {
    let app = spawn_app().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let state = AppState::new(app.queue.clone(), app.relay.clone(), ApiConfig::default());
    tokio::spawn(fallow_api::server::serve_metrics(
        listener,
        state,
        std::future::pending(),
    ));
    let response = app
        .client
        .get(format!("http://{addr}/metrics"))
        .header("host", "prometheus-target.example")
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    let text = response.text().await.expect("text");
    assert!(
        text.contains("fallow:runners") || text.starts_with('#'),
        "{text}"
    );
    let other = app
        .client
        .get(format!("http://{addr}/v1/models"))
        .send()
        .await
        .expect("request");
    assert_eq!(other.status(), 404, "only /metrics there");
}
