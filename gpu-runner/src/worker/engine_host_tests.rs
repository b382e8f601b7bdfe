//! The engine thread steps on while a new request is prepared beside it: a huge prompt, or a
//! constrained request waiting for the grammar vocabulary, pauses no other sequence. With
//! SmolLM2 and Gemma 3 (`scripts/fetch-models.sh --gemma`); no timing bound, only the order
//! of events.

use super::*;
use fallow_engine::runtime::{self, LoadOptions};
use fallow_protocol::job::{ChatMessage, Constraint, Role, Sampling};
use std::path::PathBuf;

const STREAM: u64 = 1;
const NEWCOMER: u64 = 2;

const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Its 262k-token vocabulary takes seconds to build for the grammar compiler.
const GEMMA: &str = "gemma-3-270m-Q4_K_M.gguf";

fn load(file: &str) -> Option<fallow_engine::runtime::LoadedModel> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models")
        .join(file);
    if !path.exists() {
        fallow_protocol::testing::skip_for_want_of(&format!(
            "{} (scripts/fetch-models.sh --gemma)",
            path.display()
        ));
        return None;
    }
    let options = LoadOptions {
        max_num_seqs: 4,
        ..LoadOptions::default()
    };
    Some(runtime::load(&path, &options).expect("the model loads"))
}

fn chat(text: String, sampling: Sampling) -> Box<GenerateRequest> {
    Box::new(GenerateRequest::chat(
        "m",
        vec![ChatMessage::text(Role::User, text)],
        sampling,
    ))
}

/// Starts a long stream, sends `newcomer` once the stream has produced tokens, and returns
/// how many tokens the stream produced before the newcomer was admitted or refused.
async fn tokens_while_preparing(model: &str, newcomer: Box<GenerateRequest>) -> Option<usize> {
    let model = load(model)?;
    let (host, mut events) =
        EngineHost::spawn(model.engine, model.frontend, "m", HostOptions::default())
            .expect("the engine starts");
    let long = Sampling {
        max_tokens: Some(400),
        ignore_eos: true,
        ..Sampling::default()
    };
    assert!(host.send(HostCommand::Add {
        id: STREAM,
        request: chat("Count from one to a thousand.".into(), long),
    }));
    // The stream is under way.
    loop {
        match events.recv().await.expect("events") {
            HostEvent::Step(outputs) if outputs.iter().any(|o| o.request_id == STREAM) => break,
            HostEvent::Rejected { message, .. } => panic!("refused: {message}"),
            _ => {}
        }
    }
    assert!(host.send(HostCommand::Add {
        id: NEWCOMER,
        request: newcomer,
    }));
    let mut meanwhile = 0;
    loop {
        match events.recv().await.expect("events") {
            HostEvent::Step(outputs) => {
                meanwhile += outputs
                    .iter()
                    .filter(|o| o.request_id == STREAM)
                    .map(|o| o.token_ids.len())
                    .sum::<usize>();
            }
            HostEvent::Admitted { id: NEWCOMER, .. } | HostEvent::Rejected { id: NEWCOMER, .. } => {
                return Some(meanwhile)
            }
            HostEvent::Failed { message } => panic!("the engine failed: {message}"),
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_steps_on_while_an_8_mb_prompt_is_tokenized() {
    let huge = "lorem ipsum dolor sit amet ".repeat(8 << 20 >> 5);
    let Some(meanwhile) = tokens_while_preparing(SMOLLM2, chat(huge, Sampling::default())).await
    else {
        return;
    };
    assert!(
        meanwhile >= 5,
        "the stream made {meanwhile} tokens while the prompt was prepared"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_steps_on_while_a_constrained_request_waits_for_the_grammar_vocabulary() {
    // The stream's admission started the vocabulary build; the newcomer is the first to
    // need it, with a schema never compiled before.
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    });
    let constrained = Sampling {
        max_tokens: Some(16),
        constraint: Some(Constraint::JsonSchema {
            schema,
            strict: true,
        }),
        ..Sampling::default()
    };
    let Some(meanwhile) =
        tokens_while_preparing(GEMMA, chat("Plan a trip.".into(), constrained)).await
    else {
        return;
    };
    assert!(
        meanwhile >= 5,
        "the stream made {meanwhile} tokens while the grammar was prepared"
    );
}

/// A request whose preparation outlasts the budget is refused with `preparation_timeout`,
/// and spare threads prepare the requests behind it meanwhile: two 16 MB prompts (seconds each) take both
/// regular threads, and a small request is admitted while they are still being tokenized.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_outlasting_its_preparation_budget_is_refused_and_blocks_no_other() {
    const HUGE: [u64; 2] = [10, 11];
    const SMALL: u64 = 12;
    let Some(model) = load(SMOLLM2) else {
        return;
    };
    let options = HostOptions {
        prepare_timeout: std::time::Duration::from_secs(2),
        ..HostOptions::default()
    };
    let (host, mut events) =
        EngineHost::spawn(model.engine, model.frontend, "m", options).expect("the engine starts");
    // Far longer to tokenize than the budget, which is far longer than a small request takes.
    let huge = "lorem ipsum dolor sit amet ".repeat(16 << 20 >> 5);
    for id in HUGE {
        assert!(host.send(HostCommand::Add {
            id,
            request: chat(huge.clone(), Sampling::default()),
        }));
    }
    let mut refused = Vec::new();
    while refused.len() < HUGE.len() {
        match events.recv().await.expect("events") {
            HostEvent::Rejected { id, code, message } => {
                assert_eq!(code, "preparation_timeout", "{message}");
                refused.push(id);
            }
            other => panic!("expected the refusals first, got {other:?}"),
        }
    }
    refused.sort_unstable();
    assert_eq!(refused, HUGE);
    assert!(host.send(HostCommand::Add {
        id: SMALL,
        request: chat("Hello".into(), Sampling::default()),
    }));
    loop {
        match events.recv().await.expect("events") {
            HostEvent::Admitted { id: SMALL, .. } => break,
            HostEvent::Step(_) => {}
            other => panic!("expected the small request's admission, got {other:?}"),
        }
    }
    assert!(
        host.preparing() >= HUGE.len(),
        "the huge prompts were still being tokenized when the small request was admitted"
    );
    // Once the huge prompts are tokenized, their late results are dropped.
    while host.preparing() > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    while let Ok(event) = events.try_recv() {
        if let HostEvent::Admitted { id, .. } | HostEvent::Rejected { id, .. } = &event {
            assert_eq!(*id, SMALL, "a refused request came back: {event:?}");
        }
    }
}
