//! Admission within a tenant's `max_active_jobs`: atomic under concurrency, and counted in
//! jobs (a `/v1/completions` request with several prompts is several jobs).

use crate::support::*;
use fallow_scheduler::{runners, tenants};
use serde_json::json;
use std::time::Duration;
use tokio::sync::mpsc;

/// An app with auth on and a tenant "tiny" limited to `limit` active jobs; returns its key.
async fn app_with_limit(limit: i64) -> (TestApp, String) {
    let app = spawn_app_with(fallow_api::ApiConfig {
        auth: true,
        ..Default::default()
    })
    .await;
    let pool = app.queue.pool();
    let key = tenants::create_key(pool, "tiny").await.expect("key");
    tenants::set_max_active_jobs(pool, "tiny", limit)
        .await
        .expect("limit");
    (app, key)
}

async fn active_jobs(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state IN ('queued', 'running')")
        .fetch_one(app.queue.pool())
        .await
        .expect("count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_requests_against_a_limit_of_5_admit_exactly_5() {
    let (app, key) = app_with_limit(5).await;
    let (done, mut results) = mpsc::unbounded_channel();
    for _ in 0..50 {
        let (client, url, key, done) = (
            app.client.clone(),
            app.url("/v1/chat/completions"),
            key.clone(),
            done.clone(),
        );
        tokio::spawn(async move {
            let response = client
                .post(url)
                .bearer_auth(key)
                .json(&chat_body())
                .send()
                .await;
            let response = response.expect("response");
            let retry_after = response.headers().contains_key("retry-after");
            let _ = done.send((response.status().as_u16(), retry_after));
        });
    }

    // The refused answer at once; the admitted wait for the runner.
    for _ in 0..45 {
        let (status, retry_after) = tokio::time::timeout(Duration::from_secs(30), results.recv())
            .await
            .expect("45 answers before any job ran")
            .expect("an answer");
        assert_eq!((status, retry_after), (429, true));
    }
    assert_eq!(active_jobs(&app).await, 5);
    for _ in 0..5 {
        let job = app.claim_one().await;
        app.answer(&job, &["hello"]).await;
    }
    for _ in 0..5 {
        let (status, _) = tokio::time::timeout(Duration::from_secs(30), results.recv())
            .await
            .expect("the admitted answer")
            .expect("an answer");
        assert_eq!(status, 200);
    }
}

#[tokio::test]
async fn a_completion_with_3_prompts_counts_as_3_jobs() {
    let (app, key) = app_with_limit(2).await;
    let response = app
        .client
        .post(app.url("/v1/completions"))
        .bearer_auth(&key)
        .json(&json!({"model": MODEL, "prompt": ["one", "two", "three"]}))
        .send()
        .await
        .expect("post");

    assert_eq!(response.status().as_u16(), 429);
    let body: serde_json::Value = response.json().await.expect("json");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("3 more asked; the limit is 2"),
        "{message}"
    );
    assert_eq!(
        active_jobs(&app).await,
        0,
        "none of the prompts was enqueued"
    );
}

#[tokio::test]
async fn operators_set_a_tenants_weight_and_class_and_a_zero_weight_is_refused() {
    let app = spawn_app_with(fallow_api::ApiConfig {
        admin_token: Some("test-admin-token-0123456789".into()),
        ..Default::default()
    })
    .await;
    tenants::create_key(app.queue.pool(), "acme")
        .await
        .expect("key");
    let set = |body: serde_json::Value| {
        app.client
            .post(app.url("/admin/tenants/acme/limits"))
            .bearer_auth("test-admin-token-0123456789")
            .json(&body)
            .send()
    };

    let response = set(json!({"weight": 2.5, "class": 1})).await.expect("post");
    assert_eq!(response.status().as_u16(), 200);
    let tenant: serde_json::Value = response.json().await.expect("json");
    assert_eq!(
        (
            &tenant["weight"],
            &tenant["class"],
            &tenant["max_active_jobs"]
        ),
        (&json!(2.5), &json!(1), &json!(64)),
        "limits not given keep their values"
    );

    let response = set(json!({"weight": 0})).await.expect("post");
    assert_eq!(response.status().as_u16(), 400);
    let body: serde_json::Value = response.json().await.expect("json");
    assert_eq!(body["error"]["param"], "weight");
    let response = set(json!({"class": -1})).await.expect("post");
    assert_eq!(response.status().as_u16(), 400);
}

#[tokio::test]
async fn a_drain_takes_an_optional_deadline_and_refuses_a_bad_one_naming_it() {
    let app = spawn_app_with(fallow_api::ApiConfig {
        admin_token: Some("test-admin-token-0123456789".into()),
        ..Default::default()
    })
    .await;
    let drain = |body: Option<serde_json::Value>| {
        let request = app
            .client
            .post(app.url(&format!("/admin/runners/{}/drain", app.runner_id)))
            .bearer_auth("test-admin-token-0123456789");
        match body {
            Some(body) => request.json(&body).send(),
            None => request.send(),
        }
    };
    for bad in [
        json!({"deadline_seconds": -1}),
        json!({"deadline_seconds": 1e9}),
        json!({"deadline_seconds": "soon"}),
        json!({"deadline": 5}),
    ] {
        let response = drain(Some(bad.clone())).await.expect("post");
        assert_eq!(response.status().as_u16(), 400, "{bad}");
        let body: serde_json::Value = response.json().await.expect("json");
        assert_eq!(body["error"]["param"], "deadline_seconds", "{bad}");
    }
    let response = drain(Some(json!({"deadline_seconds": 30})))
        .await
        .expect("post");
    assert_eq!(response.status().as_u16(), 200);
    let left = runners::drain_left(app.queue.pool(), app.runner_id)
        .await
        .expect("drain_left")
        .expect("a deadline");
    assert!(left > Duration::from_secs(25), "{left:?}");
    let response = drain(None).await.expect("post");
    assert_eq!(response.status().as_u16(), 200, "a drain without a body");
    let runner: serde_json::Value = response.json().await.expect("json");
    assert_eq!(runner["state"], "draining");
}
