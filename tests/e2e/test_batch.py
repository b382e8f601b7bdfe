"""The Files and Batch APIs through the official `openai` SDK: a batch's whole life on the local
store and on S3 (a real moto server), listing, cancelling, malformed files, and tenant
isolation. Every finished batch is checked for the invariant: each custom_id exactly once
across the output and error files."""

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import openai
import pytest

from conftest import FALLOW, MODEL_ID, MODEL_PATH, ROOT, Stack, free_port, psql, spawn

FINAL = {"completed", "failed", "expired", "cancelled"}


def jsonl(n: int, max_tokens: int = 4, prefix: str = "req") -> bytes:
    lines = [json.dumps({
        "custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": MODEL_ID, "messages": [{"role": "user", "content": f"Count to {i}."}],
                 "max_tokens": max_tokens, "temperature": 0},
    }) for i in range(n)]
    return ("\n".join(lines) + "\n").encode()


def upload(client, content: bytes, name: str = "input.jsonl"):
    return client.files.create(file=(name, content, "application/jsonl"), purpose="batch")


def wait_final(client, batch_id: str, timeout: float = 240.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in FINAL:
            return batch
        time.sleep(0.5)
    raise TimeoutError(f"batch {batch_id} did not finish: {batch}")


def result_lines(client, batch):
    out, err = [], []
    if batch.output_file_id:
        out = [json.loads(l) for l in client.files.content(batch.output_file_id).text.splitlines()]
    if batch.error_file_id:
        err = [json.loads(l) for l in client.files.content(batch.error_file_id).text.splitlines()]
    return out, err


def assert_each_custom_id_once(out, err, n: int, prefix: str = "req"):
    ids = [l["custom_id"] for l in out + err]
    assert sorted(ids) == sorted(f"{prefix}-{i}" for i in range(n))


def run_batch_flow(client, n: int = 5):
    content = jsonl(n)
    f = upload(client, content)
    assert f.object == "file" and f.purpose == "batch" and f.bytes == len(content)
    assert client.files.retrieve(f.id).id == f.id
    assert client.files.content(f.id).content == content
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"run": "e2e"})
    assert batch.status == "validating" and batch.metadata == {"run": "e2e"}
    batch = wait_final(client, batch.id)
    assert batch.status == "completed", batch
    assert batch.request_counts.total == n and batch.request_counts.completed == n
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    out, err = result_lines(client, batch)
    assert err == []
    assert_each_custom_id_once(out, err, n)
    for line in out:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] <= 4
    return batch


def test_a_batch_runs_to_completion_on_the_local_store(client):
    run_batch_flow(client)


@pytest.fixture(scope="module")
def moto():
    binary = shutil.which("moto_server") or str(ROOT / ".venv" / "bin" / "moto_server")
    if not Path(binary).exists():
        pytest.fail("moto_server is needed: pip install 'moto[server]' (infra/test.sh does)")
    port = free_port()
    proc = subprocess.Popen([binary, "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(150):
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def s3_client(moto):
    bucket = f"fallow-e2e-{uuid.uuid4().hex[:8]}"
    httpx.put(f"{moto}/{bucket}", timeout=10).raise_for_status()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    s = Stack("--s3-bucket", bucket, "--s3-endpoint", moto, "--s3-path-style",
              "--s3-region", "us-east-1").start()
    yield openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="unused", max_retries=0, timeout=120), moto, bucket
    s.stop()


def test_a_batch_runs_to_completion_on_s3(s3_client):
    client, moto, bucket = s3_client
    batch = run_batch_flow(client, n=3)
    listing = httpx.get(f"{moto}/{bucket}", timeout=10).text
    assert batch.output_file_id.removeprefix("file-") in listing, "the output file lives in the bucket"


def test_batches_are_listed_newest_first(client):
    f = upload(client, jsonl(1))
    first = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    second = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    ids = [b.id for b in client.batches.list(limit=100)]
    assert ids.index(second.id) < ids.index(first.id)
    page = client.batches.list(limit=1)
    assert len(page.data) == 1 and page.has_more
    wait_final(client, first.id)
    wait_final(client, second.id)


def test_a_cancelled_batch_ends_cancelled_with_one_line_per_request(client):
    n = 40
    f = upload(client, jsonl(n, max_tokens=64, prefix="c"))
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status in {"cancelling", "cancelled"}
    batch = wait_final(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at
    out, err = result_lines(client, batch)
    if batch.request_counts.total:
        assert_each_custom_id_once(out, err, n, prefix="c")
        assert any(l["error"] and l["error"]["code"] == "batch_cancelled" for l in err)


@pytest.mark.parametrize("name,content,line,code", [
    ("bad json", jsonl(1) + b"{nope\n", 2, "invalid_json_line"),
    ("duplicate custom_id", jsonl(2).replace(b"req-1", b"req-0"), 2, "duplicate_custom_id"),
    ("wrong url", jsonl(1).replace(b"/v1/chat/completions", b"/v1/embeddings"), 1, "mismatched_url"),
    ("non utf-8", jsonl(1) + b"\xff\xfe\n", 2, "invalid_encoding"),
    ("invalid body", jsonl(1).replace(b'"temperature": 0', b'"temperature": 9'), 1, "invalid_request"),
    ("empty file", b"\n", None, "empty_file"),
    ("unknown model", jsonl(2).replace(MODEL_ID.encode(), b"no-such-model", 1), 1, "model_not_found"),
])
def test_a_malformed_file_fails_the_batch_with_line_numbers(client, name, content, line, code):
    f = upload(client, content)
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    batch = wait_final(client, batch.id, timeout=60)
    assert batch.status == "failed" and batch.failed_at, name
    assert batch.request_counts.total == 0
    first = batch.errors.data[0]
    assert (first.line, first.code) == (line, code), first


def test_a_batch_with_a_bad_endpoint_or_window_is_refused(client):
    f = upload(client, jsonl(1))
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=f.id, endpoint="/v1/moderations", completion_window="24h")
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="forever")
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")


def test_a_deleted_file_is_gone(client):
    f = upload(client, jsonl(1))
    assert client.files.delete(f.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(f.id)
    assert f.id not in [x.id for x in client.files.list()]


@pytest.fixture(scope="module")
def tenants():
    s = Stack(auth=True).start()
    clients = [openai.OpenAI(base_url=f"{s.base_url}/v1", api_key=s.create_key(name), max_retries=0, timeout=120)
               for name in ("tenant-a", "tenant-b")]
    yield clients
    s.stop()


def test_another_tenants_files_and_batches_are_not_found(tenants):
    a, b = tenants
    f = upload(a, jsonl(1))
    batch = a.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    for call in (lambda: b.files.retrieve(f.id), lambda: b.files.content(f.id), lambda: b.files.delete(f.id),
                 lambda: b.batches.retrieve(batch.id), lambda: b.batches.cancel(batch.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.BadRequestError):
        b.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert f.id not in [x.id for x in b.files.list()]
    assert batch.id not in [x.id for x in b.batches.list()]
    assert wait_final(a, batch.id).status == "completed"


def test_interactive_requests_are_claimed_before_queued_batch_jobs(stack, client):
    f = upload(client, jsonl(64, max_tokens=48, prefix="p"))
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.time() + 60
    while client.batches.retrieve(batch.id).status == "validating" and time.time() < deadline:
        time.sleep(0.1)
    started = time.time()
    r = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=4, temperature=0)
    assert r.choices[0].message.content is not None
    interactive_latency = time.time() - started
    # No batch job that was already queued when the interactive request arrived was claimed
    # after it arrived but before it was claimed.
    overtaken = subprocess.run(
        ["psql", stack.database_url, "-tAc",
         "SELECT count(*) FROM jobs b, jobs i WHERE i.kind = 'interactive' AND b.kind = 'batch' "
         "AND b.created_at < i.created_at AND b.started_at > i.created_at AND b.started_at < i.started_at"],
        check=True, capture_output=True, text=True).stdout.strip()
    assert overtaken == "0"
    batch = wait_final(client, batch.id)
    assert batch.status == "completed"
    assert interactive_latency < time.time() - started, "the interactive request did not wait for the batch"


# 10,000 lines pass too (about 14 minutes on 2 busy CPU cores); the default keeps CI short.
BIG_BATCH_LINES = int(os.environ.get("FALLOW_E2E_BATCH_LINES", "2000"))




def test_a_big_batch_survives_a_runner_killed_midway(tmp_path):
    """Every custom_id exactly once across the output and error files, although the runner
    holding jobs is SIGKILLed halfway and a new one takes over."""
    n = BIG_BATCH_LINES
    store = ["--store-dir", str(tmp_path / "store")]
    api = Stack(command="api")
    psql(f'CREATE DATABASE "{api.database}"')
    api.owns_database = "created"
    runner_args = ["--model", str(MODEL_PATH), "--lease-seconds", "3", "--kv-cache-mb", "64"]
    procs = [spawn("runner", api, *runner_args), spawn("scheduler", api, *store)]
    try:
        api.log = open(api.log_path, "w")
        api.proc = subprocess.Popen([FALLOW, "api", "--no-auth", "--listen", f"127.0.0.1:{api.port}",
                                     "--database-url", api.database_url, "--redis-url", api.redis_url, *store],
                                    stdout=api.log, stderr=subprocess.STDOUT, cwd=ROOT)
        api.wait_ready()
        client = openai.OpenAI(base_url=f"{api.base_url}/v1", api_key="x", max_retries=0, timeout=120)
        f = upload(client, jsonl(n, max_tokens=1, prefix="big"))
        batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        deadline = time.time() + 900
        while client.batches.retrieve(batch.id).request_counts.completed < n // 3:
            assert time.time() < deadline, "the batch made no progress"
            time.sleep(0.5)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait()
        procs.append(spawn("runner", api, *runner_args))
        batch = wait_final(client, batch.id, timeout=900)
        assert batch.status == "completed", batch
        out, err = result_lines(client, batch)
        assert_each_custom_id_once(out, err, n, prefix="big")
        assert batch.request_counts.total == n
        assert batch.request_counts.completed + batch.request_counts.failed == n
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=15)
        api.stop()
