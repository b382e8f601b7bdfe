//! Hostile batch input files, generated: lines of mutated bodies for each batch endpoint,
//! mangled bytes (invalid UTF-8, cut JSON), repeated `custom_id`s and over-long lines, read
//! by the scheduler's line reader with the api's codec. Every line must come back as a
//! request or as an error naming its line, in order, with no panic.

use super::batches::{ChatBatchCodec, CHAT_ENDPOINT, COMPLETIONS_ENDPOINT, RESPONSES_ENDPOINT};
use crate::hostile_input::{chat_seed, completion_seed, mangle_bytes, mutate, response_seed, Rng};
use fallow_scheduler::batch::lines::LineReader;
use serde_json::{json, Value};

const LINES: u64 = 1500;
const MAX_LINE_BYTES: usize = 16 << 10;

/// One input line: a mutated request line, or its bytes mangled.
fn hostile_line(rng: &mut Rng, case: u64, endpoint: &str, seed: &Value) -> Vec<u8> {
    let custom_id = format!("c{}", rng.below(LINES as usize)); // repeats on purpose
    let line = json!({"custom_id": custom_id, "method": "POST", "url": endpoint,
                      "body": seed});
    let mut bytes = match case % 3 {
        0 => mutate(rng, &line).to_string().into_bytes(),
        1 => mangle_bytes(rng, line.to_string().as_bytes()),
        _ => {
            let mut valid = line.clone();
            valid["body"] = mutate(rng, seed);
            valid.to_string().into_bytes()
        }
    };
    // A newline inside a line would split it: the reader sees two.
    bytes.retain(|&b| b != b'\n');
    bytes
}

async fn read_all(endpoint: &str, seed: Value, salt: u64) {
    let mut rng = Rng(0x243f_6a88_85a3_08d3 ^ salt);
    let mut input = Vec::new();
    for case in 0..LINES {
        input.extend(hostile_line(&mut rng, case, endpoint, &seed));
        input.push(b'\n');
    }
    let codec = ChatBatchCodec::new(&crate::ApiConfig::default());
    let mut reader = LineReader::new(&input[..], endpoint, &codec, MAX_LINE_BYTES);
    let (mut valid, mut refused, mut last_line) = (0, 0, 0);
    while let Some(next) = reader.next().await.expect("reading from memory") {
        let line = match next {
            Ok(ok) => {
                valid += 1;
                ok.line
            }
            Err(error) => {
                refused += 1;
                assert!(!error.message.is_empty(), "an error without a message");
                error.line.expect("every line error names its line")
            }
        };
        assert!(
            line > last_line && line <= LINES,
            "line {line} after {last_line}"
        );
        last_line = line;
    }
    assert!(valid > 0 && refused > 0, "{valid} valid, {refused} refused");
}

#[tokio::test]
async fn hostile_chat_batch_lines_are_each_accepted_or_refused_with_their_line() {
    read_all(CHAT_ENDPOINT, chat_seed(), 1).await;
}

#[tokio::test]
async fn hostile_completions_batch_lines_are_each_accepted_or_refused_with_their_line() {
    read_all(COMPLETIONS_ENDPOINT, completion_seed(), 2).await;
}

#[tokio::test]
async fn hostile_responses_batch_lines_are_each_accepted_or_refused_with_their_line() {
    read_all(RESPONSES_ENDPOINT, response_seed(), 3).await;
}
