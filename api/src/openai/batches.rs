//! OpenAI's batch objects and `POST /v1/batches` body, and the [`ChatBatchCodec`] that lets
//! the scheduler validate batch lines and build their responses with exactly the code the
//! synchronous `/v1/chat/completions` endpoint uses.

use crate::error::ApiError;
use crate::openai::completions::{text_completion_id, CompletionRequest, TextCompletion};
use crate::openai::embeddings::{EmbeddingList, EmbeddingRequest};
use crate::openai::request::ChatCompletionRequest;
use crate::openai::response::ChatCompletion;
use crate::openai::responses::CreateResponseRequest;
use crate::validate::responses::validate_response;
use crate::validate::{
    embedding_model, resolve, resolve_unseen, validate_chat, validate_completion,
    validate_embeddings, Limits, ModelParsers, BATCH_PRIORITY_BASE,
};
use fallow_protocol::job::{Completion, GenerateRequest, OutputFormat};
use fallow_scheduler::batch::{batch_id, file_id, BatchCodec, BatchRecord, LineError, LineRequest};
use fallow_scheduler::runners::{ModelEntry, ModelKind};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The endpoints batches may target.
pub const CHAT_ENDPOINT: &str = "/v1/chat/completions";
pub const COMPLETIONS_ENDPOINT: &str = "/v1/completions";
pub const RESPONSES_ENDPOINT: &str = "/v1/responses";
pub const EMBEDDINGS_ENDPOINT: &str = "/v1/embeddings";
pub const BATCH_ENDPOINTS: [&str; 4] = [
    CHAT_ENDPOINT,
    COMPLETIONS_ENDPOINT,
    RESPONSES_ENDPOINT,
    EMBEDDINGS_ENDPOINT,
];

#[derive(Debug, Deserialize)]
pub struct CreateBatchRequest {
    pub input_file_id: Option<String>,
    pub endpoint: Option<String>,
    pub completion_window: Option<String>,
    #[serde(default)]
    pub metadata: Option<serde_json::Value>,
}

#[derive(Debug, Serialize)]
pub struct BatchObject {
    pub id: String,
    pub object: &'static str,
    pub endpoint: String,
    pub errors: Option<BatchErrors>,
    pub input_file_id: String,
    pub completion_window: String,
    pub status: &'static str,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    pub created_at: i64,
    pub in_progress_at: Option<i64>,
    pub expires_at: Option<i64>,
    pub finalizing_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub failed_at: Option<i64>,
    pub expired_at: Option<i64>,
    pub cancelling_at: Option<i64>,
    pub cancelled_at: Option<i64>,
    pub request_counts: RequestCountsOut,
    pub metadata: Option<serde_json::Value>,
}

#[derive(Debug, Serialize)]
pub struct BatchErrors {
    pub object: &'static str,
    pub data: Vec<LineError>,
}

#[derive(Debug, Serialize)]
pub struct RequestCountsOut {
    pub total: i64,
    pub completed: i64,
    pub failed: i64,
}

impl From<&BatchRecord> for BatchObject {
    fn from(b: &BatchRecord) -> Self {
        let ts = |t: Option<chrono::DateTime<chrono::Utc>>| t.map(|t| t.timestamp());
        BatchObject {
            id: batch_id(b.id),
            object: "batch",
            endpoint: b.endpoint.clone(),
            errors: (!b.errors.is_empty()).then(|| BatchErrors {
                object: "list",
                data: b.errors.clone(),
            }),
            input_file_id: file_id(b.input_file_id),
            completion_window: b.completion_window.clone(),
            status: b.status.as_str(),
            output_file_id: b.output_file_id.map(file_id),
            error_file_id: b.error_file_id.map(file_id),
            created_at: b.created_at.timestamp(),
            in_progress_at: ts(b.in_progress_at),
            expires_at: Some(b.expires_at.timestamp()),
            finalizing_at: ts(b.finalizing_at),
            completed_at: ts(b.completed_at),
            failed_at: ts(b.failed_at),
            expired_at: ts(b.expired_at),
            cancelling_at: ts(b.cancelling_at),
            cancelled_at: ts(b.cancelled_at),
            request_counts: RequestCountsOut {
                total: b.counts.total,
                completed: b.counts.completed,
                failed: b.counts.failed,
            },
            metadata: b.metadata.clone(),
        }
    }
}

/// Batch lines through the sync endpoint's validation and response building.
pub struct ChatBatchCodec {
    limits: Limits,
}

impl ChatBatchCodec {
    pub fn new(config: &crate::ApiConfig) -> Self {
        ChatBatchCodec {
            limits: Limits {
                max_messages: config.max_messages,
                max_n: config.max_n,
                // The engine refuses a prompt that does not fit its model; that request then
                // ends in the error file like any other failure.
                context_length: u32::MAX,
                // Set per line from the line's model (`parse_body`).
                parsers: Default::default(),
            },
        }
    }
}

impl ChatBatchCodec {
    /// A `/v1/completions` line: one prompt (one job per line), through the synchronous
    /// endpoint's validation.
    fn parse_completion(
        &self,
        body: serde_json::Value,
    ) -> Result<LineRequest, (Option<String>, String)> {
        let wire: CompletionRequest = deserialize_line(body)?;
        if wire.echo == Some(true) {
            return Err((
                Some("echo".into()),
                "`echo` is not supported in batch lines.".into(),
            ));
        }
        let valid = validate_completion(wire, &self.limits).map_err(envelope)?;
        let [request]: [_; 1] = valid.jobs().collect::<Vec<_>>().try_into().map_err(|_| {
            (
                Some("prompt".to_owned()),
                "A batch line takes one prompt; put each prompt on its own line.".to_owned(),
            )
        })?;
        Ok(LineRequest {
            request: GenerateRequest {
                stream: false,
                ..request
            },
            priority: BATCH_PRIORITY_BASE + valid.priority,
        })
    }
}

/// A `/v1/embeddings` line, checked against its model's entry. A model no runner serves
/// now is taken for an embedding model of unknown length, so only `dimensions` must wait.
fn parse_embedding(
    body: serde_json::Value,
    models: &[ModelEntry],
) -> Result<LineRequest, (Option<String>, String)> {
    let wire: EmbeddingRequest = deserialize_line(body)?;
    let model = embedding_model(&wire).map_err(envelope)?;
    let entry = models
        .iter()
        .find(|m| m.id == model)
        .cloned()
        .unwrap_or_else(|| ModelEntry {
            id: model,
            context_length: 0,
            owned_by: String::new(),
            created: 0,
            tool_parser: None,
            reasoning_parser: None,
            kind: ModelKind::Embedding,
            dimensions: None,
            matryoshka_dimensions: Vec::new(),
            parent: None,
            lora_dir: false,
            lora_path: None,
        });
    let request = validate_embeddings(wire, &entry).map_err(envelope)?;
    Ok(LineRequest {
        request,
        priority: BATCH_PRIORITY_BASE,
    })
}

impl ChatBatchCodec {
    /// A `/v1/responses` line: one response, through the synchronous endpoint's validation.
    /// Nothing of a batch is stored, so a line can neither continue a stored response nor
    /// run in the background.
    fn parse_response(
        &self,
        body: serde_json::Value,
        limits: &Limits,
    ) -> Result<LineRequest, (Option<String>, String)> {
        let mut wire: CreateResponseRequest = deserialize_line(body)?;
        for (field, set) in [
            ("previous_response_id", wire.previous_response_id.is_some()),
            ("background", wire.background == Some(true)),
        ] {
            if set {
                return Err((
                    Some(field.to_owned()),
                    format!("`{field}` is not supported in batch lines."),
                ));
            }
        }
        wire.store = Some(false);
        let created = chrono::Utc::now().timestamp();
        let valid = validate_response(wire, Vec::new(), limits, created).map_err(envelope)?;
        let mut request = valid.chat.request;
        request.stream = false;
        Ok(LineRequest {
            request,
            priority: BATCH_PRIORITY_BASE + valid.chat.priority,
        })
    }
}

fn deserialize_line<T: serde::de::DeserializeOwned>(
    body: serde_json::Value,
) -> Result<T, (Option<String>, String)> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        (
            Some(path.clone()),
            format!("Invalid value for `{path}`: {}", e.into_inner()),
        )
    })
}

/// An api error as a line error: `(param, message)`.
fn envelope(error: ApiError) -> (Option<String>, String) {
    let (_, envelope) = error.status_and_body();
    (envelope.error.param, envelope.error.message)
}

impl BatchCodec for ChatBatchCodec {
    fn parse_body(
        &self,
        endpoint: &str,
        body: serde_json::Value,
        models: &[ModelEntry],
    ) -> Result<LineRequest, (Option<String>, String)> {
        if endpoint == EMBEDDINGS_ENDPOINT {
            return parse_embedding(body, models);
        }
        if ![CHAT_ENDPOINT, RESPONSES_ENDPOINT, COMPLETIONS_ENDPOINT].contains(&endpoint) {
            return Err((None, format!("The endpoint `{endpoint}` is not supported.")));
        }
        // The line's model, as its runner published it: tool calls and reasoning are read in
        // its syntax, exactly as for a synchronous request. An adapter's line runs over its
        // base, in the adapter's queue.
        let model = body
            .get("model")
            .and_then(serde_json::Value::as_str)
            .map(str::trim)
            .unwrap_or_default();
        let lora_path = body.get("lora_path");
        let (limits, served) = match resolve(models, model, lora_path) {
            Ok((entry, served)) => {
                let limits = Limits {
                    parsers: ModelParsers {
                        tool: entry.tool_parser.clone(),
                        reasoning: entry.reasoning_parser.clone(),
                    },
                    ..self.limits.clone()
                };
                (limits, served)
            }
            // No runner up, or a model none serves: the expansion decides (it waits for
            // runners, or fails the line as `model_not_found`).
            Err(ApiError::ModelNotFound(_)) => (
                self.limits.clone(),
                resolve_unseen(model, lora_path).map_err(envelope)?,
            ),
            Err(err) => return Err(envelope(err)),
        };
        let mut line = if endpoint == COMPLETIONS_ENDPOINT {
            self.parse_completion(body)?
        } else if endpoint == RESPONSES_ENDPOINT {
            self.parse_response(body, &limits)?
        } else {
            let wire: ChatCompletionRequest = deserialize_line(body)?;
            let valid = validate_chat(wire, &limits).map_err(envelope)?;
            let mut request = valid.request;
            // Results are collected, never streamed, so every batch job stays retryable.
            request.stream = false;
            LineRequest {
                request,
                priority: BATCH_PRIORITY_BASE + valid.priority,
            }
        };
        served.apply(&mut line.request);
        Ok(line)
    }

    fn response_body(
        &self,
        job: Uuid,
        created: i64,
        model: &str,
        output: &OutputFormat,
        completion: &Completion,
    ) -> serde_json::Value {
        if let Some(format) = &output.text_completion {
            let body = TextCompletion::from_jobs(
                text_completion_id(job),
                created,
                model.to_owned(),
                1,
                format,
                &[],
                std::slice::from_ref(completion),
            );
            return serde_json::to_value(body).unwrap_or(serde_json::Value::Null);
        }
        if let Some(format) = output.embeddings {
            return EmbeddingList::from_completion(model.to_owned(), format, completion)
                .ok()
                .and_then(|body| serde_json::to_value(body).ok())
                .unwrap_or(serde_json::Value::Null);
        }
        if output.responses.is_some() {
            let body = crate::responses::answer::from_completion(job, model, output, completion);
            return serde_json::to_value(body).unwrap_or(serde_json::Value::Null);
        }
        let body =
            ChatCompletion::from_completion(job, created, model.to_owned(), completion, output);
        serde_json::to_value(body).unwrap_or(serde_json::Value::Null)
    }

    fn error_response(&self, code: &str, message: &str) -> (u16, serde_json::Value) {
        let error = ApiError::JobFailed {
            code: code.to_owned(),
            message: message.to_owned(),
        };
        let (status, envelope) = error.status_and_body();
        (
            status.as_u16(),
            serde_json::to_value(envelope).unwrap_or(serde_json::Value::Null),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fallow_protocol::job::{ChoiceResult, FinishReason, Usage};
    use serde_json::json;

    fn thinker() -> ModelEntry {
        ModelEntry {
            id: "thinker".into(),
            context_length: 4096,
            owned_by: "fallow".into(),
            created: 0,
            tool_parser: Some("hermes".into()),
            reasoning_parser: Some("qwen3".into()),
            kind: Default::default(),
            dimensions: None,
            matryoshka_dimensions: Vec::new(),
            parent: None,
            lora_dir: false,
            lora_path: None,
        }
    }

    #[test]
    fn a_batch_line_is_read_in_its_models_syntax_like_a_synchronous_answer() {
        let codec = ChatBatchCodec::new(&crate::ApiConfig::default());
        let body = json!({"model": "thinker", "messages": [{"role": "user", "content": "hi"}],
                          "tools": [{"type": "function", "function": {"name": "f"}}]});
        let line = codec
            .parse_body(CHAT_ENDPOINT, body, &[thinker()])
            .unwrap_or_else(|(_, e)| panic!("{e}"));
        let output = &line.request.output;
        assert_eq!(output.reasoning_parser.as_deref(), Some("qwen3"));
        assert_eq!(output.tool_parser.as_deref(), Some("hermes"));
        let done = Completion {
            choices: vec![ChoiceResult {
                index: 0,
                text:
                    "<think>hm</think><tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>"
                        .into(),
                finish_reason: FinishReason::Stop,
                matched_stop: None,
                logprobs: None,
                hidden_states: None,
                routed_experts: None,
            }],
            usage: Usage {
                prompt_tokens: 3,
                completion_tokens: 10,
                cached_tokens: 0,
            },
            ..Default::default()
        };
        let body = codec.response_body(Uuid::nil(), 0, "thinker", output, &done);
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(choice["message"]["reasoning_content"], "hm");
        assert_eq!(choice["message"]["content"], serde_json::Value::Null);
        assert_eq!(
            choice["message"]["tool_calls"][0]["function"]["arguments"],
            "{}"
        );
        assert!(body["usage"]["completion_tokens_details"]["reasoning_tokens"].as_u64() > Some(0));
    }

    fn line(extra: serde_json::Value) -> Result<LineRequest, (Option<String>, String)> {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        if let (Some(obj), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            obj.extend(extra.clone());
        }
        ChatBatchCodec::new(&crate::ApiConfig::default()).parse_body(CHAT_ENDPOINT, body, &[])
    }

    #[test]
    fn a_batch_line_gets_the_same_constraint_checks_as_a_request() {
        let ok = line(json!({"response_format": {"type": "json_object"}})).unwrap();
        assert_eq!(
            ok.request.sampling.constraint,
            Some(fallow_protocol::job::Constraint::JsonObject)
        );
        let (param, message) = line(json!({"regex": "(unclosed"})).unwrap_err();
        assert_eq!(param.as_deref(), Some("regex"));
        assert!(message.contains("regular expression"), "{message}");
    }

    #[test]
    fn a_completions_line_is_one_raw_prompt_answered_as_a_text_completion() {
        let codec = ChatBatchCodec::new(&crate::ApiConfig::default());
        let body = json!({"model": "thinker", "prompt": "hi", "logprobs": 1, "stream": true});
        let line = codec
            .parse_body(COMPLETIONS_ENDPOINT, body, &[thinker()])
            .unwrap_or_else(|(_, e)| panic!("{e}"));
        assert!(!line.request.stream);
        let format = line.request.output.text_completion;
        assert_eq!(format.map(|f| f.logprobs), Some(Some(1)));
        let done = Completion {
            choices: vec![ChoiceResult {
                index: 0,
                text: "there".into(),
                finish_reason: FinishReason::Length,
                matched_stop: None,
                logprobs: Some(Vec::new()),
                hidden_states: None,
                routed_experts: None,
            }],
            usage: Usage::default(),
            ..Default::default()
        };
        let body = codec.response_body(Uuid::nil(), 0, "thinker", &line.request.output, &done);
        assert_eq!(body["object"], "text_completion");
        assert_eq!(body["choices"][0]["text"], "there");
        assert_eq!(body["choices"][0]["finish_reason"], "length");
    }

    #[test]
    fn a_responses_line_is_answered_as_a_response_object() {
        let codec = ChatBatchCodec::new(&crate::ApiConfig::default());
        let body = json!({"model": "thinker", "input": "hi", "max_output_tokens": 5});
        let line = codec
            .parse_body(RESPONSES_ENDPOINT, body, &[thinker()])
            .unwrap_or_else(|(_, e)| panic!("{e}"));
        assert!(!line.request.stream);
        assert_eq!(line.request.sampling.max_tokens, Some(5));
        let done = Completion {
            choices: vec![ChoiceResult {
                index: 0,
                text: "<think>hm</think>there".into(),
                finish_reason: FinishReason::Stop,
                matched_stop: None,
                logprobs: None,
                hidden_states: None,
                routed_experts: None,
            }],
            usage: Usage::default(),
            ..Default::default()
        };
        let job = Uuid::from_u128(3);
        let body = codec.response_body(job, 0, "thinker", &line.request.output, &done);
        assert_eq!(body["object"], "response");
        assert_eq!(body["id"], crate::openai::responses::response_id(job));
        assert_eq!(body["store"], false);
        assert_eq!(body["output"][0]["type"], "reasoning");
        assert_eq!(body["output"][1]["content"][0]["text"], "there");
        for (body, param) in [
            (
                json!({"model": "m", "input": "a", "background": true}),
                "background",
            ),
            (
                json!({"model": "m", "input": "a", "previous_response_id": "resp_x"}),
                "previous_response_id",
            ),
            (
                json!({"model": "m", "input": "a", "tools": [{"type": "mcp"}]}),
                "tools[0].type",
            ),
        ] {
            match codec.parse_body(RESPONSES_ENDPOINT, body, &[]) {
                Err((Some(p), _)) => assert_eq!(p, param),
                other => panic!("not refused: {:?}", other.map(|_| ())),
            }
        }
    }

    #[test]
    fn a_completions_line_with_several_prompts_or_echo_is_refused() {
        let codec = ChatBatchCodec::new(&crate::ApiConfig::default());
        for (body, param) in [
            (json!({"model": "m", "prompt": ["a", "b"]}), "prompt"),
            (json!({"model": "m", "prompt": "a", "echo": true}), "echo"),
        ] {
            match codec.parse_body(COMPLETIONS_ENDPOINT, body, &[]) {
                Err((Some(p), _)) => assert_eq!(p, param),
                other => panic!("not refused: {:?}", other.map(|_| ())),
            }
        }
    }
}
