//! Shared arrangements for the integration tests: a fresh Postgres schema per test (dropped
//! again at the end), a queue on a fixed clock, and small job builders.
#![allow(dead_code)]

use chrono::Utc;
use fallow_protocol::job::{ChatMessage, Completion, GenerateRequest, Role, Sampling, Usage};
use fallow_scheduler::clock::Clock;
use fallow_scheduler::db;
use fallow_scheduler::queue::{JobKind, NewJob, Queue};
use fallow_scheduler::runners::{ModelEntry, RunnerInfo};
use sqlx::PgPool;

pub struct TestDb {
    pub pool: PgPool,
    pub schema: String,
}

impl TestDb {
    pub async fn new() -> TestDb {
        let (pool, schema) = db::fresh_schema(&fallow_protocol::testing::test_database_url())
            .await
            .expect("a test Postgres (FALLOW_TEST_DATABASE_URL or 127.0.0.1:5432)");
        TestDb { pool, schema }
    }

    /// A queue on a clock frozen at the current time; advance it with `queue.clock()`.
    pub fn queue(&self) -> Queue {
        Queue::new(self.pool.clone(), Clock::fixed(Utc::now()))
    }

    pub async fn drop(self) {
        db::drop_schema(&self.pool, &self.schema)
            .await
            .expect("drop test schema");
        self.pool.close().await;
    }
}

pub fn request(model: &str) -> GenerateRequest {
    GenerateRequest::chat(
        model,
        vec![ChatMessage::text(Role::User, "Say hello.")],
        Sampling::default(),
    )
}

pub fn job(model: &str, kind: JobKind, priority: i32) -> NewJob {
    NewJob {
        tenant_id: None,
        kind,
        priority,
        request: request(model),
        max_attempts: 3,
        request_id: None,
    }
}

pub fn batch_job(model: &str) -> NewJob {
    job(model, JobKind::Batch, 10)
}

pub fn interactive_job(model: &str) -> NewJob {
    job(model, JobKind::Interactive, 0)
}

pub fn completion(text: &str) -> Completion {
    Completion {
        choices: vec![fallow_protocol::job::ChoiceResult {
            index: 0,
            text: text.to_string(),
            finish_reason: fallow_protocol::job::FinishReason::Stop,
            matched_stop: None,
            logprobs: None,
            hidden_states: None,
            routed_experts: None,
        }],
        usage: Usage {
            prompt_tokens: 5,
            completion_tokens: 2,
            cached_tokens: 0,
        },
        ..Default::default()
    }
}

pub fn models(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// A runner that may serve `may_serve` and holds `warm` in memory.
pub fn runner_info(may_serve: &[&str], warm: &[&str]) -> RunnerInfo {
    RunnerInfo {
        host: "box-1".into(),
        devices: serde_json::json!([{"kind": "cpu", "cores": 2}]),
        slots: 4,
        models: may_serve
            .iter()
            .map(|id| ModelEntry {
                id: id.to_string(),
                context_length: 8192,
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
            })
            .collect(),
        warm: warm.iter().map(|id| id.to_string()).collect(),
        pool: fallow_scheduler::runners::DEFAULT_POOL.into(),
    }
}

/// Registers a runner as [`runner_info`] describes it.
pub async fn register_runner(pool: &PgPool, may_serve: &[&str], warm: &[&str]) -> uuid::Uuid {
    fallow_scheduler::runners::register(pool, &runner_info(may_serve, warm))
        .await
        .expect("register a runner")
}
