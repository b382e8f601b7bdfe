//! A JSON body extractor that speaks the OpenAI error envelope. axum's own `Json` answers
//! 415/422 with plain text; clients of an OpenAI-compatible server expect 400 with a JSON
//! error naming the bad field (and 413 when the body is too large).

use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

/// `Json<T>` with OpenAI-style rejections. The `Content-Type` is not checked: `curl -d`
/// sends form encoding by default and the body is JSON all the same.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge {
                    limit: state.config().max_body_bytes,
                }
            } else {
                ApiError::InvalidRequest {
                    message: format!("Could not read the request body: {rejection}"),
                    param: None,
                    code: None,
                }
            }
        })?;
        parse_json_body(&bytes).map(ApiJson)
    }
}

/// Parses a JSON body, naming the offending field (`messages[0].content`) on type errors.
pub fn parse_json_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::InvalidRequest {
            message: "The request body is empty; expected a JSON object.".into(),
            param: None,
            code: None,
        });
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        json_error(&path, &inner)
    })?;
    de.end().map_err(|err| json_error(".", &err))?;
    Ok(value)
}

fn json_error(path: &str, err: &serde_json::Error) -> ApiError {
    use serde_json::error::Category;
    match err.classify() {
        Category::Syntax | Category::Eof | Category::Io => ApiError::InvalidRequest {
            message: format!("We could not parse the JSON body of your request: {err}"),
            param: None,
            code: None,
        },
        Category::Data if path == "." || path.is_empty() => ApiError::InvalidRequest {
            message: format!("Invalid request body: {err}"),
            param: None,
            code: None,
        },
        Category::Data => ApiError::InvalidRequest {
            message: format!("Invalid value for `{path}`: {err}"),
            param: Some(path.to_owned()),
            code: None,
        },
    }
}
