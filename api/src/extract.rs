//! Body extractors that speak the OpenAI error envelope. axum's own `Json` answers 415/422
//! with plain text; clients of an OpenAI-compatible server expect 400 with a JSON error
//! naming the bad field (and 413 when the body is too large).
//!
//! Both extractors insist on their `Content-Type` and answer 415 otherwise.
//! A web page may send `text/plain`, form or multipart bodies to any address without a
//! CORS preflight, `127.0.0.1` included; `application/json` needs a preflight, which this
//! server never grants. So checking the type here is what stops a page from driving a
//! local `fallow dev` (CSRF). POSTs without a body never reach these extractors.

use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::multipart::Multipart;
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap, StatusCode};
use serde::de::DeserializeOwned;

/// The media type of JSON bodies.
pub const JSON: &str = "application/json";
/// The media type of file uploads.
pub const MULTIPART: &str = "multipart/form-data";

/// `Json<T>` with OpenAI-style rejections, for `Content-Type: application/json` bodies
/// (any parameters, such as `; charset=utf-8`, are accepted).
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        require_media_type(req.headers(), JSON)?;
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

/// axum's `Multipart` for `Content-Type: multipart/form-data` bodies; any other type gets
/// a 415 in the envelope (axum's own rejection is a plain-text 400).
pub struct ApiMultipart(pub Multipart);

impl FromRequest<AppState> for ApiMultipart {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        require_media_type(req.headers(), MULTIPART)?;
        Multipart::from_request(req, state)
            .await
            .map(ApiMultipart)
            .map_err(|e| {
                ApiError::invalid("file", format!("Expected a multipart/form-data body: {e}"))
            })
    }
}

/// Refuses a request whose `Content-Type` is not `expected` (compared without its
/// parameters and case-insensitively, as RFC 9110 says media types compare).
pub fn require_media_type(headers: &HeaderMap, expected: &'static str) -> Result<(), ApiError> {
    let raw = headers.get(header::CONTENT_TYPE);
    let essence = raw
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or_default().trim());
    match essence {
        Some(media) if media.eq_ignore_ascii_case(expected) => Ok(()),
        _ => Err(ApiError::UnsupportedMediaType {
            expected,
            got: match raw {
                None => "(none)".to_owned(),
                Some(v) => format!("`{}`", String::from_utf8_lossy(v.as_bytes())),
            },
        }),
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
