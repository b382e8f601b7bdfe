//! `/v1/responses`: answers, validation, storage per tenant, continuation, streams and
//! background responses, against the scripted runner.

use crate::support::*;
use fallow_protocol::job::{Role, ToolCall};
use fallow_scheduler::tenants;
use serde_json::{json, Value};

impl TestApp {
    async fn post_response(&self, body: Value) -> reqwest::Response {
        self.client
            .post(self.url("/v1/responses"))
            .json(&body)
            .send()
            .await
            .expect("request")
    }

    async fn get_json(&self, path: &str) -> (u16, Value) {
        let response = self.client.get(self.url(path)).send().await.expect("get");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

/// Posts `body`, answers its job with `pieces` and returns the JSON answer.
async fn respond(app: &TestApp, body: Value, model: &str, pieces: &[&str]) -> Value {
    let request = {
        let (client, url) = (app.client.clone(), app.url("/v1/responses"));
        tokio::spawn(async move { client.post(url).json(&body).send().await })
    };
    let job = app.claim_for(model).await;
    app.answer(&job, pieces).await;
    let response = request.await.expect("join").expect("response");
    assert_eq!(response.status(), 200);
    response.json().await.expect("json")
}

#[tokio::test]
async fn a_string_input_is_answered_as_a_completed_response() {
    let app = spawn_app().await;
    let body = json!({"model": MODEL, "input": "Say hello", "instructions": "Be brief.",
                      "metadata": {"k": "v"}, "temperature": 0});
    let answer = respond(&app, body, MODEL, &["Hel", "lo"]).await;

    assert_eq!(answer["object"], "response");
    assert!(answer["id"].as_str().unwrap_or("").starts_with("resp_"));
    assert_eq!(answer["status"], "completed");
    assert_eq!(answer["output"][0]["type"], "message");
    assert_eq!(answer["output"][0]["role"], "assistant");
    assert_eq!(answer["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(answer["output"][0]["content"][0]["text"], "Hello");
    assert_eq!(answer["output"][0]["content"][0]["annotations"], json!([]));
    assert_eq!(answer["usage"]["input_tokens"], 9);
    assert_eq!(answer["usage"]["output_tokens"], 2);
    assert_eq!(answer["usage"]["total_tokens"], 11);
    assert_eq!(
        answer["usage"]["output_tokens_details"]["reasoning_tokens"],
        0
    );
    assert_eq!(answer["metadata"], json!({"k": "v"}));
    assert_eq!(answer["instructions"], "Be brief.");
    assert_eq!(answer["store"], true);
    assert_eq!(answer["tools"], json!([]));
    assert_eq!(answer["tool_choice"], "auto");
    assert_eq!(answer["text"], json!({"format": {"type": "text"}}));

    let id = answer["id"].as_str().unwrap_or_default();
    let (status, stored) = app.get_json(&format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(stored, answer);
}

#[tokio::test]
async fn items_become_the_chat_messages_of_the_job() {
    let app = spawn_app().await;
    let body = json!({"model": MODEL, "instructions": "Sys.", "input": [
        {"role": "developer", "content": "Dev."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]},
        {"role": "user", "content": "More"},
    ]});
    let request = {
        let (client, url) = (app.client.clone(), app.url("/v1/responses"));
        tokio::spawn(async move { client.post(url).json(&body).send().await })
    };
    let job = app.claim_one().await;
    let messages: Vec<(Role, Option<String>)> = job
        .request
        .messages
        .iter()
        .map(|m| (m.role, m.content.clone()))
        .collect();
    assert_eq!(
        messages,
        [
            (Role::System, Some("Sys.".into())),
            (Role::System, Some("Dev.".into())),
            (Role::User, Some("Hi".into())),
            (Role::Assistant, Some("Hello".into())),
            (Role::User, Some("More".into())),
        ]
    );
    app.answer(&job, &["ok"]).await;
    assert_eq!(request.await.expect("join").expect("post").status(), 200);
}

#[tokio::test]
async fn refusals_name_the_responses_field() {
    let app = spawn_app().await;
    let cases = [
        (json!({"input": "hi"}), "model"),
        (json!({"model": MODEL}), "input"),
        (
            json!({"model": MODEL, "input": "hi", "tools": [{"type": "web_search"}]}),
            "tools[0].type",
        ),
        (
            json!({"model": MODEL, "input": "hi", "tools": [{"type": "function", "name": "f"}, {"type": "file_search"}]}),
            "tools[1].type",
        ),
        (
            json!({"model": MODEL, "input": "hi", "tools": [{"type": "function"}]}),
            "tools[0].name",
        ),
        (
            json!({"model": MODEL, "input": "hi", "include": ["file_search_call.results"]}),
            "include[0]",
        ),
        (
            json!({"model": MODEL, "input": [{"type": "computer_call"}]}),
            "input[0].type",
        ),
        (
            json!({"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input[0].content[0].type",
        ),
        (
            json!({"model": MODEL, "input": [{"role": "robot", "content": "x"}]}),
            "input[0].role",
        ),
        (
            json!({"model": MODEL, "input": [{"type": "function_call", "name": "f"}]}),
            "input[0].call_id",
        ),
        (
            json!({"model": MODEL, "input": "hi", "temperature": 7}),
            "temperature",
        ),
        (
            json!({"model": MODEL, "input": "hi", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (
            json!({"model": MODEL, "input": "hi", "text": {"format": {"type": "yaml"}}}),
            "text.format.type",
        ),
        (
            json!({"model": MODEL, "input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": 3}}}),
            "text.format.schema",
        ),
        (
            json!({"model": MODEL, "input": "hi", "tool_choice": {"type": "web_search_preview"}}),
            "tool_choice",
        ),
        (
            json!({"model": MODEL, "input": "hi", "background": true, "store": false}),
            "background",
        ),
        (
            json!({"model": MODEL, "input": "hi", "previous_response_id": "resp_nope"}),
            "previous_response_id",
        ),
        (
            json!({"model": MODEL, "input": "hi", "metadata": {"k": 1}}),
            "metadata.k",
        ),
    ];
    for (body, param) in cases {
        let response = app.post_response(body.clone()).await;
        assert_eq!(response.status(), 400, "{body}");
        let error: Value = response.json().await.expect("json");
        assert_eq!(error["error"]["param"], param, "{body}: {error}");
        assert_eq!(error["error"]["type"], "invalid_request_error");
    }
}

#[tokio::test]
async fn unknown_ids_are_404() {
    let app = spawn_app().await;
    let unknown = format!("resp_{}", uuid::Uuid::new_v4().simple());
    for path in [
        "/v1/responses/resp_nonsense".to_owned(),
        format!("/v1/responses/{unknown}"),
        format!("/v1/responses/{unknown}/input_items"),
    ] {
        let (status, body) = app.get_json(&path).await;
        assert_eq!(status, 404, "{path}");
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }
    let deleted = app
        .client
        .delete(app.url(&format!("/v1/responses/{unknown}")))
        .send()
        .await
        .expect("delete");
    assert_eq!(deleted.status(), 404);
    let cancelled = app
        .client
        .post(app.url(&format!("/v1/responses/{unknown}/cancel")))
        .send()
        .await
        .expect("cancel");
    assert_eq!(cancelled.status(), 404);
}

#[tokio::test]
async fn an_unstored_response_can_be_neither_retrieved_nor_continued() {
    let app = spawn_app().await;
    let body = json!({"model": MODEL, "input": "hi", "store": false});
    let answer = respond(&app, body, MODEL, &["yo"]).await;
    assert_eq!(answer["store"], false);
    let id = answer["id"].as_str().unwrap_or_default();
    let (status, _) = app.get_json(&format!("/v1/responses/{id}")).await;
    assert_eq!(status, 404);
    let next = app
        .post_response(json!({"model": MODEL, "input": "again", "previous_response_id": id}))
        .await;
    assert_eq!(next.status(), 400);
    let error: Value = next.json().await.expect("json");
    assert_eq!(error["error"]["param"], "previous_response_id");
}

#[tokio::test]
async fn a_tenant_sees_only_its_own_responses() {
    let app = spawn_app_with(fallow_api::ApiConfig {
        auth: true,
        ..Default::default()
    })
    .await;
    let mine = tenants::create_key(app.queue.pool(), "acme")
        .await
        .expect("key");
    let theirs = tenants::create_key(app.queue.pool(), "other")
        .await
        .expect("key");
    let request = {
        let (client, url, key) = (app.client.clone(), app.url("/v1/responses"), mine.clone());
        tokio::spawn(async move {
            client
                .post(url)
                .bearer_auth(key)
                .json(&json!({"model": MODEL, "input": "hi"}))
                .send()
                .await
        })
    };
    let job = app.claim_one().await;
    app.answer(&job, &["hello"]).await;
    let answer: Value = request
        .await
        .expect("join")
        .expect("post")
        .json()
        .await
        .expect("json");
    let id = answer["id"].as_str().unwrap_or_default().to_owned();
    let get = |key: String, path: String| {
        let client = app.client.clone();
        let url = app.url(&path);
        async move {
            let response = client.get(url).bearer_auth(key).send().await.expect("get");
            response.status().as_u16()
        }
    };
    assert_eq!(get(mine.clone(), format!("/v1/responses/{id}")).await, 200);
    assert_eq!(
        get(theirs.clone(), format!("/v1/responses/{id}")).await,
        404
    );
    assert_eq!(
        get(theirs.clone(), format!("/v1/responses/{id}/input_items")).await,
        404
    );
    let deleted = app
        .client
        .delete(app.url(&format!("/v1/responses/{id}")))
        .bearer_auth(&theirs)
        .send()
        .await
        .expect("delete");
    assert_eq!(deleted.status(), 404);
    let continued = app
        .client
        .post(app.url("/v1/responses"))
        .bearer_auth(&theirs)
        .json(&json!({"model": MODEL, "input": "x", "previous_response_id": id}))
        .send()
        .await
        .expect("post");
    assert_eq!(continued.status(), 400);
    assert_eq!(get(mine, format!("/v1/responses/{id}")).await, 200);
}

#[tokio::test]
async fn input_items_are_paged_and_a_deleted_response_is_gone() {
    let app = spawn_app().await;
    let body = json!({"model": MODEL, "input": [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three"},
    ]});
    let answer = respond(&app, body, MODEL, &["four"]).await;
    let id = answer["id"].as_str().unwrap_or_default();
    let path = format!("/v1/responses/{id}/input_items");

    let (status, all) = app.get_json(&path).await;
    assert_eq!(status, 200);
    assert_eq!(all["object"], "list");
    let texts: Vec<&str> = all["data"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i["content"][0]["text"].as_str())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(texts, ["three", "two", "one"], "newest first by default");
    assert_eq!(all["has_more"], false);
    assert_eq!(all["first_id"], all["data"][0]["id"]);
    assert_eq!(all["last_id"], all["data"][2]["id"]);

    let (_, first) = app.get_json(&format!("{path}?order=asc&limit=2")).await;
    assert_eq!(first["data"][0]["content"][0]["text"], "one");
    assert_eq!(first["data"].as_array().map(Vec::len), Some(2));
    assert_eq!(first["has_more"], true);
    let after = first["last_id"].as_str().unwrap_or_default();
    let (_, rest) = app
        .get_json(&format!("{path}?order=asc&limit=2&after={after}"))
        .await;
    assert_eq!(rest["data"][0]["content"][0]["text"], "three");
    assert_eq!(rest["has_more"], false);
    let (status, bad) = app.get_json(&format!("{path}?limit=0")).await;
    assert_eq!(status, 400);
    assert_eq!(bad["error"]["param"], "limit");

    let deleted = app
        .client
        .delete(app.url(&format!("/v1/responses/{id}")))
        .send()
        .await
        .expect("delete");
    assert_eq!(deleted.status(), 200);
    let deleted: Value = deleted.json().await.expect("json");
    assert_eq!(deleted["deleted"], true);
    let (status, _) = app.get_json(&format!("/v1/responses/{id}")).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_previous_response_id_continues_the_conversation_without_its_instructions() {
    let app = spawn_app().await;
    let first = respond(
        &app,
        json!({"model": MODEL, "input": "Hi", "instructions": "Only first."}),
        MODEL,
        &["Hello there"],
    )
    .await;
    let body = json!({"model": MODEL, "input": "And?", "previous_response_id": first["id"]});
    let request = {
        let (client, url) = (app.client.clone(), app.url("/v1/responses"));
        tokio::spawn(async move { client.post(url).json(&body).send().await })
    };
    let job = app.claim_one().await;
    let turns: Vec<(Role, Option<String>)> = job
        .request
        .messages
        .iter()
        .map(|m| (m.role, m.content.clone()))
        .collect();
    assert_eq!(
        turns,
        [
            (Role::User, Some("Hi".into())),
            (Role::Assistant, Some("Hello there".into())),
            (Role::User, Some("And?".into())),
        ]
    );
    app.answer(&job, &["More"]).await;
    let second: Value = request
        .await
        .expect("join")
        .expect("post")
        .json()
        .await
        .expect("json");
    assert_eq!(second["previous_response_id"], first["id"]);
}

#[tokio::test]
async fn a_function_call_round_trips_through_its_output() {
    let app = spawn_app().await;
    let tools = json!([{"type": "function", "name": "get_weather", "description": "Weather",
                        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                        "strict": false}]);
    let first = respond(
        &app,
        json!({"model": THINKER, "input": "Weather in Paris?", "tools": tools}),
        THINKER,
        &["<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>"],
    )
    .await;
    let call = &first["output"][0];
    assert_eq!(call["type"], "function_call", "{first}");
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["status"], "completed");
    let arguments: Value =
        serde_json::from_str(call["arguments"].as_str().unwrap_or("")).unwrap_or(Value::Null);
    assert_eq!(arguments, json!({"city": "Paris"}));
    assert_eq!(first["tools"], tools);

    let call_id = call["call_id"].as_str().unwrap_or_default().to_owned();
    let body = json!({"model": THINKER, "previous_response_id": first["id"], "tools": tools,
                      "input": [{"type": "function_call_output", "call_id": call_id, "output": "sunny"}]});
    let request = {
        let (client, url) = (app.client.clone(), app.url("/v1/responses"));
        tokio::spawn(async move { client.post(url).json(&body).send().await })
    };
    let job = app.claim_for(THINKER).await;
    let messages = &job.request.messages;
    assert_eq!(messages.len(), 3);
    assert_eq!(messages[1].role, Role::Assistant);
    assert_eq!(
        messages[1].tool_calls,
        [ToolCall {
            id: call_id.clone(),
            name: "get_weather".into(),
            arguments: "{\"city\": \"Paris\"}".into(),
        }]
    );
    assert_eq!(messages[2].role, Role::Tool);
    assert_eq!(messages[2].tool_call_id.as_deref(), Some(call_id.as_str()));
    assert_eq!(messages[2].content.as_deref(), Some("sunny"));
    app.answer(&job, &["It is sunny."]).await;
    let second: Value = request
        .await
        .expect("join")
        .expect("post")
        .json()
        .await
        .expect("json");
    assert_eq!(second["output"][0]["content"][0]["text"], "It is sunny.");
}

fn event_types(events: &[SseEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| e.json()["type"].as_str().unwrap_or("").to_owned())
        .collect()
}

#[tokio::test]
async fn a_streamed_response_sends_typed_events_in_order() {
    let app = spawn_app().await;
    let body = json!({"model": MODEL, "input": "hi", "stream": true});
    let request = {
        let (client, url) = (app.client.clone(), app.url("/v1/responses"));
        tokio::spawn(async move { client.post(url).json(&body).send().await })
    };
    let job = app.claim_one().await;
    app.answer(&job, &["Hel", "lo"]).await;
    let response = request.await.expect("join").expect("post");
    assert_eq!(response.status(), 200);
    let events = parse_sse(&response.text().await.expect("body"));
    assert_eq!(
        event_types(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event.json()["sequence_number"], i as u64);
    }
    let done = events.last().map(SseEvent::json).unwrap_or_default();
    assert_eq!(done["response"]["status"], "completed");
    assert_eq!(done["response"]["output"][0]["content"][0]["text"], "Hello");
    let id = done["response"]["id"].as_str().unwrap_or_default();
    let (_, stored) = app.get_json(&format!("/v1/responses/{id}")).await;
    assert_eq!(stored["output"], done["response"]["output"]);
}

#[tokio::test]
async fn a_background_response_is_queued_polled_resumed_and_cancelled() {
    let app = spawn_app().await;
    let queued = app
        .post_response(json!({"model": MODEL, "input": "hi", "background": true}))
        .await;
    assert_eq!(queued.status(), 200);
    let queued: Value = queued.json().await.expect("json");
    assert_eq!(queued["status"], "queued");
    assert_eq!(queued["background"], true);
    let id = queued["id"].as_str().unwrap_or_default().to_owned();
    let (_, polled) = app.get_json(&format!("/v1/responses/{id}")).await;
    assert_eq!(polled["status"], "queued");

    let job = app.claim_one().await;
    assert!(
        job.request.stream,
        "a background job is never retried after tokens"
    );
    app.answer(&job, &["a", "b", "c"]).await;
    let (_, done) = app.get_json(&format!("/v1/responses/{id}")).await;
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["content"][0]["text"], "abc");

    let all = app
        .client
        .get(app.url(&format!("/v1/responses/{id}?stream=true")))
        .send()
        .await
        .expect("stream");
    let all = parse_sse(&all.text().await.expect("body"));
    let tail = app
        .client
        .get(app.url(&format!("/v1/responses/{id}?stream=true&starting_after=4")))
        .send()
        .await
        .expect("stream");
    let tail = parse_sse(&tail.text().await.expect("body"));
    assert_eq!(all.len(), 11);
    let json_of = |events: &[SseEvent]| events.iter().map(SseEvent::json).collect::<Vec<_>>();
    assert_eq!(json_of(&tail), json_of(&all[5..]));
    assert_eq!(tail[0].json()["sequence_number"], 5);

    // A finished response is returned as it is; a queued one is cancelled.
    let again = app
        .client
        .post(app.url(&format!("/v1/responses/{id}/cancel")))
        .send()
        .await
        .expect("cancel");
    let again: Value = again.json().await.expect("json");
    assert_eq!(again["status"], "completed");
    let second: Value = app
        .post_response(json!({"model": MODEL, "input": "hi", "background": true}))
        .await
        .json()
        .await
        .expect("json");
    let second_id = second["id"].as_str().unwrap_or_default();
    let cancelled: Value = app
        .client
        .post(app.url(&format!("/v1/responses/{second_id}/cancel")))
        .send()
        .await
        .expect("cancel")
        .json()
        .await
        .expect("json");
    assert_eq!(cancelled["status"], "cancelled");
}

#[tokio::test]
async fn a_foreground_response_cannot_be_cancelled() {
    let app = spawn_app().await;
    let answer = respond(&app, json!({"model": MODEL, "input": "hi"}), MODEL, &["x"]).await;
    let id = answer["id"].as_str().unwrap_or_default();
    let response = app
        .client
        .post(app.url(&format!("/v1/responses/{id}/cancel")))
        .send()
        .await
        .expect("cancel");
    assert_eq!(response.status(), 400);
}

#[tokio::test]
async fn resuming_after_the_stream_expired_is_refused_rather_than_renumbered() {
    let app = spawn_app().await;
    let queued: Value = app
        .post_response(json!({"model": MODEL, "input": "hi", "background": true}))
        .await
        .json()
        .await
        .expect("json");
    let id = queued["id"].as_str().unwrap_or_default().to_owned();
    let job = app.claim_one().await;
    app.answer(&job, &["a", "b", "c"]).await;
    app.relay.delete(job.id).await.expect("expire the stream");

    let resumed = app
        .client
        .get(app.url(&format!("/v1/responses/{id}?stream=true&starting_after=4")))
        .send()
        .await
        .expect("stream");
    assert_eq!(resumed.status(), 400);
    let error: Value = resumed.json().await.expect("json");
    assert_eq!(error["error"]["param"], "starting_after");

    // From the start, the events are rebuilt from the job's record, numbered from 0.
    let whole = app
        .client
        .get(app.url(&format!("/v1/responses/{id}?stream=true")))
        .send()
        .await
        .expect("stream");
    assert_eq!(whole.status(), 200);
    let events = parse_sse(&whole.text().await.expect("body"));
    assert_eq!(events[0].json()["sequence_number"], 0);
    let last = events.last().map(SseEvent::json).unwrap_or_default();
    assert_eq!(last["type"], "response.completed");
    assert_eq!(last["response"]["output"][0]["content"][0]["text"], "abc");
}
