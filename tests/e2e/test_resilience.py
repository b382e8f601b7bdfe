"""What happens when things go away: clients, runners, Redis, Postgres."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from conftest import FALLOW, MODEL_ID, MODEL_PATH, PG_ADMIN_URL, ROOT, Stack, free_port, psql, skip_for_want_of, wait_for, spawn

LONG = [{"role": "user", "content": "Write a very long story about a lighthouse keeper."}]


def job_state(database_url: str, completion_id: str) -> str:
    job_id = completion_id.removeprefix("chatcmpl-")
    out = subprocess.run(["psql", database_url, "-tA", "-c",
                          f"SELECT state FROM jobs WHERE replace(id::text, '-', '') = '{job_id}'"],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


def test_a_client_disconnect_cancels_the_job_and_frees_the_engine_slot():
    s = Stack("--slots", "1").start()
    try:
        client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="x", max_retries=0, timeout=60)
        stream = client.chat.completions.create(model=MODEL_ID, messages=LONG, max_tokens=2000,
                                                temperature=0.8, stream=True, extra_body={"ignore_eos": True})
        first = next(iter(stream))
        stream.close()
        wait_for(lambda: job_state(s.database_url, first.id) == "cancelled")
        # With one slot, this only finishes if the cancelled sequence let go of it.
        r = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4, temperature=0)
        assert r.usage.completion_tokens == 4
    finally:
        s.stop()


RUNNER_ARGS = ["--model", str(MODEL_PATH), "--lease-seconds", "3", "--kv-cache-mb", "64"]


@contextlib.contextmanager
def split_stack():
    """`fallow api` + one `fallow runner` (short leases) + `fallow scheduler` as separate
    processes on a fresh database; yields (api, [runner, scheduler, …]) and kills them all."""
    api = Stack("--no-auth", command="api")
    psql(f'CREATE DATABASE "{api.database}"')
    api.owns_database = "created"
    procs = [spawn("runner", api, *RUNNER_ARGS)]
    try:
        api.log = open(api.log_path, "w")
        api.proc = subprocess.Popen([FALLOW, "api", "--no-auth", "--listen", f"127.0.0.1:{api.port}",
                                     "--database-url", api.database_url, "--redis-url", api.redis_url],
                                    stdout=api.log, stderr=subprocess.STDOUT, cwd=ROOT)
        procs.append(spawn("scheduler", api))
        api.wait_ready()
        yield api, procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        api.stop()


def test_a_runner_killed_mid_job_loses_nothing_another_runner_finishes_it():
    with split_stack() as (api, procs):
        first = procs[0]
        client = openai.OpenAI(base_url=f"{api.base_url}/v1", api_key="x", max_retries=0, timeout=120)
        result = {}

        def call():
            result["r"] = client.chat.completions.create(
                model=MODEL_ID, messages=LONG, max_tokens=64, temperature=0)

        t = threading.Thread(target=call)
        t.start()
        wait_for(lambda: subprocess.run(["psql", api.database_url, "-tA", "-c",
                                         "SELECT count(*) FROM jobs WHERE state = 'running'"],
                                        capture_output=True, text=True).stdout.strip() == "1")
        first.send_signal(signal.SIGKILL)
        first.wait()
        procs.append(spawn("runner", api, *RUNNER_ARGS))
        t.join(timeout=120)
        assert "r" in result, "the request did not complete on the second runner"
        assert result["r"].usage.completion_tokens == 64


def test_after_a_redis_restart_new_requests_work_without_restarting_fallow():
    port = free_port()
    workdir = tempfile.mkdtemp()

    def start_redis():
        subprocess.run(["redis-server", "--daemonize", "yes", "--port", str(port), "--bind", "127.0.0.1",
                        "--save", "", "--appendonly", "no", "--dir", workdir,
                        "--pidfile", f"{workdir}/redis.pid"], check=True, stdout=subprocess.DEVNULL)
        wait_for(lambda: subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                                        text=True).stdout.strip() == "PONG")

    start_redis()
    s = Stack(redis_url=f"redis://127.0.0.1:{port}/").start()
    client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="x", max_retries=0, timeout=60)
    msg = [{"role": "user", "content": "hi"}]
    try:
        assert client.chat.completions.create(model=MODEL_ID, messages=msg, max_tokens=4).usage
        subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True)
        time.sleep(1)
        start_redis()

        def works():
            try:
                return client.chat.completions.create(model=MODEL_ID, messages=msg, max_tokens=4,
                                                      temperature=0).usage.completion_tokens == 4
            except openai.APIError:
                return False

        assert wait_for(works, timeout=60, every=1)
    finally:
        s.stop()
        subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True)
        shutil.rmtree(workdir, ignore_errors=True)


def pg_bin(name: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    if not found:
        skip_for_want_of(f"PostgreSQL server binaries ({name})")
    return str(found[-1])


def as_postgres(args, **kw):
    if os.geteuid() == 0:
        args = ["runuser", "-u", "postgres", "--", *args]
    return subprocess.run(args, **kw)


def test_a_postgres_restart_gives_503_during_and_recovers_after():
    port = free_port()
    data = tempfile.mkdtemp(prefix="fallow-pg-")
    shutil.chown(data, "postgres") if os.geteuid() == 0 else None
    as_postgres([pg_bin("initdb"), "-D", data, "-A", "trust", "-U", "postgres"], check=True,
                stdout=subprocess.DEVNULL)
    ctl = [pg_bin("pg_ctl"), "-D", data, "-o", f"-p {port} -k {data} -c listen_addresses=127.0.0.1",
           "-l", f"{data}/log", "-w"]
    as_postgres([*ctl, "start"], check=True, stdout=subprocess.DEVNULL)
    s = Stack(database="postgres")
    s.database_url = f"postgres://postgres@127.0.0.1:{port}/postgres"
    s.start()
    client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="x", max_retries=0, timeout=60)
    msg = [{"role": "user", "content": "hi"}]
    try:
        assert client.chat.completions.create(model=MODEL_ID, messages=msg, max_tokens=4).usage
        as_postgres([*ctl, "stop", "-m", "fast"], check=True, stdout=subprocess.DEVNULL)
        r = httpx.post(f"{s.base_url}/v1/chat/completions", timeout=30,
                       json={"model": MODEL_ID, "messages": msg, "max_tokens": 4})
        assert r.status_code == 503
        assert r.json()["error"]["type"]
        assert httpx.get(f"{s.base_url}/ready", timeout=10).status_code == 503
        as_postgres([*ctl, "start"], check=True, stdout=subprocess.DEVNULL)

        def works():
            try:
                return client.chat.completions.create(model=MODEL_ID, messages=msg, max_tokens=4,
                                                      temperature=0).usage.completion_tokens == 4
            except openai.APIError:
                return False

        assert wait_for(works, timeout=60, every=1)
    finally:
        s.stop()
        as_postgres([*ctl, "stop", "-m", "immediate"], capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


def test_a_stream_whose_only_runner_dies_waits_and_goes_on_when_a_runner_comes():
    with split_stack() as (api, procs):
        runner = procs[0]
        body = {"model": MODEL_ID, "messages": LONG, "max_tokens": 300, "stream": True, "ignore_eos": True,
                "temperature": 0}
        want = httpx.post(f"{api.base_url}/v1/chat/completions", json={**body, "stream": False},
                          timeout=120).json()["choices"][0]["message"]["content"]
        events = []
        with httpx.stream("POST", f"{api.base_url}/v1/chat/completions", json=body, timeout=120) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[len("data: "):])
                if len(events) == 3:
                    runner.send_signal(signal.SIGKILL)
                    runner.wait()
                    time.sleep(4)  # the lease expires with no runner to take the job over
                    procs.append(spawn("runner", api, *RUNNER_ARGS))
        assert events[-1] == "[DONE]"
        assert not any('"error"' in e for e in events), events[-2]
        text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1]
                       if json.loads(e)["choices"])
        assert text == want, "the stream goes on from its last token on the new runner"


def test_a_standalone_runner_serves_its_engine_metrics():
    with split_stack() as (api, procs):
        port = free_port()
        procs.append(spawn("runner", api, *RUNNER_ARGS, "--metrics-listen", f"127.0.0.1:{port}"))

        def engine_gauge():
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except httpx.HTTPError:
                return False
            return f'fallow:kv_cache_usage_perc{{model_name="{MODEL_ID}"}}' in text

        assert wait_for(engine_gauge, timeout=60)
