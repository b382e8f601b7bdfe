//! A job whose runner died continues from its stream: the maintenance pass rebuilds its
//! progress from the deltas' token ids and requeues it with that progress, fenced, before
//! the reaper would restart or fail it. Real Postgres and Redis; time by the fixed clock.

mod common;

use common::*;
use fallow_protocol::job::{JobEvent, Usage};
use fallow_scheduler::queue::{ClaimedJob, JobState, Queue};
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
    let mut got = queue
        .claim(Uuid::new_v4(), &models(&["m"]), 1, LEASE)
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
