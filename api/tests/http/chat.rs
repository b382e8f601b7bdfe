use crate::support::*;
use fallow_protocol::job::JobEvent;
use fallow_scheduler::queue::JobState;
use serde_json::{json, Value};

#[tokio::test]
async fn a_non_streamed_completion_has_the_openai_shape() {
    let app = spawn_app().await;
    let request = {
        let client = app.client.clone();
        let url = app.url("/v1/chat/completions");
        tokio::spawn(async move {
            client
                .post(url)
                .header("x-request-id", "req-123")
                .json(&json!({"model": MODEL, "max_completion_tokens": 16,
                              "messages": [{"role": "user", "content": "Say hello"}]}))
                .send()
                .await
        })
    };
    let job = app.claim_one().await;
    assert_eq!(job.request.sampling.max_tokens, Some(16));
    app.answer(&job, &["Hel", "lo"]).await;

    let response = request.await.expect("join").expect("response");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-request-id"], "req-123");
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["id"], format!("chatcmpl-{}", job.id.simple()));
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], MODEL);
    assert!(body["created"].as_i64().is_some_and(|t| t > 1_700_000_000));
    assert!(body["system_fingerprint"]
        .as_str()
        .is_some_and(|f| f.starts_with("fp_")));
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(
        choice["message"],
        json!({"role": "assistant", "content": "Hello"})
    );
    assert_eq!(choice["logprobs"], Value::Null);
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
}

#[tokio::test]
async fn a_finished_completion_can_be_fetched_by_id_but_not_before() {
    let app = spawn_app().await;
    let request = {
        let client = app.client.clone();
        let url = app.url("/v1/chat/completions");
        tokio::spawn(async move { client.post(url).json(&chat_body()).send().await })
    };
    let job = app.claim_one().await;
    let id = format!("chatcmpl-{}", job.id.simple());
    let early = app
        .client
        .get(app.url(&format!("/v1/chat/completions/{id}")))
        .send()
        .await
        .expect("get");
    assert_eq!(early.status(), 409);

    app.answer(&job, &["Hi"]).await;
    let posted: Value = request
        .await
        .expect("join")
        .expect("response")
        .json()
        .await
        .expect("json");
    let fetched = app
        .client
        .get(app.url(&format!("/v1/chat/completions/{id}")))
        .send()
        .await
        .expect("get");
    assert_eq!(fetched.status(), 200);
    let fetched: Value = fetched.json().await.expect("json");
    assert_eq!(fetched["choices"], posted["choices"]);
    assert_eq!(fetched["usage"], posted["usage"]);

    let missing = format!(
        "/v1/chat/completions/chatcmpl-{}",
        uuid::Uuid::new_v4().simple()
    );
    let response = app.client.get(app.url(&missing)).send().await.expect("get");
    assert_eq!(response.status(), 404);
    let garbage = app
        .client
        .get(app.url("/v1/chat/completions/nope"))
        .send()
        .await
        .expect("get");
    assert_eq!(garbage.status(), 404);
}

#[tokio::test]
async fn a_runner_error_maps_to_its_status_and_code() {
    let app = spawn_app().await;
    let request = {
        let client = app.client.clone();
        let url = app.url("/v1/chat/completions");
        tokio::spawn(async move { client.post(url).json(&chat_body()).send().await })
    };
    let job = app.claim_one().await;
    app.append(
        job.id,
        JobEvent::Error {
            code: "context_length_exceeded".into(),
            message: "The prompt has 5000 tokens; the context is 2048.".into(),
        },
    )
    .await;
    let response = request.await.expect("join").expect("response");
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "context_length_exceeded");
    assert_eq!(body["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn a_client_that_hangs_up_cancels_its_queued_job() {
    let app = spawn_app().await;
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_millis(300))
        .build()
        .expect("client");
    let result = client
        .post(app.url("/v1/chat/completions"))
        .json(&chat_body())
        .send()
        .await;
    assert!(
        result.is_err(),
        "nobody answered, the request should have timed out"
    );
    // No runner ever claimed it: the cancellation takes it straight to `cancelled`.
    let mut cancelled = 0i64;
    for _ in 0..250 {
        cancelled = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'cancelled'")
            .fetch_one(app.queue.pool())
            .await
            .expect("count");
        if cancelled == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        cancelled, 1,
        "the job was not cancelled after its client left"
    );
}

#[tokio::test]
async fn a_request_that_outlives_its_timeout_gets_504_and_its_job_is_cancelled() {
    let config = fallow_api::ApiConfig {
        request_timeout: std::time::Duration::from_secs(1),
        ..Default::default()
    };
    let app = spawn_app_with(config).await;
    let request = {
        let client = app.client.clone();
        let url = app.url("/v1/chat/completions");
        tokio::spawn(async move { client.post(url).json(&chat_body()).send().await })
    };
    let job = app.claim_one().await;
    let response = request.await.expect("join").expect("response");
    assert_eq!(response.status(), 504);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "timeout");
    let record = app.wait_for_job(job.id, |r| r.cancel_requested).await;
    assert_eq!(record.state, JobState::Running);
}
