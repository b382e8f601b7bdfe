//! A gpt-oss model (its runner publishes `harmony` for calls and reasoning) through the api:
//! the fake runner streams harmony text, markers included, and the api answers with
//! reasoning, content and tool calls in OpenAI's shapes, streamed or not.

use crate::support::*;
use serde_json::{json, Value};

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}])
}

/// Reasoning, then a call, in pieces that cut through markers and the arguments.
const CALL_PIECES: [&str; 6] = [
    "<|channel|>analysis<|message|>Need",
    " the weather.<|end|><|start|>assistant<|chan",
    "nel|>commentary to=functions.get_weather <|constrain|>json",
    "<|message|>{\"city\":",
    "\"Paris\"}",
    "<|call|>",
];

/// Posts `body` to `path`, answers its job with `pieces` and returns the response.
async fn answered(app: &TestApp, path: &str, body: Value, pieces: &[&str]) -> reqwest::Response {
    let request = {
        let client = app.client.clone();
        let url = app.url(path);
        tokio::spawn(async move { client.post(url).json(&body).send().await })
    };
    let job = app.claim_for(GPT_OSS).await;
    assert!(
        !job.request.sampling.skip_special_tokens,
        "harmony's markers must reach the parser"
    );
    app.answer(&job, pieces).await;
    request.await.expect("join").expect("response")
}

fn chunks_of(body: &str) -> Vec<Value> {
    parse_sse(body)
        .iter()
        .filter(|e| e.data != "[DONE]")
        .map(SseEvent::json)
        .collect()
}

#[tokio::test]
async fn analysis_is_reasoning_and_the_final_channel_is_the_answer() {
    let app = spawn_app().await;
    let body = json!({"model": GPT_OSS, "reasoning_effort": "high",
                      "messages": [{"role": "user", "content": "Hi"}]});
    let pieces = [
        "<|channel|>analysis<|message|>",
        "Greet back.",
        "<|end|><|start|>assistant<|channel|>final<|message|>",
        "Hello!",
    ];
    let response = answered(&app, "/v1/chat/completions", body, &pieces).await;
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        body["choices"][0]["message"],
        json!({"role": "assistant", "content": "Hello!",
               "reasoning_content": "Greet back.", "reasoning": "Greet back."})
    );
    assert_eq!(
        body["usage"]["completion_tokens_details"],
        json!({"reasoning_tokens": 3})
    );
}

#[tokio::test]
async fn a_streamed_harmony_call_sends_reasoning_then_the_call_with_its_arguments() {
    let app = spawn_app().await;
    let body = json!({"model": GPT_OSS, "tools": weather_tools(), "stream": true,
                      "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let response = answered(&app, "/v1/chat/completions", body, &CALL_PIECES).await;
    let chunks = chunks_of(&response.text().await.expect("body"));
    let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
    let reasoning: String = deltas
        .iter()
        .filter_map(|d| d["reasoning_content"].as_str())
        .collect();
    assert_eq!(reasoning, "Need the weather.");
    assert!(deltas
        .iter()
        .all(|d| d["content"].as_str().is_none_or(str::is_empty)));
    let calls: Vec<&Value> = deltas.iter().filter_map(|d| d.get("tool_calls")).collect();
    let first = &calls.first().expect("a call delta")[0];
    assert!(first["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("call_")));
    assert_eq!(first["type"], "function");
    assert_eq!(first["function"]["name"], "get_weather");
    let arguments: String = calls
        .iter()
        .filter_map(|c| c[0]["function"]["arguments"].as_str())
        .collect();
    assert_eq!(arguments, "{\"city\":\"Paris\"}");
    assert!(calls.iter().all(|c| c[0]["index"] == 0));
    let finish = chunks
        .iter()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str());
    assert_eq!(finish, Some("tool_calls"));
}

#[tokio::test]
async fn the_responses_api_gives_a_reasoning_item_and_a_function_call_item() {
    let app = spawn_app().await;
    let body = json!({"model": GPT_OSS, "tools": [{"type": "function", "name": "get_weather",
                      "parameters": weather_tools()[0]["function"]["parameters"]}],
                      "input": "Weather in Paris?"});
    let response = answered(&app, "/v1/responses", body, &CALL_PIECES).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("json");
    let output = body["output"].as_array().expect("output items");
    let kinds: Vec<&str> = output.iter().filter_map(|i| i["type"].as_str()).collect();
    assert_eq!(kinds, ["reasoning", "function_call"], "{body}");
    let reasoning = serde_json::to_string(&output[0]).unwrap_or_default();
    assert!(reasoning.contains("Need the weather."), "{reasoning}");
    assert_eq!(output[1]["name"], "get_weather");
    assert_eq!(output[1]["arguments"], "{\"city\":\"Paris\"}");
}
