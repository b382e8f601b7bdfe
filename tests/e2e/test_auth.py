"""Keys: a stack started with --auth accepts only keys created by `fallow admin keys create`."""

import openai
import pytest

from conftest import MODEL_ID, Stack


@pytest.fixture(scope="module")
def auth_stack():
    s = Stack(auth=True).start()
    yield s
    s.stop()


def test_a_bad_key_is_an_authentication_error(auth_stack):
    bad = openai.OpenAI(base_url=f"{auth_stack.base_url}/v1", api_key="sk-fallow-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}])


def test_a_created_key_is_accepted(auth_stack):
    key = auth_stack.create_key("acme")
    assert key.startswith("sk-fallow-")
    good = openai.OpenAI(base_url=f"{auth_stack.base_url}/v1", api_key=key, max_retries=0, timeout=120)
    r = good.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}],
                                     max_tokens=4, temperature=0)
    assert r.usage.completion_tokens == 4
