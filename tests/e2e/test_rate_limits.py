"""Rate limits through the official SDK: a tenant over its requests per minute gets a 429 with
OpenAI's headers, and the SDK's own retry succeeds once the window resets. The stack's window
is shortened to a few seconds (`--rate-limit-window`), so no test waits a minute."""

import httpx
import openai
import pytest

from conftest import MODEL_ID, Stack

ADMIN_TOKEN = "e2e-rate-limit-admin-token-0123456789"
WINDOW_SECONDS = 3
HEADERS = ("x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
           "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens")
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def stack():
    s = Stack("--admin-token", ADMIN_TOKEN, "--rate-limit-window", str(WINDOW_SECONDS), auth=True).start()
    yield s
    s.stop()


def limited_key(stack: Stack, tenant: str, **limits) -> str:
    key = stack.create_key(tenant)
    r = httpx.post(f"{stack.base_url}/admin/tenants/{tenant}/limits", json=limits,
                   headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)
    assert r.status_code == 200, r.text
    return key


def client(stack: Stack, key: str, retries: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=retries, timeout=120)


def test_a_tenant_over_its_requests_gets_a_429_and_the_sdk_retry_succeeds_after_the_reset(stack):
    key = limited_key(stack, "rpm-one", requests_per_minute=1, tokens_per_minute=100_000)
    once = client(stack, key, retries=0)
    raw = once.chat.completions.with_raw_response.create(model=MODEL_ID, messages=MESSAGES, max_tokens=2)
    for name in HEADERS:
        assert name in raw.headers, f"a 200 lacks {name}"
    assert raw.headers["x-ratelimit-limit-requests"] == "1"

    # One request a window: within two more, one lands in the same window as the one before.
    refused = None
    for _ in range(3):
        try:
            once.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=2)
        except openai.RateLimitError as err:
            refused = err
            break
    assert refused is not None, "no request was refused"
    assert refused.status_code == 429
    assert int(refused.response.headers["retry-after"]) <= WINDOW_SECONDS
    for name in HEADERS:
        assert name in refused.response.headers, f"a 429 lacks {name}"
    assert refused.type == "requests"
    assert refused.code == "rate_limit_exceeded"

    # The SDK reads Retry-After, waits for the reset, and its retry is admitted.
    r = client(stack, key, retries=2).chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=2)
    assert r.usage.completion_tokens >= 1


def test_an_unlimited_tenant_gets_no_rate_limit_headers(stack):
    key = stack.create_key("unlimited")
    raw = client(stack, key, retries=0).chat.completions.with_raw_response.create(
        model=MODEL_ID, messages=MESSAGES, max_tokens=2)
    for name in HEADERS:
        assert name not in raw.headers
