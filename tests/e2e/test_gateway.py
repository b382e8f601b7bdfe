"""Runners on lent machines: a gateway runner holds only the api's URL and a runner token.

The stack is real processes on loopback: `fallow api` (with API keys and an admin token),
`fallow scheduler`, and `fallow runner --control-plane URL --runner-token-file PATH` started
with no database or Redis URL in its environment. Its answers are compared with a direct
runner's (the session's `fallow dev` stack) at temperature 0."""

import json
import os
import re
import stat
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import openai
import pytest

from net_proxy import PausableProxy
from test_batch import assert_each_custom_id_once, jsonl, result_lines, upload, wait_final
from test_operators import chromium_dom
from conftest import FALLOW, MODEL_ID, MODEL_PATH, PG_ADMIN_URL, REDIS_URL, ROOT, free_port, psql, spawn, stop_process, wait_for

ADMIN = "gateway-admin-token-for-tests"
HI = [{"role": "user", "content": "Name three colours."}]


class GatewayStack:
    """`fallow api` + `fallow scheduler` on a fresh database, and a gateway runner."""

    def __init__(self):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.database = f"fallow_e2e_gw_{uuid.uuid4().hex[:12]}"
        self.database_url = f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{self.database}"
        self.redis_url = REDIS_URL
        self.procs = []
        self.token_dir = Path(tempfile.mkdtemp(prefix="fallow-gw-"))

    def start(self):
        psql(f'CREATE DATABASE "{self.database}"')
        store = str(self.token_dir / "store")
        self.api_args = ["--listen", f"127.0.0.1:{self.port}", "--auth", "--admin-token", ADMIN,
                         "--store-dir", store]
        self.api = spawn("api", self, *self.api_args)
        self.procs.append(self.api)
        self.procs.append(spawn("scheduler", self, "--store-dir", store))
        # The stack's runner reaches the api through a proxy that can cut its network.
        self.proxy = PausableProxy(self.port)
        wait_for(lambda: self._up(), timeout=60)
        self.key = subprocess.run(
            [FALLOW, "admin", "keys", "create", "--tenant", "gw", "--url", self.base_url, "--token", ADMIN],
            check=True, capture_output=True, text=True, cwd=ROOT).stdout.strip()
        self.token = self.create_token("lab-1", "--models", MODEL_ID)
        self.runner = self.start_runner(self.token)
        wait_for(lambda: self.models(), timeout=120)
        return self

    def _up(self):
        try:
            return httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def create_token(self, name, *extra):
        out = subprocess.run(
            [FALLOW, "admin", "runner-tokens", "create", "--name", name, *extra,
             "--url", self.base_url, "--token", ADMIN],
            check=True, capture_output=True, text=True, cwd=ROOT)
        return out.stdout.strip()

    def restart_api(self, down_for=2.0, graceful=False):
        """Kills the api process (no goodbye to anyone), or stops it with SIGTERM, and starts
        it again on its port; returns how long it took to exit."""
        asked = time.time()
        if graceful:
            self.api.terminate()
        else:
            self.api.kill()
        self.api.wait(timeout=60)
        took = time.time() - asked
        time.sleep(down_for)
        self.procs.remove(self.api)
        self.api = spawn("api", self, *self.api_args)
        self.procs.append(self.api)
        wait_for(lambda: self._up(), timeout=60)
        return took

    def start_runner(self, token, *extra, via_proxy=True):
        path = self.token_dir / f"token-{uuid.uuid4().hex[:8]}"
        path.write_text(token + "\n")
        path.chmod(stat.S_IRUSR | stat.S_IWUSR)
        # Nothing of the control plane's secrets: no database, Redis or admin credential.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("FALLOW_") and "DATABASE" not in k and "REDIS" not in k}
        log = open(ROOT / "target" / f"e2e-{self.database}-gateway-{time.time_ns()}.log", "w")
        proc = subprocess.Popen(
            [FALLOW, "runner", "--control-plane", self.proxy.url if via_proxy else self.base_url,
             "--runner-token-file", str(path),
             "--model", str(MODEL_PATH), "--kv-cache-mb", "128", *extra],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        self.procs.append(proc)
        return proc

    def models(self):
        r = httpx.get(f"{self.base_url}/v1/models", headers={"Authorization": f"Bearer {self.key}"}, timeout=5)
        return r.status_code == 200 and r.json()["data"]

    def admin(self, method, path, **kw):
        return httpx.request(method, f"{self.base_url}/admin{path}",
                             headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30, **kw)

    def runner_api(self, method, path, token, **kw):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.request(method, f"{self.base_url}/runner/v1{path}", headers=headers, timeout=30, **kw)

    def stop(self):
        for proc in reversed(self.procs):
            stop_process(proc)
        self.proxy.close()
        psql(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')


@pytest.fixture(scope="module")
def gateway():
    s = GatewayStack().start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def gw_client(gateway):
    return openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=gateway.key, max_retries=0, timeout=120)


def test_a_gateway_runner_answers_as_a_direct_runner_does(gateway, gw_client, client):
    def ask(c):
        return c.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=24, temperature=0)

    direct, through = ask(client), ask(gw_client)
    assert through.choices[0].message.content == direct.choices[0].message.content
    assert through.usage.completion_tokens == direct.usage.completion_tokens

    streamed = gw_client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=24, temperature=0,
                                                 stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)
    assert text == direct.choices[0].message.content


def test_a_gateway_runner_serves_two_choices_and_tools(gateway, gw_client):
    two = gw_client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=8, n=2, seed=7)
    assert [c.index for c in two.choices] == [0, 1]
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    called = gw_client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Weather in Paris?"}], max_tokens=64,
        tools=[tool], tool_choice="required")
    assert called.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_operators_see_the_runners_transport_and_token(gateway):
    runners = gateway.admin("GET", "/runners").json()["data"]
    assert [(r["transport"], r["token"]) for r in runners] == [("gateway", "lab-1")]
    tokens = gateway.admin("GET", "/runner-tokens").json()["data"]
    assert tokens[0]["runner_id"] == runners[0]["id"]
    dom = chromium_dom(f"{gateway.base_url}/dashboard#token={ADMIN}", 2000)
    assert f'<td>{runners[0]["id"]}</td>' in dom and "<td>gateway</td><td>lab-1</td>" in dom, dom[-3000:]
    # The runner's calls, counted by call and status, and its claims timed.
    metrics = httpx.get(f"{gateway.base_url}/metrics", timeout=10).text
    assert re.search(r'fallow:runner_api_requests_total\{call="heartbeat",status="200"\} [1-9]', metrics), metrics
    assert re.search(r'fallow:runner_api_claim_seconds_count\{outcome="jobs"\} [1-9]', metrics), metrics


def test_a_report_on_a_job_the_runner_does_not_hold_is_refused_and_changes_nothing(gateway, gw_client):
    done = gw_client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=4)
    job = str(uuid.UUID(done.id.removeprefix("chatcmpl-")))
    runner = gateway.admin("GET", "/runners").json()["data"][0]["id"]
    forged = httpx.post(f"{gateway.base_url}/runner/v1/jobs/{job}/complete",
                        headers={"Authorization": f"Bearer {gateway.token}", "x-fallow-runner": runner},
                        json={"attempt": 1, "completion": {"choices": [], "usage": {
                            "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}}}, timeout=30)
    assert forged.status_code == 409, forged.text
    assert forged.json()["error"]["code"] == "lease_not_held"
    jobs = gateway.admin("GET", "/jobs", params={"limit": 1000}).json()["data"]
    assert next(j for j in jobs if j["id"] == job)["state"] == "succeeded"


def test_tokens_open_only_their_own_door(gateway):
    # A runner token is neither an API key nor the admin token.
    assert httpx.get(f"{gateway.base_url}/v1/models",
                     headers={"Authorization": f"Bearer {gateway.token}"}, timeout=5).status_code == 401
    r = httpx.get(f"{gateway.base_url}/admin/runners", headers={"Authorization": f"Bearer {gateway.token}"}, timeout=5)
    assert r.status_code == 401
    # Neither opens the runner API.
    for token in (gateway.key, ADMIN, "rt-fallow-unknown", ""):
        r = gateway.runner_api("POST", "/heartbeat", token, json={"in_flight": 0})
        assert r.status_code == 401, (token, r.text)
        assert r.json()["error"]["code"] == "invalid_runner_token"


def test_a_runner_offering_models_its_token_does_not_allow_is_refused(gateway):
    token = gateway.create_token("narrow", "--models", "some-other-model")
    info = {"host": "x", "devices": {}, "slots": 1,
            "models": [{"id": MODEL_ID, "context_length": 8192, "owned_by": "fallow", "created": 0}]}
    r = gateway.runner_api("POST", "/register", token, json={"info": info})
    assert r.status_code == 403, r.text
    assert MODEL_ID in r.json()["error"]["message"]


def test_malformed_or_oversized_event_batches_get_a_400_naming_the_field(gateway):
    runner = gateway.admin("GET", "/runners").json()["data"][0]["id"]
    headers = {"Authorization": f"Bearer {gateway.token}", "x-fallow-runner": runner}
    url = f"{gateway.base_url}/runner/v1/events"
    too_many = {"events": [{"job": str(uuid.uuid4()), "event": {"type": "started", "attempt": 1}}] * 5000}
    r = httpx.post(url, headers=headers, json=too_many, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "events"
    r = httpx.post(url, headers={**headers, "content-type": "application/json"}, content=b'{"events": [1, 2',
                   timeout=30)
    assert r.status_code == 400, r.text
    r = httpx.post(url, headers={**headers, "content-type": "application/json"}, content=b'{"events": 7}',
                   timeout=30)
    assert r.status_code == 400, r.text
    assert gateway.models(), "the api stays up"


def test_a_batch_of_200_lines_gets_each_line_answered_exactly_once(gateway, gw_client):
    n = 200
    f = upload(gw_client, jsonl(n, max_tokens=2, prefix="gw"))
    batch = gw_client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    batch = wait_final(gw_client, batch.id, timeout=600)
    assert batch.status == "completed", batch
    out, err = result_lines(gw_client, batch)
    assert_each_custom_id_once(out, err, n, prefix="gw")
    assert (batch.request_counts.completed, len(err)) == (n, 0)


LONG_BODY = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Write a very long story."}],
             "max_tokens": 400, "ignore_eos": True, "temperature": 0}


def reference_text(gateway):
    r = httpx.post(f"{gateway.base_url}/v1/chat/completions", json=LONG_BODY,
                   headers={"Authorization": f"Bearer {gateway.key}"}, timeout=180)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def sse_events(lines):
    """(data, id) of each whole server-sent event: one ends at its blank line."""
    data, event_id = None, None
    for line in lines:
        if line == "":
            if data is not None:
                yield data, event_id
            data, event_id = None, None
        elif line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()


def read_sse(lines, on_content=None):
    """The content of a chat completion's SSE lines, the id of the last whole event, the
    completion id and the longest wait between content chunks; `on_content(k)` runs after the
    k-th content chunk."""
    text, last_id, completion_id, chunks, longest, at = "", None, None, 0, 0.0, time.time()
    for data, event_id in sse_events(lines):
        if data == "[DONE]":
            continue
        chunk = json.loads(data)
        assert "error" not in chunk, chunk
        completion_id, last_id = chunk["id"], event_id or last_id
        for c in chunk["choices"]:
            content = c["delta"].get("content") or ""
            if content:
                text += content
                chunks += 1
                longest, at = max(longest, time.time() - at), time.time()
                if on_content:
                    on_content(chunks)
    return text, last_id, completion_id, longest


def job_of(gateway, completion_id):
    job_id = str(uuid.UUID(completion_id.removeprefix("chatcmpl-")))
    jobs = gateway.admin("GET", "/jobs", params={"limit": 1000}).json()["data"]
    return next(j for j in jobs if j["id"] == job_id)


def test_a_runner_that_loses_the_network_for_10_s_loses_and_repeats_nothing(gateway):
    want = reference_text(gateway)

    def cut(k):
        if k == 3:
            gateway.proxy.pause()
            time.sleep(10)
            gateway.proxy.resume()

    headers = {"Authorization": f"Bearer {gateway.key}"}
    with httpx.stream("POST", f"{gateway.base_url}/v1/chat/completions", json={**LONG_BODY, "stream": True},
                      headers=headers, timeout=180) as r:
        assert r.status_code == 200, r.read()
        text, _, completion_id, longest = read_sse(r.iter_lines(), cut)
    assert text == want, "every token once, in order"
    assert longest >= 8, f"the cut held the stream back (longest wait {longest:.1f} s)"
    job = job_of(gateway, completion_id)
    assert (job["state"], job["attempt"]) == ("succeeded", 1), "the runner kept its job through the cut"
    assert gateway.runner.poll() is None, "the runner is still up"


def test_a_stream_survives_an_api_restart_for_a_client_that_resumes(gateway):
    want = reference_text(gateway)
    headers = {"Authorization": f"Bearer {gateway.key}"}

    lines = []
    try:
        with httpx.stream("POST", f"{gateway.base_url}/v1/chat/completions",
                          json={**LONG_BODY, "stream": True}, headers=headers, timeout=180) as r:
            assert r.status_code == 200, r.read()
            content = 0
            for line in r.iter_lines():
                lines.append(line)
                if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
                    content += 1
                    if content == 3:
                        threading.Thread(target=gateway.restart_api, daemon=True).start()
    except httpx.HTTPError:
        pass  # the api went away mid-stream
    seen = read_sse(lines)
    text, last_id, completion_id, _ = seen
    assert text and last_id and completion_id, "tokens came before the api went away"
    wait_for(lambda: gateway._up() and gateway.api.poll() is None, timeout=60)
    with httpx.stream("GET", f"{gateway.base_url}/v1/chat/completions/{completion_id}/stream",
                      headers={**headers, "Last-Event-ID": last_id}, timeout=180) as r:
        assert r.status_code == 200, r.read()
        rest, _, _, _ = read_sse(r.iter_lines())
    assert text + rest == want, "the resumed stream goes on where the client stopped"
    job = job_of(gateway, completion_id)
    assert (job["state"], job["attempt"]) == ("succeeded", 1), "the runner kept its job through the restart"
    assert gateway.runner.poll() is None, "the runner is still up"


def test_an_api_with_gateway_runners_connected_shuts_down_at_once_and_they_come_back(gateway, gw_client):
    # A runner's notice stream never ends on its own: the api ends it when it shuts down.
    took = gateway.restart_api(down_for=0, graceful=True)
    assert took < 5, f"the api took {took:.1f} s to shut down"
    done = gw_client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=4)
    assert done.choices[0].message.content
    assert gateway.runner.poll() is None


def owned_runner(gateway, name, probe, *extra):
    """A second gateway runner, watching the owner `probe`, warm and ready; the stack's own
    runner cordoned, so a new job goes to the second. Returns (process, first id, second id)."""
    owned = gateway.start_runner(gateway.create_token(name, "--models", MODEL_ID),
                                 "--owner-probe", f"file:{probe}", "--owner-grace-seconds", "2", *extra)
    first = runner_with_token(gateway, "lab-1")["id"]
    try:
        second = wait_for(lambda: runner_with_token(gateway, name), timeout=120)["id"]
        wait_for(lambda: gateway.admin("GET", f"/runners/{second}").json()["warm"] == [MODEL_ID], timeout=60)
        assert gateway.admin("POST", f"/runners/{first}/cordon").status_code == 200
    except BaseException:
        stop_process(owned)
        raise
    return owned, first, second


def stream_long(gateway, on_content):
    """Streams the long request; returns its text and completion id."""
    headers = {"Authorization": f"Bearer {gateway.key}"}
    with httpx.stream("POST", f"{gateway.base_url}/v1/chat/completions",
                      json={**LONG_BODY, "stream": True}, headers=headers, timeout=180) as r:
        assert r.status_code == 200, r.read()
        text, _, completion_id, _ = read_sse(r.iter_lines(), on_content)
    return text, completion_id


def test_a_gateway_runner_whose_owner_returns_hands_its_stream_to_another_runner_seamlessly(gateway):
    want = reference_text(gateway)
    probe = gateway.token_dir / "owner-active"
    owned, first, second = owned_runner(gateway, "lab-owned", probe)
    try:
        def owner_returns(k):
            if k == 3:
                probe.touch()
                wait_for(lambda: gateway.admin("GET", f"/runners/{second}").json()["state"] == "yielded",
                         timeout=10, every=0.05)
                assert gateway.admin("POST", f"/runners/{first}/resume").status_code == 200

        text, completion_id = stream_long(gateway, owner_returns)
        assert text == want, "the stream went on on the other runner, as if uninterrupted"
        job = job_of(gateway, completion_id)
        assert (job["state"], job["runner_id"], job["attempt"]) == ("succeeded", first, 2), job
    finally:
        gateway.admin("POST", f"/runners/{first}/resume")
        stop_process(owned)


def test_a_runner_cut_off_from_the_api_still_frees_the_device_when_its_owner_returns(gateway):
    """The owner's return needs no network: the engine stops and the models unload at once;
    the jobs go back once the api can be reached again, and finish on another runner."""
    want = reference_text(gateway)
    probe = gateway.token_dir / "owner-active-cut"
    metrics = f"127.0.0.1:{free_port()}"
    resident = re.compile(r'^fallow:model_resident_bytes\{[^}]*\} (\S+)$', re.M)

    def resident_bytes():
        return sum(float(v) for v in resident.findall(httpx.get(f"http://{metrics}/metrics", timeout=5).text))

    owned, first, second = owned_runner(gateway, "lab-cut", probe, "--metrics-listen", metrics)
    try:
        freed = {}

        def cut_then_owner_returns(k):
            if k == 3:
                gateway.proxy.pause()
                probe.touch()
                touched = time.time()
                wait_for(lambda: resident_bytes() == 0, timeout=10, every=0.05)
                freed["after"] = time.time() - touched
                time.sleep(3)
                gateway.proxy.resume()
                assert gateway.admin("POST", f"/runners/{first}/resume").status_code == 200

        text, completion_id = stream_long(gateway, cut_then_owner_returns)
        assert freed["after"] < 2.0, f"the models were unloaded {freed['after']:.1f} s after the owner returned"
        assert text == want, "the stream went on on the other runner, as if uninterrupted"
        job = job_of(gateway, completion_id)
        assert (job["state"], job["runner_id"], job["attempt"]) == ("succeeded", first, 2), job
        assert gateway.admin("GET", f"/runners/{second}").json()["state"] == "yielded"
    finally:
        gateway.proxy.resume()
        gateway.admin("POST", f"/runners/{first}/resume")
        stop_process(owned)


def runner_with_token(gateway, name):
    return next((r for r in gateway.admin("GET", "/runners").json()["data"]
                 if r["token"] == name and r["state"] != "dead"), None)


def test_a_revoked_runner_stops_and_its_stream_finishes_on_another_runner(gateway):
    """Last of the module's tests: it revokes the stack's runner token."""
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Write a very long story."}],
            "max_tokens": 400, "ignore_eos": True, "temperature": 0}
    headers = {"Authorization": f"Bearer {gateway.key}"}
    url = f"{gateway.base_url}/v1/chat/completions"
    want = httpx.post(url, json=body, headers=headers, timeout=180).json()["choices"][0]["message"]["content"]
    first = runner_with_token(gateway, "lab-1")["id"]

    text, chunks, second = "", 0, None
    with httpx.stream("POST", url, json={**body, "stream": True}, headers=headers, timeout=180) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            assert "error" not in chunk, chunk
            job_id = str(uuid.UUID(chunk["id"].removeprefix("chatcmpl-")))
            for c in chunk["choices"]:
                text += c["delta"].get("content") or ""
                chunks += bool(c["delta"].get("content"))
            if chunks == 3 and second is None:
                subprocess.run([FALLOW, "admin", "runner-tokens", "revoke", "lab-1", "--url", gateway.base_url,
                                "--token", ADMIN], check=True, capture_output=True, cwd=ROOT)
                # A revoked token is refused on its next call.
                assert gateway.runner_api("POST", "/heartbeat", gateway.token,
                                          json={"in_flight": 0}).status_code == 401
                second = gateway.start_runner(gateway.create_token("lab-2", "--models", MODEL_ID),
                                              via_proxy=False)
    assert gateway.runner.wait(timeout=30) == 78, "the revoked runner stopped, saying why (EX_CONFIG)"
    assert text == want, "the stream went on on the second runner, as if uninterrupted"
    jobs = gateway.admin("GET", "/jobs", params={"limit": 1000}).json()["data"]
    job = next(j for j in jobs if j["id"] == job_id)
    assert job["state"] == "succeeded", job
    assert job["runner_id"] != first and job["attempt"] == 2, job
    runners = {r["id"]: r["state"] for r in gateway.admin("GET", "/runners").json()["data"]}
    assert runners[first] == "dead" and runners[job["runner_id"]] == "active", runners
