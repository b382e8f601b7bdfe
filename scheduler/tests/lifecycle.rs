//! How jobs end or come back: fenced completion, cancellation at every state, retries with
//! backoff, the lease reaper, hand-backs and pruning. Time moves only by the fixed clock.

mod common;

use common::*;
use fallow_protocol::job::{ChoiceProgress, Progress, Usage};
use fallow_scheduler::queue::{ClaimedJob, FailOutcome, JobState, Queue};
use std::time::Duration;
use uuid::Uuid;

const LEASE: Duration = Duration::from_secs(30);

async fn claim_one(queue: &Queue, runner: Uuid) -> ClaimedJob {
    let mut got = queue
        .claim(runner, &models(&["m"]), 1, LEASE)
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "one job claimable");
    got.remove(0)
}

async fn state_of(queue: &Queue, id: Uuid) -> JobState {
    queue.get(id).await.unwrap().unwrap().state
}

#[tokio::test]
async fn a_completed_job_stores_its_result() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let id = queue.enqueue(batch_job("m")).await.unwrap();
    let job = claim_one(&queue, Uuid::new_v4()).await;

    assert!(queue
        .complete(id, job.attempt, &completion("hi"))
        .await
        .unwrap());
    let record = queue.get(id).await.unwrap().unwrap();
    assert_eq!(record.state, JobState::Succeeded);
    assert_eq!(record.result, Some(completion("hi")));
    assert!(record.finished_at.is_some());
    assert!(!queue
        .complete(id, job.attempt, &completion("again"))
        .await
        .unwrap());
    db.drop().await;
}

#[tokio::test]
async fn expired_leases_return_jobs_to_the_queue() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let id = queue.enqueue(batch_job("m")).await.unwrap();
    claim_one(&queue, Uuid::new_v4()).await;

    queue.clock().advance(LEASE - Duration::from_secs(1));
    assert_eq!(queue.reap_expired().await.unwrap(), 0, "lease still valid");
    queue.clock().advance(Duration::from_secs(2));
    assert_eq!(queue.reap_expired().await.unwrap(), 1);

    let record = queue.get(id).await.unwrap().unwrap();
    assert_eq!(record.state, JobState::Queued);
    assert_eq!(record.runner_id, None);
    queue.clock().advance(Duration::from_secs(2)); // past the first backoff (≤ 1 s)
    let again = claim_one(&queue, Uuid::new_v4()).await;
    assert_eq!((again.id, again.attempt), (id, 2));
    db.drop().await;
}

#[tokio::test]
async fn a_renewed_lease_is_not_reaped() {
    let db = TestDb::new().await;
    let queue = db.queue();
    queue.enqueue(batch_job("m")).await.unwrap();
    let runner = Uuid::new_v4();
    let job = claim_one(&queue, runner).await;

    queue.clock().advance(LEASE - Duration::from_secs(1));
    queue
        .renew_leases(runner, &[(job.id, job.attempt)], LEASE)
        .await
        .unwrap();
    queue.clock().advance(Duration::from_secs(2));
    assert_eq!(queue.reap_expired().await.unwrap(), 0);
    assert_eq!(state_of(&queue, job.id).await, JobState::Running);
    db.drop().await;
}

#[tokio::test]
async fn a_stale_attempts_completion_is_a_no_op() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let id = queue.enqueue(batch_job("m")).await.unwrap();
    let first = claim_one(&queue, Uuid::new_v4()).await;
    queue.clock().advance(LEASE + Duration::from_secs(1));
    queue.reap_expired().await.unwrap();
    queue.clock().advance(Duration::from_secs(2));
    let second = claim_one(&queue, Uuid::new_v4()).await;

    assert!(!queue
        .complete(id, first.attempt, &completion("late"))
        .await
        .unwrap());
    assert_eq!(
        queue.fail(id, first.attempt, "late", true).await.unwrap(),
        FailOutcome::Stale
    );
    assert!(!queue.mark_cancelled(id, first.attempt, None).await.unwrap());
    assert_eq!(state_of(&queue, id).await, JobState::Running);

    assert!(queue
        .complete(id, second.attempt, &completion("ok"))
        .await
        .unwrap());
    assert_eq!(
        queue.get(id).await.unwrap().unwrap().result,
        Some(completion("ok"))
    );
    db.drop().await;
}

#[tokio::test]
async fn cancelling_a_queued_job_cancels_it_at_once() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let id = queue.enqueue(batch_job("m")).await.unwrap();

    assert!(queue.request_cancel(id).await.unwrap());
    assert_eq!(state_of(&queue, id).await, JobState::Cancelled);
    assert!(queue
        .claim(Uuid::new_v4(), &models(&["m"]), 10, LEASE)
        .await
        .unwrap()
        .is_empty());
    db.drop().await;
}

#[tokio::test]
async fn cancelling_a_running_job_flags_it_for_its_runner() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let id = queue.enqueue(interactive_job("m")).await.unwrap();
    let runner = Uuid::new_v4();
    let job = claim_one(&queue, runner).await;

    assert!(queue.request_cancel(id).await.unwrap());
    let record = queue.get(id).await.unwrap().unwrap();
    assert_eq!(record.state, JobState::Running);
    assert!(record.cancel_requested);
    let cancels = queue
        .renew_leases(runner, &[(id, job.attempt)], LEASE)
        .await
        .unwrap();
    assert_eq!(cancels, vec![id]);

    assert!(queue
        .mark_cancelled(id, job.attempt, Some(&completion("par")))
        .await
        .unwrap());
    let record = queue.get(id).await.unwrap().unwrap();
    assert_eq!(record.state, JobState::Cancelled);
    assert_eq!(record.result, Some(completion("par")));
    db.drop().await;
}

#[tokio::test]
async fn cancelling_a_finished_or_unknown_job_changes_nothing() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let id = queue.enqueue(batch_job("m")).await.unwrap();
    let job = claim_one(&queue, Uuid::new_v4()).await;
    queue
        .complete(id, job.attempt, &completion("done"))
        .await
        .unwrap();

    assert!(!queue.request_cancel(id).await.unwrap());
    assert!(!queue.request_cancel(Uuid::new_v4()).await.unwrap());
    let record = queue.get(id).await.unwrap().unwrap();
    assert_eq!(record.state, JobState::Succeeded);
    assert!(!record.cancel_requested);
    db.drop().await;
}

#[tokio::test]
async fn a_cancel_requested_job_whose_runner_dies_ends_cancelled() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let id = queue.enqueue(batch_job("m")).await.unwrap();
    claim_one(&queue, Uuid::new_v4()).await;
    queue.request_cancel(id).await.unwrap();

    queue.clock().advance(LEASE + Duration::from_secs(1));
    assert_eq!(queue.reap_expired().await.unwrap(), 1);
    assert_eq!(state_of(&queue, id).await, JobState::Cancelled);
    db.drop().await;
}

#[tokio::test]
async fn fail_requeues_with_backoff_then_fails_after_max_attempts() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let id = queue.enqueue(batch_job("m")).await.unwrap(); // max_attempts = 3
    let runner = Uuid::new_v4();

    for attempt in 1..=2 {
        let job = claim_one(&queue, runner).await;
        assert_eq!(job.attempt, attempt);
        assert_eq!(
            queue.fail(id, attempt, "oom", true).await.unwrap(),
            FailOutcome::Requeued
        );
        assert_eq!(state_of(&queue, id).await, JobState::Queued);
        // Backoff for attempt n lies in [base·2^(n−1)/2, base·2^(n−1)]: not claimable at once.
        let backoff = Duration::from_secs(1 << (attempt - 1));
        queue
            .clock()
            .advance(backoff / 2 - Duration::from_millis(10));
        assert!(queue
            .claim(runner, &models(&["m"]), 1, LEASE)
            .await
            .unwrap()
            .is_empty());
        queue
            .clock()
            .advance(backoff / 2 + Duration::from_millis(20));
    }
    let last = claim_one(&queue, runner).await;
    assert_eq!(last.attempt, 3);
    assert_eq!(
        queue.fail(id, 3, "oom", true).await.unwrap(),
        FailOutcome::Failed
    );
    let record = queue.get(id).await.unwrap().unwrap();
    assert_eq!(record.state, JobState::Failed);
    assert_eq!(record.error.as_deref(), Some("oom"));
    db.drop().await;
}

#[tokio::test]
async fn a_non_retryable_failure_fails_at_once() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let id = queue.enqueue(batch_job("m")).await.unwrap();
    let job = claim_one(&queue, Uuid::new_v4()).await;

    let outcome = queue
        .fail(id, job.attempt, "prompt too long", false)
        .await
        .unwrap();
    assert_eq!(outcome, FailOutcome::Failed);
    assert_eq!(state_of(&queue, id).await, JobState::Failed);
    db.drop().await;
}

#[tokio::test]
async fn an_interactive_job_that_streamed_is_not_requeued_by_the_reaper() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let streamed = queue.enqueue(interactive_job("m")).await.unwrap();
    let silent = queue.enqueue(interactive_job("m")).await.unwrap();
    let runner = Uuid::new_v4();
    let jobs = queue
        .claim(runner, &models(&["m"]), 2, LEASE)
        .await
        .unwrap();
    let attempt = jobs.iter().find(|j| j.id == streamed).unwrap().attempt;
    queue.mark_streamed(streamed, attempt).await.unwrap();

    queue.clock().advance(LEASE + Duration::from_secs(1));
    assert_eq!(queue.reap_expired().await.unwrap(), 2);

    let record = queue.get(streamed).await.unwrap().unwrap();
    assert_eq!(record.state, JobState::Failed);
    assert_eq!(record.error.as_deref(), Some("runner lost mid-stream"));
    assert_eq!(state_of(&queue, silent).await, JobState::Queued);
    db.drop().await;
}

#[tokio::test]
async fn a_streamed_interactive_job_is_not_retried_after_a_failure() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let id = queue.enqueue(interactive_job("m")).await.unwrap();
    let job = claim_one(&queue, Uuid::new_v4()).await;
    queue.mark_streamed(id, job.attempt).await.unwrap();

    let outcome = queue
        .fail(id, job.attempt, "device lost", true)
        .await
        .unwrap();
    assert_eq!(outcome, FailOutcome::Failed);
    db.drop().await;
}

#[tokio::test]
async fn the_reaper_fails_jobs_out_of_attempts() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let mut one_shot = batch_job("m");
    one_shot.max_attempts = 1;
    let id = queue.enqueue(one_shot).await.unwrap();
    claim_one(&queue, Uuid::new_v4()).await;

    queue.clock().advance(LEASE + Duration::from_secs(1));
    assert_eq!(queue.reap_expired().await.unwrap(), 1);
    assert_eq!(state_of(&queue, id).await, JobState::Failed);
    db.drop().await;
}

#[tokio::test]
async fn a_released_job_is_runnable_again_without_using_an_attempt() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let mut one_shot = batch_job("m");
    one_shot.max_attempts = 1;
    let id = queue.enqueue(one_shot).await.unwrap();
    let job = claim_one(&queue, Uuid::new_v4()).await;

    assert_eq!(
        queue.release(id, job.attempt, None).await.unwrap(),
        FailOutcome::Requeued
    );
    assert_eq!(
        queue.release(id, job.attempt, None).await.unwrap(),
        FailOutcome::Stale
    );
    let again = claim_one(&queue, Uuid::new_v4()).await;
    assert_eq!(again.attempt, 2);
    let record = queue.get(id).await.unwrap().unwrap();
    assert_eq!(
        record.max_attempts, 2,
        "the hand-back did not burn the only attempt"
    );
    db.drop().await;
}

#[tokio::test]
async fn a_streamed_job_handed_back_with_its_progress_is_continued_not_failed() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let id = queue.enqueue(interactive_job("m")).await.unwrap();
    let job = claim_one(&queue, Uuid::new_v4()).await;
    queue.mark_streamed(id, job.attempt).await.unwrap();
    let progress = Progress {
        prompt_ids: vec![1, 2, 3],
        choices: vec![ChoiceProgress {
            token_ids: vec![7, 8],
            text: "Hi".into(),
            ..Default::default()
        }],
        usage: Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
            cached_tokens: 0,
        },
    };

    assert_eq!(
        queue
            .release(id, job.attempt, Some(&progress))
            .await
            .unwrap(),
        FailOutcome::Requeued
    );
    let again = claim_one(&queue, Uuid::new_v4()).await;
    assert_eq!(again.attempt, 2);
    assert_eq!(
        again.request.progress,
        Some(progress),
        "the next runner gets it"
    );
    db.drop().await;
}

#[tokio::test]
async fn a_streamed_job_that_fails_with_progress_continues_until_its_attempts_run_out() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let mut job = interactive_job("m");
    job.max_attempts = 2;
    let id = queue.enqueue(job).await.unwrap();
    let first = claim_one(&queue, Uuid::new_v4()).await;
    queue.mark_streamed(id, first.attempt).await.unwrap();
    let progress = Progress {
        prompt_ids: vec![1],
        choices: vec![ChoiceProgress {
            token_ids: vec![4],
            text: "a".into(),
            ..Default::default()
        }],
        usage: Usage::default(),
    };

    assert_eq!(
        queue
            .fail_and_continue(id, first.attempt, "engine panicked", &progress)
            .await
            .unwrap(),
        FailOutcome::Requeued
    );
    queue.clock().advance(Duration::from_secs(3600)); // past the backoff
    let second = claim_one(&queue, Uuid::new_v4()).await;
    assert_eq!(second.attempt, 2, "the failed attempt counts");
    assert_eq!(second.request.progress, Some(progress.clone()));
    assert_eq!(
        queue
            .fail_and_continue(id, second.attempt, "engine panicked", &progress)
            .await
            .unwrap(),
        FailOutcome::Failed,
        "no attempt left"
    );
    db.drop().await;
}

#[tokio::test]
async fn a_streamed_job_handed_back_without_progress_fails() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let id = queue.enqueue(interactive_job("m")).await.unwrap();
    let job = claim_one(&queue, Uuid::new_v4()).await;
    queue.mark_streamed(id, job.attempt).await.unwrap();

    assert_eq!(
        queue.release(id, job.attempt, None).await.unwrap(),
        FailOutcome::Failed
    );
    assert_eq!(state_of(&queue, id).await, JobState::Failed);
    db.drop().await;
}

#[tokio::test]
async fn pruning_removes_old_finished_jobs_only() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let runner = Uuid::new_v4();
    let old_done = queue.enqueue(batch_job("m")).await.unwrap();
    let job = claim_one(&queue, runner).await;
    queue
        .complete(old_done, job.attempt, &completion("x"))
        .await
        .unwrap();
    let old_cancelled = queue.enqueue(batch_job("m")).await.unwrap();
    queue.request_cancel(old_cancelled).await.unwrap();
    let old_queued = queue.enqueue(batch_job("q")).await.unwrap();
    let old_running = queue.enqueue(batch_job("m")).await.unwrap();
    claim_one(&queue, runner).await;

    queue.clock().advance(Duration::from_secs(3600));
    let recent_done = queue.enqueue(batch_job("m")).await.unwrap();
    let job = claim_one(&queue, runner).await;
    queue
        .complete(recent_done, job.attempt, &completion("y"))
        .await
        .unwrap();
    queue.clock().advance(Duration::from_secs(60));

    let pruned = queue
        .prune_finished(Duration::from_secs(1800))
        .await
        .unwrap();
    assert_eq!(pruned, 2);
    assert!(queue.get(old_done).await.unwrap().is_none());
    assert!(queue.get(old_cancelled).await.unwrap().is_none());
    for kept in [old_queued, old_running, recent_done] {
        assert!(queue.get(kept).await.unwrap().is_some());
    }
    db.drop().await;
}

#[tokio::test]
async fn counts_follow_tenants_and_states() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let key = fallow_scheduler::tenants::create_key(&db.pool, "acme")
        .await
        .unwrap();
    let tenant = fallow_scheduler::tenants::tenant_for_key(&db.pool, &key)
        .await
        .unwrap()
        .unwrap();
    let mut mine = batch_job("m");
    mine.tenant_id = Some(tenant.id);
    queue
        .enqueue_many(&[mine.clone(), mine, batch_job("n")])
        .await
        .unwrap();
    claim_one(&queue, Uuid::new_v4()).await;

    assert_eq!(queue.active_for_tenant(tenant.id).await.unwrap(), 2);
    assert_eq!(queue.queued_total().await.unwrap(), 2);
    assert_eq!(
        queue.queue_depths().await.unwrap(),
        vec![("m".to_string(), 1), ("n".to_string(), 1)]
    );
    db.drop().await;
}

#[tokio::test]
async fn reaping_and_pruning_handle_more_rows_than_one_batch() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let jobs: Vec<_> = (0..2500).map(|_| batch_job("m")).collect();
    queue.enqueue_many(&jobs).await.unwrap();
    let runner = Uuid::new_v4();
    let claimed = queue
        .claim(runner, &models(&["m"]), 2500, LEASE)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2500);

    queue.clock().advance(LEASE + Duration::from_secs(1));
    assert_eq!(queue.reap_expired().await.unwrap(), 2500);
    assert_eq!(queue.queued_total().await.unwrap(), 2500);

    // Finish them all at once (completing 2,500 jobs one by one would only test patience).
    sqlx::query("UPDATE jobs SET state = 'succeeded', finished_at = $1")
        .bind(queue.clock().now())
        .execute(&db.pool)
        .await
        .unwrap();
    queue.clock().advance(Duration::from_secs(10));
    assert_eq!(
        queue.prune_finished(Duration::from_secs(5)).await.unwrap(),
        2500
    );
    db.drop().await;
}
