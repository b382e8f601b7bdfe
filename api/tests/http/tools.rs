//! Tool calls and reasoning through the api: the fake runner streams a model's raw text, the
//! api answers in OpenAI's shapes — streamed, non-streamed, fetched later and resumed alike.

use crate::support::*;
use serde_json::{json, Value};

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}])
}

const CALL_PIECES: [&str; 4] = [
    "Checking.\n<tool_",
    "call>\n{\"name\": \"get_weather\", \"argu",
    "ments\": {\"city\": \"Par",
    "is\"}}\n</tool_call>",
];

/// Posts `body`, answers its job with `pieces` on `model` and returns the response.
async fn answered(app: &TestApp, model: &str, body: Value, pieces: &[&str]) -> reqwest::Response {
    let request = {
        let client = app.client.clone();
        let url = app.url("/v1/chat/completions");
        tokio::spawn(async move { client.post(url).json(&body).send().await })
    };
    let job = app.claim_for(model).await;
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
async fn a_tool_call_is_answered_as_tool_calls_with_finish_reason_tool_calls() {
    let app = spawn_app().await;
    let body = json!({"model": MODEL, "tools": weather_tools(),
                      "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let response = answered(&app, MODEL, body, &CALL_PIECES).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("json");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    let message = &choice["message"];
    assert_eq!(message["content"], "Checking.");
    let call = &message["tool_calls"][0];
    assert!(call["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("call_")));
    assert_eq!(call["type"], "function");
    assert_eq!(
        call["function"],
        json!({"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"})
    );
    assert_eq!(message["tool_calls"].as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn the_job_carries_the_tools_for_the_template_and_how_to_parse_them() {
    let app = spawn_app().await;
    let request = {
        let client = app.client.clone();
        let url = app.url("/v1/chat/completions");
        let body = json!({"model": MODEL, "tools": weather_tools(), "parallel_tool_calls": false,
                          "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
              "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"}]});
        tokio::spawn(async move { client.post(url).json(&body).send().await })
    };
    let job = app.claim_one().await;
    assert_eq!(
        job.request.tools,
        weather_tools().as_array().cloned().unwrap_or_default()
    );
    assert_eq!(job.request.output.tool_parser.as_deref(), Some("hermes"));
    assert!(job.request.output.single_tool_call);
    let assistant = &job.request.messages[1];
    assert_eq!(assistant.content, None);
    assert_eq!(assistant.tool_calls[0].arguments, "{\"city\": \"Oslo\"}");
    assert_eq!(
        job.request.messages[2].tool_call_id.as_deref(),
        Some("call_1")
    );
    app.answer(&job, &["It is cold."]).await;
    let body: Value = request
        .await
        .expect("join")
        .expect("response")
        .json()
        .await
        .expect("json");
    assert_eq!(
        body["choices"][0]["message"],
        json!({"role": "assistant", "content": "It is cold."})
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn a_streamed_tool_call_sends_the_name_first_then_argument_fragments() {
    let app = spawn_app().await;
    let body = json!({"model": MODEL, "tools": weather_tools(), "stream": true,
                      "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let response = answered(&app, MODEL, body, &CALL_PIECES).await;
    let chunks = chunks_of(&response.text().await.expect("body"));
    let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
    assert_eq!(deltas[0], &json!({"role": "assistant", "content": ""}));
    assert_eq!(deltas[1], &json!({"content": "Checking."}));
    let first = &deltas[2]["tool_calls"][0];
    assert_eq!(first["index"], 0);
    assert!(first["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("call_")));
    assert_eq!(first["type"], "function");
    assert_eq!(
        first["function"],
        json!({"name": "get_weather", "arguments": ""})
    );
    let arguments: String = deltas[3..]
        .iter()
        .filter_map(|d| d["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    assert_eq!(arguments, "{\"city\": \"Paris\"}");
    for d in &deltas[3..] {
        if let Some(call) = d["tool_calls"][0].as_object() {
            assert!(
                !call.contains_key("id") && !call.contains_key("type"),
                "{d}"
            );
        }
    }
    let last = chunks.last().expect("chunks");
    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(last["choices"][0]["delta"], json!({}));

    // The stored result reads the same, with the same call id.
    let id = chunks[0]["id"].as_str().expect("id");
    let stored: Value = app
        .client
        .get(app.url(&format!("/v1/chat/completions/{id}")))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(
        stored["choices"][0]["message"]["tool_calls"][0]["id"],
        first["id"]
    );
    assert_eq!(stored["choices"][0]["finish_reason"], "tool_calls");
}

#[tokio::test]
async fn a_stream_resumed_inside_a_tool_call_continues_its_arguments() {
    let app = spawn_app().await;
    let body = json!({"model": MODEL, "tools": weather_tools(), "stream": true,
                      "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let response = answered(&app, MODEL, body, &CALL_PIECES).await;
    let events = parse_sse(&response.text().await.expect("body"));
    // Resume after the chunk that started the call.
    let start = events
        .iter()
        .find(|e| e.json()["choices"][0]["delta"]["tool_calls"][0]["id"].is_string())
        .and_then(|e| e.id.clone())
        .expect("a call start with an id");
    let id = events[0].json()["id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let resumed = app
        .client
        .get(app.url(&format!("/v1/chat/completions/{id}/stream")))
        .header("last-event-id", &start)
        .send()
        .await
        .expect("resume");
    let chunks = chunks_of(&resumed.text().await.expect("body"));
    let arguments: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    // The call started before the resume point: only its arguments follow, never a
    // second start.
    assert_eq!(arguments, "{\"city\": \"Paris\"}");
    assert!(chunks
        .iter()
        .all(|c| c["choices"][0]["delta"]["tool_calls"][0]["id"].is_null()));
    assert!(chunks
        .iter()
        .all(|c| c["choices"][0]["delta"]["content"].is_null()));
    assert_eq!(
        chunks
            .last()
            .map(|c| c["choices"][0]["finish_reason"].clone()),
        Some(json!("tool_calls"))
    );
}

#[tokio::test]
async fn legacy_functions_are_answered_with_function_call() {
    let app = spawn_app().await;
    let body = json!({"model": MODEL,
        "functions": [{"name": "get_weather", "parameters": {"type": "object", "properties": {}}}],
        "function_call": {"name": "get_weather"},
        "messages": [{"role": "user", "content": "Weather?"},
                     {"role": "assistant", "content": null, "function_call": {"name": "get_weather", "arguments": "{}"}},
                     {"role": "function", "name": "get_weather", "content": "sunny"}]});
    let pieces = ["<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>"];
    let response = answered(&app, MODEL, body, &pieces).await;
    let body: Value = response.json().await.expect("json");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "function_call");
    assert_eq!(
        choice["message"],
        json!({"role": "assistant", "content": null,
               "function_call": {"name": "get_weather", "arguments": "{}"}})
    );
}

#[tokio::test]
async fn reasoning_is_split_into_reasoning_content_and_counted() {
    let app = spawn_app().await;
    let body = json!({"model": THINKER, "messages": [{"role": "user", "content": "Hi"}]});
    let pieces = [
        "<think>",
        "\nGreet",
        " back.\n",
        "</think>",
        "\n\nHello",
        "!",
    ];
    let response = answered(&app, THINKER, body, &pieces).await;
    let body: Value = response.json().await.expect("json");
    assert_eq!(
        body["choices"][0]["message"],
        json!({"role": "assistant", "content": "Hello!",
               "reasoning_content": "Greet back.", "reasoning": "Greet back."})
    );
    assert_eq!(body["usage"]["completion_tokens"], 6);
    assert_eq!(
        body["usage"]["completion_tokens_details"],
        json!({"reasoning_tokens": 4})
    );
}

#[tokio::test]
async fn streamed_reasoning_arrives_as_reasoning_deltas_or_whole_without_stream_reasoning() {
    let app = spawn_app().await;
    let pieces = ["<think>", "a", " b", "</think>", "Yes"];
    for (stream_reasoning, expected) in [(true, vec!["a", " b"]), (false, vec!["a b"])] {
        let body = json!({"model": THINKER, "stream": true, "stream_reasoning": stream_reasoning,
                          "stream_options": {"include_usage": true},
                          "messages": [{"role": "user", "content": "Hi"}]});
        let response = answered(&app, THINKER, body, &pieces).await;
        let chunks = chunks_of(&response.text().await.expect("body"));
        let reasoning: Vec<&str> = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str())
            .collect();
        assert_eq!(reasoning, expected, "stream_reasoning={stream_reasoning}");
        let also: Vec<&str> = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["reasoning"].as_str())
            .collect();
        assert_eq!(also, expected);
        let content: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(content, "Yes");
        let usage = &chunks.last().expect("usage chunk")["usage"];
        assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], 4);
    }
}

#[tokio::test]
async fn separate_reasoning_false_or_thinking_off_leaves_the_text_in_content() {
    let app = spawn_app().await;
    for extra in [
        json!({"separate_reasoning": false}),
        json!({"chat_template_kwargs": {"enable_thinking": false}}),
    ] {
        let mut body = json!({"model": THINKER, "messages": [{"role": "user", "content": "Hi"}]});
        for (k, v) in extra.as_object().cloned().unwrap_or_default() {
            body[k] = v;
        }
        let response = answered(&app, THINKER, body, &["<think>x</think>", "y"]).await;
        let body: Value = response.json().await.expect("json");
        assert_eq!(
            body["choices"][0]["message"],
            json!({"role": "assistant", "content": "<think>x</think>y"}),
            "{extra}"
        );
        assert!(body["usage"].get("completion_tokens_details").is_none());
    }
}

#[tokio::test]
async fn bad_tools_and_unknown_tool_choices_are_400s_naming_the_parameter() {
    let app = spawn_app().await;
    let cases = [
        (
            json!({"tools": weather_tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]}),
            "tools[0].function.parameters.type",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "bad name"}}]}),
            "tools[0].function.name",
        ),
        (json!({"tools": [{"type": "retrieval"}]}), "tools[0].type"),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"functions": [{"name": "f"}], "function_call": {"name": "g"}}),
            "function_call",
        ),
    ];
    for (extra, param) in cases {
        let mut body = chat_body();
        for (k, v) in extra.as_object().cloned().unwrap_or_default() {
            body[k] = v;
        }
        let response = app.post_chat(body).await;
        assert_eq!(response.status(), 400, "{extra}");
        let error: Value = response.json().await.expect("json");
        assert_eq!(error["error"]["param"], param, "{extra}: {error}");
    }
}
