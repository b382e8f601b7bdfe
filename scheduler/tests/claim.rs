//! Claiming: exactly-once under concurrency, order, and what a claim may take.

mod common;

use common::*;
use fallow_scheduler::queue::{JobKind, JobState};
use std::collections::HashSet;
use std::time::Duration;
use uuid::Uuid;

const LEASE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_concurrent_claimers_claim_each_of_2000_jobs_exactly_once() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let jobs: Vec<_> = (0..2000).map(|_| batch_job("m")).collect();
    let enqueued = queue.enqueue_many(&jobs).await.unwrap();

    let mut claimers = Vec::new();
    for _ in 0..8 {
        let queue = queue.clone();
        claimers.push(tokio::spawn(async move {
            let runner = Uuid::new_v4();
            let mut mine = Vec::new();
            loop {
                let got = queue
                    .claim(runner, &models(&["m"]), 25, LEASE)
                    .await
                    .unwrap();
                if got.is_empty() {
                    // SKIP LOCKED may come back empty while others hold rows: stop only
                    // when nothing is queued any more.
                    if queue.queued_total().await.unwrap() == 0 {
                        return mine;
                    }
                    tokio::task::yield_now().await;
                    continue;
                }
                mine.extend(got.into_iter().map(|j| (j.id, j.attempt)));
            }
        }));
    }
    let mut claimed = Vec::new();
    for claimer in claimers {
        claimed.extend(claimer.await.unwrap());
    }

    let unique: HashSet<Uuid> = claimed.iter().map(|(id, _)| *id).collect();
    assert_eq!(claimed.len(), 2000, "every job claimed once, none twice");
    assert_eq!(unique.len(), 2000);
    assert_eq!(unique, enqueued.into_iter().collect::<HashSet<_>>());
    assert!(claimed.iter().all(|(_, attempt)| *attempt == 1));
    db.drop().await;
}

#[tokio::test]
async fn claims_follow_priority_then_age() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let old_batch = queue.enqueue(job("m", JobKind::Batch, 10)).await.unwrap();
    queue.clock().advance(Duration::from_secs(1));
    let new_batch = queue.enqueue(job("m", JobKind::Batch, 10)).await.unwrap();
    queue.clock().advance(Duration::from_secs(1));
    let interactive = queue
        .enqueue(job("m", JobKind::Interactive, 0))
        .await
        .unwrap();
    queue.clock().advance(Duration::from_secs(1));
    let urgent = queue
        .enqueue(job("m", JobKind::Interactive, -5))
        .await
        .unwrap();

    let runner = Uuid::new_v4();
    let first_two = queue
        .claim(runner, &models(&["m"]), 2, LEASE)
        .await
        .unwrap();
    let rest = queue
        .claim(runner, &models(&["m"]), 10, LEASE)
        .await
        .unwrap();

    let order: Vec<Uuid> = first_two.iter().chain(&rest).map(|j| j.id).collect();
    assert_eq!(order, vec![urgent, interactive, old_batch, new_batch]);
    db.drop().await;
}

#[tokio::test]
async fn a_claim_over_several_models_takes_the_best_jobs_across_them() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let a_low = queue.enqueue(job("a", JobKind::Batch, 10)).await.unwrap();
    queue.clock().advance(Duration::from_secs(1));
    let b_high = queue
        .enqueue(job("b", JobKind::Interactive, 0))
        .await
        .unwrap();
    let a_high = queue
        .enqueue(job("a", JobKind::Interactive, 0))
        .await
        .unwrap();
    queue.clock().advance(Duration::from_secs(1));
    queue.enqueue(job("b", JobKind::Batch, 10)).await.unwrap();

    let runner = Uuid::new_v4();
    let got = queue
        .claim(runner, &models(&["a", "b"]), 3, LEASE)
        .await
        .unwrap();
    let ids: Vec<Uuid> = got.iter().map(|j| j.id).collect();
    assert_eq!(ids.len(), 3);
    assert!(ids[..2].contains(&b_high) && ids[..2].contains(&a_high));
    assert_eq!(ids[2], a_low);
    assert_eq!(
        queue.queued_total().await.unwrap(),
        1,
        "locked extras were not claimed"
    );
    db.drop().await;
}

#[tokio::test]
async fn a_claim_takes_only_its_models_up_to_its_limit() {
    let db = TestDb::new().await;
    let queue = db.queue();
    queue
        .enqueue_many(&[
            batch_job("a"),
            batch_job("a"),
            batch_job("a"),
            batch_job("b"),
        ])
        .await
        .unwrap();
    let runner = Uuid::new_v4();

    let got = queue
        .claim(runner, &models(&["a"]), 2, LEASE)
        .await
        .unwrap();
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|j| j.request.model == "a"));
    assert!(queue
        .claim(runner, &models(&["c"]), 10, LEASE)
        .await
        .unwrap()
        .is_empty());
    assert!(queue
        .claim(runner, &models(&["a"]), 0, LEASE)
        .await
        .unwrap()
        .is_empty());
    let both = queue
        .claim(runner, &models(&["a", "b"]), 10, LEASE)
        .await
        .unwrap();
    assert_eq!(both.len(), 2);
    db.drop().await;
}

#[tokio::test]
async fn a_claimed_job_is_running_with_a_lease_and_its_request_intact() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let id = queue.enqueue(interactive_job("m")).await.unwrap();
    let runner = Uuid::new_v4();

    let got = queue
        .claim(runner, &models(&["m"]), 1, LEASE)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].request, request("m"));
    assert_eq!(got[0].kind, JobKind::Interactive);
    let record = queue.get(id).await.unwrap().unwrap();
    assert_eq!(record.state, JobState::Running);
    assert_eq!(record.attempt, 1);
    assert_eq!(record.runner_id, Some(runner));
    db.drop().await;
}

#[tokio::test]
async fn renewing_leases_reports_cancellations_and_jobs_no_longer_held() {
    let db = TestDb::new().await;
    let queue = db.queue();
    queue
        .enqueue_many(&[batch_job("m"), batch_job("m")])
        .await
        .unwrap();
    let runner = Uuid::new_v4();
    let held = queue
        .claim(runner, &models(&["m"]), 2, LEASE)
        .await
        .unwrap();
    queue.request_cancel(held[0].id).await.unwrap();
    let stale = (held[1].id, held[1].attempt + 1);

    let renewal = queue
        .renew_leases_detailed(runner, &[(held[0].id, held[0].attempt), stale], LEASE)
        .await
        .unwrap();
    assert_eq!(renewal.cancel_requested, vec![held[0].id]);
    assert_eq!(renewal.lost, vec![held[1].id]);

    let other_runner = Uuid::new_v4();
    let cancels = queue
        .renew_leases(other_runner, &[(held[0].id, held[0].attempt)], LEASE)
        .await
        .unwrap();
    assert!(cancels.is_empty(), "another runner's lease is not renewed");
    db.drop().await;
}

#[tokio::test]
async fn waiting_for_work_wakes_when_a_job_is_enqueued() {
    let db = TestDb::new().await;
    let queue = db.queue();
    // Start the listener, and let it settle.
    queue.wait_for_work(Duration::from_millis(300)).await;
    queue.wait_for_work(Duration::from_millis(300)).await;

    let enqueuer = queue.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        enqueuer.enqueue(batch_job("m")).await.unwrap();
    });
    let started = std::time::Instant::now();
    queue.wait_for_work(Duration::from_secs(10)).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "woken by NOTIFY, not the timeout"
    );
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelling_while_runners_claim_never_loses_a_cancellation() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let jobs: Vec<_> = (0..400).map(|_| batch_job("m")).collect();
    let ids = queue.enqueue_many(&jobs).await.unwrap();

    let canceller = {
        let (queue, ids) = (queue.clone(), ids.clone());
        tokio::spawn(async move {
            for id in ids {
                assert!(
                    queue.request_cancel(id).await.unwrap(),
                    "cancel of a live job"
                );
            }
        })
    };
    let mut claimers = Vec::new();
    for _ in 0..4 {
        let queue = queue.clone();
        claimers.push(tokio::spawn(async move {
            let runner = Uuid::new_v4();
            while !queue
                .claim(runner, &models(&["m"]), 5, LEASE)
                .await
                .unwrap()
                .is_empty()
            {}
        }));
    }
    canceller.await.unwrap();
    for claimer in claimers {
        claimer.await.unwrap();
    }

    for id in ids {
        let job = queue.get(id).await.unwrap().unwrap();
        let flagged_running = job.state == JobState::Running && job.cancel_requested;
        assert!(
            job.state == JobState::Cancelled || flagged_running,
            "job {id} ended {:?} (cancel_requested {})",
            job.state,
            job.cancel_requested
        );
    }
    db.drop().await;
}

#[tokio::test]
async fn an_undecodable_row_fails_only_its_own_job() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let ids = queue
        .enqueue_many(&[batch_job("m"), batch_job("m"), batch_job("m")])
        .await
        .unwrap();
    let bad = ids[1];
    sqlx::query("UPDATE jobs SET request = '{\"not\": \"a request\"}' WHERE id = $1")
        .bind(bad)
        .execute(&db.pool)
        .await
        .unwrap();

    let got = queue
        .claim(Uuid::new_v4(), &models(&["m"]), 10, LEASE)
        .await
        .unwrap();

    let claimed: HashSet<Uuid> = got.iter().map(|j| j.id).collect();
    assert_eq!(claimed, HashSet::from([ids[0], ids[2]]));
    let (state, attempt, error): (String, i32, Option<String>) =
        sqlx::query_as("SELECT state, attempt, error FROM jobs WHERE id = $1")
            .bind(bad)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (state.as_str(), attempt),
        ("failed", 1),
        "failed once, not retried"
    );
    let error = error.unwrap_or_default();
    assert!(
        error.contains("could not be read") && error.contains("request"),
        "{error}"
    );
    db.drop().await;
}
