"""Mixture-of-experts models served through the whole stack with the same API as the dense
ones: the tiny random Qwen3-MoE GGUF (converted by llama.cpp's own converter) and the tiny
Mixtral HF checkpoint, from gpu-runner/engine/tests/fixtures/tiny/. Their text is babble
(random weights); what matters is that real routed tokens come back, streamed and not, and
that a step batching many requests routes each as if it ran alone."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import ROOT, Stack

TINY = ROOT / "gpu-runner" / "engine" / "tests" / "fixtures" / "tiny"
QWEN3_MOE = "tiny-qwen3-moe"
MIXTRAL = "tiny-mixtral"
PROMPTS = [f"Tell me about the number {i}." for i in range(8)]


@pytest.fixture(scope="module")
def moe_stack():
    s = Stack("--model", f"{QWEN3_MOE}={TINY / 'qwen3_moe' / 'model.q8_0.gguf'}",
              "--model", f"{MIXTRAL}={TINY / 'mixtral'}").start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def moe_client(moe_stack):
    from openai import OpenAI
    return OpenAI(base_url=f"{moe_stack.base_url}/v1", api_key="unused", max_retries=0,
                  timeout=120)


def chat(client, model, prompt, **kw):
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], temperature=0,
        max_tokens=12, **kw)


def test_both_moe_models_are_listed(moe_client):
    ids = {m.id for m in moe_client.models.list().data}
    assert {QWEN3_MOE, MIXTRAL} <= ids


@pytest.mark.parametrize("model", [QWEN3_MOE, MIXTRAL])
def test_a_moe_model_answers_a_chat_completion_with_real_tokens(moe_client, model):
    r = chat(moe_client, model, "Hello there")
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.completion_tokens > 0
    assert r.usage.prompt_tokens > 3
    assert r.model == model


@pytest.mark.parametrize("model", [QWEN3_MOE, MIXTRAL])
def test_streamed_greedy_text_equals_the_unstreamed_answer(moe_client, model):
    whole = chat(moe_client, model, PROMPTS[0]).choices[0].message.content
    parts = []
    for chunk in chat(moe_client, model, PROMPTS[0], stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    assert "".join(parts) == whole


def test_concurrent_requests_batched_together_answer_as_each_does_alone(moe_client):
    # Each step groups the batch's tokens by expert: a token's result must not depend on
    # which other requests share its step.
    alone = [chat(moe_client, QWEN3_MOE, p).choices[0].message.content for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(
            lambda p: chat(moe_client, QWEN3_MOE, p).choices[0].message.content, PROMPTS))
    assert together == alone
    assert len(set(alone)) > 1, "different prompts should route to different answers"


def decode_routes(encoded):
    """SGLang's `routed_experts`: base64 of little-endian int32 ids."""
    import base64
    import struct
    raw = base64.b64decode(encoded)
    return list(struct.unpack(f"<{len(raw) // 4}i", raw))


def test_routed_experts_of_a_token_prompt_are_those_transformers_chooses(moe_client):
    import json
    reference = json.loads((TINY / "mixtral" / "reference.json").read_text())
    tokens = reference["sequences"][0]
    r = moe_client.completions.create(model=MIXTRAL, prompt=tokens, max_tokens=1,
                                      temperature=0,
                                      extra_body={"return_routed_experts": True})
    # One generated token: every prompt position ran, the new token did not.
    want = [e for pos in reference["routed_experts"][0] for layer in pos for e in layer]
    assert decode_routes(r.model_extra["sglext"]["routed_experts"]) == want


def test_a_chat_answer_carries_the_routes_of_every_position_it_ran(moe_client):
    r = chat(moe_client, QWEN3_MOE, PROMPTS[1], extra_body={"return_routed_experts": True})
    routes = decode_routes(r.model_extra["sglext"]["routed_experts"])
    layers, top_k, experts = 2, 2, 8
    positions = r.usage.prompt_tokens + r.usage.completion_tokens - 1
    assert len(routes) == positions * layers * top_k
    assert all(0 <= e < experts for e in routes)
    # Each token's top-k are distinct experts.
    assert all(len(set(routes[i:i + top_k])) == top_k for i in range(0, len(routes), top_k))
    # The same request streamed carries the same routes, in a chunk of their own.
    streamed = None
    for chunk in chat(moe_client, QWEN3_MOE, PROMPTS[1], stream=True,
                      extra_body={"return_routed_experts": True}):
        ext = (chunk.model_extra or {}).get("sglext")
        if ext:
            streamed = decode_routes(ext["routed_experts"])
    assert streamed == routes


def test_routed_experts_are_refused_for_a_dense_model_and_for_several_choices(moe_client):
    import openai
    from conftest import MODEL_ID
    with pytest.raises(openai.BadRequestError) as dense:
        chat(moe_client, MODEL_ID, "hi", extra_body={"return_routed_experts": True})
    assert "mixture-of-experts" in str(dense.value)
    with pytest.raises(openai.BadRequestError) as several:
        chat(moe_client, QWEN3_MOE, "hi", n=2, extra_body={"return_routed_experts": True})
    assert several.value.body["param"] == "n"
