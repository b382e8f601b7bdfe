//! A job whose runner died continues from its stream: the maintenance pass rebuilds its
//! progress from the deltas' token ids and requeues it with that progress, fenced, before
//! the reaper would restart or fail it; without a stream, from its heartbeat's checkpoint.
//! Continuations are claimed ahead of new work. Real Postgres and Redis; time by the fixed
//! clock.

mod common;

use common::*;
use fallow_protocol::job::{ChoiceProgress, JobEvent, Progress, Usage};
use fallow_scheduler::queue::{Checkpoint, ClaimedJob, JobState, LeaseRenewal, Queue};
use fallow_scheduler::stream::TokenRelay;
use std::time::Duration;
use uuid::Uuid;

const LEASE: Duration = Duration::from_secs(30);

async fn relay() -> TokenRelay {
    TokenRelay::connect(&fallow_protocol::testing::test_redis_url())
        .await
        .unwrap()
}

async fn claim_one(queue: &Queue) -> ClaimedJob {
    claim_as(queue, Uuid::new_v4()).await
}

async fn claim_as(queue: &Queue, runner: Uuid) -> ClaimedJob {
    let mut got = queue
        .claim(runner, &models(&["m"]), 1, LEASE)
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "one job claimable");
    got.remove(0)
}

fn started(attempt: i32) -> JobEvent {
    JobEvent::Started {
        attempt,
        prompt_text: None,
        continues: false,
    }
}

fn delta(text: &str, token_ids: Vec<u32>) -> JobEvent {
    JobEvent::Delta {
        index: 0,
        text: text.into(),
        token_ids,
        logprobs: None,
        finish_reason: None,
        usage: Usage {
            prompt_tokens: 4,
            completion_tokens: 3,
            cached_tokens: 0,
        },
        at: None,
    }
}

/// An interactive job claimed, marked streamed, and `events` in its stream.
async fn streamed_job(queue: &Queue, relay: &TokenRelay, events: Vec<JobEvent>) -> Uuid {
    let id = queue.enqueue(interactive_job("m")).await.unwrap();
    let job = claim_one(queue).await;
    queue.mark_streamed(id, job.attempt).await.unwrap();
    let events: Vec<(Uuid, JobEvent)> = events.into_iter().map(|e| (id, e)).collect();
    relay.append(&events).await.unwrap();
    id
}

#[tokio::test]
async fn a_lost_stream_with_token_ids_is_requeued_with_its_progress() {
    let db = TestDb::new().await;
    let (queue, relay) = (db.queue(), relay().await);
    let events = vec![started(1), delta("Hel", vec![5, 6]), delta("lo", vec![7])];
    streamed_job(&queue, &relay, events).await;

    assert_eq!(
        queue.continue_lost(&relay).await.unwrap(),
        0,
        "lease still live"
    );
    queue.clock().advance(LEASE + Duration::from_secs(1));
    assert_eq!(queue.continue_lost(&relay).await.unwrap(), 1);
    assert_eq!(
        queue.reap_expired().await.unwrap(),
        0,
        "nothing left to reap"
    );

    let again = claim_one(&queue).await;
    assert_eq!(again.attempt, 2, "the lost attempt counts");
    let progress = again.request.progress.expect("progress from the stream");
    assert_eq!(progress.choices[0].token_ids, [5, 6, 7]);
    assert_eq!(progress.choices[0].text, "Hello");
    assert_eq!(progress.usage.completion_tokens, 3);
    db.drop().await;
}

#[tokio::test]
async fn a_lost_stream_without_token_ids_is_left_to_the_reaper() {
    let db = TestDb::new().await;
    let (queue, relay) = (db.queue(), relay().await);
    let events = vec![started(1), delta("Hel", Vec::new())];
    let id = streamed_job(&queue, &relay, events).await;
    queue.clock().advance(LEASE + Duration::from_secs(1));

    assert_eq!(queue.continue_lost(&relay).await.unwrap(), 0);
    assert_eq!(queue.reap_expired().await.unwrap(), 1);
    let record = queue.get(id).await.unwrap().unwrap();
    assert_eq!(
        record.state,
        JobState::Failed,
        "a started stream is not restarted"
    );
    db.drop().await;
}

#[tokio::test]
async fn a_lost_job_whose_cancellation_was_asked_for_is_not_continued() {
    let db = TestDb::new().await;
    let (queue, relay) = (db.queue(), relay().await);
    let id = queue.enqueue(batch_job("m")).await.unwrap();
    claim_one(&queue).await;
    relay
        .append(&[(id, started(1)), (id, delta("a", vec![1]))])
        .await
        .unwrap();
    assert!(queue.request_cancel(id).await.unwrap());
    queue.clock().advance(LEASE + Duration::from_secs(1));

    assert_eq!(queue.continue_lost(&relay).await.unwrap(), 0);
    assert_eq!(queue.reap_expired().await.unwrap(), 1);
    assert_eq!(
        queue.get(id).await.unwrap().unwrap().state,
        JobState::Cancelled
    );
    db.drop().await;
}

fn progress(tokens: &[u32], text: &str) -> Progress {
    Progress {
        prompt_ids: Vec::new(),
        choices: vec![ChoiceProgress {
            token_ids: tokens.to_vec(),
            text: text.into(),
            ..ChoiceProgress::default()
        }],
        usage: Usage::default(),
    }
}

/// `runner`'s heartbeat for `job`, with a checkpoint.
async fn heartbeat(
    queue: &Queue,
    runner: Uuid,
    job: &ClaimedJob,
    progress: Option<Progress>,
    generated: u32,
) -> LeaseRenewal {
    let held = [Checkpoint {
        id: job.id,
        attempt: job.attempt,
        progress,
        generated,
    }];
    queue
        .renew_with_checkpoints(runner, &held, LEASE)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_lost_batch_job_whose_stream_redis_lost_continues_from_its_heartbeat_checkpoint() {
    let db = TestDb::new().await;
    let (queue, relay) = (db.queue(), relay().await);
    let runner = Uuid::new_v4();
    queue.enqueue(batch_job("m")).await.unwrap();
    let job = claim_as(&queue, runner).await;
    let renewal = heartbeat(&queue, runner, &job, Some(progress(&[5, 6, 7], "Hello")), 3).await;
    assert!(renewal.lost.is_empty(), "the lease was renewed");
    // A heartbeat with nothing new keeps the checkpoint it has.
    heartbeat(&queue, runner, &job, None, 3).await;

    queue.clock().advance(LEASE + Duration::from_secs(1));
    assert_eq!(
        queue.continue_lost(&relay).await.unwrap(),
        1,
        "no stream, but a checkpoint"
    );
    let again = claim_one(&queue).await;
    assert_eq!(again.attempt, 2);
    let resumed = again
        .request
        .progress
        .expect("progress from the checkpoint");
    assert_eq!(resumed.choices[0].token_ids, [5, 6, 7]);
    assert_eq!(resumed.choices[0].text, "Hello");
    assert_eq!(
        again.generated_before, 3,
        "the tokens generated so far travel with the job"
    );
    db.drop().await;
}

#[tokio::test]
async fn a_stream_a_client_read_is_never_continued_from_a_checkpoint() {
    let db = TestDb::new().await;
    let (queue, relay) = (db.queue(), relay().await);
    let runner = Uuid::new_v4();
    let id = queue.enqueue(interactive_job("m")).await.unwrap();
    let job = claim_as(&queue, runner).await;
    queue.mark_streamed(id, job.attempt).await.unwrap();
    heartbeat(&queue, runner, &job, Some(progress(&[5, 6], "Hel")), 2).await;

    queue.clock().advance(LEASE + Duration::from_secs(1));
    assert_eq!(
        queue.continue_lost(&relay).await.unwrap(),
        0,
        "its client saw the lost stream"
    );
    assert_eq!(queue.reap_expired().await.unwrap(), 1);
    assert_eq!(
        queue.get(id).await.unwrap().unwrap().state,
        JobState::Failed
    );
    db.drop().await;
}

#[tokio::test]
async fn a_job_restarted_from_zero_knows_how_many_tokens_it_had_generated() {
    let db = TestDb::new().await;
    let (queue, relay) = (db.queue(), relay().await);
    let runner = Uuid::new_v4();
    queue.enqueue(batch_job("m")).await.unwrap();
    let job = claim_as(&queue, runner).await;
    heartbeat(&queue, runner, &job, None, 7).await;

    queue.clock().advance(LEASE + Duration::from_secs(1));
    assert_eq!(
        queue.continue_lost(&relay).await.unwrap(),
        0,
        "nothing to continue from"
    );
    assert_eq!(queue.reap_expired().await.unwrap(), 1);
    queue.clock().advance(Duration::from_secs(600)); // past the backoff
    let again = claim_one(&queue).await;
    assert!(again.request.progress.is_none(), "it starts over");
    assert_eq!(
        again.generated_before, 7,
        "so its next runner counts 7 tokens generated again"
    );
    db.drop().await;
}

#[tokio::test]
async fn a_continuation_is_claimed_ahead_of_older_new_work_of_the_same_priority() {
    let db = TestDb::new().await;
    let queue = db.queue();
    let older = queue.enqueue(batch_job("m")).await.unwrap();
    queue.clock().advance(Duration::from_secs(1));
    let handed_back = queue.enqueue(batch_job("m")).await.unwrap();
    let runner = Uuid::new_v4();
    let both = queue
        .claim(runner, &models(&["m"]), 2, LEASE)
        .await
        .unwrap();
    assert_eq!(both.len(), 2);
    // The older job fails and waits out its backoff; the newer one is handed back mid-run.
    queue.fail(older, 1, "engine hiccup", true).await.unwrap();
    let progress = progress(&[1, 2], "ab");
    queue
        .release(handed_back, 1, Some(&progress))
        .await
        .unwrap();
    queue.clock().advance(Duration::from_secs(600));

    let next = claim_one(&queue).await;
    assert_eq!(next.id, handed_back, "the continuation goes first");
    assert_eq!(claim_one(&queue).await.id, older);
    db.drop().await;
}
