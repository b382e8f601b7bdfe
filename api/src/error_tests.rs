use super::*;
use crate::extract::parse_json_body;
use crate::openai::request::ChatCompletionRequest;
use axum::body::to_bytes;

async fn rendered(err: ApiError) -> (StatusCode, serde_json::Value, Option<String>) {
    let response = err.into_response();
    let status = response.status();
    let retry = response
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = match to_bytes(response.into_body(), 1 << 20).await {
        Ok(bytes) => bytes,
        Err(err) => panic!("body: {err}"),
    };
    let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, json, retry)
}

#[tokio::test]
async fn every_error_renders_the_openai_envelope_with_its_status() {
    let cases = vec![
        (
            ApiError::invalid("top_p", "bad"),
            400,
            "invalid_request_error",
            Some("top_p"),
            None,
        ),
        (
            ApiError::MissingApiKey,
            401,
            "authentication_error",
            None,
            Some("invalid_api_key"),
        ),
        (
            ApiError::InvalidApiKey,
            401,
            "authentication_error",
            None,
            Some("invalid_api_key"),
        ),
        (
            ApiError::ModelNotFound("x".into()),
            404,
            "invalid_request_error",
            Some("model"),
            Some("model_not_found"),
        ),
        (
            ApiError::NotFound("nope".into()),
            404,
            "invalid_request_error",
            None,
            Some("not_found"),
        ),
        (
            ApiError::PayloadTooLarge { limit: 10 },
            413,
            "invalid_request_error",
            None,
            Some("payload_too_large"),
        ),
        (
            ApiError::Unavailable("db".into()),
            503,
            "service_unavailable_error",
            None,
            Some("service_unavailable"),
        ),
        (
            ApiError::Timeout(Duration::from_secs(3)),
            504,
            "timeout_error",
            None,
            Some("timeout"),
        ),
        (
            ApiError::Internal("x".into()),
            500,
            "server_error",
            None,
            None,
        ),
    ];
    for (err, status, kind, param, code) in cases {
        let message = err.to_string();
        let (got, body, _) = rendered(err).await;
        assert_eq!(got.as_u16(), status, "{message}");
        let e = &body["error"];
        assert_eq!(e["message"], message.as_str());
        assert_eq!(e["type"], kind);
        assert_eq!(e["param"].as_str(), param, "{message}");
        assert_eq!(e["code"].as_str(), code, "{message}");
        // The envelope always carries all four keys, null when unknown.
        assert_eq!(e.as_object().map(|o| o.len()), Some(4));
    }
}

#[tokio::test]
async fn rate_limits_say_when_to_retry() {
    let err = ApiError::RateLimited {
        message: "slow down".into(),
        retry_after: Duration::from_secs(5),
    };
    let (status, body, retry) = rendered(err).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert_eq!(retry.as_deref(), Some("5"));
}

#[tokio::test]
async fn a_tenant_rate_limit_names_its_limit_as_the_type_and_rounds_the_wait_up() {
    let err = ApiError::RateLimitReached {
        limit: "tokens",
        message: "Rate limit reached for tokens per minute".into(),
        retry_after: Duration::from_millis(1200),
    };
    let (status, body, retry) = rendered(err).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["error"]["type"], "tokens");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert_eq!(retry.as_deref(), Some("2"));
}

#[test]
fn job_errors_map_by_their_code() {
    let status = |code: &str| {
        ApiError::JobFailed {
            code: code.into(),
            message: "m".into(),
        }
        .status_and_body()
        .0
    };
    assert_eq!(status("context_length_exceeded"), StatusCode::BAD_REQUEST);
    assert_eq!(status("invalid_request"), StatusCode::BAD_REQUEST);
    assert_eq!(status("preparation_timeout"), StatusCode::BAD_REQUEST);
    assert_eq!(status("model_not_found"), StatusCode::NOT_FOUND);
    assert_eq!(status("overloaded"), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(status("engine_crashed"), StatusCode::INTERNAL_SERVER_ERROR);
}

#[test]
fn scheduler_outages_become_503() {
    let err: ApiError = SchedulerError::Database(sqlx::Error::PoolTimedOut).into();
    assert_eq!(err.status_and_body().0, StatusCode::SERVICE_UNAVAILABLE);
    let err: ApiError = SchedulerError::Corrupt("x".into()).into();
    assert_eq!(err.status_and_body().0, StatusCode::INTERNAL_SERVER_ERROR);
}

#[test]
fn malformed_json_and_wrong_types_are_400_never_422() {
    let syntax = parse_json_body::<ChatCompletionRequest>(b"{\"model\": ").err();
    let wrong_type =
        parse_json_body::<ChatCompletionRequest>(br#"{"model":"m","temperature":"hot"}"#).err();
    let nested = parse_json_body::<ChatCompletionRequest>(
        br#"{"model":"m","messages":[{"role":"user","content":5}]}"#,
    )
    .err();
    let empty = parse_json_body::<ChatCompletionRequest>(b"  ").err();
    let trailing = parse_json_body::<ChatCompletionRequest>(br#"{"model":"m"} x"#).err();
    for err in [&syntax, &wrong_type, &nested, &empty, &trailing] {
        let status = err.as_ref().map(|e| e.status_and_body().0);
        assert_eq!(status, Some(StatusCode::BAD_REQUEST), "{err:?}");
    }
    let param = |e: &Option<ApiError>| match e {
        Some(ApiError::InvalidRequest { param, .. }) => param.clone(),
        _ => None,
    };
    assert_eq!(param(&wrong_type).as_deref(), Some("temperature"));
    assert_eq!(param(&nested).as_deref(), Some("messages[0].content"));
    assert!(syntax.is_some_and(|e| e.to_string().contains("could not parse the JSON")));
}
