"""Pools: at most a share of a pool's runners is lent at once. Runner A (a dev stack) and
runner B (a `fallow runner` process) form a pool of two lending at most half of it; each has
an owner probe file."""

import tempfile
from pathlib import Path

import httpx
import openai

from conftest import MODEL_ID, MODEL_PATH, Stack, spawn, stop_process, wait_for

HI = [{"role": "user", "content": "hi"}]
POOL = ["--pool", "office", "--pool-max-share", "0.5", "--owner-grace-seconds", "1"]


def runners(stack):
    return httpx.get(f"{stack.base_url}/admin/runners", timeout=30).json()["data"]


def states(stack):
    return {r["id"]: r["state"] for r in runners(stack)}


def test_a_pool_lends_at_most_its_share_and_another_member_steps_in_when_an_owner_returns():
    probes = Path(tempfile.mkdtemp(prefix="fallow-pool-"))
    stack = Stack("--lease-seconds", "3", "--owner-probe", f"file:{probes / 'a'}", *POOL).start()
    runner_b = spawn("runner", stack, "--model", str(MODEL_PATH), "--kv-cache-mb", "64",
                     "--lease-seconds", "3", "--owner-probe", f"file:{probes / 'b'}", *POOL)
    try:
        a = runners(stack)[0]["id"]
        ids = wait_for(lambda: (lambda s: s if len(s) == 2 else None)(states(stack)), timeout=120)
        b = next(i for i in ids if i != a)
        assert all(r["pool"] == "office" for r in runners(stack))
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
