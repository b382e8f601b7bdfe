"""gpt-oss through the whole stack: a real runner serves the tiny random gpt-oss
(`gpu-runner/engine/tests/fixtures/tiny/gpt_oss_harmony/`, gpt_oss's layers behind a
vocabulary with o200k_harmony's special tokens and gpt-oss's real chat template), and the
official SDK reads OpenAI-shaped answers back.

Its text is babble (random weights), so these tests check what does not depend on the weights:
the runner reads harmony off the template, the template's prompt reaches the model, forced
calls are held by the grammar to harmony's call message on really sampled tokens (special
tokens included), `<|call|>` ends generation, and the api's harmony parser turns the raw text
into tool calls, reasoning and content without leaking harmony's markers.

A forced call lets the model reason first, and random weights never choose to stop reasoning:
unnudged, the tiny model babbles on the `analysis` channel until `max_tokens`. So forced calls
here raise `<|end|>` a little (`logit_bias` +2, `END_NUDGE`): the model writes a few tokens of
reasoning, ends the message, and the grammar alone holds the rest to one call message."""

import json

import httpx
import openai
import pytest

from conftest import ROOT, Stack

TINY = ROOT / "gpu-runner" / "engine" / "tests" / "fixtures" / "tiny"
GPT_OSS = "tiny-gpt-oss"
MARKERS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
           "<|return|>", "<|call|>"]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                          "celsius": {"type": "boolean"}},
           "required": ["city", "celsius"]}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather",
                                           "description": "The weather in a city.",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time",
                                           "description": "The time in a zone.",
                                           "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
END = 325  # `<|end|>` in the fixture's vocabulary (o200k_harmony's 200007)
END_NUDGE = {str(END): 2}
HARMONY_ANSWER = ('start: <|channel|> "analysis" <|message|> WORD <|end|> <|start|> "assistant" '
                  '<|channel|> "final" <|message|> WORD\nWORD: /[a-z]{1,8}/\n')


@pytest.fixture(scope="module")
def gpt_oss_stack():
    s = Stack("--model", f"{GPT_OSS}={TINY / 'gpt_oss_harmony'}").start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def gpt_oss(gpt_oss_stack):
    return openai.OpenAI(base_url=f"{gpt_oss_stack.base_url}/v1", api_key="unused",
                         max_retries=0, timeout=120)


def extra(obj, name):
    """A non-standard field of an SDK object (`reasoning_content`)."""
    return (getattr(obj, "model_extra", None) or {}).get(name)


def chat(client, **kw):
    kw.setdefault("messages", QUESTION)
    kw.setdefault("max_tokens", 256)
    return client.chat.completions.create(model=GPT_OSS, temperature=0, **kw)


def streamed(client, **kw):
    """A streamed request folded into (content, reasoning, calls, finish)."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in chat(client, stream=True, **kw):
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            reasoning += extra(delta, "reasoning_content") or ""
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": call.id, "name": None, "arguments": ""})
                entry["name"] = call.function.name or entry["name"]
                entry["arguments"] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, reasoning, [calls[i] for i in sorted(calls)], finish


def assert_follows(arguments: dict, schema: dict):
    """The few schema features used here: required keys, enums, booleans, no other keys."""
    assert set(arguments) == set(schema["properties"]), arguments
    for key, spec in schema["properties"].items():
        if "enum" in spec:
            assert arguments[key] in spec["enum"], arguments
        if spec["type"] == "boolean":
            assert isinstance(arguments[key], bool), arguments


def assert_no_markers(text):
    assert not any(m in (text or "") for m in MARKERS), text


def tokenize(stack, messages=QUESTION, **kw):
    r = httpx.post(f"{stack.base_url}/tokenize", timeout=60,
                   json={"model": GPT_OSS, "messages": messages, **kw})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def detokenize(stack, tokens):
    r = httpx.post(f"{stack.base_url}/detokenize", timeout=60,
                   json={"model": GPT_OSS, "tokens": tokens})
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def forced(client, tool_choice, stream=False):
    kw = dict(tools=TOOLS, tool_choice=tool_choice, logit_bias=END_NUDGE)
    return streamed(client, **kw) if stream else chat(client, **kw)


def named(name):
    return {"type": "function", "function": {"name": name}}


def test_the_runner_reads_harmony_off_gpt_oss_template(gpt_oss_stack):
    runners = httpx.get(f"{gpt_oss_stack.base_url}/admin/runners", timeout=30).json()["data"]
    models = {m["id"]: m for r in runners for m in r["models"]}
    assert models[GPT_OSS]["tool_parser"] == "harmony"
    assert models[GPT_OSS]["reasoning_parser"] == "harmony"


def test_the_fixture_has_harmony_special_tokens_where_the_test_expects(gpt_oss_stack):
    assert detokenize(gpt_oss_stack, [END]) == "<|end|>"


def test_a_named_function_is_called_with_arguments_that_follow_its_schema(gpt_oss):
    choice = forced(gpt_oss, named("get_time")).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_time"
    assert_follows(json.loads(call.function.arguments), TIME)
    # The analysis message before the call is the reasoning, its markers stripped.
    reasoning = extra(choice.message, "reasoning_content")
    assert reasoning, choice.message
    assert_no_markers(reasoning)
    assert_no_markers(choice.message.content)


def test_a_streamed_forced_call_reassembles_to_the_unstreamed_one(gpt_oss):
    message = forced(gpt_oss, named("get_weather")).choices[0].message
    content, reasoning, calls, finish = forced(gpt_oss, named("get_weather"), stream=True)
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c.function.name, c.function.arguments) for c in message.tool_calls]
    assert calls[0]["name"] == "get_weather"
    assert_follows(json.loads(calls[0]["arguments"]), WEATHER)
    assert reasoning == (extra(message, "reasoning_content") or "")
    assert content == (message.content or "")


def test_required_calls_one_of_the_offered_functions(gpt_oss):
    choice = forced(gpt_oss, "required").choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    assert_follows(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    _, _, calls, finish = forced(gpt_oss, "required", stream=True)
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (call.function.name, call.function.arguments)]


def test_a_plain_answer_leaks_no_harmony_markers(gpt_oss):
    r = chat(gpt_oss, max_tokens=48)
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens > 0
    message = choice.message
    reasoning = extra(message, "reasoning_content")
    assert message.content is not None or reasoning is not None
    assert_no_markers(message.content)
    assert_no_markers(reasoning)
    assert not message.tool_calls


def test_an_answer_in_harmony_messages_splits_into_reasoning_and_content(gpt_oss):
    # The grammar holds the babble to harmony's shape: an analysis message, then the final
    # one, markers sampled as the special tokens they are, `<|return|>` ending it.
    shape = {"ebnf": HARMONY_ANSWER}
    r = chat(gpt_oss, extra_body=shape)
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice
    reasoning = extra(choice.message, "reasoning_content")
    assert reasoning.isalpha() and choice.message.content.isalpha(), choice.message
    assert 0 < r.usage.completion_tokens_details.reasoning_tokens < r.usage.completion_tokens
    assert streamed(gpt_oss, extra_body=shape) == (choice.message.content, reasoning, [], "stop")
    # Unsplit, the raw harmony text comes back, markers and all.
    raw = chat(gpt_oss, extra_body={**shape, "separate_reasoning": False}).choices[0].message
    assert raw.content == (f"<|channel|>analysis<|message|>{reasoning}<|end|>"
                           f"<|start|>assistant<|channel|>final<|message|>{choice.message.content}")


def test_the_prompt_is_harmony_and_the_reasoning_effort_reaches_it(gpt_oss, gpt_oss_stack):
    # The fixture's BPE spells "low", "medium" and "high" in 2, 3 and 4 tokens, so each
    # effort's prompt has a length of its own, and a chat's prompt_tokens tells which it got.
    prompts, lengths = {}, {}
    for effort in ("low", "medium", "high"):
        tokens = tokenize(gpt_oss_stack, chat_template_kwargs={"reasoning_effort": effort})
        prompts[effort] = detokenize(gpt_oss_stack, tokens)
        assert f"\n\nReasoning: {effort}\n\n" in prompts[effort]
        lengths[effort] = len(tokens)
    assert len(set(lengths.values())) == 3, lengths
    for effort in ("low", "high"):
        r = chat(gpt_oss, max_tokens=4, reasoning_effort=effort)
        assert r.usage.prompt_tokens == lengths[effort]
    # No effort: the template's default, medium.
    assert chat(gpt_oss, max_tokens=4).usage.prompt_tokens == lengths["medium"]
    assert prompts["low"].startswith("<|start|>system<|message|>")
    assert prompts["low"].endswith("<|start|>user<|message|>What is the weather in Paris?"
                                   "<|end|><|start|>assistant")


def test_a_json_schema_response_format_gives_parseable_json_content(gpt_oss):
    r = chat(gpt_oss, response_format={"type": "json_schema", "json_schema": {
        "name": "weather", "schema": WEATHER, "strict": True}})
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice
    assert_follows(json.loads(choice.message.content), WEATHER)


def test_an_earlier_call_and_its_result_go_back_to_the_model_as_harmony(gpt_oss, gpt_oss_stack):
    [call] = forced(gpt_oss, named("get_time")).choices[0].message.tool_calls
    messages = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"time": "12:00"}'},
    ]
    prompt = detokenize(gpt_oss_stack, tokenize(gpt_oss_stack, messages))
    # As gpt-oss's own template writes them: the recipient before the channel, the result
    # as a JSON string.
    assert ("<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>"
            f"{call.function.arguments}<|call|>") in prompt, prompt
    assert ('<|start|>functions.get_time to=assistant<|channel|>commentary<|message|>'
            '"{\\"time\\": \\"12:00\\"}"<|end|>') in prompt, prompt
    r = chat(gpt_oss, messages=messages, tools=TOOLS, max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_a_function_without_a_description_is_offered_too(gpt_oss):
    # gpt-oss's template writes `"// " + tool.description`; OpenAI makes it optional.
    bare = [{"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
    choice = chat(gpt_oss, tools=bare, tool_choice=named("get_time"),
                  logit_bias=END_NUDGE).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert_follows(json.loads(choice.message.tool_calls[0].function.arguments), TIME)
