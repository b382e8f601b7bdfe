"""The Responses API (`/v1/responses`) through the official `openai` SDK against a real stack:
plain and itemised input, the stream helper, background responses polled and resumed on a
second api process, cancellation, `previous_response_id`, function tools, JSON schema output
and a batch on `/v1/responses`."""

import json
import subprocess
import time

import jsonschema
import openai
import pytest

from conftest import FALLOW, MODEL_ID, ROOT, Stack, free_port, stop_process, wait_for
from test_tools_reasoning import TEMPLATE

BRIEF = {"max_output_tokens": 24, "temperature": 0}


@pytest.fixture(scope="module")
def second_api(stack):
    """Another `fallow api` process on the same database and Redis: it holds no job of its own,
    so whatever it answers for a job it reads from Postgres and the job's stream."""
    port = free_port()
    log = open(ROOT / "target" / f"e2e-{stack.database}-api2-{port}.log", "w")
    proc = subprocess.Popen([FALLOW, "api", "--no-auth", "--listen", f"127.0.0.1:{port}",
                             "--database-url", stack.database_url, "--redis-url", stack.redis_url],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0,
                           timeout=120)

    def ready():
        try:
            return bool(client.models.list().data)
        except openai.APIError:
            return False
    wait_for(ready, timeout=60)
    yield client
    stop_process(proc)


def test_a_string_input_gets_a_completed_response(client):
    response = client.responses.create(model=MODEL_ID, input="Say hello.", **BRIEF)
    assert response.id.startswith("resp_")
    assert response.object == "response"
    assert response.status in ("completed", "incomplete")
    assert response.output[0].type == "message"
    assert response.output_text
    assert response.usage.input_tokens > 0
    assert response.usage.output_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert client.responses.retrieve(response.id).output_text == response.output_text


def test_items_and_instructions_are_read_as_a_conversation(client):
    response = client.responses.create(
        model=MODEL_ID,
        instructions="You answer in one word.",
        input=[
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Blue."}]},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "Another one."}]},
        ],
        **BRIEF,
    )
    assert response.output_text
    assert response.instructions == "You answer in one word."
    items = client.responses.input_items.list(response.id, order="asc")
    assert [i.role for i in items.data] == ["user", "assistant", "user"]


def test_the_stream_helper_reads_ordered_events_equal_to_the_plain_answer(client):
    ask = {"model": MODEL_ID, "input": "Say hi.", "max_output_tokens": 400, "temperature": 0}
    plain = client.responses.create(**ask)
    assert plain.status == "completed", "the model did not stop within max_output_tokens"
    with client.responses.stream(**ask) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[0] == "response.created"
    assert types[1] == "response.in_progress"
    assert types[-1] == "response.completed"
    assert types.index("response.output_item.added") < types.index("response.output_text.delta")
    assert types.index("response.output_text.done") < types.index("response.output_item.done")
    numbers = [e.sequence_number for e in events]
    assert all(a < b for a, b in zip(numbers, numbers[1:])), numbers
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == plain.output_text
    assert final.output_text == plain.output_text


def test_a_background_response_is_polled_and_resumed_on_another_api(client, second_api):
    queued = client.responses.create(model=MODEL_ID, input="Tell me a short story.",
                                     background=True, max_output_tokens=32, temperature=0)
    assert queued.status in ("queued", "in_progress")
    assert queued.background is True

    def finished():
        r = second_api.responses.retrieve(queued.id)
        return r if r.status not in ("queued", "in_progress") else None
    done = wait_for(finished, timeout=120, every=0.2)
    assert done.output_text

    everything = list(second_api.responses.retrieve(queued.id, stream=True))
    numbers = [e.sequence_number for e in everything]
    assert numbers == list(range(len(numbers)))
    assert everything[-1].type in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in everything if e.type == "response.output_text.delta")
    assert text == done.output_text

    resumed = list(client.responses.retrieve(queued.id, stream=True, starting_after=3))
    assert [e.sequence_number for e in resumed] == numbers[4:]
    assert [e.type for e in resumed] == [e.type for e in everything[4:]]


def test_a_background_response_can_be_cancelled(client):
    queued = client.responses.create(model=MODEL_ID, input="Write a very long essay.",
                                     background=True, max_output_tokens=2000)
    cancelled = client.responses.cancel(queued.id)
    assert cancelled.status in ("cancelled", "completed", "incomplete")
    later = client.responses.retrieve(queued.id)
    assert later.status == cancelled.status or later.status == "cancelled"


def test_previous_response_id_carries_two_turns(client):
    first = client.responses.create(model=MODEL_ID, input="My name is Ada.", store=True, **BRIEF)
    second = client.responses.create(model=MODEL_ID, input="What did I say?",
                                     previous_response_id=first.id, **BRIEF)
    third = client.responses.create(model=MODEL_ID, input="Once more.",
                                    previous_response_id=second.id, **BRIEF)
    assert third.previous_response_id == second.id
    assert third.output_text
    # The third turn was shown both earlier turns: its prompt is longer than the second's.
    assert third.usage.input_tokens > second.usage.input_tokens > first.usage.input_tokens


def test_an_unstored_response_is_not_found(client):
    response = client.responses.create(model=MODEL_ID, input="hi", store=False, **BRIEF)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL_ID, input="again", previous_response_id=response.id)
    assert err.value.body["param"] == "previous_response_id"


def test_unsupported_tools_and_includes_are_refused_with_their_param(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL_ID, input="hi", tools=[{"type": "web_search"}])
    assert err.value.body["param"] == "tools[0].type"
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL_ID, input="hi",
                                include=["reasoning.encrypted_content"])
    assert err.value.body["param"] == "include[0]"


WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"], "additionalProperties": False},
           "strict": True}


@pytest.fixture(scope="module")
def tool_client():
    """A stack whose chat template renders tools, calls and tool results (and reasoning)."""
    stack = Stack("--chat-template", str(TEMPLATE)).start()
    try:
        yield openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="x", max_retries=0, timeout=120)
    finally:
        stack.stop()


def test_a_function_call_round_trips(tool_client):
    client = tool_client
    first = client.responses.create(model=MODEL_ID, input="What is the weather in Paris?",
                                    tools=[WEATHER], tool_choice="required", max_output_tokens=64,
                                    temperature=0, reasoning={"effort": "none"})
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls, first.output
    call = calls[0]
    assert call.name == "get_weather"
    assert "city" in json.loads(call.arguments)
    second = client.responses.create(
        model=MODEL_ID, previous_response_id=first.id, tools=[WEATHER], **BRIEF,
        reasoning={"effort": "none"},
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21C"}],
    )
    assert second.status in ("completed", "incomplete")
    assert second.output_text


def test_a_json_schema_format_is_obeyed(client):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer", "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    response = client.responses.create(
        model=MODEL_ID, input="Invent a person.", max_output_tokens=200, temperature=0,
        text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}},
    )
    jsonschema.validate(json.loads(response.output_text), schema)
    assert response.text.format.type == "json_schema"


def test_a_batch_on_v1_responses_answers_response_objects(client):
    lines = [json.dumps({"custom_id": f"r-{i}", "method": "POST", "url": "/v1/responses",
                         "body": {"model": MODEL_ID, "input": f"Count to {i}.",
                                  "max_output_tokens": 8, "temperature": 0}})
             for i in range(3)]
    file = client.files.create(file=("in.jsonl", ("\n".join(lines) + "\n").encode(),
                                     "application/jsonl"), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/responses",
                                  completion_window="24h")
    deadline = time.time() + 240
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.time() < deadline, batch
        time.sleep(0.5)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    out = [json.loads(l) for l in client.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(l["custom_id"] for l in out) == ["r-0", "r-1", "r-2"]
    for line in out:
        body = line["response"]["body"]
        assert line["response"]["status_code"] == 200
        assert body["object"] == "response"
        assert body["output"][0]["content"][0]["type"] == "output_text"
