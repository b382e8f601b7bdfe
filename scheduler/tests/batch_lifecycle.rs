//! A batch's life on a real Postgres: validation and bulk expansion, priority below
//! interactive work, finalisation (idempotent, and safe when a finaliser dies midway),
//! cancellation and expiry. Every test checks the invariant: one output or error line per
//! input line.

mod batch_support;
mod common;

use batch_support::{line, SlowCodec, TestCodec};
use common::TestDb;
use fallow_protocol::job::{ChoiceResult, Completion, FinishReason, Usage};
use fallow_scheduler::batch::expand::Validated;
use fallow_scheduler::batch::{
    files, object_key, records, BatchConfig, BatchStatus, BatchWorker, FileRecord, NewBatch,
};
use fallow_scheduler::queue::{JobKind, NewJob, Queue};
use fallow_scheduler::store::{LocalStore, ObjectStore};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use uuid::Uuid;

const MODEL: &str = "m";

struct Setup {
    db: TestDb,
    queue: Queue,
    store: ObjectStore,
    worker: BatchWorker,
    _dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    let db = TestDb::new().await;
    let queue = db.queue();
    let dir = tempfile::tempdir().unwrap();
    let store = ObjectStore::Local(LocalStore::new(dir.path()));
    let config = BatchConfig {
        lease: Duration::from_secs(60),
        ..BatchConfig::default()
    };
    let worker = BatchWorker::new(queue.clone(), store.clone(), Arc::new(TestCodec), config);
    Setup {
        db,
        queue,
        store,
        worker,
        _dir: dir,
    }
}

/// Uploads `content` as a file and creates a batch on it; returns the batch id.
async fn create_batch(s: &Setup, content: &str) -> Uuid {
    let id = Uuid::new_v4();
    let path = s.store.staging_path().await.unwrap();
    tokio::fs::write(&path, content).await.unwrap();
    let bytes = s.store.put_file(&object_key(id), &path).await.unwrap();
    let file = FileRecord {
        id,
        tenant_id: None,
        purpose: "batch".into(),
        filename: "in.jsonl".into(),
        bytes: bytes as i64,
        object_key: object_key(id),
        created_at: s.queue.clock().now(),
    };
    files::insert(s.queue.pool(), &file).await.unwrap();
    let new = NewBatch {
        tenant_id: None,
        endpoint: "/v1/chat/completions".into(),
        input_file_id: id,
        completion_window: "24h".into(),
        window: Duration::from_secs(24 * 3600),
        metadata: None,
    };
    records::create(s.queue.pool(), &new, s.queue.clock().now())
        .await
        .unwrap()
        .id
}

fn input(n: usize) -> String {
    (0..n)
        .map(|i| line(&format!("req-{i}"), MODEL) + "\n")
        .collect()
}

fn completion(text: &str) -> Completion {
    Completion {
        choices: vec![ChoiceResult {
            index: 0,
            text: text.into(),
            finish_reason: FinishReason::Stop,
            matched_stop: None,
            logprobs: None,
            hidden_states: None,
            routed_experts: None,
        }],
        usage: Usage::default(),
        ..Default::default()
    }
}

/// Claims and completes up to `n` jobs.
async fn run_jobs(queue: &Queue, n: i64) -> usize {
    let jobs = queue
        .claim(
            Uuid::new_v4(),
            &[MODEL.to_owned()],
            n,
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    for job in &jobs {
        assert!(queue
            .complete(job.id, job.attempt, &completion("ok"))
            .await
            .unwrap());
    }
    jobs.len()
}

async fn batch(s: &Setup, id: Uuid) -> records::BatchRecord {
    records::get(s.queue.pool(), id, None)
        .await
        .unwrap()
        .unwrap()
}

/// The lines of a stored file.
async fn file_lines(s: &Setup, id: Option<Uuid>) -> Vec<Value> {
    let Some(id) = id else { return Vec::new() };
    let file = files::get(s.queue.pool(), id, None).await.unwrap().unwrap();
    let mut text = String::new();
    s.store
        .get(&file.object_key)
        .await
        .unwrap()
        .read_to_string(&mut text)
        .await
        .unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Every custom id appears exactly once across the output and error files.
async fn assert_one_line_per_request(s: &Setup, id: Uuid, n: usize) -> (Vec<Value>, Vec<Value>) {
    let b = batch(s, id).await;
    let (out, err) = (
        file_lines(s, b.output_file_id).await,
        file_lines(s, b.error_file_id).await,
    );
    let mut seen: HashMap<String, usize> = HashMap::new();
    for l in out.iter().chain(err.iter()) {
        *seen
            .entry(l["custom_id"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    assert_eq!(seen.len(), n, "every request has a line");
    assert!(seen.values().all(|&c| c == 1), "no request has two lines");
    (out, err)
}

#[tokio::test]
async fn a_batch_is_expanded_in_bulk_and_finalised_with_one_line_per_request() {
    let s = setup().await;
    let id = create_batch(&s, &input(4500)).await;
    s.worker.run_once().await.unwrap();
    let b = batch(&s, id).await;
    assert_eq!(b.status, BatchStatus::InProgress);
    assert_eq!(b.counts.total, 4500);
    while run_jobs(&s.queue, 1000).await > 0 {}
    assert_eq!(batch(&s, id).await.counts.completed, 4500, "live counts");
    s.worker.run_once().await.unwrap();
    let b = batch(&s, id).await;
    assert_eq!(b.status, BatchStatus::Completed);
    assert!(b.completed_at.is_some() && b.finalizing_at.is_some());
    let (out, err) = assert_one_line_per_request(&s, id, 4500).await;
    assert_eq!((out.len(), err.len()), (4500, 0));
    assert_eq!(out[0]["custom_id"], "req-0");
    assert_eq!(out[0]["response"]["status_code"], 200);
    assert_eq!(out[0]["response"]["body"]["object"], "chat.completion");
    assert!(out[0]["error"].is_null());
    s.db.drop().await;
}

#[tokio::test]
async fn a_bad_file_fails_the_batch_with_line_numbers_and_creates_no_job() {
    let s = setup().await;
    let content = format!("{}\n{{oops\n{}\n", line("a", MODEL), line("a", MODEL));
    let id = create_batch(&s, &content).await;
    s.worker.run_once().await.unwrap();
    let b = batch(&s, id).await;
    assert_eq!(b.status, BatchStatus::Failed);
    let lines: Vec<Option<u64>> = b.errors.iter().map(|e| e.line).collect();
    assert_eq!(lines, [Some(2), Some(3)]);
    assert_eq!(s.queue.queued_total().await.unwrap(), 0);
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs")
        .fetch_one(s.queue.pool())
        .await
        .unwrap();
    assert_eq!(jobs, 0);
    s.db.drop().await;
}

#[tokio::test]
async fn an_empty_file_fails_the_batch() {
    let s = setup().await;
    let id = create_batch(&s, "\n\n").await;
    s.worker.run_once().await.unwrap();
    let b = batch(&s, id).await;
    assert_eq!(b.status, BatchStatus::Failed);
    assert_eq!(b.errors[0].code, "empty_file");
    s.db.drop().await;
}

#[tokio::test]
async fn interactive_jobs_are_claimed_before_any_queued_batch_job() {
    let s = setup().await;
    create_batch(&s, &input(50)).await;
    s.worker.run_once().await.unwrap();
    s.queue.clock().advance(Duration::from_secs(5));
    let interactive = s
        .queue
        .enqueue(NewJob {
            tenant_id: None,
            kind: JobKind::Interactive,
            priority: 1000,
            request: batch_request(),
            max_attempts: 3,
            request_id: None,
        })
        .await
        .unwrap();
    let claimed = s
        .queue
        .claim(
            Uuid::new_v4(),
            &[MODEL.to_owned()],
            1,
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert_eq!(
        claimed[0].id, interactive,
        "the later interactive job goes first"
    );
    s.db.drop().await;
}

fn batch_request() -> fallow_protocol::job::GenerateRequest {
    use fallow_scheduler::batch::BatchCodec;
    let body: Value = serde_json::from_str(&line("x", MODEL)).unwrap();
    TestCodec
        .parse_body("/v1/chat/completions", body["body"].clone(), &[])
        .unwrap()
        .request
}

#[tokio::test]
async fn finalising_twice_or_after_a_crash_records_exactly_one_set_of_files() {
    let s = setup().await;
    let id = create_batch(&s, &input(30)).await;
    s.worker.run_once().await.unwrap();
    while run_jobs(&s.queue, 100).await > 0 {}
    // A first finaliser claims the batch and dies before recording anything.
    let crashed = s.worker.claim_finalization().await.unwrap().unwrap();
    assert_eq!(batch(&s, id).await.status, BatchStatus::Finalizing);
    assert!(
        s.worker.claim_finalization().await.unwrap().is_none(),
        "the lease holds"
    );
    // Its lease runs out; a second finaliser takes over and finishes.
    s.queue.clock().advance(Duration::from_secs(61));
    let second = s.worker.claim_finalization().await.unwrap().unwrap();
    assert!(s.worker.finalize(&second).await.unwrap());
    // The first one wakes up and finishes too: fenced, it records nothing.
    assert!(!s.worker.finalize(&crashed).await.unwrap());
    // And another round finds nothing to do.
    assert!(!s.worker.run_once().await.unwrap());
    let b = batch(&s, id).await;
    assert_eq!(b.status, BatchStatus::Completed);
    assert_eq!((b.counts.completed, b.counts.failed), (30, 0));
    let (out, _) = assert_one_line_per_request(&s, id, 30).await;
    assert_eq!(out.len(), 30);
    let outputs: i64 =
        sqlx::query_scalar("SELECT count(*) FROM files WHERE purpose = 'batch_output'")
            .fetch_one(s.queue.pool())
            .await
            .unwrap();
    assert_eq!(outputs, 1, "the fenced finaliser's file was not recorded");
    s.db.drop().await;
}

#[tokio::test]
async fn a_cancelled_batch_ends_cancelled_with_what_finished() {
    let s = setup().await;
    let id = create_batch(&s, &input(10)).await;
    s.worker.run_once().await.unwrap();
    assert_eq!(run_jobs(&s.queue, 3).await, 3);
    let running = s
        .queue
        .claim(
            Uuid::new_v4(),
            &[MODEL.to_owned()],
            1,
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    let flagged = records::cancel(s.queue.pool(), id, s.queue.clock().now())
        .await
        .unwrap();
    assert_eq!(
        flagged,
        vec![running[0].id],
        "the running job is flagged, not dropped"
    );
    assert_eq!(batch(&s, id).await.status, BatchStatus::Cancelling);
    // Not final until the running job ends.
    s.worker.run_once().await.unwrap();
    assert_eq!(batch(&s, id).await.status, BatchStatus::Cancelling);
    s.queue
        .mark_cancelled(running[0].id, running[0].attempt, None)
        .await
        .unwrap();
    s.worker.run_once().await.unwrap();
    let b = batch(&s, id).await;
    assert_eq!(b.status, BatchStatus::Cancelled);
    assert!(b.cancelled_at.is_some() && b.cancelling_at.is_some());
    let (out, err) = assert_one_line_per_request(&s, id, 10).await;
    assert_eq!((out.len(), err.len()), (3, 7));
    assert_eq!(err[0]["error"]["code"], "batch_cancelled");
    assert!(err[0]["response"].is_null());
    s.db.drop().await;
}

#[tokio::test]
async fn a_batch_past_its_window_expires_with_what_finished() {
    let s = setup().await;
    let id = create_batch(&s, &input(5)).await;
    s.worker.run_once().await.unwrap();
    assert_eq!(run_jobs(&s.queue, 2).await, 2);
    s.queue.clock().advance(Duration::from_secs(24 * 3600 + 1));
    s.worker.run_once().await.unwrap();
    let b = batch(&s, id).await;
    assert_eq!(b.status, BatchStatus::Expired);
    assert!(b.expired_at.is_some());
    let (out, err) = assert_one_line_per_request(&s, id, 5).await;
    assert_eq!((out.len(), err.len()), (2, 3));
    assert_eq!(err[0]["error"]["code"], "batch_expired");
    s.db.drop().await;
}

#[tokio::test]
async fn a_batch_cancelled_while_validating_creates_no_jobs() {
    let s = setup().await;
    let id = create_batch(&s, &input(5)).await;
    let claimed = s.worker.claim_validation().await.unwrap().unwrap();
    records::cancel(s.queue.pool(), id, s.queue.clock().now())
        .await
        .unwrap();
    assert_eq!(
        s.worker.validate_and_expand(&claimed).await.unwrap(),
        Validated::Superseded
    );
    s.worker.run_once().await.unwrap();
    let b = batch(&s, id).await;
    assert_eq!(b.status, BatchStatus::Cancelled);
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs")
        .fetch_one(s.queue.pool())
        .await
        .unwrap();
    assert_eq!(jobs, 0);
    s.db.drop().await;
}

#[tokio::test]
async fn a_batch_whose_input_is_missing_from_the_store_fails_with_the_reason() {
    let s = setup().await;
    let id = create_batch(&s, &input(3)).await;
    let file = batch(&s, id).await.input_file_id;
    s.store.delete(&object_key(file)).await.unwrap();
    assert!(s.worker.run_once().await.unwrap());
    let b = batch(&s, id).await;
    assert_eq!(b.status, BatchStatus::Failed);
    assert_eq!(b.errors[0].code, "input_file_missing");
    assert_eq!(s.queue.queued_total().await.unwrap(), 0);
    s.db.drop().await;
}

#[tokio::test]
async fn a_batch_whose_rounds_keep_failing_fails_after_max_rounds_and_the_others_go_on() {
    let s = setup().await;
    let broken = create_batch(&s, &input(2)).await;
    // The object becomes a directory: opening it works, reading it fails, every time.
    let ObjectStore::Local(local) = &s.store else {
        unreachable!("the test store is local")
    };
    let path = local
        .root()
        .join(object_key(batch(&s, broken).await.input_file_id));
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    let fine = create_batch(&s, &input(2)).await;
    let config = BatchConfig {
        lease: Duration::from_secs(60),
        max_rounds: 2,
        retry_after: Duration::ZERO,
        ..BatchConfig::default()
    };
    let worker = BatchWorker::new(
        s.queue.clone(),
        s.store.clone(),
        Arc::new(TestCodec),
        config,
    );

    assert!(worker.run_once().await.unwrap());
    assert_eq!(batch(&s, fine).await.status, BatchStatus::InProgress);
    assert_eq!(batch(&s, broken).await.status, BatchStatus::Validating);
    s.queue.clock().advance(Duration::from_secs(1));
    assert!(worker.run_once().await.unwrap());

    let b = batch(&s, broken).await;
    assert_eq!(b.status, BatchStatus::Failed);
    assert_eq!(b.errors[0].code, "validation_failed");
    assert!(
        b.errors[0].message.contains("after 2 attempts"),
        "{}",
        b.errors[0].message
    );
    assert_eq!(batch(&s, fine).await.status, BatchStatus::InProgress);
    s.db.drop().await;
}

#[tokio::test]
async fn a_failed_validation_round_backs_off_instead_of_retrying_at_once() {
    let s = setup().await;
    let id = create_batch(&s, &input(1)).await;
    let ObjectStore::Local(local) = &s.store else {
        unreachable!("the test store is local")
    };
    let path = local
        .root()
        .join(object_key(batch(&s, id).await.input_file_id));
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();

    let attempts = || async {
        sqlx::query_scalar::<_, i32>("SELECT validation_attempts FROM batches WHERE id = $1")
            .bind(id)
            .fetch_one(s.queue.pool())
            .await
            .unwrap()
    };

    s.worker.run_once().await.unwrap();
    s.queue.clock().advance(Duration::from_secs(5));
    s.worker.run_once().await.unwrap();
    assert_eq!(attempts().await, 1, "a retry waits for the backoff (10 s)");
    s.queue.clock().advance(Duration::from_secs(6));
    s.worker.run_once().await.unwrap();
    assert_eq!(attempts().await, 2);
    assert_eq!(batch(&s, id).await.status, BatchStatus::Validating);
    s.db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_keeps_the_lease_of_a_batch_it_is_still_validating() {
    let s = setup().await;
    let id = create_batch(&s, &input(4)).await;
    // Checking takes 2 × 4 × 250 ms, far past the 300 ms lease, renewed every 100 ms.
    let config = BatchConfig {
        lease: Duration::from_millis(300),
        ..BatchConfig::default()
    };
    let slow = Arc::new(SlowCodec(Duration::from_millis(250)));
    let worker = BatchWorker::new(s.queue.clone(), s.store.clone(), slow, config);
    let validating = tokio::spawn(async move { worker.run_once().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.queue.clock().advance(Duration::from_secs(1)); // the lease as claimed has passed
    tokio::time::sleep(Duration::from_millis(350)).await;

    assert!(
        s.worker.claim_validation().await.unwrap().is_none(),
        "no other worker takes over a batch whose worker is alive"
    );
    assert!(validating.await.unwrap().unwrap());
    let b = batch(&s, id).await;
    assert_eq!(b.status, BatchStatus::InProgress);
    assert_eq!(s.queue.queued_total().await.unwrap(), 4);
    s.db.drop().await;
}
