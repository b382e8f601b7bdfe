//! The maintenance loop reaps and prunes on its cadence and stops on shutdown.

mod common;

use common::*;
use fallow_scheduler::maintenance::{self, MaintenanceConfig};
use fallow_scheduler::queue::JobState;
use fallow_scheduler::stream::TokenRelay;
use std::time::Duration;
use uuid::Uuid;

#[tokio::test]
async fn the_maintenance_loop_reaps_expired_leases_until_shut_down() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let id = queue.enqueue(batch_job("m")).await.unwrap();
    queue
        .claim(Uuid::new_v4(), &models(&["m"]), 1, Duration::from_secs(10))
        .await
        .unwrap();
    queue.clock().advance(Duration::from_secs(11));

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = MaintenanceConfig {
        reap_every: Duration::from_millis(50),
        prune_every: Duration::from_secs(60),
        retention: Duration::from_secs(3600),
        abandoned_after: Duration::from_secs(3600),
    };
    let relay = TokenRelay::connect(&fallow_protocol::testing::test_redis_url())
        .await
        .unwrap();
    let running = tokio::spawn(maintenance::run(queue.clone(), relay, config, async {
        let _ = stopped.await;
    }));

    let mut state = JobState::Running;
    for _ in 0..100 {
        state = queue.get(id).await.unwrap().unwrap().state;
        if state == JobState::Queued {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(state, JobState::Queued);

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(2), running)
        .await
        .unwrap()
        .unwrap();
    db.drop().await;
}

#[tokio::test]
async fn queued_interactive_jobs_past_the_request_timeout_are_cancelled_and_batch_jobs_wait() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let abandoned = queue.enqueue(interactive_job("m")).await.unwrap();
    let batch = queue.enqueue(batch_job("m")).await.unwrap();
    queue.clock().advance(Duration::from_secs(700));
    let fresh = queue.enqueue(interactive_job("m")).await.unwrap();

    let cancelled = queue
        .cancel_abandoned(Duration::from_secs(660))
        .await
        .unwrap();

    assert_eq!(cancelled, 1);
    let record = queue.get(abandoned).await.unwrap().unwrap();
    assert_eq!(record.state, JobState::Cancelled);
    assert!(record.error.unwrap_or_default().contains("no client"));
    assert_eq!(
        queue.get(batch).await.unwrap().unwrap().state,
        JobState::Queued
    );
    assert_eq!(
        queue.get(fresh).await.unwrap().unwrap().state,
        JobState::Queued
    );
    db.drop().await;
}

#[tokio::test]
async fn a_queued_background_response_is_not_taken_for_abandoned() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let mut polled_later = interactive_job("m");
    polled_later.request.output.responses = Some(serde_json::json!({"background": true}));
    let background = queue.enqueue(polled_later).await.unwrap();
    queue.clock().advance(Duration::from_secs(7200));

    let cancelled = queue
        .cancel_abandoned(Duration::from_secs(660))
        .await
        .unwrap();

    assert_eq!(cancelled, 0);
    assert_eq!(
        queue.get(background).await.unwrap().unwrap().state,
        JobState::Queued
    );
    db.drop().await;
}
