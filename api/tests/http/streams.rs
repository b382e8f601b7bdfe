use crate::support::*;
use fallow_protocol::job::FinishReason;
use fallow_protocol::job::JobEvent;
use futures::StreamExt;
use serde_json::{json, Value};

fn stream_body(include_usage: bool) -> Value {
    json!({"model": MODEL, "stream": true, "stream_options": {"include_usage": include_usage},
           "messages": [{"role": "user", "content": "Say hello"}]})
}

#[tokio::test]
async fn a_streamed_completion_sends_openai_chunks_usage_and_done() {
    let app = spawn_app().await;
    let request = {
        let client = app.client.clone();
        let url = app.url("/v1/chat/completions");
        tokio::spawn(async move { client.post(url).json(&stream_body(true)).send().await })
    };
    let job = app.claim_one().await;
    app.answer(&job, &["Hel", "lo"]).await;
    let response = request.await.expect("join").expect("response");
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap_or("")
        .starts_with("text/event-stream"));
    let events = parse_sse(&response.text().await.expect("body"));

    let chunks: Vec<Value> = events
        .iter()
        .filter(|e| e.data != "[DONE]")
        .map(|e| e.json())
        .collect();
    assert_eq!(events.last().map(|e| e.data.as_str()), Some("[DONE]"));
    let deltas: Vec<Value> = chunks
        .iter()
        .map(|c| c["choices"][0]["delta"].clone())
        .collect();
    assert_eq!(deltas[0], json!({"role": "assistant", "content": ""}));
    assert_eq!(deltas[1], json!({"content": "Hel"}));
    assert_eq!(deltas[2], json!({"content": "lo"}));
    assert_eq!(deltas[3], json!({}));
    assert_eq!(chunks[3]["choices"][0]["finish_reason"], "stop");
    for chunk in &chunks[..4] {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["id"], format!("chatcmpl-{}", job.id.simple()));
        assert!(
            chunk["usage"].is_null(),
            "usage must be null before the usage chunk"
        );
    }
    let usage_chunk = &chunks[4];
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["total_tokens"], 11);
    assert_eq!(chunks.len(), 5);
    // Chunks carry the Redis entry ids, increasing.
    assert!(events[1].id.as_deref().is_some_and(|id| id.contains('-')));
}

/// Streams a finished three-piece answer; returns the job and the events the client got.
async fn finished_stream(app: &TestApp) -> (fallow_scheduler::queue::ClaimedJob, Vec<SseEvent>) {
    let request = {
        let client = app.client.clone();
        let url = app.url("/v1/chat/completions");
        tokio::spawn(async move { client.post(url).json(&stream_body(false)).send().await })
    };
    let job = app.claim_one().await;
    app.answer(&job, &["one ", "two ", "three"]).await;
    let response = request.await.expect("join").expect("response");
    (job, parse_sse(&response.text().await.expect("body")))
}

fn resume_url(app: &TestApp, job: uuid::Uuid) -> String {
    app.url(&format!(
        "/v1/chat/completions/chatcmpl-{}/stream",
        job.simple()
    ))
}

#[tokio::test]
async fn a_stream_can_be_resumed_after_its_last_event_id() {
    let app = spawn_app().await;
    let (job, events) = finished_stream(&app).await;
    let first_content = events
        .iter()
        .find(|e| e.json()["choices"][0]["delta"]["content"] == "one ")
        .and_then(|e| e.id.clone())
        .expect("an id on the first content chunk");

    let resumed = app
        .client
        .get(resume_url(&app, job.id))
        .header("last-event-id", &first_content)
        .send()
        .await
        .expect("resume");
    assert_eq!(resumed.status(), 200);
    let resumed = parse_sse(&resumed.text().await.expect("body"));
    let deltas: Vec<Value> = resumed
        .iter()
        .filter(|e| e.data != "[DONE]")
        .map(|e| e.json()["choices"][0]["delta"].clone())
        .collect();
    assert_eq!(
        deltas,
        [
            json!({"content": "two "}),
            json!({"content": "three"}),
            json!({})
        ]
    );
    assert_eq!(resumed.last().map(|e| e.data.as_str()), Some("[DONE]"));
}

#[tokio::test]
async fn a_stream_is_replayed_whole_without_last_event_id_and_bad_ids_are_400() {
    let app = spawn_app().await;
    let (job, events) = finished_stream(&app).await;
    let replay = app
        .client
        .get(resume_url(&app, job.id))
        .send()
        .await
        .expect("replay");
    let replay = parse_sse(&replay.text().await.expect("body"));
    // Everything but `created` (request time versus the job row's time) must match.
    let data = |e: &[SseEvent]| {
        e.iter()
            .map(|e| match e.json() {
                Value::Object(mut chunk) => {
                    chunk.remove("created");
                    Value::Object(chunk)
                }
                _ => json!(e.data),
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(data(&replay), data(&events));

    let bad = app
        .client
        .get(resume_url(&app, job.id))
        .header("last-event-id", "not-an-id")
        .send()
        .await
        .expect("bad id");
    assert_eq!(bad.status(), 400);
    let body: Value = bad.json().await.expect("json");
    assert_eq!(body["error"]["param"], "Last-Event-ID");
}

#[tokio::test]
async fn a_disconnected_stream_cancels_its_running_job() {
    let app = spawn_app().await;
    let request = {
        let client = app.client.clone();
        let url = app.url("/v1/chat/completions");
        tokio::spawn(async move { client.post(url).json(&stream_body(false)).send().await })
    };
    let job = app.claim_one().await;
    app.append(
        job.id,
        JobEvent::Started {
            attempt: job.attempt,
            prompt_text: None,
            continues: false,
        },
    )
    .await;
    app.append(
        job.id,
        JobEvent::Delta {
            index: 0,
            text: "partial".into(),
            token_ids: Vec::new(),
            logprobs: None,
            finish_reason: None,
            usage: usage(1),
            at: None,
        },
    )
    .await;
    let response = request.await.expect("join").expect("response");
    let mut body = response.bytes_stream();
    let first = body.next().await.expect("a first chunk").expect("bytes");
    assert!(String::from_utf8_lossy(&first).contains("data:"));
    drop(body);

    let record = app.wait_for_job(job.id, |r| r.cancel_requested).await;
    assert!(record.cancel_requested);
}

#[tokio::test]
async fn an_error_mid_stream_is_an_error_event_then_done() {
    let app = spawn_app().await;
    let request = {
        let client = app.client.clone();
        let url = app.url("/v1/chat/completions");
        tokio::spawn(async move { client.post(url).json(&stream_body(false)).send().await })
    };
    let job = app.claim_one().await;
    app.append(
        job.id,
        JobEvent::Delta {
            index: 0,
            text: "par".into(),
            token_ids: Vec::new(),
            logprobs: None,
            finish_reason: None::<FinishReason>,
            usage: usage(1),
            at: None,
        },
    )
    .await;
    app.append(
        job.id,
        JobEvent::Error {
            code: "engine_failure".into(),
            message: "boom".into(),
        },
    )
    .await;
    let events = parse_sse(
        &request
            .await
            .expect("join")
            .expect("response")
            .text()
            .await
            .expect("body"),
    );
    let n = events.len();
    assert_eq!(events[n - 1].data, "[DONE]");
    let error = events[n - 2].json();
    assert_eq!(error["error"]["message"], "boom");
    assert_eq!(error["error"]["code"], "engine_failure");
}

#[tokio::test]
async fn a_stream_refused_before_any_text_gets_a_real_http_status() {
    let app = spawn_app().await;
    let request = {
        let client = app.client.clone();
        let url = app.url("/v1/chat/completions");
        tokio::spawn(async move { client.post(url).json(&stream_body(false)).send().await })
    };
    let job = app.claim_one().await;
    app.append(
        job.id,
        JobEvent::Error {
            code: "context_length_exceeded".into(),
            message: "The prompt is longer than the context.".into(),
        },
    )
    .await;
    let response = request.await.expect("join").expect("response");
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "context_length_exceeded");
}

#[tokio::test]
async fn a_stalled_stream_ends_with_a_timeout_event_and_cancels_its_job() {
    let config = fallow_api::ApiConfig {
        request_timeout: std::time::Duration::from_secs(1),
        ..Default::default()
    };
    let app = spawn_app_with(config).await;
    let request = {
        let client = app.client.clone();
        let url = app.url("/v1/chat/completions");
        tokio::spawn(async move { client.post(url).json(&stream_body(false)).send().await })
    };
    let job = app.claim_one().await;
    app.append(
        job.id,
        JobEvent::Started {
            attempt: job.attempt,
            prompt_text: None,
            continues: false,
        },
    )
    .await;
    let events = parse_sse(
        &request
            .await
            .expect("join")
            .expect("response")
            .text()
            .await
            .expect("body"),
    );
    let n = events.len();
    assert_eq!(events[n - 1].data, "[DONE]");
    assert_eq!(events[n - 2].json()["error"]["code"], "timeout");
    app.wait_for_job(job.id, |r| r.cancel_requested).await;
}
