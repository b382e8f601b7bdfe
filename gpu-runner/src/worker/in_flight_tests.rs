//! A held job's bookkeeping: the checkpoint it gives the heartbeat, and the tokens it counts
//! as generated again.

use super::*;
use fallow_protocol::job::{ChatMessage, GenerateRequest, Role, Sampling};

fn request(stream: bool, progress: Option<Progress>) -> GenerateRequest {
    GenerateRequest {
        stream,
        progress,
        ..GenerateRequest::chat(
            "m",
            vec![ChatMessage::text(Role::User, "Say hello.")],
            Sampling::default(),
        )
    }
}

fn held(kind: JobKind, stream: bool, progress: Option<Progress>, before: u32) -> InFlight {
    let job = ClaimedJob {
        id: Uuid::new_v4(),
        attempt: 2,
        kind,
        request: request(stream, progress),
        created_at: chrono::Utc::now(),
        generated_before: before,
    };
    let mut job = InFlight::new(&job, None);
    job.admitted(vec![1, 2, 3]);
    job
}

fn tokens(ids: &[u32]) -> SeqOutput {
    SeqOutput {
        request_id: 1,
        index: 0,
        text: "x".repeat(ids.len()),
        token_ids: ids.to_vec(),
        logprobs: None,
        finish: None,
        matched_stop: None,
        usage: Usage::default(),
        hidden_states: None,
        routed_experts: None,
    }
}

fn progress(ids: &[u32]) -> Progress {
    Progress {
        choices: vec![ChoiceProgress {
            token_ids: ids.to_vec(),
            text: "x".repeat(ids.len()),
            ..ChoiceProgress::default()
        }],
        ..Progress::default()
    }
}

#[test]
fn a_checkpoint_carries_new_progress_once_and_never_the_prompt() {
    let mut job = held(JobKind::Batch, false, None, 0);
    let first = job.checkpoint();
    assert!(first.progress.is_none(), "nothing generated yet");
    job.absorb(tokens(&[10, 11]));
    let second = job.checkpoint();
    let progress = second.progress.expect("new tokens are checkpointed");
    assert_eq!(progress.choices[0].token_ids, [10, 11]);
    assert!(progress.prompt_ids.is_empty());
    assert_eq!(second.generated, 2);
    let third = job.checkpoint();
    assert!(third.progress.is_none(), "nothing new since");
    assert_eq!(third.generated, 2);
}

#[test]
fn a_stream_its_client_reads_reports_its_count_but_no_checkpoint() {
    let mut job = held(JobKind::Interactive, true, None, 0);
    job.absorb(tokens(&[10, 11, 12]));
    let checkpoint = job.checkpoint();
    assert!(checkpoint.progress.is_none());
    assert_eq!(checkpoint.generated, 3);
}

#[test]
fn tokens_an_earlier_attempt_generated_beyond_its_progress_count_as_generated_again() {
    // The earlier attempt got to 5 tokens; its progress kept 2 of them.
    let mut job = held(JobKind::Batch, false, Some(progress(&[10, 11])), 5);
    assert_eq!(job.generated_again(1), 1, "token 3 was generated before");
    assert_eq!(
        job.generated_again(3),
        2,
        "tokens 4 and 5 were, token 6 is new"
    );
    assert_eq!(job.generated_again(4), 0);
}

#[test]
fn a_graceful_continuation_generates_nothing_again() {
    let mut job = held(JobKind::Batch, false, Some(progress(&[10, 11, 12])), 3);
    assert_eq!(job.generated_again(10), 0);
}

#[test]
fn a_restart_from_zero_counts_everything_up_to_what_was_generated() {
    let mut job = held(JobKind::Batch, false, None, 4);
    assert_eq!(job.generated_again(3), 3);
    assert_eq!(job.generated_again(3), 1);
}

#[test]
fn each_delta_says_where_its_choice_stood_over_every_attempt() {
    let mut job = held(JobKind::Batch, false, Some(progress(&[10, 11])), 2);
    let at = |event: JobEvent| match event {
        JobEvent::Delta { at, .. } => at,
        _ => None,
    };
    let first = at(job.absorb(tokens(&[12])));
    assert_eq!(
        first,
        Some(ChoicePosition {
            tokens: 2,
            bytes: 2
        }),
        "after the progress"
    );
    let second = at(job.absorb(tokens(&[13, 14])));
    assert_eq!(
        second,
        Some(ChoicePosition {
            tokens: 3,
            bytes: 3
        })
    );
}
