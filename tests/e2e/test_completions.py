"""The legacy completions API, /tokenize and /detokenize, and the SGLang request extras,
with the official `openai` SDK (and httpx for the non-OpenAI routes) against a real stack."""

import httpx
import openai
import pytest

from conftest import MODEL_ID

PROMPT = "The capital of France is"


def test_a_string_prompt_completes_without_the_chat_template(client):
    r = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=8, temperature=0)
    assert r.id.startswith("cmpl-")
    assert r.object == "text_completion"
    assert len(r.choices) == 1
    assert r.choices[0].text
    assert r.choices[0].finish_reason in ("stop", "length")
    # A raw prompt is a handful of tokens; the chat template would add dozens.
    assert 0 < r.usage.prompt_tokens < 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_max_tokens_defaults_to_sixteen(client):
    r = client.completions.create(model=MODEL_ID, prompt="Once upon a time", temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16
    assert r.choices[0].finish_reason == "length"


def test_token_id_prompts_answer_like_their_text(client, stack):
    tokens = httpx.post(f"{stack.base_url}/tokenize", json={"model": MODEL_ID, "prompt": PROMPT}).json()["tokens"]
    by_text = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=8, temperature=0)
    by_ids = client.completions.create(model=MODEL_ID, prompt=tokens, max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(tokens)
    nested = client.completions.create(model=MODEL_ID, prompt=[tokens, tokens], max_tokens=8, temperature=0)
    assert [c.text for c in nested.choices] == [by_text.choices[0].text] * 2


def test_a_list_of_prompts_numbers_choices_prompt_major_then_n(client):
    prompts = ["One, two, three,", "The sky is"]
    singles = [client.completions.create(model=MODEL_ID, prompt=p, max_tokens=6, temperature=0).choices[0].text
               for p in prompts]
    r = client.completions.create(model=MODEL_ID, prompt=prompts, n=2, max_tokens=6, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == [singles[0], singles[0], singles[1], singles[1]]


def test_echo_prepends_the_prompt(client):
    r = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=4, temperature=0, echo=True)
    plain = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=4, temperature=0)
    assert r.choices[0].text == PROMPT + plain.choices[0].text


def test_integer_logprobs_come_in_the_legacy_shape(client):
    r = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=5, temperature=0,
                                  logprobs=3, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[0] == 0
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0
        assert 3 <= len(top) <= 4 and token in top
        # Greedy: the sampled token is the most likely one.
        assert top[token] == pytest.approx(max(top.values()), abs=1e-4)


def test_a_stream_concatenates_to_the_sync_text_at_temperature_zero(client):
    sync = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=12, temperature=0)
    chunks = list(client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "text_completion" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == sync.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [sync.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == sync.usage.completion_tokens


def test_a_streamed_list_of_prompts_with_n_keeps_every_choice_apart(client):
    prompts = ["One, two, three,", "The sky is"]
    sync = client.completions.create(model=MODEL_ID, prompt=prompts, n=2, max_tokens=6, temperature=0)
    texts = {}
    for chunk in client.completions.create(model=MODEL_ID, prompt=prompts, n=2, max_tokens=6,
                                           temperature=0, stream=True, echo=True):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {c.index: prompts[c.index // 2] + c.text for c in sync.choices}


def test_suffix_is_refused(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL_ID, prompt=PROMPT, suffix="!", max_tokens=4)
    assert e.value.body["param"] == "suffix"


def test_an_out_of_vocabulary_token_id_is_a_clear_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL_ID, prompt=[1, 10_000_000], max_tokens=4)
    assert "vocabulary" in e.value.message


def test_constraints_apply_to_completions_too(client):
    r = client.completions.create(model=MODEL_ID, prompt="My favourite number is", max_tokens=8,
                                  extra_body={"regex": "[0-9]{3}"})
    assert len(r.choices[0].text) == 3 and r.choices[0].text.isdigit()


def test_tokenize_then_detokenize_round_trips(stack):
    base = stack.base_url
    t = httpx.post(f"{base}/tokenize", json={"model": MODEL_ID, "prompt": "Hello, world! Ünïcode."}).json()
    assert t["count"] == len(t["tokens"]) > 0
    assert t["max_model_len"] > 0
    d = httpx.post(f"{base}/detokenize", json={"model": MODEL_ID, "tokens": t["tokens"]}).json()
    assert d["prompt"] == "Hello, world! Ünïcode."


def test_tokenized_messages_count_what_chat_usage_counts(client, stack):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    t = httpx.post(f"{stack.base_url}/tokenize", json={"model": MODEL_ID, "messages": messages}).json()
    r = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=2)
    assert t["count"] == r.usage.prompt_tokens


def test_tokenize_of_an_unknown_model_is_404(stack):
    r = httpx.post(f"{stack.base_url}/tokenize", json={"model": "nope", "prompt": "x"})
    assert r.status_code == 404


def test_no_stop_trim_keeps_the_matched_stop_string(client):
    plain = client.completions.create(model=MODEL_ID, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0,
                                      stop=["6"])
    kept = client.completions.create(model=MODEL_ID, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0,
                                     stop=["6"], extra_body={"no_stop_trim": True})
    assert plain.choices[0].finish_reason == "stop"
    assert kept.choices[0].text == plain.choices[0].text + "6"
    assert kept.choices[0].model_extra.get("matched_stop") == "6"


def test_chat_choices_report_the_matched_stop(client):
    r = client.chat.completions.create(model=MODEL_ID, temperature=0, max_tokens=40, stop=[","],
                                       messages=[{"role": "user", "content": "List three fruits, comma separated."}])
    if r.choices[0].finish_reason == "stop" and r.choices[0].model_extra.get("matched_stop") is not None:
        assert r.choices[0].model_extra["matched_stop"] in (",", 2)


def test_continue_final_message_continues_the_assistant_turn(client):
    messages = [{"role": "user", "content": "Write a short poem about the ocean."},
                {"role": "assistant", "content": "In the depths of the ocean"}]
    r = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=8, temperature=0,
                                       extra_body={"continue_final_message": True, "add_generation_prompt": False})
    text = r.choices[0].message.content
    # A continuation, not a new turn: it does not start over with the poem's opening.
    assert text and not text.startswith("In the depths")


def test_an_image_content_part_is_a_400_naming_the_part(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL_ID, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}}]}])
    assert e.value.body["param"] == "messages[0].content[1]"
    assert "image_url" in e.value.message


def test_a_batch_of_completions_lines_answers_text_completions(client):
    import json
    import time
    lines = [json.dumps({"custom_id": f"c-{i}", "method": "POST", "url": "/v1/completions",
                         "body": {"model": MODEL_ID, "prompt": f"Count to {i}:", "max_tokens": 4,
                                  "temperature": 0, "logprobs": 1}}) for i in range(3)]
    f = client.files.create(file=("c.jsonl", ("\n".join(lines) + "\n").encode(), "application/jsonl"),
                            purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="24h")
    deadline = time.time() + 120
    while batch.status not in {"completed", "failed", "expired", "cancelled"} and time.time() < deadline:
        time.sleep(0.5)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    out = [json.loads(l) for l in client.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(l["custom_id"] for l in out) == ["c-0", "c-1", "c-2"]
    for line in out:
        body = line["response"]["body"]
        assert body["object"] == "text_completion"
        assert body["id"].startswith("cmpl-")
        assert len(body["choices"][0]["logprobs"]["tokens"]) == body["usage"]["completion_tokens"]


def test_cached_token_details_come_only_when_asked(client):
    messages = [{"role": "user", "content": "Say hi."}]
    plain = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=2)
    assert plain.usage.prompt_tokens_details.cached_tokens >= 0
    assert "sglext" not in (plain.model_extra or {})
    asked = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=2,
                                           extra_body={"return_cached_tokens_details": True})
    details = asked.model_extra["sglext"]["cached_tokens_details"]
    # The same prompt again: its prefix is in the device's cache.
    assert details["device"] == asked.usage.prompt_tokens_details.cached_tokens > 0
    assert details["host"] == details["storage"] == 0


def test_no_stop_trim_works_for_chat_too(client):
    messages = [{"role": "user", "content": "Count from 1 to 9, comma separated."}]
    plain = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=30, temperature=0,
                                           stop=["5"])
    kept = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=30, temperature=0,
                                          stop=["5"], extra_body={"no_stop_trim": True})
    if plain.choices[0].finish_reason == "stop":
        assert kept.choices[0].message.content == plain.choices[0].message.content + "5"
        assert kept.choices[0].model_extra.get("matched_stop") == "5"


def test_continue_final_message_renders_the_open_assistant_turn(stack):
    base = stack.base_url
    messages = [{"role": "user", "content": "Write a short poem about the ocean."},
                {"role": "assistant", "content": "In the depths of the ocean"}]
    t = httpx.post(f"{base}/tokenize", json={"model": MODEL_ID, "messages": messages,
                                             "continue_final_message": True}).json()
    text = httpx.post(f"{base}/detokenize", json={"model": MODEL_ID, "tokens": t["tokens"]}).json()["prompt"]
    # The prompt ends inside the assistant's message: no end-of-turn, no new turn.
    assert text.endswith("In the depths of the ocean")
    closed = httpx.post(f"{base}/tokenize", json={"model": MODEL_ID, "messages": messages,
                                                  "add_generation_prompt": False}).json()
    assert closed["count"] > t["count"]


def test_echo_of_a_token_prompt_is_its_text(client, stack):
    tokens = httpx.post(f"{stack.base_url}/tokenize", json={"model": MODEL_ID, "prompt": PROMPT}).json()["tokens"]
    sync = client.completions.create(model=MODEL_ID, prompt=tokens, max_tokens=4, temperature=0, echo=True)
    assert sync.choices[0].text.startswith(PROMPT)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL_ID, prompt=tokens, max_tokens=4, temperature=0, echo=True, stream=True) if c.choices)
    assert streamed == sync.choices[0].text


def test_streamed_logprobs_cover_the_streamed_text(client):
    chunks = list(client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=6, temperature=0,
                                            logprobs=2, stream=True, extra_body={"ignore_eos": True}))
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    offsets = [o for c in chunks if c.choices and c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert "".join(tokens) == text and len(tokens) == 6
    assert offsets == sorted(offsets) and offsets[0] == 0


def test_return_hidden_states_gives_each_choice_its_last_state_streamed_or_not(client):
    messages = [{"role": "user", "content": "Say hi."}]
    asked = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=4, temperature=0,
                                           n=2, extra_body={"return_hidden_states": True})
    states = [choice.model_extra["hidden_states"] for choice in asked.choices]
    assert all(len(state) == 576 for state in states), "SmolLM2-135M's hidden size"
    assert states[0] == states[1], "two greedy choices end in the same state"
    plain = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=4, temperature=0)
    assert "hidden_states" not in plain.choices[0].model_extra

    stream = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=4, temperature=0,
                                            stream=True, extra_body={"return_hidden_states": True})
    chunks = list(stream)
    carried = [c for c in chunks if c.choices and (c.choices[0].delta.model_extra or {}).get("hidden_states")]
    assert len(carried) == 1, "one chunk carries the choice's state"
    finished = next(i for i, c in enumerate(chunks) if c.choices and c.choices[0].finish_reason)
    assert chunks.index(carried[0]) > finished, "after the choice finished"
    streamed = carried[0].choices[0].delta.model_extra["hidden_states"]
    assert max(abs(a - b) for a, b in zip(streamed, states[0])) < 1e-3

    text = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=3, temperature=0,
                                     extra_body={"return_hidden_states": True})
    assert len(text.choices[0].model_extra["hidden_states"]) == 576
