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
