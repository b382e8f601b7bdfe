//! Runner states and liveness: silent runners are marked dead and their jobs requeued
//! (fenced); a stalled runner comes back; runner-reported states never override the operator.

mod common;

use common::*;
use fallow_scheduler::queue::JobState;
use fallow_scheduler::runners::{self, ModelEntry, RunnerInfo, RunnerState};
use std::time::Duration;
use uuid::Uuid;

fn info() -> RunnerInfo {
    RunnerInfo {
        host: "box-1".into(),
        devices: serde_json::json!([{"kind": "cpu", "cores": 2}]),
        slots: 4,
        models: vec![ModelEntry {
            id: "m".into(),
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
        }],
        warm: vec!["m".into()],
        pool: runners::DEFAULT_POOL.into(),
    }
}

async fn silence(db: &TestDb, runner: Uuid, secs: i64) {
    sqlx::query(
        "UPDATE runners SET last_heartbeat = now() - make_interval(secs => $2) WHERE id = $1",
    )
    .bind(runner)
    .bind(secs as f64)
    .execute(&db.pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn a_silent_runner_is_marked_dead_and_its_jobs_are_requeued() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let runner = runners::register(&db.pool, &info()).await.unwrap();
    let alive = runners::register(&db.pool, &info()).await.unwrap();
    let id = queue.enqueue(batch_job("m")).await.unwrap();
    let claimed = queue
        .claim(runner, &models(&["m"]), 1, Duration::from_secs(600))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    silence(&db, runner, 31).await;

    let dead = runners::mark_dead(&db.pool, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(dead, vec![runner], "only the silent runner is dead");
    let record = runners::get(&db.pool, runner).await.unwrap().unwrap();
    assert_eq!(record.state, "dead");
    let other = runners::get(&db.pool, alive).await.unwrap().unwrap();
    assert_eq!(other.state, "active");

    // Its long lease no longer protects the job: the reaper takes it back at once.
    assert_eq!(queue.reap_expired().await.unwrap(), 1);
    let job = queue.get(id).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Queued);
    assert_eq!(job.runner_id, None);

    // Fenced: the dead runner's late completion changes nothing.
    let late = queue
        .complete(id, claimed[0].attempt, &completion("late"))
        .await
        .unwrap();
    assert!(!late, "a completion from the dead attempt is stale");
    db.drop().await;
}

#[tokio::test]
async fn marking_dead_is_idempotent_and_spares_runners_that_heartbeat() {
    let db = TestDb::new().await;
    let runner = runners::register(&db.pool, &info()).await.unwrap();
    runners::heartbeat(&db.pool, runner, 0).await.unwrap();
    let none = runners::mark_dead(&db.pool, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(none.is_empty());
    silence(&db, runner, 60).await;
    assert_eq!(
        runners::mark_dead(&db.pool, Duration::from_secs(30))
            .await
            .unwrap(),
        vec![runner]
    );
    assert!(runners::mark_dead(&db.pool, Duration::from_secs(30))
        .await
        .unwrap()
        .is_empty());
    db.drop().await;
}

#[tokio::test]
async fn a_dead_runner_that_heartbeats_again_is_active_and_learns_its_jobs_are_lost() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let runner = runners::register(&db.pool, &info()).await.unwrap();
    let id = queue.enqueue(batch_job("m")).await.unwrap();
    let claimed = queue
        .claim(runner, &models(&["m"]), 1, Duration::from_secs(600))
        .await
        .unwrap();
    silence(&db, runner, 40).await;
    runners::mark_dead(&db.pool, Duration::from_secs(30))
        .await
        .unwrap();
    queue.reap_expired().await.unwrap();

    let state = runners::heartbeat(&db.pool, runner, 1).await.unwrap();
    assert_eq!(state, "active");
    let renewal = queue
        .renew_leases_detailed(runner, &[(id, claimed[0].attempt)], Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(renewal.lost, vec![id]);
    db.drop().await;
}

#[tokio::test]
async fn a_heartbeat_from_an_unregistered_runner_is_not_found_and_it_can_register_as_itself() {
    let db = TestDb::new().await;
    let runner = runners::register(&db.pool, &info()).await.unwrap();
    runners::deregister(&db.pool, runner).await.unwrap();
    let err = runners::heartbeat(&db.pool, runner, 0).await.unwrap_err();
    assert!(matches!(err, fallow_scheduler::SchedulerError::NotFound(_)));

    runners::register_as(&db.pool, runner, &info())
        .await
        .unwrap();
    assert_eq!(
        runners::heartbeat(&db.pool, runner, 0).await.unwrap(),
        "active"
    );
    db.drop().await;
}

#[tokio::test]
async fn a_runner_reported_state_never_overrides_the_operator() {
    let db = TestDb::new().await;
    let runner = runners::register(&db.pool, &info()).await.unwrap();
    assert_eq!(
        runners::report_state(
            &db.pool,
            runner,
            &[RunnerState::Active],
            RunnerState::Yielded
        )
        .await
        .unwrap(),
        "yielded"
    );
    assert_eq!(
        runners::report_state(
            &db.pool,
            runner,
            &[RunnerState::Yielded],
            RunnerState::Active
        )
        .await
        .unwrap(),
        "active"
    );
    assert!(runners::set_state(&db.pool, runner, RunnerState::Draining)
        .await
        .unwrap());
    // The owner returns while draining: the operator's drain stands.
    assert_eq!(
        runners::report_state(
            &db.pool,
            runner,
            &[RunnerState::Active],
            RunnerState::Yielded
        )
        .await
        .unwrap(),
        "draining"
    );
    assert_eq!(
        runners::report_state(
            &db.pool,
            runner,
            &[RunnerState::Draining],
            RunnerState::Drained
        )
        .await
        .unwrap(),
        "drained"
    );
    assert!(runners::report_state(
        &db.pool,
        Uuid::new_v4(),
        &[RunnerState::Active],
        RunnerState::Yielded
    )
    .await
    .is_err());
    db.drop().await;
}

#[tokio::test]
async fn a_runner_that_is_not_active_in_the_registry_claims_nothing() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let runner = runners::register(&db.pool, &info()).await.unwrap();
    queue.enqueue(batch_job("m")).await.unwrap();
    let lease = Duration::from_secs(30);
    for state in [
        RunnerState::Cordoned,
        RunnerState::Draining,
        RunnerState::Drained,
        RunnerState::Yielded,
        RunnerState::Dead,
    ] {
        runners::set_state(&db.pool, runner, state).await.unwrap();
        let claimed = queue
            .claim(runner, &models(&["m"]), 1, lease)
            .await
            .unwrap();
        assert!(claimed.is_empty(), "a {state} runner claimed a job");
    }
    runners::set_state(&db.pool, runner, RunnerState::Active)
        .await
        .unwrap();
    let claimed = queue
        .claim(runner, &models(&["m"]), 1, lease)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "an active runner claims again");
    db.drop().await;
}
