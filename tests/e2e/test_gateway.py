"""Runners on lent machines: a gateway runner holds only the api's URL and a runner token.

The stack is real processes on loopback: `fallow api` (with API keys and an admin token),
`fallow scheduler`, and `fallow runner --control-plane URL --runner-token-file PATH` started
with no database or Redis URL in its environment. Its answers are compared with a direct
runner's (the session's `fallow dev` stack) at temperature 0."""

import os
import stat
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import openai
import pytest

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
        self.api = spawn("api", self, "--listen", f"127.0.0.1:{self.port}", "--auth",
                         "--admin-token", ADMIN)
        self.procs.append(self.api)
        self.procs.append(spawn("scheduler", self))
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

    def start_runner(self, token, *extra):
        path = self.token_dir / f"token-{uuid.uuid4().hex[:8]}"
        path.write_text(token + "\n")
        path.chmod(stat.S_IRUSR | stat.S_IWUSR)
        # Nothing of the control plane's secrets: no database, Redis or admin credential.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("FALLOW_") and "DATABASE" not in k and "REDIS" not in k}
        log = open(ROOT / "target" / f"e2e-{self.database}-gateway-{time.time_ns()}.log", "w")
        proc = subprocess.Popen(
            [FALLOW, "runner", "--control-plane", self.base_url, "--runner-token-file", str(path),
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
