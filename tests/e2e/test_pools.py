"""Pools: at most a share of a pool's runners is lent at once. Runner A (a dev stack) and
runner B (a `fallow runner` process) form a pool of two lending at most half of it; each has
an owner probe file. Runner B reaches the control plane directly, naming its pool, or as a
gateway runner whose runner token carries the pool."""

import tempfile
from pathlib import Path

import httpx
import openai
import pytest

from conftest import MODEL_ID, MODEL_PATH, Stack, spawn, spawn_gateway_runner, stop_process, wait_for

HI = [{"role": "user", "content": "hi"}]
SHARE = ["--pool-max-share", "0.5", "--owner-grace-seconds", "1"]
POOL = ["--pool", "office", *SHARE]


def runners(stack):
    return httpx.get(f"{stack.base_url}/admin/runners", timeout=30).json()["data"]


def states(stack):
    return {r["id"]: r["state"] for r in runners(stack)}


@pytest.mark.parametrize("transport", ["direct", "gateway"])
def test_a_pool_lends_at_most_its_share_and_another_member_steps_in_when_an_owner_returns(transport):
    probes = Path(tempfile.mkdtemp(prefix="fallow-pool-"))
    stack = Stack("--lease-seconds", "3", "--owner-probe", f"file:{probes / 'a'}", *POOL).start()
    b_args = ["--model", str(MODEL_PATH), "--kv-cache-mb", "64", "--lease-seconds", "3",
              "--owner-probe", f"file:{probes / 'b'}"]
    if transport == "gateway":
        # No `--pool`: the token's pool is the runner's.
        runner_b = spawn_gateway_runner(stack, "b", *b_args, *SHARE, token_options=("--pool", "office"))
    else:
        runner_b = spawn("runner", stack, *b_args, *POOL)
    try:
        a = runners(stack)[0]["id"]
        ids = wait_for(lambda: (lambda s: s if len(s) == 2 else None)(states(stack)), timeout=120)
        b = next(i for i in ids if i != a)
        assert {r["id"]: (r["pool"], r["transport"]) for r in runners(stack)} == \
            {a: ("office", "direct"), b: ("office", transport)}
        wait_for(lambda: states(stack) == {a: "active", b: "yielded"}, timeout=15)

        client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="x", max_retries=0, timeout=120)
        (probes / "a").touch()
        wait_for(lambda: states(stack) == {a: "yielded", b: "active"}, timeout=15)
        reply = client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=4)
        jobs = httpx.get(f"{stack.base_url}/admin/jobs", params={"limit": 10}, timeout=30).json()["data"]
        job = next(j for j in jobs if j["id"].replace("-", "") == reply.id.removeprefix("chatcmpl-"))
        assert job["runner_id"] == b, "the member that stepped in served it"

        (probes / "a").unlink()
        wait_for(lambda: states(stack) == {a: "active", b: "yielded"}, timeout=20)
    finally:
        stop_process(runner_b)
        stack.stop()
