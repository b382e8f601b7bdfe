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
        EngineHost::spawn(model.engine, model.frontend, "m", PanicHook::default())
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
