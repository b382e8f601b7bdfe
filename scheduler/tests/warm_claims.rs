//! Claims prefer runners that hold the job's model warm; the registry's warm lists and
//! operators' eviction requests.

mod common;

use common::*;
use fallow_scheduler::queue::ClaimScope;
use fallow_scheduler::runners::{self, RunnerState};
use std::time::Duration;
use uuid::Uuid;

const LEASE: Duration = Duration::from_secs(30);
const PATIENT: Duration = Duration::from_secs(600);

fn cold(model: &[String], cold_after: Duration) -> ClaimScope<'_> {
    ClaimScope {
        warm: &[],
        cold: model,
        cold_after,
    }
}

#[tokio::test]
async fn a_cold_runner_leaves_a_fresh_job_to_the_runner_that_has_its_model_warm() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let warm = register_runner(&db.pool, &["smol"], &["smol"]).await;
    let cold_runner = register_runner(&db.pool, &["smol"], &[]).await;
    queue.enqueue(interactive_job("smol")).await.unwrap();
    let smol = models(&["smol"]);

    let taken = queue
        .claim_in(cold_runner, &cold(&smol, PATIENT), 4, LEASE)
        .await
        .unwrap();
    assert!(taken.is_empty(), "the warm runner gets the first chance");
    let taken = queue.claim(warm, &smol, 4, LEASE).await.unwrap();
    assert_eq!(taken.len(), 1);
    db.drop().await;
}

#[tokio::test]
async fn a_cold_runner_takes_a_job_that_waited_longer_than_cold_after() {
    let db = TestDb::new().await;
    let queue = db.queue();
    register_runner(&db.pool, &["smol"], &["smol"]).await;
    let cold_runner = register_runner(&db.pool, &["smol"], &[]).await;
    queue.enqueue(interactive_job("smol")).await.unwrap();
    queue.clock().advance(Duration::from_secs(5));

    let smol = models(&["smol"]);
    let taken = queue
        .claim_in(cold_runner, &cold(&smol, Duration::from_secs(2)), 4, LEASE)
        .await
        .unwrap();
    assert_eq!(
        taken.len(),
        1,
        "waiting for the busy warm runner is not worth it"
    );
    db.drop().await;
}

#[tokio::test]
async fn a_job_whose_model_is_warm_nowhere_goes_to_a_cold_runner_at_once() {
    let db = TestDb::new().await;
    let queue = db.queue();
    register_runner(&db.pool, &["smol", "gemma"], &["gemma"]).await;
    let cold_runner = register_runner(&db.pool, &["smol"], &[]).await;
    queue.enqueue(interactive_job("smol")).await.unwrap();

    let smol = models(&["smol"]);
    let taken = queue
        .claim_in(cold_runner, &cold(&smol, PATIENT), 4, LEASE)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    db.drop().await;
}

#[tokio::test]
async fn a_warm_runner_out_of_service_holds_no_job_back() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let warm = register_runner(&db.pool, &["smol"], &["smol"]).await;
    runners::set_state(&db.pool, warm, RunnerState::Cordoned)
        .await
        .unwrap();
    let cold_runner = register_runner(&db.pool, &["smol"], &[]).await;
    queue.enqueue(interactive_job("smol")).await.unwrap();

    let smol = models(&["smol"]);
    let taken = queue
        .claim_in(cold_runner, &cold(&smol, PATIENT), 4, LEASE)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1, "a cordoned runner serves nothing");
    db.drop().await;
}

#[tokio::test]
async fn a_model_listed_warm_and_cold_counts_as_warm() {
    let db = TestDb::new().await;
    let queue = db.queue();
    register_runner(&db.pool, &["smol"], &["smol"]).await;
    let me = register_runner(&db.pool, &["smol"], &["smol"]).await;
    queue.enqueue(interactive_job("smol")).await.unwrap();
    let smol = models(&["smol"]);
    let scope = ClaimScope {
        warm: &smol,
        cold: &smol,
        cold_after: PATIENT,
    };
    let taken = queue.claim_in(me, &scope, 4, LEASE).await.unwrap();
    assert_eq!(taken.len(), 1);
    db.drop().await;
}

#[tokio::test]
async fn warm_replicas_count_live_active_runners_per_model() {
    let db = TestDb::new().await;
    let a = register_runner(&db.pool, &["smol", "gemma"], &["smol"]).await;
    register_runner(&db.pool, &["smol"], &["smol"]).await;
    let drained = register_runner(&db.pool, &["gemma"], &["gemma"]).await;
    runners::set_state(&db.pool, drained, RunnerState::Drained)
        .await
        .unwrap();

    let counts = runners::warm_replicas(&db.pool).await.unwrap();
    assert_eq!(counts.get("smol"), Some(&2));
    assert_eq!(counts.get("gemma"), None, "a drained runner is no replica");

    runners::set_warm(&db.pool, a, &models(&["gemma"]))
        .await
        .unwrap();
    let counts = runners::warm_replicas(&db.pool).await.unwrap();
    assert_eq!(counts.get("smol"), Some(&1));
    assert_eq!(counts.get("gemma"), Some(&1));
    let record = runners::get(&db.pool, a).await.unwrap().unwrap();
    assert_eq!(record.warm, vec!["gemma".to_string()]);
    db.drop().await;
}

#[tokio::test]
async fn an_eviction_request_is_taken_once() {
    let db = TestDb::new().await;
    let runner = register_runner(&db.pool, &["smol", "gemma"], &["smol", "gemma"]).await;
    assert!(runners::request_evict(&db.pool, runner, "smol")
        .await
        .unwrap());
    assert!(runners::request_evict(&db.pool, runner, "smol")
        .await
        .unwrap());
    assert!(runners::request_evict(&db.pool, runner, "gemma")
        .await
        .unwrap());
    assert!(!runners::request_evict(&db.pool, Uuid::new_v4(), "smol")
        .await
        .unwrap());

    let taken = runners::take_evictions(&db.pool, runner).await.unwrap();
    assert_eq!(taken, models(&["smol", "gemma"]), "once each, in order");
    assert!(runners::take_evictions(&db.pool, runner)
        .await
        .unwrap()
        .is_empty());
    db.drop().await;
}
