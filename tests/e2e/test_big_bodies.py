"""Bodies near the 8 MB limit: each is answered (a 400 when a cap refuses it, or the job's
own answer) and none raises the api process's peak memory by more than about 50 MB. The api
runs as its own process here, so the runner's work on the accepted prompts is not counted."""

import subprocess

import httpx
import pytest

from conftest import FALLOW, MODEL_ID, ROOT, free_port, stop_process, wait_for

MIB = 1 << 20


@pytest.fixture(scope="module")
def api(stack):
    port = free_port()
    log = open(ROOT / "target" / f"e2e-{stack.database}-bigapi-{port}.log", "w")
    proc = subprocess.Popen([FALLOW, "api", "--no-auth", "--listen", f"127.0.0.1:{port}",
                             "--database-url", stack.database_url, "--redis-url", stack.redis_url],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"

    def ready():
        try:
            return httpx.get(f"{base}/v1/models", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False
    wait_for(ready, timeout=60)
    yield proc, base
    stop_process(proc)


def peak_rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def reset_peak(pid: int):
    """Sets the process's peak RSS back to its current RSS (Linux's clear_refs, value 5)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def bodies():
    text = "word " * (MIB // 5)  # 1 MiB of text
    stops = ["x" * 512] * 8  # the caps: 4096 bytes in all
    return {
        "an 8 MB chat message": ("/v1/chat/completions",
                                 {"model": MODEL_ID, "messages": [{"role": "user", "content": text * 7}]}),
        "64 prompts of 120 KB": ("/v1/completions",
                                 {"model": MODEL_ID, "prompt": [text[:120_000]] * 64, "max_tokens": 1}),
        "64 prompts of 60 KB with 8 long stops": ("/v1/completions",
                                                   {"model": MODEL_ID, "prompt": [text[:60_000]] * 64,
                                                    "max_tokens": 1, "stop": stops}),
        "a 3.9 MB chat message with n=8": ("/v1/chat/completions",
                                           {"model": MODEL_ID, "n": 8, "max_tokens": 1, "stop": stops,
                                            "messages": [{"role": "user", "content": text[:3_900_000]}]}),
        "301 logit_bias entries and a 7 MB tool": ("/v1/chat/completions",
                                                   {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}],
                                                    "logit_bias": {str(i): 1 for i in range(301)},
                                                    "tools": [{"type": "function", "function": {
                                                        "name": "f", "description": text * 7}}]}),
    }


def test_near_limit_bodies_are_answered_without_raising_the_apis_memory_past_50_mb(api):
    proc, base = api
    httpx.get(f"{base}/v1/models", timeout=30)  # allocator warmed by a first request
    reset_peak(proc.pid)
    before = peak_rss_mib(proc.pid)
    growth = []
    for name, (path, body) in bodies().items():
        response = httpx.post(f"{base}{path}", json=body, timeout=300)
        growth.append(f"{name}: {peak_rss_mib(proc.pid) - before:.0f} MiB")
        assert response.status_code < 500, f"{name}: {response.status_code} {response.text[:300]}"
        if response.status_code >= 400:
            error = response.json()["error"]
            assert error["message"], name
    grown = peak_rss_mib(proc.pid) - before
    assert grown <= 50, f"the api's peak RSS grew by {grown:.0f} MiB: {growth}"
