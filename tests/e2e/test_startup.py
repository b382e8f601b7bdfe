"""Starting up: the first request sent as soon as `fallow dev` says it is serving succeeds,
and `/metrics` lists every counter and histogram at 0 before any request."""

import re
import subprocess
import time

import httpx
import pytest
from openai import OpenAI

from conftest import FALLOW, MODEL_ID, MODEL_PATH, ROOT, Stack, psql


@pytest.fixture()
def fresh():
    """A `fallow dev` process just started, and its first stdout line that says it serves."""
    stack = Stack()
    psql(f'CREATE DATABASE "{stack.database}"')
    stack.owns_database = "created"
    args = [FALLOW, "dev", "--listen", f"127.0.0.1:{stack.port}",
            "--database-url", stack.database_url, "--redis-url", stack.redis_url,
            "--model", str(MODEL_PATH), "--no-auth", "--kv-cache-mb", "128"]
    log = open(stack.log_path, "w")
    stack.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
    deadline = time.time() + 120
    line = ""
    while time.time() < deadline:
        line = stack.proc.stdout.readline()
        if "serving" in line or not line:
            break
    assert "serving" in line, f"fallow dev did not say it serves: {stack.log_text()}"
    yield stack
    stack.stop()


def test_the_first_request_sent_when_dev_says_serving_gets_its_answer(fresh):
    client = OpenAI(base_url=f"{fresh.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    answer = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=4, temperature=0)
    assert answer.choices[0].message.content
    assert httpx.get(f"{fresh.base_url}/ready", timeout=5).status_code == 200


def test_every_counter_and_histogram_is_listed_at_zero_before_the_first_request(fresh):
    text = httpx.get(f"{fresh.base_url}/metrics", timeout=10).text
    for series in [
        "fallow:request_received_total 0",
        "fallow:request_cancelled_total 0",
        "fallow:prompt_tokens_total 0",
        "fallow:generation_tokens_total 0",
        'fallow:request_success_total{finished_reason="stop"} 0',
        "fallow:time_to_first_token_seconds_count 0",
        "fallow:e2e_request_latency_seconds_count 0",
        f'fallow:inter_token_latency_seconds_count{{model_name="{MODEL_ID}"}} 0',
        f'fallow:request_queue_time_seconds_count{{model_name="{MODEL_ID}"}} 0',
        f'fallow:prefix_cache_queries_total{{model_name="{MODEL_ID}"}} 0',
    ]:
        assert re.search(r"^" + re.escape(series) + r"$", text, re.M), f"{series} missing:\n{text}"
