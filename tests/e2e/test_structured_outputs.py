"""Structured outputs through the official SDK: `response_format` (json_object, json_schema),
SGLang's `regex`, `ebnf` and `stop_regex`, on the default model with real sampling."""

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from conftest import MODEL_ID

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "address", "tags"],
    "additionalProperties": False,
}

PERSON_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True},
}

ASK_PERSON = [{"role": "user", "content": "Describe a fictional person as JSON."}]


def test_json_schema_outputs_validate_on_fifty_seeded_samples(client):
    # Seeds 0..49: choice i of a request seeded s samples with seed s + i.
    def batch(seed):
        return client.chat.completions.create(
            model=MODEL_ID, messages=ASK_PERSON, response_format=PERSON_FORMAT,
            temperature=0.8, seed=seed, n=10, max_tokens=120)

    with ThreadPoolExecutor(max_workers=5) as pool:
        responses = list(pool.map(batch, range(0, 50, 10)))
    choices = [c for r in responses for c in r.choices]
    assert len(choices) == 50
    for choice in choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), PERSON_SCHEMA)
    assert len({c.message.content for c in choices}) > 10, "samples differ"


def test_json_object_outputs_parse_as_objects(client):
    r = client.chat.completions.create(
        model=MODEL_ID, response_format={"type": "json_object"}, temperature=0.8, seed=1, n=8,
        max_tokens=160,
        messages=[{"role": "user", "content": "Give a JSON object with a title and a year."}])
    stopped = [c for c in r.choices if c.finish_reason == "stop"]
    assert len(stopped) >= 4, [c.message.content for c in r.choices]
    for choice in stopped:
        assert isinstance(json.loads(choice.message.content), dict), choice.message.content


def test_regex_outputs_match_the_whole_pattern(client):
    pattern = r"(yes|no), [0-9]{1,3} [a-z]{1,10}"
    r = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Is the sea blue?"}],
        temperature=0.8, seed=3, n=8, max_tokens=40, extra_body={"regex": pattern})
    for choice in r.choices:
        assert choice.finish_reason == "stop"
        assert re.fullmatch(pattern, choice.message.content), choice.message.content


def test_an_ebnf_grammar_constrains_the_output(client):
    grammar = 'root ::= answer "!"\nanswer ::= "yes" | "no" | "maybe"\n'
    r = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Is the sea blue?"}],
        temperature=0.8, seed=5, n=4, max_tokens=10, extra_body={"ebnf": grammar})
    for choice in r.choices:
        assert choice.message.content in ("yes!", "no!", "maybe!")
        assert choice.finish_reason == "stop"


def test_max_tokens_cuts_constrained_output_with_length(client):
    r = client.chat.completions.create(
        model=MODEL_ID, messages=ASK_PERSON, response_format=PERSON_FORMAT, temperature=0,
        max_tokens=5)
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    assert r.usage.completion_tokens == 5
    assert choice.message.content.startswith('{"')


def test_streamed_constrained_output_equals_the_sync_output_at_temperature_zero(client):
    sync = client.chat.completions.create(
        model=MODEL_ID, messages=ASK_PERSON, response_format=PERSON_FORMAT, temperature=0,
        max_tokens=120)
    stream = client.chat.completions.create(
        model=MODEL_ID, messages=ASK_PERSON, response_format=PERSON_FORMAT, temperature=0,
        max_tokens=120, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == sync.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == sync.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), PERSON_SCHEMA)


def test_stop_regex_ends_the_choice_before_the_match(client):
    r = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Write a short poem about the ocean."}],
        temperature=0, max_tokens=64, extra_body={"stop_regex": [r"[.,]"]})
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert "." not in choice.message.content and "," not in choice.message.content


def bad_request(client, **kwargs) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL_ID, messages=ASK_PERSON, max_tokens=4, **kwargs)
    assert e.value.type == "invalid_request_error"
    return e.value


def test_an_unsupported_schema_feature_is_a_400_naming_it(client):
    schema = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    err = bad_request(client, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}})
    assert err.param == "response_format"
    assert err.code == "unsupported_schema_feature"
    assert "uniqueItems" in err.message


def test_a_bad_regex_or_grammar_is_a_400_naming_the_parameter(client):
    err = bad_request(client, extra_body={"regex": "(unclosed"})
    assert (err.param, err.code) == ("regex", "invalid_regex")
    err = bad_request(client, extra_body={"ebnf": "root ::= undefined-rule"})
    assert (err.param, err.code) == ("ebnf", "invalid_grammar")
    err = bad_request(client, extra_body={"stop_regex": "(bad"})
    assert err.param == "stop_regex"


def test_two_constraints_at_once_are_a_400(client):
    err = bad_request(client, response_format={"type": "json_object"}, extra_body={"regex": "a+"})
    assert (err.param, err.code) == ("regex", "conflicting_constraints")
