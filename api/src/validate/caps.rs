//! The size caps that keep one request from slowing the engine step every tenant shares.
//!
//! Each cap guards one field; a request over it is a 400 naming the field and the limit.
//! They are fixed rather than configured: they bound the work one request can put on a
//! shared step, not a tenant's quota. `docs/api.md` lists them in its Limits table.

use crate::error::ApiError;
use serde_json::Value;

/// Stop strings per request (OpenAI takes 4, vLLM any number).
pub const MAX_STOP_SEQUENCES: usize = 16;
/// Bytes of one stop string.
pub const MAX_STOP_BYTES: usize = 512;
/// Bytes of all stop strings together.
pub const MAX_STOP_TOTAL_BYTES: usize = 4096;
/// `stop_regex` patterns per request (as for `stop` strings).
pub const MAX_STOP_REGEXES: usize = 16;
/// Bytes of one `stop_regex` pattern.
pub const MAX_STOP_REGEX_BYTES: usize = 512;
/// Bytes of a constraint: `response_format` (as compact JSON), `regex` or `ebnf`.
pub const MAX_CONSTRAINT_BYTES: usize = 256 << 10;
/// `stop_token_ids` entries.
pub const MAX_STOP_TOKEN_IDS: usize = 256;
/// `logit_bias` entries (OpenAI's limit).
pub const MAX_LOGIT_BIAS: usize = 300;
/// Bytes of prompt text: all messages' text together for chat and `/tokenize`, all
/// prompts together for `/v1/completions`. Half the default body limit (8 MiB), so JSON
/// escaping never makes a body that fits refuse a prompt that fits.
pub const MAX_PROMPT_BYTES: usize = 4 << 20;
/// Token ids of all prompts given as ids together (`/v1/completions`, `/tokenize`,
/// `/detokenize`): more than any model's context.
pub const MAX_PROMPT_TOKEN_IDS: usize = 1 << 20;
/// Tools (or legacy functions) per request (OpenAI's limit).
pub const MAX_TOOLS: usize = 128;
/// Bytes of one tool definition, as compact JSON.
pub const MAX_TOOL_BYTES: usize = 64 << 10;
/// Bytes of all tool definitions together, as compact JSON.
pub const MAX_TOOLS_TOTAL_BYTES: usize = 256 << 10;

/// A 400 for a field over a byte cap.
pub(super) fn too_many_bytes(param: &str, what: &str, bytes: usize, limit: usize) -> ApiError {
    ApiError::invalid(
        param,
        format!("`{param}` {what} {bytes} bytes; at most {limit} are allowed."),
    )
}

/// A 400 for a list over a count cap.
pub(super) fn too_many(param: &str, things: &str, count: usize, limit: usize) -> ApiError {
    ApiError::invalid(
        param,
        format!("`{param}` has {count} {things}; at most {limit} are allowed."),
    )
}

/// The length of `value` written as compact JSON, counted without building the string.
pub(super) fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a `Value` to a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}
