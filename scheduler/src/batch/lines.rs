//! Reading a batch input file line by line and checking each line: UTF-8, a JSON object,
//! a unique non-empty `custom_id`, `method` `POST`, `url` equal to the batch's endpoint,
//! and a `body` the api accepts. Every problem names its 1-based line. The reader holds one
//! line at a time (bounded by `max_line_bytes`) plus the set of `custom_id`s seen. Checking
//! a line runs off the async runtime's workers.

use super::{BatchCodec, LineError, LineRequest};
use crate::runners::ModelEntry;
use serde_json::Value;
use std::collections::HashSet;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// A line that passed every check.
#[derive(Debug, Clone)]
pub struct ValidLine {
    pub line: u64,
    /// The line's length in the file, in bytes: what it weighs when jobs are inserted.
    pub bytes: usize,
    pub custom_id: String,
    pub request: LineRequest,
}

/// Walks the lines of one input file. Blank lines are skipped (a trailing newline is not a
/// request) but still counted, so line numbers match an editor's.
pub struct LineReader<'a, R> {
    reader: R,
    endpoint: &'a str,
    codec: &'a dyn BatchCodec,
    /// The live models, for the codec to read each line as its model writes.
    models: &'a [ModelEntry],
    max_line_bytes: usize,
    line: u64,
    seen: HashSet<String>,
    buf: Vec<u8>,
}

impl<'a, R: AsyncBufRead + Unpin> LineReader<'a, R> {
    pub fn new(
        reader: R,
        endpoint: &'a str,
        codec: &'a dyn BatchCodec,
        max_line_bytes: usize,
    ) -> Self {
        LineReader {
            reader,
            endpoint,
            codec,
            models: &[],
            max_line_bytes,
            line: 0,
            seen: HashSet::new(),
            buf: Vec::new(),
        }
    }

    /// The live models the lines' requests are validated against (their output syntax).
    pub fn with_models(mut self, models: &'a [ModelEntry]) -> Self {
        self.models = models;
        self
    }

    /// The next non-blank line, checked; `None` at the end of the file.
    pub async fn next(&mut self) -> std::io::Result<Option<Result<ValidLine, LineError>>> {
        loop {
            let Some(oversize) = self.read_line().await? else {
                return Ok(None);
            };
            self.line += 1;
            if oversize {
                return Ok(Some(Err(self.error(
                    "line_too_long",
                    None,
                    format!("The line is longer than {} bytes.", self.max_line_bytes),
                ))));
            }
            if self.buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return Ok(Some(off_the_runtime(|| self.check())));
        }
    }

    /// Reads one line into `buf` (without its newline), keeping at most `max_line_bytes`.
    /// Returns `None` at the end of the input, `Some(true)` if the line was too long.
    async fn read_line(&mut self) -> std::io::Result<Option<bool>> {
        self.buf.clear();
        let mut oversize = false;
        let mut any = false;
        loop {
            let chunk = self.reader.fill_buf().await?;
            if chunk.is_empty() {
                return Ok(any.then_some(oversize));
            }
            any = true;
            let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (i, true),
                None => (chunk.len(), false),
            };
            if self.buf.len() + take > self.max_line_bytes {
                oversize = true;
            } else {
                self.buf.extend_from_slice(&chunk[..take]);
            }
            self.reader.consume(if done { take + 1 } else { take });
            if done {
                if self.buf.last() == Some(&b'\r') {
                    self.buf.pop();
                }
                return Ok(Some(oversize));
            }
        }
    }

    fn check(&mut self) -> Result<ValidLine, LineError> {
        let text = std::str::from_utf8(&self.buf).map_err(|e| {
            self.error(
                "invalid_encoding",
                None,
                format!("The line is not valid UTF-8: {e}."),
            )
        })?;
        let value: Value = serde_json::from_str(text).map_err(|e| {
            self.error(
                "invalid_json_line",
                None,
                format!("The line is not valid JSON: {e}."),
            )
        })?;
        let Value::Object(mut object) = value else {
            return Err(self.error(
                "invalid_json_line",
                None,
                "The line must be a JSON object.".into(),
            ));
        };
        let custom_id = match object.remove("custom_id") {
            Some(Value::String(id)) if !id.is_empty() => id,
            _ => {
                return Err(self.error(
                    "missing_required_parameter",
                    Some("custom_id"),
                    "`custom_id` must be a non-empty string.".into(),
                ))
            }
        };
        match object.get("method").and_then(Value::as_str) {
            Some(m) if m.eq_ignore_ascii_case("POST") => {}
            _ => {
                return Err(self.error(
                    "invalid_method",
                    Some("method"),
                    "`method` must be `POST`.".into(),
                ))
            }
        }
        let url = object.get("url").and_then(Value::as_str).unwrap_or("");
        if url != self.endpoint {
            return Err(self.error(
                "mismatched_url",
                Some("url"),
                format!(
                    "`url` is `{url}` but the batch's endpoint is `{}`.",
                    self.endpoint
                ),
            ));
        }
        let Some(body) = object.remove("body").filter(Value::is_object) else {
            return Err(self.error(
                "missing_required_parameter",
                Some("body"),
                "`body` must be a JSON object.".into(),
            ));
        };
        let request = self
            .codec
            .parse_body(self.endpoint, body, self.models)
            .map_err(|(param, message)| {
                let param = param.map(|p| format!("body.{p}"));
                self.error("invalid_request", param.as_deref(), message)
            })?;
        if !self.seen.insert(custom_id.clone()) {
            return Err(self.error(
                "duplicate_custom_id",
                Some("custom_id"),
                format!("`custom_id` `{custom_id}` appears more than once."),
            ));
        }
        Ok(ValidLine {
            line: self.line,
            bytes: self.buf.len(),
            custom_id,
            request,
        })
    }

    fn error(&self, code: &str, param: Option<&str>, message: String) -> LineError {
        LineError {
            code: code.to_owned(),
            message: format!("Line {}: {message}", self.line),
            param: param.map(str::to_owned),
            line: Some(self.line),
        }
    }
}

/// Runs `check` where a slow line (a 4 MiB body to parse, a json_schema to compile) does not
/// hold up the runtime's other tasks: the maintenance loops, and in `fallow dev` the api.
/// A current-thread runtime (the tests') has no other thread to hand its tasks to.
fn off_the_runtime<T>(check: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(check),
        _ => check(),
    }
}
