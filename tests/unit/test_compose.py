"""Static checks of docker-compose.yml, deploy/prometheus/prometheus.yml and deploy/Dockerfile
(Grafana's provisioning and the alert rules' mount: tests/unit/test_dashboard.py).

Docker is neither needed nor run: the files are parsed and checked against each other and
against the settings the service really reads. Each ``*_problems`` helper returns what is wrong
(empty when all is well), so a failure names the broken entry.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from rl_export.runtime.settings import ENV_PREFIX, Settings
from rl_export.runtime.storeurl import parse_store_url

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
PROMETHEUS_FILE = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"

EXPECTED_SERVICES = {
    "kafka", "minio", "minio-init", "worker", "web", "prometheus", "kafka-exporter", "grafana",
}  # fmt: skip
RL_EXPORT_SERVICES = ("worker", "web")
MINIO_DEFAULT_S3_PORT = 9000

Compose = dict[str, Any]


# --- reading the files ---------------------------------------------------------------------


def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as handle:
        return yaml.safe_load(handle)


@pytest.fixture(scope="module")
def compose() -> Compose:
    data = load_yaml(COMPOSE_FILE)
    assert isinstance(data, dict), "docker-compose.yml is not a mapping"
    return data


@pytest.fixture(scope="module")
def prometheus() -> dict[str, Any]:
    data = load_yaml(PROMETHEUS_FILE)
    assert isinstance(data, dict), "prometheus.yml is not a mapping"
    return data


@pytest.fixture(scope="module")
def dockerfile() -> str:
    return DOCKERFILE.read_text(encoding="utf-8")


# --- helpers over the parsed data ----------------------------------------------------------


def service(compose: Compose, name: str) -> dict[str, Any]:
    svc = compose["services"][name]
    assert isinstance(svc, dict), f"service {name} is not a mapping"
    return svc


def argv(value: str | list[Any] | None) -> list[str]:
    """A compose command/entrypoint (string or list) as a list of words."""
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(word) for word in value]


def environment(svc: dict[str, Any]) -> dict[str, str]:
    """A service's environment, whether written as a mapping or as a list of KEY=VALUE."""
    env = svc.get("environment") or {}
    if isinstance(env, list):
        pairs = (str(item).partition("=") for item in env)
        return {key: value for key, _, value in pairs}
    return {str(key): str(value) for key, value in env.items()}


def flag_value(words: list[str], *flags: str) -> str | None:
    """The value of the first of ``flags`` in ``words`` (``--flag V`` or ``--flag=V``)."""
    for i, word in enumerate(words):
        for flag in flags:
            if word == flag and i + 1 < len(words):
                return words[i + 1]
            if word.startswith(f"{flag}="):
                return word.partition("=")[2]
    return None


def served_port(svc: dict[str, Any]) -> int | None:
    """The port a command serves HTTP on: rl-export's ``--web-port N`` or ``--port N``,
    kafka-exporter's ``--web.listen-address=[HOST]:N``."""
    words = argv(svc.get("command"))
    value = flag_value(words, "--web-port", "--port")
    if value is None:
        address = flag_value(words, "--web.listen-address")
        value = address.rpartition(":")[2] if address else None
    return int(value) if value is not None else None


def metrics_port(svc: dict[str, Any]) -> int | None:
    """The port a command serves ``/metrics`` on: the web's ``--metrics-port N`` (never its
    public port), else the port it serves."""
    value = flag_value(argv(svc.get("command")), "--metrics-port")
    return int(value) if value is not None else served_port(svc)


def host_port(address: str) -> tuple[str, int]:
    """``host:port`` or ``scheme://host:port`` as (host, port)."""
    parts = urlsplit(address if "://" in address else f"//{address}")
    assert parts.hostname, f"no host in {address!r}"
    assert parts.port, f"no port in {address!r}"
    return parts.hostname, parts.port


def advertised_listeners(compose: Compose) -> set[tuple[str, int]]:
    value = environment(service(compose, "kafka"))["KAFKA_ADVERTISED_LISTENERS"]
    return {host_port(item.strip()) for item in value.split(",") if item.strip()}


def minio_s3_port(compose: Compose) -> int:
    address = flag_value(argv(service(compose, "minio").get("command")), "--address")
    return int(address.rpartition(":")[2]) if address else MINIO_DEFAULT_S3_PORT


def created_buckets(compose: Compose) -> set[str]:
    """Buckets named by ``mc mb [--flags] ALIAS/BUCKET`` in minio-init's entrypoint/command."""
    init = service(compose, "minio-init")
    script = " ".join(argv(init.get("entrypoint")) + argv(init.get("command")))
    return set(re.findall(r"\bmc\s+mb(?:\s+--[\w-]+)*\s+[\w.-]+/([a-z0-9.-]+)", script))


def depends_on(svc: dict[str, Any]) -> list[str]:
    """depends_on targets, in either the list or the mapping form."""
    return [str(name) for name in svc.get("depends_on") or []]


def named_volumes_used(compose: Compose) -> set[str]:
    used: set[str] = set()
    for svc in compose["services"].values():
        for mount in svc.get("volumes") or []:
            if isinstance(mount, dict):
                source = str(mount.get("source", "")) if mount.get("type") == "volume" else ""
            else:
                source, sep, _ = str(mount).partition(":")
                source = source if sep else ""
            if source and not source.startswith((".", "/", "~", "$")):
                used.add(source)
    return used


def rl_export_env_names(*texts: str) -> set[str]:
    return set(re.findall(rf"\b{ENV_PREFIX}[A-Z0-9_]+", "\n".join(texts)))


def scrape_targets(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(metrics_path, target) for every static target of every scrape job."""
    found: list[tuple[str, str]] = []
    for job in config["scrape_configs"]:
        path = job.get("metrics_path", "/metrics")
        for static in job.get("static_configs", []):
            found.extend((path, str(target)) for target in static["targets"])
    return found


def dockerfile_instructions(text: str) -> list[list[str]]:
    """Each instruction as words, continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    lines = (line.strip() for line in joined.splitlines())
    return [line.split() for line in lines if line and not line.startswith("#")]


def copy_sources(text: str) -> list[str]:
    """Build-context paths the Dockerfile COPYs/ADDs (multi-stage --from copies excluded)."""
    sources: list[str] = []
    for words in dockerfile_instructions(text):
        if words[0].upper() not in {"COPY", "ADD"} or any(w.startswith("--from") for w in words):
            continue
        args = [word for word in words[1:] if not word.startswith("--")]
        sources.extend(args[:-1])
    return sources


# --- problem finders (empty list = fine) ---------------------------------------------------


def dependency_problems(compose: Compose) -> list[str]:
    names = set(compose["services"])
    return [
        f"{name} depends on undefined service {target!r}"
        for name, svc in compose["services"].items()
        for target in depends_on(svc)
        if target not in names
    ]


def volume_problems(compose: Compose) -> list[str]:
    declared = set(compose.get("volumes") or {})
    return sorted(f"volume {v!r} is not declared" for v in named_volumes_used(compose) - declared)


def setting_problems(names: set[str]) -> list[str]:
    return sorted(
        f"{name} is not a setting"
        for name in names
        if name.removeprefix(ENV_PREFIX).lower() not in Settings.model_fields
    )


def kafka_bootstrap_problems(compose: Compose, name: str) -> list[str]:
    bootstrap = environment(service(compose, name))["RL_EXPORT_KAFKA_BOOTSTRAP"]
    host, port = host_port(bootstrap)
    problems = []
    if host != "kafka":
        problems.append(f"{name}: bootstrap host {host!r} is not the kafka service")
    if (host, port) not in advertised_listeners(compose):
        problems.append(f"{name}: {bootstrap} is not one of kafka's advertised listeners")
    return problems


def s3_problems(compose: Compose, name: str) -> list[str]:
    env = environment(service(compose, name))
    endpoint = urlsplit(env["AWS_ENDPOINT_URL"])
    location = parse_store_url(env["RL_EXPORT_STORE_URL"])
    problems = []
    if (endpoint.hostname, endpoint.port) != ("minio", minio_s3_port(compose)):
        problems.append(f"{name}: AWS_ENDPOINT_URL {env['AWS_ENDPOINT_URL']} is not MinIO's API")
    if location.kind != "s3" or location.bucket not in created_buckets(compose):
        problems.append(f"{name}: store {location} is not in a bucket minio-init creates")
    return problems


def scrape_problems(compose: Compose, config: dict[str, Any]) -> list[str]:
    problems = []
    for path, target in scrape_targets(config):
        host, port = host_port(target)
        if path != "/metrics":
            problems.append(f"{target}: metrics path {path!r} is not /metrics")
        if host not in compose["services"]:
            problems.append(f"{target}: no compose service {host!r}")
        elif metrics_port(service(compose, host)) != port:
            problems.append(f"{target}: {host}'s command does not serve its metrics on {port}")
    return problems


def copy_problems(text: str, root: Path = ROOT) -> list[str]:
    # git keeps no empty directories, so an empty one would be missing from a fresh clone.
    return [
        f"COPY {src}: missing or empty in the repo"
        for src in copy_sources(text)
        if not (root / src).exists() or ((root / src).is_dir() and not any((root / src).iterdir()))
    ]


# --- tests ---------------------------------------------------------------------------------


def test_compose_defines_exactly_the_services(compose: Compose) -> None:
    assert set(compose["services"]) == EXPECTED_SERVICES


def test_depends_on_targets_are_services(compose: Compose) -> None:
    assert all(depends_on(service(compose, name)) for name in RL_EXPORT_SERVICES)
    assert dependency_problems(compose) == []


def test_named_volumes_are_declared(compose: Compose) -> None:
    assert {"kafka-data", "minio-data", "worker-data", "grafana-data"} <= named_volumes_used(
        compose
    )
    assert volume_problems(compose) == []


@pytest.mark.parametrize("name", RL_EXPORT_SERVICES)
def test_kafka_bootstrap_is_the_in_network_listener(compose: Compose, name: str) -> None:
    assert kafka_bootstrap_problems(compose, name) == []


@pytest.mark.parametrize("name", RL_EXPORT_SERVICES)
def test_store_is_the_minio_bucket(compose: Compose, name: str) -> None:
    assert created_buckets(compose), "minio-init creates no bucket (no `mc mb ALIAS/BUCKET`)"
    assert s3_problems(compose, name) == []


@pytest.mark.parametrize("name", RL_EXPORT_SERVICES)
def test_s3_credentials_are_minio_root_user(compose: Compose, name: str) -> None:
    env = environment(service(compose, name))
    minio = environment(service(compose, "minio"))
    assert env["AWS_ACCESS_KEY_ID"] == minio["MINIO_ROOT_USER"]
    assert env["AWS_SECRET_ACCESS_KEY"] == minio["MINIO_ROOT_PASSWORD"]


def test_rl_export_env_vars_are_settings(dockerfile: str) -> None:
    names = rl_export_env_names(COMPOSE_FILE.read_text(encoding="utf-8"), dockerfile)
    assert {"RL_EXPORT_KAFKA_BOOTSTRAP", "RL_EXPORT_STORE_URL"} <= names
    assert setting_problems(names) == []


@pytest.mark.parametrize("name", RL_EXPORT_SERVICES)
def test_rl_export_env_values_are_valid_settings(compose: Compose, name: str) -> None:
    env = environment(service(compose, name))
    values = {
        k.removeprefix(ENV_PREFIX).lower(): v for k, v in env.items() if k.startswith(ENV_PREFIX)
    }
    settings = Settings.model_validate(values)
    assert settings.kafka_bootstrap == env["RL_EXPORT_KAFKA_BOOTSTRAP"]


def test_worker_healthcheck_uses_its_web_port(compose: Compose) -> None:
    worker = service(compose, "worker")
    test = " ".join(argv(worker["healthcheck"]["test"]))
    assert f"http://localhost:{served_port(worker)}/healthz" in test


def test_the_worker_is_given_the_time_its_stop_takes(compose: Compose) -> None:
    """Docker SIGKILLs a container after ``stop_grace_period`` (10 s by default); a worker
    takes up to its stop grace and 5 s more to close (:func:`run_stages`)."""
    worker = service(compose, "worker")
    env = environment(worker)
    grace = float(env.get("RL_EXPORT_STOP_GRACE_S", Settings.model_fields["stop_grace_s"].default))
    period = str(worker.get("stop_grace_period", "10s"))
    match = re.fullmatch(r"(\d+)s", period)
    assert match, f"stop_grace_period {period!r}: write it in whole seconds, like 20s"
    assert int(match[1]) > grace + 5.0


def test_kafka_exporter_reads_the_in_network_listener(compose: Compose) -> None:
    words = argv(service(compose, "kafka-exporter")["command"])
    server = flag_value(words, "--kafka.server")
    assert server is not None
    assert host_port(server) in advertised_listeners(compose)
    assert host_port(server)[0] == "kafka"


def test_kafka_host_listener_is_published(compose: Compose) -> None:
    ports = {str(mapping) for mapping in service(compose, "kafka").get("ports", [])}
    host_listeners = {port for host, port in advertised_listeners(compose) if host == "localhost"}
    assert host_listeners
    assert all(f"{port}:{port}" in ports for port in host_listeners)


def test_prometheus_scrapes_the_served_ports(compose: Compose, prometheus: dict[str, Any]) -> None:
    scraped = {host_port(t)[0] for _, t in scrape_targets(prometheus)}
    assert scraped == {*RL_EXPORT_SERVICES, "kafka-exporter"}
    assert scrape_problems(compose, prometheus) == []
    web = service(compose, "web")
    assert metrics_port(web) != served_port(web)  # metrics are not on the public port
    assert all(str(metrics_port(web)) not in str(p).split(":")[0] for p in web.get("ports", []))


def test_dockerfile_copies_files_that_exist(dockerfile: str) -> None:
    assert "pyproject.toml" in copy_sources(dockerfile)
    assert copy_problems(dockerfile) == []


def test_image_commands_are_the_rl_export_cli(compose: Compose, dockerfile: str) -> None:
    instructions = {words[0].upper() for words in dockerfile_instructions(dockerfile)}
    assert "ENTRYPOINT" not in instructions, "compose `command:` must be the whole command line"
    exposed = {
        int(port)
        for words in dockerfile_instructions(dockerfile)
        if words[0].upper() == "EXPOSE"
        for port in words[1:]
    }
    for name in RL_EXPORT_SERVICES:
        svc = service(compose, name)
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile"
        assert (ROOT / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file()
        assert argv(svc["command"])[0] == "rl-export"
        assert served_port(svc) in exposed
