"""The official OpenAI SDK against a real Fallow stack: real jobs, real tokens."""

import openai
import pytest

from conftest import MODEL_ID

QUESTION = [{"role": "user", "content": "Write a short poem about the ocean."}]
# What llama.cpp's greedy decoding of the default model says (gpu-runner/engine/tests/fixtures/smollm2_logits.json).
OCEAN_START = "In the depths of the ocean, where shadows play"


def test_a_sync_chat_completion_returns_real_text_and_usage(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=24, temperature=0)
    assert r.id.startswith("chatcmpl-")
    assert r.object == "chat.completion"
    assert r.model == MODEL_ID
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content.startswith(OCEAN_START)
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 5
    assert r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streamed_chunks_concatenate_to_the_sync_text_at_temperature_zero(client):
    sync = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=32, temperature=0)
    stream = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=32,
                                            temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == sync.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == sync.choices[0].finish_reason
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_include_usage_adds_a_final_chunk_with_usage_and_no_choices(client):
    stream = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=8, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    last = chunks[-1]
    assert last.choices == []
    assert last.usage.completion_tokens == 8
    assert last.usage.total_tokens == last.usage.prompt_tokens + 8
    assert all(c.usage is None for c in chunks[:-1])


def test_a_multi_turn_conversation_continues_like_llama_cpp(client):
    messages = [
        {"role": "user", "content": "Hi! My name is Ada."},
        {"role": "assistant", "content": "Hello Ada! How can I help you today?"},
        {"role": "user", "content": "What is my name, and what is 17 * 3?"},
    ]
    r = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=16, temperature=0)
    assert r.choices[0].message.content.startswith("I'm glad you're interested in learning about")


def test_n_two_returns_two_choices(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=8, temperature=1.0,
                                       seed=7, n=2)
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.message.content for c in r.choices)
    assert r.usage.completion_tokens == 16


def test_a_stop_string_ends_the_text_before_it(client):
    base = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=24, temperature=0)
    text = base.choices[0].message.content
    assert "shadows" in text
    r = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=24, temperature=0,
                                       stop=["shadows"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == text.split("shadows")[0]


def test_max_tokens_ends_with_finish_reason_length(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3


def test_an_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=QUESTION)
    assert e.value.body["code"] == "model_not_found"


def test_a_malformed_body_is_a_bad_request_naming_the_param(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL_ID, messages=QUESTION, temperature=7)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL_ID, messages=[])
    assert e.value.body["param"] == "messages"


def test_the_models_endpoint_lists_the_served_model(client):
    ids = [m.id for m in client.models.list().data]
    assert MODEL_ID in ids
    assert client.models.retrieve(MODEL_ID).id == MODEL_ID
