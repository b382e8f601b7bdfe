//! Per-tenant requests and tokens per minute, OpenAI's `x-ratelimit-*` headers, and the
//! batch quota, against real Postgres and Redis. Windows are an hour long here, so that a
//! test never straddles a window's edge (each test's tenant has its own windows).

use crate::support::*;
use fallow_api::{ApiConfig, AppState};
use fallow_scheduler::batch::files::{self, FileRecord};
use fallow_scheduler::store::{LocalStore, ObjectStore};
use fallow_scheduler::tenants::{self, LimitsUpdate};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::sync::oneshot;
use uuid::Uuid;

const HEADERS: [&str; 6] = [
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
];

fn config() -> ApiConfig {
    ApiConfig {
        auth: true,
        rate_window: Duration::from_secs(3600),
        ..Default::default()
    }
}

/// A tenant named `name` with the given limits, and its key.
async fn tenant(app: &TestApp, name: &str, update: LimitsUpdate) -> String {
    let key = tenants::create_key(app.queue.pool(), name)
        .await
        .expect("key");
    tenants::set_limits(app.queue.pool(), name, &update)
        .await
        .expect("set limits")
        .expect("tenant exists");
    key
}

fn limits(requests: i64, tokens: i64) -> LimitsUpdate {
    LimitsUpdate {
        requests_per_minute: Some(requests),
        tokens_per_minute: Some(tokens),
        ..Default::default()
    }
}

async fn post(app: &TestApp, base: &str, key: &str, body: &Value) -> reqwest::Response {
    app.client
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .expect("post")
}

/// Sends one chat request and lets the fake runner answer it with 1 completion token
/// (usage: 9 prompt tokens, 1 completion token).
async fn answered(app: &TestApp, base: &str, key: &str, body: &Value) -> reqwest::Response {
    let (response, ()) = tokio::join!(post(app, base, key, body), async {
        let job = app.claim_one().await;
        app.answer(&job, &["hi"]).await;
    });
    response
}

fn header<'a>(response: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

fn number(response: &reqwest::Response, name: &str) -> u64 {
    header(response, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no numeric {name} header"))
}

#[tokio::test]
async fn a_tenant_with_3_requests_a_minute_gets_3_answers_then_a_429_with_the_headers() {
    let app = spawn_app_with(config()).await;
    let key = tenant(&app, "acme", limits(3, 100_000)).await;
    for remaining in [2, 1, 0] {
        let ok = answered(&app, &app.base, &key, &chat_body()).await;
        assert_eq!(ok.status(), 200);
        for name in HEADERS {
            assert!(header(&ok, name).is_some(), "a 200 lacks {name}");
        }
        assert_eq!(number(&ok, "x-ratelimit-limit-requests"), 3);
        assert_eq!(number(&ok, "x-ratelimit-remaining-requests"), remaining);
    }

    let refused = post(&app, &app.base, &key, &chat_body()).await;
    assert_eq!(refused.status(), 429);
    let retry: u64 = header(&refused, "retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After in seconds");
    assert!((1..=3600).contains(&retry), "Retry-After {retry}");
    for name in HEADERS {
        assert!(header(&refused, name).is_some(), "a 429 lacks {name}");
    }
    assert_eq!(number(&refused, "x-ratelimit-remaining-requests"), 0);
    let reset = header(&refused, "x-ratelimit-reset-requests").unwrap_or_default();
    assert!(reset.ends_with('s'), "reset {reset:?} is not a duration");
    let body: Value = refused.json().await.expect("json");
    assert_eq!(body["error"]["type"], "requests");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert!(body["error"]["param"].is_null());
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("requests per minute") && message.contains('3'),
        "{message}"
    );
}

#[tokio::test]
async fn tokens_are_reserved_at_admission_and_settled_with_the_real_usage() {
    let app = spawn_app_with(config()).await;
    let key = tenant(&app, "acme", limits(0, 100)).await;
    // "Say hello" is 9 bytes, 3 estimated tokens; with max_tokens 50 the request holds 53.
    let body = json!({"model": MODEL, "max_tokens": 50,
                      "messages": [{"role": "user", "content": "Say hello"}]});
    let first = answered(&app, &app.base, &key, &body).await;
    assert_eq!(first.status(), 200);
    assert_eq!(number(&first, "x-ratelimit-limit-tokens"), 100);
    assert_eq!(number(&first, "x-ratelimit-remaining-tokens"), 47);
    assert!(
        header(&first, "x-ratelimit-limit-requests").is_none(),
        "an unlimited requests count sends no headers"
    );

    // The first job used 10 tokens: 43 of its 53 came back, so 90 - 53 remain now.
    let second = answered(&app, &app.base, &key, &body).await;
    assert_eq!(second.status(), 200);
    assert_eq!(number(&second, "x-ratelimit-remaining-tokens"), 37);

    // 10 + 10 used; 53 more would fit, but not 53 + 28 more.
    let greedy = json!({"model": MODEL, "max_tokens": 78,
                        "messages": [{"role": "user", "content": "Say hello"}]});
    let refused = post(&app, &app.base, &key, &greedy).await;
    assert_eq!(refused.status(), 429);
    assert!(header(&refused, "retry-after").is_some());
    let error: Value = refused.json().await.expect("json");
    assert_eq!(error["error"]["type"], "tokens");
    assert_eq!(error["error"]["code"], "rate_limit_exceeded");
}

#[tokio::test]
async fn a_background_response_is_settled_though_nobody_reads_its_stream() {
    let app = spawn_app_with(config()).await;
    let key = tenant(&app, "acme", limits(0, 100)).await;
    // "hi" is 1 estimated token; with max_output_tokens 50 the response holds 51.
    let queued = app
        .client
        .post(app.url("/v1/responses"))
        .bearer_auth(&key)
        .json(&json!({"model": MODEL, "input": "hi", "background": true,
                      "max_output_tokens": 50}))
        .send()
        .await
        .expect("post");
    assert_eq!(queued.status(), 200);
    assert_eq!(number(&queued, "x-ratelimit-remaining-tokens"), 49);

    // The runner answers (10 tokens used) while no client polls or streams the response.
    let job = app.claim_one().await;
    app.answer(&job, &["hi"]).await;

    // 41 of its 51 came back: 90 remain, less the next request's 53.
    let body = json!({"model": MODEL, "max_tokens": 50,
                      "messages": [{"role": "user", "content": "Say hello"}]});
    let next = answered(&app, &app.base, &key, &body).await;
    assert_eq!(next.status(), 200);
    assert_eq!(number(&next, "x-ratelimit-remaining-tokens"), 37);
}

#[tokio::test]
async fn a_request_larger_than_the_whole_token_limit_is_told_so() {
    let app = spawn_app_with(config()).await;
    let key = tenant(&app, "acme", limits(0, 100)).await;
    let body = json!({"model": MODEL, "max_tokens": 500,
                      "messages": [{"role": "user", "content": "Say hello"}]});
    let refused = post(&app, &app.base, &key, &body).await;
    assert_eq!(refused.status(), 429);
    let error: Value = refused.json().await.expect("json");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("Request too large"), "{message}");
}

#[tokio::test]
async fn an_unlimited_tenant_is_never_limited_and_gets_no_headers() {
    let app = spawn_app_with(config()).await;
    let key = tenant(&app, "acme", limits(0, 0)).await;
    for _ in 0..5 {
        let ok = answered(&app, &app.base, &key, &chat_body()).await;
        assert_eq!(ok.status(), 200);
        for name in HEADERS {
            assert!(
                header(&ok, name).is_none(),
                "an unlimited tenant got {name}"
            );
        }
    }
}

#[tokio::test]
async fn the_legacy_completions_endpoint_counts_against_the_same_window() {
    let app = spawn_app_with(config()).await;
    let key = tenant(&app, "acme", limits(1, 0)).await;
    let body = json!({"model": MODEL, "prompt": "Say hello", "max_tokens": 5});
    let (ok, ()) = tokio::join!(
        async {
            app.client
                .post(app.url("/v1/completions"))
                .bearer_auth(&key)
                .json(&body)
                .send()
                .await
                .expect("post")
        },
        async {
            let job = app.claim_one().await;
            app.answer(&job, &["hi"]).await;
        }
    );
    assert_eq!(ok.status(), 200);
    assert_eq!(number(&ok, "x-ratelimit-remaining-requests"), 0);
    let refused = post(&app, &app.base, &key, &chat_body()).await;
    assert_eq!(refused.status(), 429);
}

/// A second api server on the same Postgres schema and Redis; its address.
async fn second_server(
    app: &TestApp,
    config: ApiConfig,
    store: Option<ObjectStore>,
) -> (String, oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let mut state = AppState::new(app.queue.clone(), app.relay.clone(), config);
    if let Some(store) = store {
        state = state.with_store(store);
    }
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(fallow_api::serve(listener, state, async {
        let _ = rx.await;
    }));
    (format!("http://{addr}"), tx)
}

#[tokio::test]
async fn two_api_servers_on_one_redis_share_a_tenants_window() {
    let app = spawn_app_with(config()).await;
    let (other, _stop) = second_server(&app, config(), None).await;
    let key = tenant(&app, "acme", limits(2, 0)).await;
    assert_eq!(
        answered(&app, &app.base, &key, &chat_body()).await.status(),
        200
    );
    assert_eq!(
        answered(&app, &other, &key, &chat_body()).await.status(),
        200
    );
    assert_eq!(
        post(&app, &app.base, &key, &chat_body()).await.status(),
        429
    );
    assert_eq!(post(&app, &other, &key, &chat_body()).await.status(), 429);
}

#[tokio::test]
async fn operators_set_the_rate_limits_and_a_negative_one_names_its_field() {
    let token = "admin-token-for-rate-limit-tests";
    let app = spawn_app_with(ApiConfig {
        admin_token: Some(token.into()),
        ..config()
    })
    .await;
    tenants::create_key(app.queue.pool(), "acme")
        .await
        .expect("key");
    let set = |body: Value| {
        app.client
            .post(app.url("/admin/tenants/acme/limits"))
            .bearer_auth(token)
            .json(&body)
            .send()
    };
    let ok = set(json!({"requests_per_minute": 30, "tokens_per_minute": 9000,
                        "max_batch_queued_lines": 500}))
    .await
    .expect("post");
    assert_eq!(ok.status(), 200);
    let view: Value = ok.json().await.expect("json");
    assert_eq!(view["requests_per_minute"], 30);
    assert_eq!(view["tokens_per_minute"], 9000);
    assert_eq!(view["max_batch_queued_lines"], 500);
    assert_eq!(
        view["max_active_jobs"], 64,
        "a limit left out keeps its value"
    );

    let bad = set(json!({"tokens_per_minute": -1})).await.expect("post");
    assert_eq!(bad.status(), 400);
    let error: Value = bad.json().await.expect("json");
    assert_eq!(error["error"]["param"], "tokens_per_minute");
}

/// A batch input file of `lines` lines owned by `tenant`, in `store`; its public id.
async fn batch_file(app: &TestApp, store: &ObjectStore, tenant: Uuid, lines: usize) -> String {
    let id = Uuid::new_v4();
    let line = json!({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",
                      "body": chat_body()})
    .to_string();
    let text = format!("{line}\n").repeat(lines);
    let staged = std::env::temp_dir().join(format!("fallow-quota-{id}"));
    std::fs::write(&staged, &text).expect("stage");
    let key = fallow_scheduler::batch::object_key(id);
    store.put_file(&key, &staged).await.expect("put");
    let _ = std::fs::remove_file(&staged);
    let record = FileRecord {
        id,
        tenant_id: Some(tenant),
        purpose: "batch".into(),
        filename: "in.jsonl".into(),
        bytes: text.len() as i64,
        object_key: key,
        created_at: chrono::Utc::now(),
    };
    files::insert(app.queue.pool(), &record)
        .await
        .expect("file");
    fallow_scheduler::batch::file_id(id)
}

#[tokio::test]
async fn batches_past_the_queued_lines_quota_get_a_429() {
    let app = spawn_app_with(config()).await;
    let root = std::env::temp_dir().join(format!("fallow-quota-store-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&root).expect("store root");
    let store = ObjectStore::Local(LocalStore::new(&root));
    let (base, _stop) = second_server(&app, config(), Some(store.clone())).await;
    let key = tenant(
        &app,
        "acme",
        LimitsUpdate {
            max_batch_queued_lines: Some(5),
            ..Default::default()
        },
    )
    .await;
    let tenant_id = tenants::tenant_for_key(app.queue.pool(), &key)
        .await
        .expect("lookup")
        .expect("tenant")
        .id;
    let create = |file: String| {
        app.client
            .post(format!("{base}/v1/batches"))
            .bearer_auth(&key)
            .json(
                &json!({"input_file_id": file, "endpoint": "/v1/chat/completions",
                          "completion_window": "24h"}),
            )
            .send()
    };
    let three = batch_file(&app, &store, tenant_id, 3).await;
    assert_eq!(create(three).await.expect("post").status(), 200);
    // 3 lines queued; 3 more would make 6, past the quota of 5.
    let again = batch_file(&app, &store, tenant_id, 3).await;
    let refused = create(again).await.expect("post");
    assert_eq!(refused.status(), 429);
    let error: Value = refused.json().await.expect("json");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("max_batch_queued_lines is 5"), "{message}");
    let two = batch_file(&app, &store, tenant_id, 2).await;
    assert_eq!(create(two).await.expect("post").status(), 200);
    let _ = std::fs::remove_dir_all(&root);
}
