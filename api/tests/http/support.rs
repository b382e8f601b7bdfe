//! `spawn_app()` and a scripted fake runner. The fake runner is allowed here only: it
//! claims jobs with `queue.claim`, appends events with `relay.append` and completes with
//! `queue.complete`, exactly like the real worker's protocol, without an engine.

use fallow_api::{ApiConfig, AppState};
use fallow_protocol::job::{ChoiceResult, Completion, FinishReason, JobEvent, Usage};
use fallow_scheduler::clock::Clock;
use fallow_scheduler::db;
use fallow_scheduler::queue::{ClaimedJob, JobRecord, Queue};
use fallow_scheduler::runners::{self, ModelEntry, ModelKind, RunnerInfo};
use fallow_scheduler::stream::TokenRelay;
use std::time::Duration;
use tokio::sync::oneshot;
use uuid::Uuid;

pub const MODEL: &str = "test-org/test-model";
/// A model whose runner published Hermes tool calls and Qwen3-style reasoning.
pub const THINKER: &str = "test-org/thinker";
/// A model whose runner published harmony (gpt-oss) for calls and reasoning.
pub const GPT_OSS: &str = "test-org/gpt-oss";
pub const CONTEXT: u32 = 2048;
/// An embedding model of 4 dimensions that may be cut to 2.
pub const EMBEDDER: &str = "test-org/embedder";

pub struct TestApp {
    pub base: String,
    pub queue: Queue,
    pub relay: TokenRelay,
    pub runner_id: Uuid,
    pub client: reqwest::Client,
    schema: String,
    _shutdown: oneshot::Sender<()>,
}

/// Drops the test's schema, even when the test panicked. `Drop` cannot await, so a short
/// thread with its own runtime and connection does it.
impl Drop for TestApp {
    fn drop(&mut self) {
        let schema = std::mem::take(&mut self.schema);
        let url = fallow_protocol::testing::test_database_url();
        let cleanup = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&url);
                if let Ok(pool) = pool.await {
                    let _ = db::drop_schema(&pool, &schema).await;
                    pool.close().await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

fn redis_url() -> String {
    fallow_protocol::testing::test_redis_url()
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(ApiConfig::default()).await
}

pub async fn spawn_app_with(config: ApiConfig) -> TestApp {
    spawn_app_on(config, &redis_url()).await
}

/// An app whose token relay points at `redis` (tests of a Redis outage pass a dead port).
pub async fn spawn_app_on(config: ApiConfig, redis: &str) -> TestApp {
    let (pool, schema) = db::fresh_schema(&fallow_protocol::testing::test_database_url())
        .await
        .expect("fresh schema (is Postgres running?)");
    let queue = Queue::new(pool.clone(), Clock::system());
    let relay = TokenRelay::connect(redis).await.expect("redis");
    let info = RunnerInfo {
        host: "fake-runner".into(),
        devices: serde_json::json!({"kind": "cpu"}),
        slots: 8,
        models: vec![
            ModelEntry {
                id: MODEL.into(),
                context_length: CONTEXT,
                owned_by: "fallow".into(),
                created: 1_700_000_000,
                tool_parser: None,
                reasoning_parser: None,
                kind: Default::default(),
                dimensions: None,
                matryoshka_dimensions: Vec::new(),
                parent: None,
                lora_dir: false,
                lora_path: None,
            },
            ModelEntry {
                id: THINKER.into(),
                context_length: CONTEXT,
                owned_by: "fallow".into(),
                created: 1_700_000_000,
                tool_parser: Some("hermes".into()),
                reasoning_parser: Some("qwen3".into()),
                kind: Default::default(),
                dimensions: None,
                matryoshka_dimensions: Vec::new(),
                parent: None,
                lora_dir: false,
                lora_path: None,
            },
            ModelEntry {
                id: GPT_OSS.into(),
                context_length: CONTEXT,
                owned_by: "fallow".into(),
                created: 1_700_000_000,
                tool_parser: Some("harmony".into()),
                reasoning_parser: Some("harmony".into()),
                kind: Default::default(),
                dimensions: None,
                matryoshka_dimensions: Vec::new(),
                parent: None,
                lora_dir: false,
                lora_path: None,
            },
            ModelEntry {
                id: EMBEDDER.into(),
                context_length: 512,
                owned_by: "fallow".into(),
                created: 1_700_000_000,
                tool_parser: None,
                reasoning_parser: None,
                kind: ModelKind::Embedding,
                dimensions: Some(4),
                matryoshka_dimensions: vec![2],
                parent: None,
                lora_dir: false,
                lora_path: None,
            },
        ],
        warm: vec![
            MODEL.into(),
            THINKER.into(),
            GPT_OSS.into(),
            EMBEDDER.into(),
        ],
        pool: runners::DEFAULT_POOL.into(),
    };
    let runner_id = runners::register(&pool, &info)
        .await
        .expect("register runner");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let state = AppState::new(queue.clone(), relay.clone(), config);
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(fallow_api::serve(listener, state, async {
        let _ = rx.await;
    }));
    TestApp {
        base: format!("http://{addr}"),
        queue,
        relay,
        runner_id,
        client: reqwest::Client::new(),
        schema,
        _shutdown: tx,
    }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn post_chat(&self, body: serde_json::Value) -> reqwest::Response {
        self.client
            .post(self.url("/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .expect("request")
    }

    /// Claims the next job for the test model, waiting up to 10 s for one.
    pub async fn claim_one(&self) -> ClaimedJob {
        self.claim_for(MODEL).await
    }

    /// Claims the next job for `model`, waiting up to 10 s for one.
    pub async fn claim_for(&self, model: &str) -> ClaimedJob {
        let models = [model.to_owned()];
        for _ in 0..500 {
            let mut jobs = self
                .queue
                .claim(self.runner_id, &models, 1, Duration::from_secs(30))
                .await
                .expect("claim");
            if let Some(job) = jobs.pop() {
                return job;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("no job was enqueued within 10 s");
    }

    /// Streams `pieces` as deltas of choice 0 (the last one carrying `finish_reason`),
    /// then `Final`, then completes the job in Postgres.
    pub async fn answer(&self, job: &ClaimedJob, pieces: &[&str]) -> Completion {
        self.append(
            job.id,
            JobEvent::Started {
                attempt: job.attempt,
                prompt_text: None,
                continues: false,
            },
        )
        .await;
        for (i, piece) in pieces.iter().enumerate() {
            let last = i + 1 == pieces.len();
            self.append(
                job.id,
                JobEvent::Delta {
                    index: 0,
                    text: (*piece).to_owned(),
                    token_ids: Vec::new(),
                    logprobs: None,
                    finish_reason: last.then_some(FinishReason::Stop),
                    usage: usage(i as u32 + 1),
                    at: None,
                },
            )
            .await;
        }
        let completion = Completion {
            choices: vec![ChoiceResult {
                index: 0,
                text: pieces.concat(),
                finish_reason: FinishReason::Stop,
                matched_stop: None,
                logprobs: None,
                hidden_states: None,
                routed_experts: None,
            }],
            usage: usage(pieces.len() as u32),
            ..Default::default()
        };
        self.append(
            job.id,
            JobEvent::Final {
                completion: completion.clone(),
            },
        )
        .await;
        let done = self
            .queue
            .complete(job.id, job.attempt, &completion)
            .await
            .expect("complete");
        assert!(done, "completion was fenced off");
        completion
    }

    pub async fn append(&self, job: Uuid, event: JobEvent) {
        self.relay.append(&[(job, event)]).await.expect("append");
    }

    pub async fn job(&self, id: Uuid) -> JobRecord {
        self.queue.get(id).await.expect("get").expect("job exists")
    }

    /// Polls the job row until `pred` holds (5 s at most).
    pub async fn wait_for_job(&self, id: Uuid, pred: impl Fn(&JobRecord) -> bool) -> JobRecord {
        for _ in 0..250 {
            let record = self.job(id).await;
            if pred(&record) {
                return record;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("job {id} never reached the expected state");
    }
}

pub fn usage(completion_tokens: u32) -> Usage {
    Usage {
        prompt_tokens: 9,
        completion_tokens,
        cached_tokens: 0,
    }
}

pub fn chat_body() -> serde_json::Value {
    serde_json::json!({"model": MODEL, "messages": [{"role": "user", "content": "Say hello"}]})
}

/// One parsed SSE event.
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub id: Option<String>,
    pub data: String,
}

impl SseEvent {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.data).unwrap_or(serde_json::Value::Null)
    }
}

/// Parses a complete SSE body (comments and keep-alives skipped).
pub fn parse_sse(body: &str) -> Vec<SseEvent> {
    body.split("\n\n")
        .filter_map(|block| {
            let mut id = None;
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = Some(v.trim().to_owned());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.strip_prefix(' ').unwrap_or(v).to_owned());
                }
            }
            (!data.is_empty()).then(|| SseEvent {
                id,
                data: data.join("\n"),
            })
        })
        .collect()
}
