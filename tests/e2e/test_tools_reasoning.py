"""Tool calling and reasoning with the official OpenAI SDK against a real stack. The stack serves
the tiny default model with a fixture chat template (`fixtures/think_tools.jinja`) that shows the
Hermes tool-call format with an example and opens a `<think>` block, so the runner detects the
`hermes` and `deepseek_r1` parsers from it. Reasoning is then deterministic (everything up to
`</think>` is reasoning); with `separate_reasoning: false` the same output is read as content, and
at temperature 0 the model writes a real `<tool_call>` for "Weather in Paris?"."""

import json
from pathlib import Path

import openai
import pytest

from conftest import MODEL_ID, Stack

TEMPLATE = Path(__file__).resolve().parent / "fixtures" / "think_tools.jinja"
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def tool_client():
    stack = Stack("--chat-template", str(TEMPLATE)).start()
    try:
        yield openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    finally:
        stack.stop()


def extra(obj, name):
    """A non-standard field of an SDK object (`reasoning_content`, `reasoning`)."""
    return (getattr(obj, "model_extra", None) or {}).get(name)


def streamed(client, **kwargs):
    """Runs a streamed request and folds its chunks into (content, reasoning, calls, finish, usage)."""
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            assert extra(delta, "reasoning") == extra(delta, "reasoning_content")
            reasoning += extra(delta, "reasoning_content") or ""
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": call.id, "name": None, "arguments": ""})
                if call.function.name:
                    entry["name"] = call.function.name
                entry["arguments"] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, reasoning, [calls[i] for i in sorted(calls)], finish, chunks[-1].usage


def test_reasoning_opened_by_the_template_is_split_off_and_counted(tool_client):
    r = tool_client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=16, temperature=0)
    message = r.choices[0].message
    reasoning = extra(message, "reasoning_content")
    assert isinstance(reasoning, str) and reasoning
    assert extra(message, "reasoning") == reasoning
    details = r.usage.completion_tokens_details
    assert details is not None and 0 < details.reasoning_tokens <= r.usage.completion_tokens
    if "</think>" not in reasoning:
        assert message.content == ""


def test_streamed_reasoning_matches_the_non_streamed_answer(tool_client):
    kwargs = dict(model=MODEL_ID, messages=QUESTION, max_tokens=16, temperature=0, tools=TOOLS)
    sync = tool_client.chat.completions.create(**kwargs)
    content, reasoning, calls, finish, usage = streamed(tool_client, **kwargs)
    message = sync.choices[0].message
    assert reasoning == (extra(message, "reasoning_content") or "")
    assert content == (message.content or "")
    sync_calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                  for c in message.tool_calls or []]
    assert calls == sync_calls
    assert finish == sync.choices[0].finish_reason
    assert usage.completion_tokens_details.reasoning_tokens == sync.usage.completion_tokens_details.reasoning_tokens


def test_stream_reasoning_false_sends_the_reasoning_in_one_delta(tool_client):
    stream = tool_client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=12, temperature=0,
                                                 stream=True, extra_body={"stream_reasoning": False})
    pieces = [extra(c.choices[0].delta, "reasoning_content") for c in stream if c.choices]
    pieces = [p for p in pieces if p]
    assert len(pieces) == 1


def test_thinking_off_or_separate_reasoning_false_leaves_reasoning_out(tool_client):
    off = tool_client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=8, temperature=0,
                                              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert extra(off.choices[0].message, "reasoning_content") is None
    assert off.choices[0].message.content
    kept = tool_client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=8, temperature=0,
                                               extra_body={"separate_reasoning": False})
    assert extra(kept.choices[0].message, "reasoning_content") is None
    assert kept.usage.completion_tokens_details is None


def test_tools_reach_the_template(tool_client):
    plain = tool_client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=1, temperature=0)
    with_tools = tool_client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=1,
                                                     temperature=0, tools=TOOLS)
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 20
    # `tool_choice: none` keeps them out of the prompt.
    none = tool_client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=1, temperature=0,
                                               tools=TOOLS, tool_choice="none")
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens


def test_a_multi_turn_conversation_with_a_tool_result_renders_and_runs(tool_client):
    messages = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_abc", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "18 C and sunny"},
    ]
    r = tool_client.chat.completions.create(model=MODEL_ID, messages=messages, tools=TOOLS, max_tokens=8,
                                            temperature=0)
    shorter = tool_client.chat.completions.create(model=MODEL_ID, messages=QUESTION, tools=TOOLS, max_tokens=1,
                                                  temperature=0)
    assert r.usage.prompt_tokens > shorter.usage.prompt_tokens + 10
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # The assistant's answer goes back in as the next turn, reasoning included.
    message = r.choices[0].message.model_dump(exclude_none=True)
    again = tool_client.chat.completions.create(
        model=MODEL_ID, messages=messages + [message, {"role": "user", "content": "Thanks!"}],
        tools=TOOLS, max_tokens=4, temperature=0)
    assert again.usage.prompt_tokens > r.usage.prompt_tokens


# At temperature 0 the model answers this with a `<tool_call>` (inside what the template opened
# as reasoning, so reasoning is kept in the content for the tool parser to read it).
CALLING = dict(model=MODEL_ID, messages=[{"role": "user", "content": "Weather in Paris?"}], max_tokens=64,
               temperature=0, stop=["</tool_call>"], extra_body={"separate_reasoning": False})


def test_the_models_tool_call_is_parsed_alike_streamed_and_not(tool_client):
    sync = tool_client.chat.completions.create(tools=TOOLS, **CALLING)
    choice = sync.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    content, reasoning, calls, finish, _ = streamed(tool_client, tools=TOOLS, **CALLING)
    assert (content, reasoning, finish) == ("", "", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", call.function.arguments)]
    assert calls[0]["id"].startswith("call_")


def test_the_models_call_and_its_result_go_back_in_for_the_next_turn(tool_client):
    first = tool_client.chat.completions.create(tools=TOOLS, **CALLING)
    call = first.choices[0].message.tool_calls[0]
    messages = CALLING["messages"] + [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"},
    ]
    second = tool_client.chat.completions.create(model=MODEL_ID, messages=messages, tools=TOOLS, max_tokens=8,
                                                 temperature=0)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 20
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_a_legacy_function_call_is_answered_as_function_call(tool_client):
    r = tool_client.chat.completions.create(functions=[TOOLS[0]["function"]], **CALLING)
    choice = r.choices[0]
    assert choice.finish_reason == "function_call"
    assert choice.message.tool_calls is None
    assert choice.message.function_call.name == "get_weather"
    assert json.loads(choice.message.function_call.arguments) == {"city": "Paris"}


def test_legacy_functions_are_accepted_and_answered_in_their_shape(tool_client):
    r = tool_client.chat.completions.create(
        model=MODEL_ID, max_tokens=8, temperature=0,
        messages=QUESTION + [
            {"role": "assistant", "content": None,
             "function_call": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
            {"role": "function", "name": "get_weather", "content": "18 C"}],
        functions=[TOOLS[0]["function"]], function_call="auto")
    choice = r.choices[0]
    assert choice.message.tool_calls is None
    if choice.message.function_call is not None:
        assert choice.finish_reason in ("function_call", "length")
        assert choice.message.function_call.name
    else:
        assert choice.finish_reason in ("stop", "length")


def test_a_tool_choice_naming_an_unknown_function_is_a_400(tool_client):
    with pytest.raises(openai.BadRequestError) as err:
        tool_client.chat.completions.create(model=MODEL_ID, messages=QUESTION, tools=TOOLS, max_tokens=1,
                                            tool_choice={"type": "function", "function": {"name": "nope"}})
    assert err.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError) as err:
        tool_client.chat.completions.create(
            model=MODEL_ID, messages=QUESTION, max_tokens=1,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}])
    assert err.value.body["param"] == "tools[0].function.parameters.type"


def test_a_batch_line_reads_tool_calls_and_reasoning_like_a_sync_answer(tool_client):
    import time

    body = {"model": MODEL_ID, "tools": TOOLS, "messages": CALLING["messages"], "max_tokens": 64,
            "temperature": 0, "stop": ["</tool_call>"], "separate_reasoning": False}
    thinking = {"model": MODEL_ID, "messages": QUESTION, "max_tokens": 16, "temperature": 0}
    lines = [{"custom_id": name, "method": "POST", "url": "/v1/chat/completions", "body": b}
             for name, b in (("call", body), ("think", thinking))]
    content = ("\n".join(json.dumps(l) for l in lines) + "\n").encode()
    upload = tool_client.files.create(file=("tools.jsonl", content, "application/jsonl"), purpose="batch")
    batch = tool_client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                       completion_window="24h")
    deadline = time.time() + 240
    while batch.status not in ("completed", "failed", "expired", "cancelled") and time.time() < deadline:
        time.sleep(0.5)
        batch = tool_client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    out = {l["custom_id"]: l["response"]["body"]
           for l in map(json.loads, tool_client.files.content(batch.output_file_id).text.splitlines())}
    sync = tool_client.chat.completions.create(tools=TOOLS, **CALLING)
    choice = out["call"]["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert (call["function"]["name"], call["function"]["arguments"]) == \
        ("get_weather", sync.choices[0].message.tool_calls[0].function.arguments)
    think = out["think"]
    assert think["choices"][0]["message"]["reasoning_content"]
    assert think["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


# Forced calls (`tool_choice: "required"` or a named function) are enforced by a grammar, so
# even the tiny default model, whose own template knows nothing of tools, always calls a
# declared function with arguments valid against its schema.
FORCED_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 24},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Current time in a timezone",
        "parameters": {"type": "object", "properties": {
            "timezone": {"type": "string", "enum": ["UTC", "CET", "PST"]},
            "precise": {"type": "boolean"}},
            "required": ["timezone", "precise"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in FORCED_TOOLS}
ASK = [{"role": "user", "content": "What's the weather and the time in Paris?"}]


def assert_valid_calls(message, allowed):
    import jsonschema
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in allowed
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_and_named_tool_choices_always_produce_valid_calls_over_50_seeded_samples(client):
    from concurrent.futures import ThreadPoolExecutor

    def sample(seed):
        choice = "required" if seed % 2 == 0 else {"type": "function", "function": {"name": "get_time"}}
        r = client.chat.completions.create(
            model=MODEL_ID, messages=ASK, tools=FORCED_TOOLS, tool_choice=choice, parallel_tool_calls=False,
            temperature=0.8, seed=seed, max_tokens=96)
        return choice, r.choices[0]

    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(sample, range(50)))
    for choice, result in results:
        assert result.finish_reason == "tool_calls", result
        allowed = set(SCHEMAS) if choice == "required" else {"get_time"}
        assert_valid_calls(result.message, allowed)
        assert len(result.message.tool_calls) == 1, "parallel_tool_calls: false"


def test_a_forced_call_is_the_same_streamed_and_not_at_temperature_0(client):
    kwargs = dict(model=MODEL_ID, messages=ASK, tools=FORCED_TOOLS, tool_choice="required",
                  parallel_tool_calls=False, temperature=0, max_tokens=96)
    whole = client.chat.completions.create(**kwargs).choices[0]
    content, _, calls, finish, _ = streamed(client, **kwargs)
    assert finish == whole.finish_reason == "tool_calls"
    # Ids are per job; the calls themselves are the same.
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert_valid_calls(whole.message, set(SCHEMAS))


def test_forced_parallel_calls_are_each_valid(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=FORCED_TOOLS, tool_choice="required",
                                       temperature=0, max_tokens=200)
    message = r.choices[0].message
    assert_valid_calls(message, set(SCHEMAS))
    assert len({c.id for c in message.tool_calls}) == len(message.tool_calls)


def test_a_forced_legacy_function_call_is_valid(client):
    import jsonschema
    r = client.chat.completions.create(
        model=MODEL_ID, messages=ASK, temperature=0, max_tokens=96,
        functions=[t["function"] for t in FORCED_TOOLS], function_call={"name": "get_weather"})
    choice = r.choices[0]
    assert choice.finish_reason == "function_call"
    assert choice.message.function_call.name == "get_weather"
    jsonschema.validate(json.loads(choice.message.function_call.arguments), SCHEMAS["get_weather"])



# The case: a two-field function whose schema says nothing of other keys or of string
# lengths. Objects admit only the keys they name and JSON is compact, so the call ends.
OPEN_WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_a_forced_call_of_a_two_field_function_ends_within_60_tokens_for_10_seeds(client, choice):
    import jsonschema
    from concurrent.futures import ThreadPoolExecutor

    def sample(seed):
        return client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "What's the weather in Paris?"}],
            tools=OPEN_WEATHER, tool_choice=choice, parallel_tool_calls=False, temperature=1, seed=seed,
            max_tokens=60).choices[0]

    with ThreadPoolExecutor(5) as pool:
        results = list(pool.map(sample, range(10)))
    for result in results:
        assert result.finish_reason == "tool_calls", result
        calls = result.message.tool_calls
        assert len(calls) == 1, "a named tool_choice, or parallel_tool_calls: false, gives one call"
        for call in calls:
            assert call.function.name == "get_weather"
            arguments = json.loads(call.function.arguments)
            schema = dict(OPEN_WEATHER[0]["function"]["parameters"], additionalProperties=False)
            jsonschema.validate(arguments, schema)
