"""Warm models: runners load models when jobs need them, within a memory budget, unload the
least recently used (or idle past their keep-alive, or on an operator's request), and claims
prefer the runner that has a job's model warm. Uses the two real models: SmolLM2-135M (the
default) and Gemma 3 270M."""

import subprocess
import time

import httpx
import openai
import pytest

from conftest import FALLOW, MODEL_ID, MODEL_PATH, ROOT, Stack, skip_for_want_of, spawn, stop_process, wait_for

GEMMA_PATH = ROOT / "models" / "gemma-3-270m-Q4_K_M.gguf"
GEMMA_ID = "gemma"
HI = [{"role": "user", "content": "Say hello."}]
# SmolLM2 takes ~94 MiB of weights, Gemma ~241 MiB; with their KV caches (128 MiB each in the
# dev stacks, 64 MiB on the second runner) one fits in 400 MiB, not both.
BUDGET_FOR_ONE = "400"



@pytest.fixture(autouse=True)
def gemma_fetched():
    if not GEMMA_PATH.exists():
        skip_for_want_of(f"{GEMMA_PATH} (scripts/fetch-models.sh --gemma)")


def admin(stack, method, path, **kw):
    return httpx.request(method, f"{stack.base_url}/admin{path}", timeout=30, **kw)


def runners(stack):
    return admin(stack, "GET", "/runners").json()["data"]


def warm(stack, runner_id):
    return admin(stack, "GET", f"/runners/{runner_id}").json()["warm"]


def preloaded(stack, runner_id, expected):
    """The runner's warm models once its start-up preload ends: a runner registers first and
    loads after, so a request sent meanwhile waits in the queue rather than failing."""
    return wait_for(lambda: (lambda w: w if w == expected else None)(warm(stack, runner_id)), timeout=120)


def client_for(stack):
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="x", max_retries=0, timeout=180)


def ask(client, model):
    return client.chat.completions.create(model=model, messages=HI, max_tokens=8, temperature=0)


def metric_total(stack, name, **labels):
    """The sum of a Prometheus series' samples whose labels include `labels`."""
    total = 0.0
    for line in httpx.get(f"{stack.base_url}/metrics", timeout=30).text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def job_runner(stack, completion_id):
    jobs = admin(stack, "GET", "/jobs", params={"limit": 1000}).json()["data"]
    job = next(j for j in jobs if j["id"].replace("-", "") == completion_id.removeprefix("chatcmpl-"))
    return job["runner_id"]


@pytest.fixture(scope="module")
def budget_stack():
    stack = Stack("--model", f"{GEMMA_ID}={GEMMA_PATH}", "--model-memory-mb", BUDGET_FOR_ONE).start()
    yield stack
    stack.stop()


def test_two_models_under_a_budget_for_one_alternate_and_every_request_succeeds(budget_stack):
    client = client_for(budget_stack)
    runner = runners(budget_stack)[0]
    assert {m["id"] for m in runner["models"]} == {MODEL_ID, GEMMA_ID}, "both are offered"
    assert preloaded(budget_stack, runner["id"], [MODEL_ID]), "the first model preloads; the second does not fit"
    listed = {m.id for m in client.models.list().data}
    assert {MODEL_ID, GEMMA_ID} <= listed, "a cold model is listed: a request loads it"
    loads_before = metric_total(budget_stack, "fallow:model_load_seconds_count")

    for model in [GEMMA_ID, MODEL_ID, GEMMA_ID, MODEL_ID]:
        reply = ask(client, model)
        assert reply.model == model
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert reply.usage.completion_tokens > 0
        assert warm(budget_stack, runner["id"]) == [model], "only the model in use is resident"

    loads = metric_total(budget_stack, "fallow:model_load_seconds_count") - loads_before
    assert loads == 4, "every switch was a cold start, recorded in the load histogram"
    assert metric_total(budget_stack, "fallow:model_evictions_total", reason="budget") >= 4


def test_concurrent_requests_for_two_models_under_a_budget_for_one_all_succeed(budget_stack):
    client = client_for(budget_stack)
    from concurrent.futures import ThreadPoolExecutor
    models = [GEMMA_ID, MODEL_ID] * 4
    with ThreadPoolExecutor(len(models)) as pool:
        replies = list(pool.map(lambda m: ask(client, m), models))
    assert [r.model for r in replies] == models
    assert all(r.usage.completion_tokens > 0 for r in replies)


@pytest.fixture(scope="module")
def two_runners():
    """Runner A (the dev stack) serves SmolLM2; runner B may serve Gemma and SmolLM2 but has
    room for one, so it preloads Gemma and has SmolLM2 cold."""
    stack = Stack().start()
    a = runners(stack)[0]["id"]
    runner_b = spawn("runner", stack, "--model", f"{GEMMA_ID}={GEMMA_PATH}", "--model", str(MODEL_PATH),
                     "--kv-cache-mb", "64", "--model-memory-mb", BUDGET_FOR_ONE, "--slots", "4")
    try:
        ids = wait_for(lambda: (lambda ids: ids if len(ids) == 2 else None)([r["id"] for r in runners(stack)]),
                       timeout=120)
        b = next(i for i in ids if i != a)
        preloaded(stack, a, [MODEL_ID])
        yield stack, a, b
    finally:
        stop_process(runner_b)
        stack.stop()


def test_with_two_runners_jobs_go_to_the_one_with_their_model_warm(two_runners):
    stack, a, b = two_runners
    client = client_for(stack)
    assert preloaded(stack, b, [GEMMA_ID]), "runner B preloads Gemma"
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda _: ask(client, MODEL_ID), range(6)))
    assert {job_runner(stack, r.id) for r in replies} == {a}, "runner B would have had to load SmolLM2"
    assert warm(stack, b) == [GEMMA_ID], "runner B evicted nothing"

    reply = ask(client, GEMMA_ID)
    assert job_runner(stack, reply.id) == b


def test_an_operator_evicts_a_model_and_the_next_request_loads_it_again(two_runners):
    stack, _, b = two_runners
    client = client_for(stack)
    out = subprocess.run([FALLOW, "admin", "runners", "evict", b, "--model", GEMMA_ID,
                          "--url", stack.base_url], check=True, capture_output=True, text=True, cwd=ROOT)
    assert b in out.stdout
    wait_for(lambda: warm(stack, b) == [], timeout=15)

    reply = ask(client, GEMMA_ID)
    assert job_runner(stack, reply.id) == b
    assert warm(stack, b) == [GEMMA_ID]

    refused = admin(stack, "POST", f"/runners/{b}/evict", json={"model": "no-such-model"})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "model"


def test_keep_alive_unloads_an_idle_model_unless_its_minimum_of_warm_replicas_needs_it():
    stack = Stack("--model", f"{GEMMA_ID}={GEMMA_PATH};keep_alive=1s",
                  "--model", f"pinned={GEMMA_PATH};keep_alive=1s;min_warm=1").start()
    try:
        client = client_for(stack)
        runner = runners(stack)[0]["id"]
        wait_for(lambda: warm(stack, runner) == sorted([MODEL_ID, "pinned"]), timeout=15)
        assert metric_total(stack, "fallow:model_evictions_total", model_name=GEMMA_ID, reason="keep_alive") == 1

        reply = ask(client, GEMMA_ID)
        assert reply.usage.completion_tokens > 0
        assert GEMMA_ID in warm(stack, runner), "loaded again on demand"
        wait_for(lambda: GEMMA_ID not in warm(stack, runner), timeout=15)
        time.sleep(1.5)
        assert "pinned" in warm(stack, runner), "the only warm replica of a min_warm=1 model stays"
    finally:
        stack.stop()
