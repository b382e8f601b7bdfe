"""The TLS setups docs/deploy.md ("TLS") describes, run for real on loopback.

The module builds everything it needs on random free ports, and removes it afterwards:

- a throwaway CA, and a server certificate it signs for `localhost` and 127.0.0.1;
- a throwaway PostgreSQL cluster with `ssl = on`, whose pg_hba.conf refuses every connection
  that is not TLS (`hostnossl … reject`);
- a throwaway redis-server with a TLS port only (`--port 0`), so nothing can speak plain Redis;
- a TLS-terminating proxy (Python's `ssl`, in this module) in front of the api's plain HTTP.

On them it runs `fallow migrate`, `fallow api` and `fallow scheduler` with
`postgres://…?sslmode=verify-full&sslrootcert=CA` and `rediss://…` (the CA in `SSL_CERT_FILE`,
which rustls' native roots honour), and a gateway runner that holds nothing but
`--control-plane https://localhost:PROXY` and a runner token (the CA in `SSL_CERT_FILE`).

It proves that those setups work end to end (completions, streamed and not, served by the gateway
runner), that TLS is really in use (plain connections are refused; Postgres lists the
services' connections as TLS), and that certificates are really verified: without the CA, or
for a name the certificate does not hold, Postgres, Redis and the api's proxy are refused,
while `sslmode=require` encrypts without checking who answers, as the docs say."""

import datetime
import glob
import ipaddress
import os
import pwd
import select
import shutil
import socket
import ssl
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

from conftest import FALLOW, MODEL_ID, MODEL_PATH, ROOT, free_port, skip_for_want_of, stop_process, wait_for

ADMIN = "tls-admin-token-for-tests-5b1e"
HI = [{"role": "user", "content": "Name three colours."}]


def log_file(name: str) -> Path:
    """A fresh log under target/, as the other e2e tests keep theirs."""
    return ROOT / "target" / f"e2e-tls-{name}-{time.time_ns()}.log"


def clean_env(ca: Path | None) -> dict:
    """The environment of a spawned `fallow`: no FALLOW_*, database or Redis variables, and
    no trust bundle but `ca` (rustls' native roots read SSL_CERT_FILE instead of the system's
    store when it is set; without it, only the system's roots, which lack the test CA)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FALLOW_") and "DATABASE" not in k and "REDIS" not in k
           and k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    if ca is not None:
        env["SSL_CERT_FILE"] = str(ca)
    return env


def fallow(*args: str, ca: Path | None, timeout: float = 60) -> subprocess.CompletedProcess:
    """A short-lived `fallow` command (migrate, admin …), its output captured."""
    return subprocess.run([FALLOW, *args], capture_output=True, text=True, cwd=ROOT, env=clean_env(ca),
                          timeout=timeout)


def spawn(name: str, *args: str, ca: Path | None) -> tuple[subprocess.Popen, Path]:
    """A long-running `fallow` process, logging to target/."""
    path = log_file(name)
    with open(path, "w") as log:
        proc = subprocess.Popen([FALLOW, *args], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=clean_env(ca))
    return proc, path


# ---------------------------------------------------------------------------------------------
# The certificates


class Pki:
    """A throwaway CA (`ca.pem`) and a server certificate it signs for DNS `localhost` and IP
    127.0.0.1 (`server.pem`, `server.key`), in `dir`."""

    def __init__(self, dir: Path):
        try:
            import cryptography  # noqa: F401  (moto's dependency, in requirements.txt)
        except ImportError:
            skip_for_want_of("the `cryptography` package")
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        now = datetime.datetime.now(datetime.timezone.utc)
        valid = dict(not_valid_before=now - datetime.timedelta(hours=1),
                     not_valid_after=now + datetime.timedelta(days=1))

        def build(subject, issuer, public_key):
            return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
                    .serial_number(x509.random_serial_number())
                    .not_valid_before(valid["not_valid_before"]).not_valid_after(valid["not_valid_after"]))

        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Fallow e2e throwaway CA")])
        ca = (build(ca_name, ca_name, ca_key.public_key())
              .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
              .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                           content_commitment=False, key_encipherment=False,
                                           data_encipherment=False, key_agreement=False,
                                           encipher_only=False, decipher_only=False), critical=True)
              .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
              .sign(ca_key, hashes.SHA256()))

        key = ec.generate_private_key(ec.SECP256R1())
        server = (build(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]), ca_name,
                        key.public_key())
                  .add_extension(x509.SubjectAlternativeName([
                      x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                      critical=False)
                  .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                  .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                  .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                                 critical=False)
                  .sign(ca_key, hashes.SHA256()))

        self.dir = dir
        self.ca = dir / "ca.pem"
        self.cert = dir / "server.pem"
        self.key = dir / "server.key"
        self.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        self.cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
        self.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        self.key.chmod(0o600)


# ---------------------------------------------------------------------------------------------
# PostgreSQL with ssl = on, TLS only


class TlsPostgres:
    """A throwaway cluster (initdb, pg_ctl) on 127.0.0.1 and 127.0.0.2, TLS only. 127.0.0.2 is
    a name the server certificate does not hold. initdb refuses root, so as root the cluster
    runs as the `postgres` user (Debian's packages create it)."""

    def __init__(self, pki: Pki, dir: Path):
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        initdb = bins[-1] if bins else shutil.which("initdb")
        if not initdb:
            skip_for_want_of("PostgreSQL's initdb (/usr/lib/postgresql/*/bin/initdb)")
        self.bin = Path(initdb).parent
        self.as_user = []
        owner = None
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                skip_for_want_of("a `postgres` user to run initdb as (initdb refuses root)")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.port = free_port()
        self.dir = dir / "pg"
        self.data = self.dir / "data"
        self.dir.mkdir()
        self.log_path = log_file("postgres")
        self.log_path.touch()
        if owner:
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
            os.chown(self.log_path, owner.pw_uid, owner.pw_gid)
        self.dir.chmod(0o700)
        self.run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync",
                 "--no-instructions")
        # Its own copies of the certificate and key: Postgres wants the key owned by it, 0600.
        for src, name in ((pki.cert, "server.pem"), (pki.key, "server.key")):
            shutil.copy(src, self.data / name)
            if owner:
                os.chown(self.data / name, owner.pw_uid, owner.pw_gid)
        (self.data / "server.key").chmod(0o600)
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(f"""
listen_addresses = '127.0.0.1,127.0.0.2'
port = {self.port}
unix_socket_directories = '{self.dir}'
ssl = on
ssl_cert_file = 'server.pem'
ssl_key_file = 'server.key'
fsync = off
""")
        # TLS or nothing over TCP; the Unix socket is this module's own admin door.
        (self.data / "pg_hba.conf").write_text(
            "local all all trust\n"
            "hostnossl all all 0.0.0.0/0 reject\n"
            "hostssl all all 127.0.0.1/32 trust\n"
            "hostssl all all 127.0.0.2/32 trust\n")
        self.run("pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-w", "-t", "30", "start")
        self.psql("CREATE DATABASE fallow")

    def run(self, tool: str, *args: str) -> None:
        subprocess.run([*self.as_user, str(self.bin / tool), *args], check=True, capture_output=True,
                       text=True, timeout=60)

    def psql(self, sql: str) -> str:
        """SQL over the Unix socket (not TLS: only the tests' own checks use it)."""
        return subprocess.run(
            [str(self.bin / "psql"), "-h", str(self.dir), "-p", str(self.port), "-U", "postgres", "-d",
             "postgres", "-v", "ON_ERROR_STOP=1", "-qAt", "-c", sql],
            check=True, capture_output=True, text=True, timeout=30).stdout.strip()

    def url(self, host: str = "127.0.0.1", **query: str) -> str:
        q = "&".join(f"{k}={v}" for k, v in query.items())
        return f"postgres://postgres@{host}:{self.port}/fallow" + (f"?{q}" if q else "")

    def stop(self) -> None:
        try:
            self.run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except subprocess.CalledProcessError:
            pass


# ---------------------------------------------------------------------------------------------
# Redis with a TLS port only


class TlsRedis:
    """A throwaway redis-server with `--port 0 --tls-port P`: plain Redis is not served at all.
    It listens on 127.0.0.2 too, a name the server certificate does not hold."""

    def __init__(self, pki: Pki, dir: Path):
        if not shutil.which("redis-server"):
            skip_for_want_of("redis-server")
        self.pki = pki
        self.port = free_port()
        self.log_path = log_file("redis")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                ["redis-server", "--bind", "127.0.0.1 127.0.0.2", "--port", "0", "--tls-port", str(self.port),
                 "--tls-cert-file", str(pki.cert), "--tls-key-file", str(pki.key),
                 "--tls-ca-cert-file", str(pki.ca), "--tls-auth-clients", "no",
                 "--save", "", "--appendonly", "no", "--dir", str(dir)],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 15
        while time.time() < deadline:
            if self.proc.poll() is not None:
                # A build without TLS rejects the tls-* options and exits.
                skip_for_want_of(f"redis-server with TLS ({self.log_path.read_text()[-300:]!r})")
            try:
                if self.command("PING") == "PONG":
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"redis-server did not come up: {self.log_path.read_text()[-2000:]}")

    def command(self, *args: str) -> str:
        """One Redis command over verified TLS; the reply's text (simple or bulk strings only)."""
        ctx = ssl.create_default_context(cafile=str(self.pki.ca))
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(f"*{len(args)}\r\n".encode() + b"".join(
                f"${len(a.encode())}\r\n{a}\r\n".encode() for a in args))
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
                head, _, rest = data.partition(b"\r\n")
                if head[:1] in (b"+", b"-") and _:
                    return head[1:].decode()
                if head[:1] == b"$" and len(rest) >= int(head[1:]) + 2:
                    return rest[:int(head[1:])].decode()
            raise OSError(f"no reply: {data!r}")

    def stop(self) -> None:
        stop_process(self.proc)


# ---------------------------------------------------------------------------------------------
# A TLS-terminating proxy in front of the api


class TlsProxy:
    """Terminates TLS with the server certificate on 127.0.0.1:port and forwards the bytes to
    the api's plain HTTP port, as an Ingress or a reverse proxy would (without HTTP parsing).
    Counts the handshakes that succeeded, and keeps the errors of those that failed.

    A thread per connection, which alone uses its TLS socket (an SSL object is not for two
    threads at once): it completes the handshake, then pumps bytes both ways with select()."""

    def __init__(self, pki: Pki, upstream_port: int):
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(str(pki.cert), str(pki.key))
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.handshakes = 0
        self.failed_handshakes = []
        self.lock = threading.Lock()
        self.closed = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        try:
            tls = self.ctx.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError) as e:
            with self.lock:
                self.failed_handshakes.append(repr(e))
            conn.close()
            return
        with self.lock:
            self.handshakes += 1
        tls.settimeout(None)
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10)
        except OSError:
            tls.close()
            return
        upstream.settimeout(None)
        with tls, upstream:
            while not self.closed:
                # Bytes TLS has decrypted already do not make the socket readable.
                readable = [tls] if tls.pending() else select.select([tls, upstream], [], [], 0.5)[0]
                for src in readable:
                    try:
                        data = src.recv(65536)
                        if not data:
                            return
                        (upstream if src is tls else tls).sendall(data)
                    except OSError:  # ssl.SSLError included
                        return

    def stop(self) -> None:
        self.closed = True
        self.thread.join(timeout=10)
        self.listener.close()


# ---------------------------------------------------------------------------------------------
# The stack: migrate, api, scheduler and a gateway runner, every connection over TLS


class TlsStack:
    def __init__(self, pki: Pki, pg: TlsPostgres, redis: TlsRedis, dir: Path):
        self.pki, self.pg, self.redis, self.dir = pki, pg, redis, dir
        # The URLs docs/deploy.md prescribes.
        self.database_url = pg.url(sslmode="verify-full", sslrootcert=str(pki.ca))
        self.redis_url = f"rediss://127.0.0.1:{redis.port}/"
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.proxy = TlsProxy(pki, self.port)
        self.control_plane = f"https://localhost:{self.proxy.port}"
        self.procs = []

    def start(self):
        # No SSL_CERT_FILE: the URL's sslrootcert alone lets `migrate` verify Postgres.
        migrated = fallow("migrate", "--database-url", self.database_url, ca=None)
        assert migrated.returncode == 0, migrated.stderr
        self.api, self.api_log = self.spawn("api", "--listen", f"127.0.0.1:{self.port}", "--auth",
                                            "--admin-token", ADMIN)
        # Both need SSL_CERT_FILE for Redis: rediss:// has no sslrootcert of its own.
        self.scheduler, _ = self.spawn("scheduler")
        # /ready answers 200 only once the api reaches Postgres and Redis.
        wait_for(lambda: self.ready(self.api, self.api_log), timeout=60)
        self.key = self.admin_cli("keys", "create", "--tenant", "tls")
        self.token = self.admin_cli("runner-tokens", "create", "--name", "lab-tls", "--models", MODEL_ID)
        self.runner, self.runner_log = self.start_runner(self.token, ca=self.pki.ca)
        wait_for(self.serving, timeout=120)
        return self

    def spawn(self, command: str, *extra: str):
        proc, log = spawn(command, command, "--database-url", self.database_url, "--redis-url", self.redis_url,
                          *extra, ca=self.pki.ca)
        self.procs.append(proc)
        return proc, log

    def ready(self, proc, log: Path):
        if proc.poll() is not None:
            raise RuntimeError(f"the api exited with {proc.returncode}: {log.read_text()[-3000:]}")
        try:
            return httpx.get(f"{self.base_url}/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def serving(self):
        """The gateway runner registered and its model is offered."""
        if self.runner.poll() is not None:
            raise RuntimeError(f"the runner exited with {self.runner.returncode} (the proxy's handshakes: "
                               f"{self.proxy.handshakes} good, failed: {self.proxy.failed_handshakes}): "
                               f"{self.runner_log.read_text()[-3000:]}")
        return self.models()

    def admin_cli(self, *args: str) -> str:
        # The admin CLI talks to the api directly; only the runner goes through the proxy.
        out = fallow("admin", *args, "--url", self.base_url, "--token", ADMIN, ca=None)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def start_runner(self, token: str, ca: Path | None):
        """A gateway runner as on a lent machine: the api's https:// URL and a token file, and
        nothing of the control plane's secrets in its environment."""
        path = self.dir / f"token-{uuid.uuid4().hex[:8]}"
        path.write_text(token + "\n")
        path.chmod(stat.S_IRUSR | stat.S_IWUSR)
        proc, log = spawn("runner", "runner", "--control-plane", self.control_plane, "--runner-token-file",
                          str(path), "--model", str(MODEL_PATH), "--kv-cache-mb", "128", ca=ca)
        self.procs.append(proc)
        return proc, log

    def models(self):
        r = httpx.get(f"{self.base_url}/v1/models", headers={"Authorization": f"Bearer {self.key}"}, timeout=5)
        return r.status_code == 200 and r.json()["data"]

    def admin(self, path: str):
        return httpx.get(f"{self.base_url}/admin{path}", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)

    def stop(self):
        for proc in reversed(self.procs):
            stop_process(proc)
        self.proxy.stop()


@pytest.fixture(scope="module")
def workdir():
    path = Path(tempfile.mkdtemp(prefix="fallow-tls-"))
    path.chmod(0o755)  # the postgres user walks through it to its data directory
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def pki(workdir):
    return Pki(workdir)


@pytest.fixture(scope="module")
def pg(pki, workdir):
    server = TlsPostgres(pki, workdir)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def redis(pki, workdir):
    server = TlsRedis(pki, workdir)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tls_stack(pki, pg, redis, workdir):
    if not MODEL_PATH.exists():
        pytest.fail(f"default model missing at {MODEL_PATH}: run scripts/fetch-models.sh")
    s = TlsStack(pki, pg, redis, workdir)
    try:
        s.start()
    except BaseException:
        s.stop()
        raise
    yield s
    s.stop()


# ---------------------------------------------------------------------------------------------
# The tests


def test_every_service_speaks_tls_to_postgres_redis_and_the_api_with_verified_certificates(tls_stack, pg, redis):
    client = openai.OpenAI(base_url=f"{tls_stack.base_url}/v1", api_key=tls_stack.key, max_retries=0, timeout=120)
    answer = client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=8, temperature=0)
    assert answer.choices[0].message.content and answer.usage.completion_tokens > 0

    streamed = client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=8, temperature=0,
                                              stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)
    assert text == answer.choices[0].message.content

    # The gateway runner served them, through the proxy, having verified its certificate.
    runners = tls_stack.admin("/runners").json()["data"]
    assert [(r["transport"], r["token"]) for r in runners] == [("gateway", "lab-tls")], runners
    assert tls_stack.proxy.handshakes > 0 and not tls_stack.proxy.failed_handshakes

    # The scheduler runs on the same URLs, and is still up.
    assert tls_stack.scheduler.poll() is None

    # Postgres sees only TLS connections from the services (the cluster refuses others anyway).
    rows = pg.psql("SELECT s.ssl, s.version FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
                   "WHERE a.datname = 'fallow' AND a.client_addr IS NOT NULL").splitlines()
    assert rows and all(row.startswith("t|TLS") for row in rows), rows
    # Redis has no plain port at all, and the services hold connections to its TLS port
    # (CLIENT LIST names this one too).
    clients = redis.command("CLIENT", "LIST").splitlines()
    assert len(clients) >= 2, clients


def test_plain_connections_to_postgres_and_redis_are_refused(pg, redis):
    # sslmode=disable: pg_hba.conf's `hostnossl … reject` answers.
    plain = fallow("migrate", "--database-url", pg.url(sslmode="disable"), ca=None)
    assert plain.returncode != 0
    assert "no encryption" in plain.stderr, plain.stderr
    # Redis serves TLS only: a plain client's command on its port gets no answer.
    with socket.create_connection(("127.0.0.1", redis.port), timeout=5) as s:
        s.sendall(b"PING\r\n")
        try:
            reply = s.recv(100)
        except OSError:
            reply = b""
        assert b"PONG" not in reply, reply


def test_postgres_verify_full_refuses_an_unknown_ca_and_a_name_the_certificate_lacks(pg, redis, pki):
    # No sslrootcert, and the system's roots lack the throwaway CA: the api does not start.
    # (With the CA in SSL_CERT_FILE it would: sqlx adds the native roots, which read that file.)
    proc, log = spawn("api-unverified", "api", "--listen", f"127.0.0.1:{free_port()}",
                      "--database-url", pg.url(sslmode="verify-full"),
                      "--redis-url", f"rediss://127.0.0.1:{redis.port}/", "--auth", "--admin-token", ADMIN,
                      ca=None)
    try:
        assert proc.wait(timeout=60) != 0
    finally:
        stop_process(proc)
    assert "UnknownIssuer" in log.read_text(), log.read_text()[-2000:]

    # The right CA, but a host name (127.0.0.2) the certificate does not hold.
    wrong_name = fallow("migrate", "--database-url",
                        pg.url("127.0.0.2", sslmode="verify-full", sslrootcert=str(pki.ca)), ca=None)
    assert wrong_name.returncode != 0
    assert 'not valid for name "127.0.0.2"' in wrong_name.stderr, wrong_name.stderr

    # `require` encrypts, but does not check who answers (docs/deploy.md): the same server
    # under the same wrong name, without the CA, is accepted.
    required = fallow("migrate", "--database-url", pg.url("127.0.0.2", sslmode="require"), ca=None)
    assert required.returncode == 0, required.stderr


@pytest.mark.parametrize("case", ["unknown CA", "wrong name"])
def test_an_api_that_cannot_verify_redis_certificate_is_not_ready(tls_stack, redis, case):
    # The api starts without Redis (it connects on first use), but /ready says why it is not.
    if case == "unknown CA":
        # No SSL_CERT_FILE: the certificate chains to no root this process trusts.
        redis_url, ca, error = tls_stack.redis_url, None, "UnknownIssuer"
    else:
        # The CA trusted, but the server reached as 127.0.0.2, a name the certificate lacks.
        redis_url, ca = f"rediss://127.0.0.2:{redis.port}/", tls_stack.pki.ca
        error = 'not valid for name "127.0.0.2"'
    port = free_port()
    proc, log = spawn("api-unverified-redis", "api", "--listen", f"127.0.0.1:{port}",
                      "--database-url", tls_stack.database_url, "--redis-url", redis_url,
                      "--auth", "--admin-token", ADMIN, ca=ca)
    try:
        def answer():
            if proc.poll() is not None:
                return "exited"
            try:
                return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2)
            except httpx.HTTPError:
                return None
        r = wait_for(answer, timeout=30)
        if r != "exited":
            assert r.status_code == 503, r.text
            assert error in r.json()["error"]["message"], r.text
    finally:
        stop_process(proc)
    assert error in log.read_text(), log.read_text()[-2000:]


def test_a_runner_that_does_not_trust_the_apis_certificate_does_not_register(tls_stack):
    before = tls_stack.admin("/runners").json()["data"]
    failed = len(tls_stack.proxy.failed_handshakes)
    token = tls_stack.admin_cli("runner-tokens", "create", "--name", "lab-untrusting", "--models", MODEL_ID)
    # The same runner, without the CA in SSL_CERT_FILE: only the system's roots.
    runner, log = tls_stack.start_runner(token, ca=None)
    try:
        code = runner.wait(timeout=90)
    finally:
        stop_process(runner)
    text = log.read_text()
    assert code != 0, text[-2000:]
    assert f"{tls_stack.control_plane}/runner/v1/register" in text, text[-2000:]
    # It refused the certificate, and says why: the proxy's handshake ended with the runner's
    # TLS alert `unknown_ca`.
    assert "UnknownIssuer" in text, text[-2000:]
    refused = tls_stack.proxy.failed_handshakes[failed:]
    assert refused and all("unknown ca" in e.lower() for e in refused), refused
    # The api saw no new runner.
    assert [r["id"] for r in tls_stack.admin("/runners").json()["data"]] == [r["id"] for r in before]
