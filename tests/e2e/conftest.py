"""End-to-end fixtures: a real `fallow dev` stack (Postgres, Redis, the engine with the default
model) on a random port with a fresh database, driven by the official `openai` SDK."""

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
FALLOW = os.environ.get("FALLOW_BIN", str(ROOT / "target" / "debug" / "fallow"))
MODEL_PATH = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ID = "SmolLM2-135M-Instruct.Q4_1"
# The embedding model (scripts/fetch-models.sh --minilm): a sentence-transformers directory.
MINILM_PATH = ROOT / "models" / "all-MiniLM-L6-v2"
MINILM_ID = "all-MiniLM-L6-v2"
PG_ADMIN_URL = os.environ.get("FALLOW_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("FALLOW_TEST_REDIS_URL", "redis://127.0.0.1:6379/")


def skip_for_want_of(what: str) -> None:
    """Skips a test for want of `what`, or fails it in CI (CI=true): infra/test.sh installs
    everything the suite needs, so a skip there would hide a broken install as a pass."""
    if os.environ.get("CI") in ("true", "1"):
        pytest.fail(f"{what}: CI=true requires it (infra/test.sh installs it)")
    pytest.skip(f"{what} is missing")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def psql(sql: str) -> None:
    subprocess.run(["psql", PG_ADMIN_URL, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql], check=True,
                   stdout=subprocess.DEVNULL)


def wait_for(predicate, timeout=30.0, every=0.1):
    """Polls `predicate` until it returns something truthy, which is returned."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError("condition not met in time")


def spawn(command: str, stack: "Stack", *extra: str) -> subprocess.Popen:
    """Another `fallow` process (runner, scheduler, …) against `stack`'s database and Redis."""
    args = [FALLOW, command, "--database-url", stack.database_url, "--redis-url", stack.redis_url, *extra]
    log = open(ROOT / "target" / f"e2e-{stack.database}-{command}-{time.time_ns()}.log", "w")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def spawn_gateway_runner(stack: "Stack", name: str, *extra: str, token_options: tuple = ()) -> subprocess.Popen:
    """A gateway runner of `stack`: `fallow runner --control-plane` with a runner token of its
    own (`fallow admin runner-tokens create --name name *token_options`, through the stack's
    admin API, open on loopback) in a 0600 file, and no database or Redis URL in its arguments
    or environment."""
    token = subprocess.run(
        [FALLOW, "admin", "runner-tokens", "create", "--name", name, *token_options, "--url", stack.base_url],
        check=True, capture_output=True, text=True, cwd=ROOT).stdout.strip()
    path = Path(tempfile.mkdtemp(prefix="fallow-runner-token-")) / name
    path.write_text(token + "\n")
    path.chmod(0o600)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FALLOW_") and "DATABASE" not in k and "REDIS" not in k}
    log = open(ROOT / "target" / f"e2e-{stack.database}-runner-{name}-{time.time_ns()}.log", "w")
    return subprocess.Popen([FALLOW, "runner", "--control-plane", stack.base_url, "--runner-token-file", str(path),
                             *extra], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)


def stop_process(proc: subprocess.Popen) -> None:
    """Stops a process started by `spawn`: SIGTERM (a runner hands its jobs back), then kill."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Stack:
    """One `fallow` process and its database."""

    def __init__(self, *extra_args: str, auth: bool = False, redis_url: str = REDIS_URL,
                 database: str | None = None, command: str = "dev"):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.database = database or f"fallow_e2e_{uuid.uuid4().hex[:12]}"
        self.owns_database = database is None
        base = PG_ADMIN_URL.rsplit("/", 1)[0]
        self.database_url = f"{base}/{self.database}"
        self.redis_url = redis_url
        self.auth = auth
        self.command = command
        self.extra_args = list(extra_args)
        self.proc = None
        self.ready_key = None
        self.log_path = ROOT / "target" / f"e2e-{self.database}-{self.port}.log"

    def start(self):
        if self.owns_database:
            psql(f'CREATE DATABASE "{self.database}"')
            self.owns_database = "created"
        self.ready_key = self.create_key("e2e-readiness") if self.auth else None
        args = [FALLOW, self.command, "--listen", f"127.0.0.1:{self.port}",
                "--database-url", self.database_url, "--redis-url", self.redis_url,
                "--model", str(MODEL_PATH), "--auth" if self.auth else "--no-auth",
                "--kv-cache-mb", "128", *self.extra_args]
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 120.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"fallow exited with {self.proc.returncode}: {self.log_text()}")
            try:
                headers = {"Authorization": f"Bearer {self.ready_key}"} if self.ready_key else {}
                r = httpx.get(f"{self.base_url}/v1/models", timeout=2, headers=headers)
                if r.status_code == 200 and r.json().get("data"):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"fallow did not become ready: {self.log_text()}")

    def log_text(self) -> str:
        try:
            return self.log_path.read_text()[-4000:]
        except OSError:
            return ""

    def create_key(self, tenant: str) -> str:
        out = subprocess.run([FALLOW, "admin", "keys", "create", "--tenant", tenant,
                              "--database-url", self.database_url],
                             check=True, capture_output=True, text=True, cwd=ROOT)
        return out.stdout.strip()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.owns_database == "created":
            psql(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')


@pytest.fixture(scope="session")
def stack():
    if not MODEL_PATH.exists():
        pytest.fail(f"default model missing at {MODEL_PATH}: run scripts/fetch-models.sh")
    if not shutil.which("psql"):
        pytest.fail("psql is needed to create test databases")
    s = Stack().start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def embedding_stack():
    """A stack that serves the default model and MiniLM, for embeddings."""
    if not MINILM_PATH.is_dir():
        skip_for_want_of(f"{MINILM_PATH} (scripts/fetch-models.sh --minilm)")
    s = Stack("--model", str(MINILM_PATH)).start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(stack):
    from openai import OpenAI
    return OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
