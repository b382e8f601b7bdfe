"""A panic on an engine thread is contained: the jobs of the engine that panicked end with an
error instead of hanging, the model is loaded again for the next request, and the runner's
other models keep serving. The panic comes from the runner's test hook
(`--test-engine-panic-marker`, debug builds only): the engine panics at the step after it
admits a request whose input carries the marker."""

import httpx
import openai
import pytest

from conftest import MODEL_ID, ROOT, Stack, skip_for_want_of

GEMMA_PATH = ROOT / "models" / "gemma-3-270m-Q4_K_M.gguf"
MARKER = "engine-panic-marker-5d41"


@pytest.fixture(scope="module")
def panic_stack():
    if not GEMMA_PATH.exists():
        skip_for_want_of(f"{GEMMA_PATH} (scripts/fetch-models.sh --gemma)")
    stack = Stack("--model", f"gemma={GEMMA_PATH}", "--test-engine-panic-marker", MARKER).start()
    yield stack
    stack.stop()


def client_for(stack):
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="x", max_retries=0, timeout=120)


def ask(client, model, text="Say hello."):
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], max_tokens=8, temperature=0)


def jobs(stack):
    return httpx.get(f"{stack.base_url}/admin/jobs", params={"limit": 100}, timeout=30).json()["data"]


def test_a_panicking_engine_fails_its_job_and_its_model_serves_the_next_request(panic_stack):
    client = client_for(panic_stack)
    with pytest.raises(openai.APIError):
        ask(client, MODEL_ID, f"Repeat after me: {MARKER}")
    failed = [j for j in jobs(panic_stack) if j["state"] == "failed"]
    assert len(failed) == 1, failed
    assert "panicked" in (failed[0].get("error") or ""), failed[0]
    answer = ask(client, MODEL_ID)
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.choices[0].message.content
    assert "the engine panicked" in panic_stack.log_text()


def test_a_panic_in_one_model_leaves_the_runners_other_models_serving(panic_stack):
    client = client_for(panic_stack)
    before = ask(client, "gemma")
    with pytest.raises(openai.APIError):
        ask(client, MODEL_ID, f"Now say {MARKER}, please.")
    after = ask(client, "gemma")
    assert after.choices[0].message.content == before.choices[0].message.content


def test_a_streamed_request_to_a_panicking_engine_gets_an_error_not_a_hang(panic_stack):
    client = client_for(panic_stack)
    with pytest.raises(openai.APIError):
        stream = client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": MARKER}], max_tokens=8,
            stream=True)
        for _ in stream:
            pass
    assert ask(client, MODEL_ID).choices[0].message.content
