"""Operators: the admin API and `fallow admin`, cordon / drain / resume, and runners that
yield their GPU to its owner. Multi-runner tests run a `fallow dev` stack (runner A) plus a
`fallow runner` process (runner B) whose owner probe is a file. Runner B reaches Postgres and
Redis directly; the tests of its hand-overs (a drain deadline, a shutdown deadline, a SIGKILL,
its owner's return) run again with B a gateway runner, which holds only the api's URL and a
runner token."""

import datetime
import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from conftest import (FALLOW, MODEL_ID, MODEL_PATH, ROOT, Stack, free_port, skip_for_want_of, spawn_gateway_runner,
                      wait_for)

ADMIN_TOKEN = "admin-secret-for-tests"
LONG = [{"role": "user", "content": "Write a very long story about a lighthouse keeper."}]
HI = [{"role": "user", "content": "hi"}]


def admin(stack, method, path, token=None, **kw):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, f"{stack.base_url}/admin{path}", headers=headers, timeout=30, **kw)




def cli(*args):
    return subprocess.run([FALLOW, "admin", *args], check=True, capture_output=True, text=True, cwd=ROOT)


def job_id(completion_id: str) -> str:
    return completion_id.removeprefix("chatcmpl-")


class Pair:
    """A dev stack (runner A) and a second runner process (runner B) on one database. B, and
    every runner a test adds, is of the pair's transport: `direct` (Postgres and Redis) or
    `gateway` (the api's runner API, with a runner token and no database or Redis URL)."""

    def __init__(self, transport="direct"):
        self.transport = transport
        self.stack = Stack("--lease-seconds", "3", "--slots", "4")
        self.probe = Path(tempfile.mkdtemp(prefix="fallow-owner-")) / "owner-active"
        self.runner_b = None

    def start(self):
        self.stack.start()
        self.a = self.runner_ids()[0]
        self.b_metrics = f"http://127.0.0.1:{free_port()}/metrics"
        self.runner_b = self.spawn_runner(
            "b", "--lease-seconds", "3", "--kv-cache-mb", "64", "--slots", "4",
            # The probe read every 100 ms: a short job cannot finish before B sees its owner.
            "--owner-probe", f"file:{self.probe}", "--owner-every", "100ms", "--owner-grace-seconds", "2",
            "--metrics-listen", self.b_metrics.removeprefix("http://").removesuffix("/metrics"))
        ids = wait_for(lambda: (lambda ids: ids if len(ids) == 2 else None)(self.runner_ids()), timeout=120)
        self.b = next(i for i in ids if i != self.a)
        self.client = openai.OpenAI(base_url=f"{self.stack.base_url}/v1", api_key="x", max_retries=0,
                                    timeout=180)
        return self

    def spawn_runner(self, name, *extra):
        """A `fallow runner` process serving the default model, of the pair's transport (a
        gateway runner's token is named `name`)."""
        args = ["--model", str(MODEL_PATH), *extra]
        if self.transport == "gateway":
            return spawn_gateway_runner(self.stack, name, *args)
        log = open(ROOT / "target" / f"e2e-{self.stack.database}-runner-{name}.log", "w")
        return subprocess.Popen(
            [FALLOW, "runner", "--database-url", self.stack.database_url, "--redis-url", self.stack.redis_url, *args],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)

    def transport_of(self, runner):
        return admin(self.stack, "GET", f"/runners/{runner}").json()["transport"]

    def counter(self, name):
        """A counter's total over both runners: A's in the stack's /metrics, B's on its own."""
        texts = [httpx.get(url, timeout=10).text for url in (f"{self.stack.base_url}/metrics", self.b_metrics)]
        assert all(re.search(rf'^{re.escape(name)}{{', text, re.M) for text in texts), f"{name} is not listed"
        return sum(float(v) for text in texts for v in re.findall(rf'^{re.escape(name)}{{[^}}]*}} (\S+)$', text, re.M))

    def runner_ids(self):
        return [r["id"] for r in admin(self.stack, "GET", "/runners").json()["data"]]

    def state(self, runner):
        return admin(self.stack, "GET", f"/runners/{runner}").json()["state"]

    def set(self, runner, action):
        r = admin(self.stack, "POST", f"/runners/{runner}/{action}")
        assert r.status_code == 200, r.text
        return r.json()

    def job(self, completion_id):
        jobs = admin(self.stack, "GET", "/jobs", params={"limit": 1000}).json()["data"]
        return next(j for j in jobs if j["id"].replace("-", "") == job_id(completion_id))

    def running_on(self, runner):
        jobs = admin(self.stack, "GET", "/jobs", params={"state": "running"}).json()["data"]
        return [j for j in jobs if j["runner_id"] == runner]

    def reset(self):
        self.probe.unlink(missing_ok=True)
        for runner in (self.a, self.b):
            self.set(runner, "resume")
        wait_for(lambda: self.state(self.b) == "active", timeout=15)

    def stop(self):
        if self.runner_b and self.runner_b.poll() is None:
            self.runner_b.terminate()
            try:
                self.runner_b.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.runner_b.kill()
        self.stack.stop()


@pytest.fixture(scope="module")
def pair(request):
    """The module's pair, runner B `direct` unless a test is parametrised with
    `@both_transports`; tests are grouped by transport, so each pair starts once."""
    p = Pair(request.param).start()
    assert p.transport_of(p.b) == p.transport, "runner B reaches the control plane as the test says"
    yield p
    p.stop()


both_transports = pytest.mark.parametrize("pair", ["direct", "gateway"], indirect=True)


def pytest_generate_tests(metafunc):
    # Every other test of the pair gets the direct one, under the same key as the
    # parametrised tests' (an unparametrised request would start a pair of its own).
    marked = any("pair" in m.args[0] for m in metafunc.definition.iter_markers("parametrize"))
    if "pair" in metafunc.fixturenames and not marked:
        metafunc.parametrize("pair", ["direct"], indirect=True)


def in_background(fn):
    result = {}

    def run():
        try:
            result["value"] = fn()
        except Exception as e:  # noqa: BLE001 - reported by the test
            result["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, result


def long_request(client, max_tokens=400):
    return lambda: client.chat.completions.create(model=MODEL_ID, messages=LONG, max_tokens=max_tokens,
                                                  temperature=0, extra_body={"ignore_eos": True})


def test_cordon_claims_nothing_new_and_resume_claims_again(pair):
    pair.reset()
    assert pair.set(pair.a, "cordon")["state"] == "cordoned"
    ids = [pair.client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=4).id
           for _ in range(3)]
    assert {pair.job(i)["runner_id"] for i in ids} == {pair.b}, "a cordoned runner claimed a job"

    pair.set(pair.a, "resume")
    pair.set(pair.b, "cordon")
    ids = [pair.client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=4).id
           for _ in range(3)]
    assert {pair.job(i)["runner_id"] for i in ids} == {pair.a}
    pair.reset()


def test_drain_finishes_in_flight_work_and_claims_nothing_new(pair):
    pair.reset()
    pair.set(pair.b, "cordon")
    t, result = in_background(long_request(pair.client, 300))
    wait_for(lambda: pair.running_on(pair.a), timeout=60)
    pair.set(pair.b, "resume")
    assert pair.set(pair.a, "drain")["state"] == "draining"

    ids = [pair.client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=4).id
           for _ in range(3)]
    assert {pair.job(i)["runner_id"] for i in ids} == {pair.b}, "a draining runner claimed a job"

    t.join(timeout=180)
    assert "value" in result, result.get("error")
    assert result["value"].usage.completion_tokens == 300
    finished = pair.job(result["value"].id)
    assert finished["runner_id"] == pair.a and finished["attempt"] == 1, "the in-flight job finished where it ran"
    wait_for(lambda: pair.state(pair.a) == "drained", timeout=15)
    pair.reset()


@both_transports
def test_a_drain_with_a_deadline_hands_its_streams_over_and_they_finish_elsewhere(pair):
    body = {"model": MODEL_ID, "messages": LONG, "max_tokens": 400, "stream": True, "ignore_eos": True,
            "temperature": 0}
    want = httpx.post(f"{pair.stack.base_url}/v1/chat/completions", json={**body, "stream": False},
                      timeout=180).json()["choices"][0]["message"]["content"]
    pair.reset()
    pair.set(pair.a, "cordon")

    def stream():
        events = []
        with httpx.stream("POST", f"{pair.stack.base_url}/v1/chat/completions", json=body, timeout=180) as r:
            assert r.status_code == 200, r.read()
            events.extend(line[len("data: "):] for line in r.iter_lines() if line.startswith("data: "))
        return events

    streams = [in_background(stream) for _ in range(8)]
    held = wait_for(lambda: (lambda jobs: jobs if len(jobs) == 4 else None)(pair.running_on(pair.b)), timeout=60)
    time.sleep(1.0)  # each has sent tokens
    cli("runners", "drain", pair.b, "--deadline", "5s", "--url", pair.stack.base_url)
    drained_at = time.time()
    pair.set(pair.a, "resume")
    wait_for(lambda: pair.state(pair.b) == "drained", timeout=30, every=0.1)
    assert time.time() - drained_at < 10, "the runner held its jobs past the deadline"

    for t, result in streams:
        t.join(timeout=240)
        assert "value" in result, result.get("error")
        events = result["value"]
        assert events[-1] == "[DONE]"
        assert texts_of(events) == [want], "each stream is the uninterrupted run's"
    handed = [pair.job(j["id"].replace("-", "")) for j in held]
    assert all((j["state"], j["runner_id"]) == ("succeeded", pair.a) for j in handed), handed
    pair.reset()


@both_transports
def test_a_runner_yields_within_2s_of_its_probe_file_its_jobs_finish_elsewhere_and_it_returns(pair):
    pair.reset()
    pair.set(pair.a, "cordon")
    t, result = in_background(long_request(pair.client, 300))
    job = wait_for(lambda: pair.running_on(pair.b), timeout=60)[0]
    pair.set(pair.a, "resume")

    pair.probe.touch()
    appeared = time.time()
    wait_for(lambda: pair.state(pair.b) == "yielded", timeout=10, every=0.05)
    assert time.time() - appeared < 2.0, "the runner took more than 2 s to yield"
    wait_for(lambda: not pair.running_on(pair.b), timeout=2, every=0.05)
    yielded = admin(pair.stack, "GET", f"/runners/{pair.b}").json()
    assert yielded["warm"] == [], "a yielded runner frees the device memory its models held"

    t.join(timeout=180)
    assert "value" in result, result.get("error")
    assert result["value"].usage.completion_tokens == 300
    finished = pair.job(result["value"].id)
    assert finished["id"] == job["id"]
    assert finished["runner_id"] == pair.a, "the handed-back job finished on the other runner"
    assert finished["state"] == "succeeded"

    # A yielded runner claims nothing, even with the other runner cordoned; its model stays
    # listed, so the request waits in the queue for it.
    pair.set(pair.a, "cordon")
    t2, r2 = in_background(lambda: pair.client.chat.completions.create(model=MODEL_ID, messages=HI,
                                                                       max_tokens=4))
    time.sleep(1.5)
    assert not pair.running_on(pair.b)

    pair.probe.unlink()
    gone = time.time()
    wait_for(lambda: pair.state(pair.b) == "active", timeout=15, every=0.1)
    assert time.time() - gone >= 1.5, "the runner came back before the grace period"
    t2.join(timeout=120)
    assert "value" in r2, r2.get("error")
    assert pair.job(r2["value"].id)["runner_id"] == pair.b, "the returned runner claims again"
    assert admin(pair.stack, "GET", f"/runners/{pair.b}").json()["warm"] == [MODEL_ID]
    pair.reset()


def test_a_runner_outside_its_lending_windows_stays_yielded_and_claims_nothing(pair):
    pair.reset()
    days = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
    not_today = days[(datetime.datetime.now(datetime.timezone.utc).weekday() + 3) % 7]
    runner_c = pair.spawn_runner("c", "--kv-cache-mb", "64", "--slots", "4",
                                 "--lend-windows", f"{not_today} 00:00-24:00", "--owner-grace-seconds", "1")
    try:
        ids = wait_for(lambda: (lambda ids: ids if len(ids) == 3 else None)(pair.runner_ids()), timeout=120)
        c = next(i for i in ids if i not in (pair.a, pair.b))
        wait_for(lambda: pair.state(c) == "yielded", timeout=15, every=0.1)
        done = [pair.client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=2) for _ in range(4)]
        assert all(pair.job(r.id)["runner_id"] in (pair.a, pair.b) for r in done)
        time.sleep(1.5)
        assert pair.state(c) == "yielded", "the runner came back outside its lending windows"
    finally:
        runner_c.terminate()
        runner_c.wait(timeout=30)
    wait_for(lambda: len(pair.runner_ids()) == 2, timeout=30)


def stream_interrupted(pair, body, interrupt, after_chunks=3, holder=None, cordon=()):
    """Streams `body` from runner B (or `holder`, with `cordon` cordoned too), calls
    `interrupt` once `after_chunks` chunks of content (or tool call arguments) came, lets runner A take the job over, and
    returns the stream's events."""
    holder = holder or pair.b
    pair.reset()
    for runner in (pair.a, *cordon):
        pair.set(runner, "cordon")
    events = []
    with httpx.stream("POST", f"{pair.stack.base_url}/v1/chat/completions", json=body, timeout=180) as r:
        assert r.status_code == 200, r.read()
        content = 0
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            events.append(data)
            if data != "[DONE]" and any(f'"{k}":"' in data and f'"{k}":""' not in data
                                        for k in ("content", "arguments")):
                content += 1
                if content == after_chunks:
                    assert pair.running_on(holder), "the job runs on the runner to interrupt"
                    interrupt()
                    pair.set(pair.a, "resume")
    return events


def owner_returns_to_b(pair):
    pair.probe.touch()
    wait_for(lambda: pair.state(pair.b) == "yielded", timeout=10, every=0.05)


def texts_of(events, n=1):
    texts = [""] * n
    for e in events:
        if e == "[DONE]":
            continue
        chunk = json.loads(e)
        assert "error" not in chunk, chunk
        for c in chunk["choices"]:
            texts[c["index"]] += c["delta"].get("content") or ""
    return texts


# Bounded, so that the forced call ends (`tool_calls`) rather than running out of tokens (391
# of 500), and long enough that runner B cannot finish it before it reads its owner probe
# (every 0.5 s): without `minLength` the model wrote 83 tokens, done in about 0.3 s.
SHORT_STORY = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 40},
    "chapters": {"type": "array", "items": {"type": "string", "minLength": 150, "maxLength": 200}, "minItems": 6, "maxItems": 6}},
    "required": ["title", "chapters"]}


def calls_of(events):
    """The streamed tool calls of choice 0, as (name, arguments) pairs."""
    calls = {}
    for e in events:
        if e == "[DONE]":
            continue
        for c in json.loads(e)["choices"]:
            for call in c["delta"].get("tool_calls") or []:
                name, args = calls.get(call["index"], ("", ""))
                function = call.get("function") or {}
                calls[call["index"]] = (name + (function.get("name") or ""), args + (function.get("arguments") or ""))
    return [calls[i] for i in sorted(calls)]


STORY_SCHEMA = {"type": "json_schema", "json_schema": {"name": "story", "strict": True, "schema": {
    "type": "object", "properties": {"title": {"type": "string"}, "chapters": {
        "type": "array", "items": {"type": "string"}, "minItems": 6}},
    "required": ["title", "chapters"]}}}


@pytest.mark.parametrize("sampling", [
    {"temperature": 0, "n": 2, "ignore_eos": True},
    {"temperature": 1.0, "top_p": 0.9, "seed": 7, "frequency_penalty": 0.3, "n": 2, "ignore_eos": True},
    {"temperature": 0, "response_format": STORY_SCHEMA},
    {"temperature": 0, "logprobs": True, "top_logprobs": 2, "stop": [" a heart of gold"]},
    {"temperature": 0, "tools": [{"type": "function", "function": {
        "name": "publish_story", "description": "Publish a story", "parameters": SHORT_STORY}}],
     "tool_choice": {"type": "function", "function": {"name": "publish_story"}}},
], ids=["greedy", "seeded", "json_schema", "logprobs_and_stop", "forced_tool_call"])
def test_a_stream_whose_runner_yields_continues_on_another_runner_as_if_uninterrupted(pair, sampling):
    body = {"model": MODEL_ID, "messages": LONG, "max_tokens": 500, "stream": True, **sampling}
    reference = httpx.post(f"{pair.stack.base_url}/v1/chat/completions", json={**body, "stream": False},
                           timeout=180).json()
    choices = sorted(reference["choices"], key=lambda c: c["index"])
    want = [c["message"]["content"] for c in choices]
    assert reference["usage"]["completion_tokens"] > 40, "long enough to be interrupted"

    events = stream_interrupted(pair, body, lambda: owner_returns_to_b(pair))
    pair.reset()
    assert events[-1] == "[DONE]"
    assert texts_of(events, n=len(want)) == [w or "" for w in want], "the continued stream is the uninterrupted run's text"
    if "response_format" in sampling and choices[0]["finish_reason"] == "stop":
        assert len(json.loads(want[0])["chapters"]) >= 6, "the grammar held across the hand-over"
    if "tools" in sampling:
        want_calls = [(c["function"]["name"], c["function"]["arguments"])
                      for c in choices[0]["message"]["tool_calls"]]
        assert calls_of(events) == want_calls, "the forced call went on where it stopped"
        assert choices[0]["finish_reason"] == "tool_calls"
    if sampling.get("logprobs"):
        streamed = [t["token"] for e in events[:-1] for c in json.loads(e)["choices"]
                    for t in ((c.get("logprobs") or {}).get("content") or [])]
        assert streamed == [t["token"] for t in choices[0]["logprobs"]["content"]]
        finish = [c["finish_reason"] for e in events[:-1] for c in json.loads(e)["choices"] if c["finish_reason"]]
        assert finish == [choices[0]["finish_reason"]] == ["stop"], "the stop string matched after the hand-over"
    jobs = admin(pair.stack, "GET", "/jobs", params={"limit": 1000}).json()["data"]
    job = next(j for j in jobs if j["id"].replace("-", "") == job_id(json_id(events)))
    assert job["state"] == "succeeded"
    assert (job["runner_id"], job["attempt"]) == (pair.a, 2), "runner A finished the second attempt"
    # Runner A (the dev stack's, whose metrics /metrics renders) took the tokens over.
    metrics = httpx.get(f"{pair.stack.base_url}/metrics", timeout=10).text
    assert re.search(r'fallow:continuation_tokens_reused_total\{[^}]*\} [1-9]', metrics), metrics


def json_id(events):
    return json.loads(events[0])["id"]


@both_transports
def test_a_runner_stopped_with_a_shutdown_deadline_hands_back_what_it_could_not_finish(pair):
    body = {"model": MODEL_ID, "messages": LONG, "max_tokens": 400, "stream": True, "ignore_eos": True,
            "temperature": 0}
    want = httpx.post(f"{pair.stack.base_url}/v1/chat/completions", json={**body, "stream": False},
                      timeout=180).json()["choices"][0]["message"]["content"]
    known = set(pair.runner_ids())
    runner_d = pair.spawn_runner("d", "--lease-seconds", "3", "--kv-cache-mb", "64", "--slots", "4",
                                 "--shutdown-deadline", "2s")
    try:
        d = wait_for(lambda: next((i for i in pair.runner_ids() if i not in known), None), timeout=120)
        assert pair.transport_of(d) == pair.transport
        wait_for(lambda: admin(pair.stack, "GET", f"/runners/{d}").json()["warm"] == [MODEL_ID], timeout=60)
        stopped = {}

        def terminate_d():
            runner_d.terminate()
            stopped["at"] = time.time()

        events = stream_interrupted(pair, body, terminate_d, holder=d, cordon=(pair.b,))
        runner_d.wait(timeout=30)
        exited = time.time() - stopped["at"]
        assert 1.5 <= exited < 10, f"the runner exited {exited:.1f} s after SIGTERM, not at its deadline"
    finally:
        if runner_d.poll() is None:
            runner_d.kill()
    pair.reset()
    assert events[-1] == "[DONE]"
    assert texts_of(events) == [want], "the stream went on on another runner, as if uninterrupted"


def test_a_batch_gets_every_line_once_with_uninterrupted_outputs_while_a_runner_yields_in_turn(pair):
    prompts = ["Count from one to twenty in words.", "Name ten animals and describe each.",
               "Describe the sea at night.", "List the planets and one fact about each."]
    request = {"model": MODEL_ID, "max_tokens": 32, "temperature": 0, "ignore_eos": True}
    lines_total = 2000
    want = {p: httpx.post(f"{pair.stack.base_url}/v1/chat/completions", timeout=120,
                          json={**request, "messages": [{"role": "user", "content": p}]}).json()
            for p in prompts}
    lines = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {**request, "messages": [{"role": "user", "content": prompts[i % 4]}]}}
             for i in range(lines_total)]
    pair.reset()
    reused = pair.counter("fallow:continuation_tokens_reused_total")
    upload = pair.client.files.create(
        file=("yields.jsonl", "\n".join(json.dumps(line) for line in lines).encode(), "application/jsonl"),
        purpose="batch")
    batch = pair.client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                       completion_window="24h")
    flapping = threading.Event()

    def owner_comes_and_goes():
        # Runner B's owner returns for a second every four (its grace period is 2 s).
        while not flapping.is_set():
            time.sleep(1.0)
            pair.probe.touch()
            time.sleep(1.0)
            pair.probe.unlink(missing_ok=True)
            time.sleep(2.0)

    flapper = threading.Thread(target=owner_comes_and_goes)
    flapper.start()
    try:
        done = wait_for(lambda: (lambda b: b if b.status in ("completed", "failed", "expired") else None)(
            pair.client.batches.retrieve(batch.id)), timeout=1200, every=1.0)
    finally:
        flapping.set()
        flapper.join()
    pair.reset()
    assert done.status == "completed", done
    assert done.request_counts.completed == lines_total and done.request_counts.failed == 0
    out = [json.loads(line) for line in pair.client.files.content(done.output_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in out) == sorted(line["custom_id"] for line in lines), \
        "every line exactly once"
    for o in out:
        prompt = prompts[int(o["custom_id"].split("-")[1]) % 4]
        body = o["response"]["body"]
        assert body["choices"][0]["message"]["content"] == want[prompt]["choices"][0]["message"]["content"]
        counts = ("prompt_tokens", "completion_tokens", "total_tokens")
        assert [body["usage"][k] for k in counts] == [want[prompt]["usage"][k] for k in counts], \
            "the usage of one uninterrupted run"
    jobs = admin(pair.stack, "GET", "/jobs", params={"limit": 1000}).json()["data"]
    handed = [j for j in jobs if j["kind"] == "batch" and j["attempt"] > 1]
    assert handed, "some lines were handed over mid-run"
    assert pair.counter("fallow:continuation_tokens_reused_total") > reused, "continuations took tokens over"
    assert pair.counter("fallow:tokens_regenerated_total") == 0, "no token was generated twice"


def test_a_runner_the_registry_forgot_registers_again_under_its_own_id(pair):
    pair.reset()
    subprocess.run(["psql", pair.stack.database_url, "-q", "-c", f"DELETE FROM runners WHERE id = '{pair.b}'"],
                   check=True, capture_output=True)
    # No check that the row is gone first: a heartbeat may register it again within
    # milliseconds of the DELETE, which is what this test wants to see.
    wait_for(lambda: pair.b in pair.runner_ids(), timeout=15)
    assert pair.state(pair.b) == "active"


def redis_del(url, key):
    """DEL `key` over RESP: Redis losing a stream, without a client library."""
    import socket
    from urllib.parse import urlparse
    u = urlparse(url)
    with socket.create_connection((u.hostname, u.port or 6379), timeout=5) as conn:
        parts = [b"DEL", key.encode()]
        conn.sendall(b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts))
        reply = conn.recv(64)
    assert reply.startswith(b":"), reply
    return int(reply[1:].strip())


def checkpointed_tokens(pair, job):
    """The tokens a running job's runner has reported generated, once a checkpoint exists."""
    out = subprocess.run(["psql", pair.stack.database_url, "-tAq", "-c",
                          "SELECT generated_tokens FROM jobs WHERE id = "
                          f"'{job}' AND state = 'running' AND checkpoint IS NOT NULL"],
                         check=True, capture_output=True, text=True)
    return int(out.stdout.strip() or 0)


def test_a_job_whose_runner_died_and_whose_stream_redis_lost_continues_from_its_checkpoint(pair):
    request = {"model": MODEL_ID, "messages": LONG, "max_tokens": 400, "ignore_eos": True, "temperature": 0}
    want = httpx.post(f"{pair.stack.base_url}/v1/chat/completions", json=request, timeout=180).json()
    known = set(pair.runner_ids())
    runner_e = pair.spawn_runner("e", "--lease-seconds", "3", "--kv-cache-mb", "64", "--slots", "4")
    try:
        e = wait_for(lambda: next((i for i in pair.runner_ids() if i not in known), None), timeout=120)
        wait_for(lambda: admin(pair.stack, "GET", f"/runners/{e}").json()["warm"] == [MODEL_ID], timeout=60)
        pair.reset()
        reused = pair.counter("fallow:continuation_tokens_reused_total")
        for runner in (pair.a, pair.b):
            pair.set(runner, "cordon")
        t, result = in_background(lambda: httpx.post(f"{pair.stack.base_url}/v1/chat/completions",
                                                     json=request, timeout=240).json())
        job = wait_for(lambda: (pair.running_on(e) or [None])[0], timeout=60)
        # Killed as soon as a heartbeat checkpointed some tokens, well before its 400th: a
        # fixed wait could outlast the whole generation on a fast machine.
        wait_for(lambda: checkpointed_tokens(pair, job["id"]) > 0, timeout=30)
        runner_e.kill()
        runner_e.wait(timeout=10)
        assert redis_del(pair.stack.redis_url, f"fallow:job:{job['id']}") == 1, "the stream existed"
        pair.set(pair.a, "resume")
        t.join(timeout=240)
    finally:
        if runner_e.poll() is None:
            runner_e.kill()
    pair.reset()
    assert "value" in result, result.get("error")
    got = result["value"]
    assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [got["usage"][k] for k in counts] == [want["usage"][k] for k in counts], \
        "the usage of one uninterrupted run"
    finished = pair.job(got["id"])
    assert (finished["state"], finished["runner_id"], finished["attempt"]) == ("succeeded", pair.a, 2)
    assert pair.counter("fallow:continuation_tokens_reused_total") > reused, \
        "runner A continued from the checkpoint rather than from token zero"


@both_transports
def test_a_stream_whose_runner_is_killed_continues_from_the_last_token_it_sent(pair):
    """Last of the pair's tests: runner B does not come back."""
    body = {"model": MODEL_ID, "messages": LONG, "max_tokens": 400, "stream": True, "ignore_eos": True,
            "temperature": 0}
    reference = httpx.post(f"{pair.stack.base_url}/v1/chat/completions", json={**body, "stream": False},
                           timeout=180).json()
    want = reference["choices"][0]["message"]["content"]

    def kill_b():
        pair.runner_b.kill()
        pair.runner_b.wait(timeout=10)

    events = stream_interrupted(pair, body, kill_b)
    assert events[-1] == "[DONE]"
    assert texts_of(events) == [want], "the stream goes on from its last token, as if uninterrupted"
    jobs = admin(pair.stack, "GET", "/jobs", params={"limit": 1000}).json()["data"]
    job = next(j for j in jobs if j["id"].replace("-", "") == job_id(json_id(events)))
    assert (job["state"], job["runner_id"], job["attempt"]) == ("succeeded", pair.a, 2)


def test_admin_endpoints_reject_tenant_keys_and_accept_the_admin_token():
    s = Stack("--admin-token", ADMIN_TOKEN, auth=True).start()
    try:
        key = s.create_key("acme")
        denied = admin(s, "GET", "/runners", token=key)
        assert denied.status_code == 403
        assert denied.json()["error"]["type"] == "permission_error"
        assert admin(s, "GET", "/runners").status_code == 401
        assert admin(s, "GET", "/runners", token="not-the-token").status_code == 401
        for method, path in [("POST", "/tenants/acme/keys"), ("GET", "/jobs"), ("GET", "/queue"),
                             ("GET", "/tenants"), ("GET", "/keys")]:
            assert admin(s, method, path, token=key).status_code == 403, path

        runners = admin(s, "GET", "/runners", token=ADMIN_TOKEN).json()["data"]
        assert len(runners) == 1 and runners[0]["state"] == "active"
        table = cli("runners", "list", "--url", s.base_url, "--token", ADMIN_TOKEN).stdout
        assert table.splitlines()[0].split()[:4] == ["ID", "HOST", "POOL", "STATE"]
        assert runners[0]["id"] in table and MODEL_ID in table

        # Keys over the admin API: create, list (prefix only), limit, revoke.
        new_key = cli("keys", "create", "--tenant", "globex", "--url", s.base_url,
                      "--token", ADMIN_TOKEN).stdout.strip()
        assert new_key.startswith("sk-fallow-")
        tenant_client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key=new_key, max_retries=0)
        assert tenant_client.models.list().data
        keys = admin(s, "GET", "/keys", token=ADMIN_TOKEN, params={"tenant": "globex"}).json()["data"]
        assert len(keys) == 1 and new_key.startswith(keys[0]["prefix"]) and "key" not in keys[0]
        cli("tenants", "limits", "globex", "--max-active-jobs", "7", "--url", s.base_url, "--token", ADMIN_TOKEN)
        tenants = {t["name"]: t for t in admin(s, "GET", "/tenants", token=ADMIN_TOKEN).json()["data"]}
        assert tenants["globex"]["max_active_jobs"] == 7
        cli("keys", "revoke", keys[0]["id"], "--url", s.base_url, "--token", ADMIN_TOKEN)
        with pytest.raises(openai.AuthenticationError):
            tenant_client.models.list()
    finally:
        s.stop()


def test_the_admin_api_is_open_on_loopback_without_auth_but_still_refuses_tenant_keys(stack, client):
    assert admin(stack, "GET", "/runners").status_code == 200
    key = stack.create_key("acme-open")
    assert admin(stack, "GET", "/runners", token=key).status_code == 403


def test_jobs_can_be_searched_and_cancelled_and_the_queue_depth_read(stack, client):
    done = client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=4)
    jobs = admin(stack, "GET", "/jobs", params={"state": "succeeded", "model": MODEL_ID}).json()["data"]
    assert job_id(done.id) in [j["id"].replace("-", "") for j in jobs]
    assert admin(stack, "GET", "/jobs", params={"state": "bogus"}).status_code == 400

    t, result = in_background(long_request(client, 2000))
    running = wait_for(lambda: admin(stack, "GET", "/jobs", params={"state": "running"}).json()["data"],
                       timeout=60)
    depth = admin(stack, "GET", "/queue").json()["data"]
    assert any(d["model"] == MODEL_ID and d["running"] >= 1 for d in depth)
    out = cli("jobs", "cancel", running[0]["id"], "--url", stack.base_url).stdout
    assert "true" in out
    t.join(timeout=60)
    assert "error" in result, "the cancelled request did not end in an error"
    wait_for(lambda: admin(stack, "GET", "/jobs", params={"state": "cancelled"}).json()["data"], timeout=30)
    listing = cli("queue", "--url", stack.base_url).stdout
    assert listing.splitlines()[0].split() == ["MODEL", "PRIORITY", "QUEUED", "RUNNING"]


def test_metrics_use_vllm_names_and_include_the_engine_queue_latencies_and_runner_states(stack, client):
    client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=4)
    text = httpx.get(f"{stack.base_url}/metrics", timeout=30).text
    samples = {line.split(" ")[0]: line.rsplit(" ", 1)[1] for line in text.splitlines()
               if line and not line.startswith("#")}
    model = f'model_name="{MODEL_ID}"'
    assert f"fallow:num_requests_waiting{{{model}}}" in samples
    assert f"fallow:num_requests_running{{{model}}}" in samples
    assert 0.0 <= float(samples[f"fallow:kv_cache_usage_perc{{{model}}}"]) <= 1.0
    assert float(samples[f"fallow:prefix_cache_queries_total{{{model}}}"]) > 0
    assert f"fallow:prefix_cache_hits_total{{{model}}}" in samples
    assert float(samples['fallow:runners{state="active"}']) == 1
    assert float(samples["fallow:generation_tokens_total"]) >= 4
    assert float(samples[f"fallow:model_load_seconds_count{{{model}}}"]) == 1
    assert float(samples[f"fallow:request_queue_time_seconds_count{{{model}}}"]) >= 1
    # Four tokens are three intervals (fewer only if the model ended early).
    assert float(samples[f"fallow:inter_token_latency_seconds_count{{{model}}}"]) >= 1
    assert float(samples[f"fallow:model_load_seconds_sum{{{model}}}"]) > 0


def chromium_dom(url: str, budget_ms: int) -> str:
    """The page's DOM after `budget_ms` of (virtual) time in headless Chromium."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        skip_for_want_of("Debian chromium (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
            capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_the_dashboard_renders_the_runners_of_a_running_stack_and_its_charts_update(stack, client):
    runners = admin(stack, "GET", "/runners").json()["data"]
    client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=4)
    short = chromium_dom(f"{stack.base_url}/dashboard", 1500)
    longer = chromium_dom(f"{stack.base_url}/dashboard", 6000)

    for runner in runners:
        assert f'data-runner-id="{runner["id"]}"' in longer
    assert MODEL_ID in longer and "state-active" in longer

    def points(dom, chart):
        match = re.search(rf'id="chart-{chart}" data-points="(\d+)"', dom)
        assert match, f"chart {chart} missing"
        return int(match.group(1))

    assert points(longer, "queue") > points(short, "queue") >= 1, "the queue chart did not update"
    assert points(longer, "throughput") >= 2


def test_the_dashboard_asks_for_the_admin_token_and_uses_it():
    s = Stack("--admin-token", ADMIN_TOKEN, auth=True).start()
    try:
        assert httpx.get(f"{s.base_url}/dashboard", timeout=10).status_code == 200
        locked = chromium_dom(f"{s.base_url}/dashboard", 2000)
        assert re.search(r'<form id="login"(?! hidden)', locked), "no token form without a token"
        assert "data-runner-id" not in locked
        unlocked = chromium_dom(f"{s.base_url}/dashboard#token={ADMIN_TOKEN}", 2000)
        assert "data-runner-id" in unlocked
    finally:
        s.stop()
