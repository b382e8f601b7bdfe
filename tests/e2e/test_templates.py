"""The deployment templates under infra/ give a runner no secret of the control plane: it gets
the api's URL and a runner token as a file, and no database URL, Redis URL or admin token,
and it runs no migration (docs/deploy.md#trust-model). These tests read the templates alone:
they need neither the fallow binary nor Postgres or Redis."""

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S_RUNNER = ROOT / "infra" / "k8s" / "runner.yaml"
COMPOSE = ROOT / "infra" / "compose" / "compose.yaml"
SYSTEMD = ROOT / "infra" / "systemd"
SYSTEMD_RUNNER = SYSTEMD / "fallow-runner.service"

# A name or value that hands the runner the database, Redis or the admin API.
FORBIDDEN = re.compile(r"DATABASE|REDIS|ADMIN_TOKEN|postgres(ql)?://|rediss?://", re.IGNORECASE)
FORBIDDEN_FLAGS = ("--database-url", "--redis-url", "--admin-token", "--admin-token-file", "--runner-token")


@dataclass
class Runner:
    """What a template gives the runner's process."""

    env: dict = field(default_factory=dict)
    # The secrets it is handed (Kubernetes Secrets, Compose secrets, systemd credentials).
    secrets: list = field(default_factory=list)
    # Where those secrets appear as files in the runner's file system.
    secret_dirs: list = field(default_factory=list)
    # The command lines run for it: the runner's own and anything run before it.
    commands: list = field(default_factory=list)


def k8s_documents() -> list:
    return [d for d in yaml.safe_load_all(K8S_RUNNER.read_text()) if d]


def k8s_pod() -> dict:
    daemon_sets = [d for d in k8s_documents() if d["kind"] == "DaemonSet"]
    assert len(daemon_sets) == 1, "runner.yaml should hold one DaemonSet"
    return daemon_sets[0]["spec"]["template"]["spec"]


def k8s_config_maps() -> dict:
    return {d["metadata"]["name"]: d.get("data") or {} for d in k8s_documents() if d["kind"] == "ConfigMap"}


def k8s_runner() -> Runner:
    pod = k8s_pod()
    config_maps = k8s_config_maps()
    runner = Runner()
    for container in pod.get("initContainers", []) + pod["containers"]:
        runner.commands.append([*container.get("command", []), *container.get("args", [])])
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                runner.secrets.append(f"envFrom secret {source['secretRef']['name']}")
            if "configMapRef" in source:
                name = source["configMapRef"]["name"]
                # A ConfigMap from elsewhere (fallow-config names Redis) cannot be checked here.
                assert name in config_maps, f"the runner loads the ConfigMap {name!r}, not one of runner.yaml's own"
                runner.env.update(config_maps[name])
        for var in container.get("env", []):
            value_from = var.get("valueFrom", {})
            if "secretKeyRef" in value_from:
                runner.secrets.append(f"env {var['name']} from secret {value_from['secretKeyRef']['name']}")
            runner.env[var["name"]] = str(var.get("value", value_from))
    mounts = {m["name"]: m for c in pod["containers"] for m in c.get("volumeMounts", [])}
    for volume in pod.get("volumes", []):
        sources = [volume] + volume.get("projected", {}).get("sources", [])
        for source in sources:
            if "secret" in source:
                runner.secrets.append(source["secret"].get("secretName") or source["secret"].get("name"))
                if volume["name"] in mounts:
                    runner.secret_dirs.append(mounts[volume["name"]]["mountPath"])
    return runner


def compose_services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def env_file(path: Path) -> dict:
    """KEY=VALUE lines, as systemd's EnvironmentFile= and Compose's env_file read them."""
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        name, _, value = line.partition("=")
        env[name.strip()] = value.strip().strip("\"'")
    return env


def compose_runner() -> Runner:
    document = yaml.safe_load(COMPOSE.read_text())
    service = document["services"]["runner"]
    runner = Runner()
    environment = service.get("environment", {})
    if isinstance(environment, list):
        environment = dict(item.partition("=")[::2] for item in environment)
    env_files = service.get("env_file", [])
    for path in [env_files] if isinstance(env_files, str) else env_files:
        path = path if isinstance(path, str) else path["path"]
        runner.env.update(env_file(COMPOSE.parent / path))
    runner.env.update({k: str(v) for k, v in environment.items()})
    for command in (service.get("entrypoint"), service.get("command")):
        if command:
            runner.commands.append(shlex.split(command) if isinstance(command, str) else command)
    for secret in service.get("secrets", []):
        source = secret if isinstance(secret, str) else secret["source"]
        target = source if isinstance(secret, str) else secret.get("target", source)
        definition = document.get("secrets", {}).get(source)
        assert definition is not None, f"the runner's secret {source!r} is not defined"
        assert "file" in definition, f"the runner's secret {source!r} should come from a file"
        runner.secrets.append(source)
        path = target if target.startswith("/") else f"/run/secrets/{target}"
        runner.secret_dirs.append(path.rsplit("/", 1)[0])
    return runner


def systemd_unit(path: Path) -> list:
    """The unit's (section, key, value) settings, in order (keys repeat)."""
    settings, section = [], None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        settings.append((section, key.strip(), value.strip()))
    return settings


def systemd_env_example(environment_file: str) -> Path:
    """The example shipped for an EnvironmentFile= (/etc/fallow/X.env: infra/systemd/X.env.example)."""
    return SYSTEMD / (Path(environment_file.lstrip("-")).name + ".example")


def systemd_runner() -> Runner:
    runner = Runner()
    settings = systemd_unit(SYSTEMD_RUNNER)
    # EnvironmentFile= wins over Environment=, whatever their order.
    for _, key, value in settings:
        if key == "Environment":
            runner.env.update(item.partition("=")[::2] for item in shlex.split(value))
    for _, key, value in settings:
        if key == "EnvironmentFile":
            example = systemd_env_example(value)
            assert example.exists(), f"{value} has no example under infra/systemd/"
            runner.env.update(env_file(example))
        elif key in ("LoadCredential", "LoadCredentialEncrypted", "SetCredential", "SetCredentialEncrypted"):
            runner.secrets.append(value.partition(":")[0])
            runner.secret_dirs.append("%d")
        elif key.startswith("Exec"):
            runner.commands.append(shlex.split(value.lstrip("-+!@:")))
    return runner


def runner_token_file_flag(runner: Runner):
    """The value of `--runner-token-file PATH` (or `=PATH`) in the runner's command, if any."""
    for command in runner.commands:
        for i, arg in enumerate(command):
            if arg == "--runner-token-file" and i + 1 < len(command):
                return command[i + 1]
            if arg.startswith("--runner-token-file="):
                return arg.partition("=")[2]
    return None


TEMPLATES = {"k8s": k8s_runner, "compose": compose_runner, "systemd": systemd_runner}


# Each generic test reads its template itself, so that a template the reader refuses fails
# the test rather than erroring in a fixture.
each_template = pytest.mark.parametrize("template", sorted(TEMPLATES))


@each_template
def test_every_runner_template_gives_the_runner_the_api_url_as_its_control_plane(template):
    runner = TEMPLATES[template]()
    url = runner.env.get("FALLOW_CONTROL_PLANE", "")
    assert url.startswith(("http://", "https://")), f"FALLOW_CONTROL_PLANE is {url!r}"


@each_template
def test_every_runner_template_hands_the_token_over_as_a_file_of_its_one_secret(template):
    runner = TEMPLATES[template]()
    assert "FALLOW_RUNNER_TOKEN" not in runner.env, "the token itself is in the environment, not in a file"
    token_file = runner.env.get("FALLOW_RUNNER_TOKEN_FILE") or runner_token_file_flag(runner)
    assert token_file, "neither FALLOW_RUNNER_TOKEN_FILE nor --runner-token-file"
    assert len(runner.secrets) == 1, f"the runner gets these secrets: {runner.secrets}"
    assert any(token_file.startswith(d.rstrip("/") + "/") for d in runner.secret_dirs), (
        f"{token_file} is not in the token secret's files ({runner.secret_dirs})"
    )


@each_template
def test_no_runner_template_gives_the_runner_a_database_redis_or_admin_secret(template):
    runner = TEMPLATES[template]()
    for name, value in runner.env.items():
        assert not FORBIDDEN.search(name), f"the runner gets {name}"
        assert not FORBIDDEN.search(value), f"the runner's {name} is {value!r}"
    for secret in runner.secrets:
        assert not FORBIDDEN.search(secret), f"the runner gets the secret {secret!r}"
    for command in runner.commands:
        for arg in command:
            assert not FORBIDDEN.search(arg), f"the runner's command {command} names {arg!r}"
            assert arg.split("=")[0] not in FORBIDDEN_FLAGS, f"the runner's command {command} passes {arg}"


@each_template
def test_no_runner_template_runs_migrations(template):
    runner = TEMPLATES[template]()
    for command in runner.commands:
        assert "migrate" not in command, f"{command} runs the migrations"


def test_the_k8s_runner_loads_neither_the_shared_config_nor_the_shared_secrets():
    pod = k8s_pod()
    for container in pod.get("initContainers", []) + pod["containers"]:
        for source in container.get("envFrom", []):
            ref = source.get("configMapRef") or source.get("secretRef")
            assert ref["name"] not in ("fallow-config", "fallow-secrets"), f"the runner loads {ref['name']}"


def test_the_k8s_runner_config_maps_hold_no_postgres_or_redis_url():
    for name, data in k8s_config_maps().items():
        for key, value in data.items():
            assert not re.search(r"postgres(ql)?://|rediss?://", str(value)), f"{name}.{key} is {value!r}"
            assert not FORBIDDEN.search(key), f"the ConfigMap {name} holds {key}"


def test_the_k8s_runner_token_secret_is_mounted_read_only_with_no_access_for_others():
    pod = k8s_pod()
    mounts = {m["name"]: m for c in pod["containers"] for m in c.get("volumeMounts", [])}
    secret_volumes = [v for v in pod["volumes"] if "secret" in v]
    assert len(secret_volumes) == 1, "the runner should mount its token Secret alone"
    volume = secret_volumes[0]
    assert volume["secret"]["secretName"] not in ("fallow-secrets",)
    # Kubernetes' default is 0644: the mode must be given. Owner and group may read;
    # the group may not write, and others get nothing.
    modes = [volume["secret"].get("defaultMode")] + [i.get("mode") for i in volume["secret"].get("items", []) if "mode" in i]
    for mode in modes:
        assert mode is not None, "the token Secret's files take Kubernetes' default mode 0644"
        assert mode & 0o037 == 0, f"the token Secret's files have mode {oct(mode)}"
    assert mounts[volume["name"]].get("readOnly") is True


def test_the_k8s_runner_pod_gets_no_service_account_token():
    assert k8s_pod().get("automountServiceAccountToken") is False


def test_the_compose_runner_waits_for_the_api_and_not_for_postgres_redis_or_migrations():
    depends_on = compose_services()["runner"].get("depends_on", {})
    names = set(depends_on if isinstance(depends_on, list) else depends_on.keys())
    assert "api" in names
    assert not names & {"postgres", "redis", "migrate"}, f"the runner depends on {names}"


def test_the_systemd_runner_waits_for_no_local_database_or_redis():
    for section, key, value in systemd_unit(SYSTEMD_RUNNER):
        if section == "Unit" and key in ("After", "Requires", "Wants", "BindsTo", "Requisite"):
            assert not re.search(r"postgres|redis", value, re.IGNORECASE), f"{key}={value}"


def test_the_systemd_runner_reads_the_runner_env_file_and_not_the_shared_one():
    files = [v.lstrip("-") for _, k, v in systemd_unit(SYSTEMD_RUNNER) if k == "EnvironmentFile"]
    assert "/etc/fallow/fallow.env" not in files
    for path in files:
        assert systemd_env_example(path).exists(), f"{path} has no example under infra/systemd/"
