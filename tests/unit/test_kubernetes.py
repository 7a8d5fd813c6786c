"""Offline checks of the Kubernetes manifests in deploy/kubernetes/.

- ``kustomize build`` of the base and of the example overlay, with the kustomize that
  ``make install`` puts in ``.cache/`` (``go install`` of its module path; without Go the
  build tests are skipped and say so);
- every built-in resource validates against the Kubernetes schemas that kubernetes-validate
  ships, for the oldest and the newest Kubernetes version checked;
- the KEDA ScaledObject, whose CRD cannot be fetched here, field by field against KEDA 2.17's
  documentation (``keda.sh/docs/2.17/reference/scaledobject-spec/`` and
  ``keda.sh/docs/2.17/scalers/apache-kafka/``);
- the manifests against the service: settings that exist, ports its commands serve, its
  probes, its stop time, and who can reach which pod (the NetworkPolicies, evaluated).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from rl_export.kafka import access
from rl_export.kafka.access import Role
from rl_export.kafka.acls import strimzi_user
from rl_export.kafka.client import check_app_id
from rl_export.runtime.settings import ENV_PREFIX, Settings
from rl_export.stream.topics import topic_specs

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
BASE = KUBE / "base"
OVERLAY = KUBE / "overlays" / "example"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"

KUSTOMIZE_VERSION = re.search(
    r"^KUSTOMIZE_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE
)
KUSTOMIZE = (
    ROOT / ".cache" / "kustomize" / KUSTOMIZE_VERSION[1] / "kustomize"
    if KUSTOMIZE_VERSION
    else None
)

# The oldest Kubernetes that KEDA 2.17 supports, and the newest the package has schemas of.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())

Resource = dict[str, Any]
# Custom resources (KEDA's, Strimzi's): no schema here; their own tests check them.
CUSTOM_GROUPS = ("keda.sh/", "kafka.strimzi.io/")

# --- what KEDA 2.17 documents ----------------------------------------------------------------
# ScaledObject specification (reference/scaledobject-spec.md of KEDA 2.17's documentation).
KEDA_VERSION = "2.17"
SCALEDOBJECT_SPEC_FIELDS = {
    "scaleTargetRef", "pollingInterval", "cooldownPeriod", "initialCooldownPeriod",
    "idleReplicaCount", "minReplicaCount", "maxReplicaCount", "fallback", "advanced", "triggers",
}  # fmt: skip
SCALE_TARGET_REF_FIELDS = {"apiVersion", "kind", "name", "envSourceContainerName"}
FALLBACK_FIELDS = {"failureThreshold", "replicas", "behavior"}
FALLBACK_BEHAVIORS = {"static", "currentReplicas", "currentReplicasIfHigher",
                      "currentReplicasIfLower"}  # fmt: skip
ADVANCED_FIELDS = {"restoreToOriginalReplicaCount", "horizontalPodAutoscalerConfig",
                   "scalingModifiers"}  # fmt: skip
HPA_CONFIG_FIELDS = {"name", "behavior"}
TRIGGER_FIELDS = {"type", "metadata", "name", "useCachedMetrics", "authenticationRef",
                  "metricType"}  # fmt: skip
METRIC_TYPES = {"AverageValue", "Value", "Utilization"}
# The Apache Kafka scaler's trigger metadata (scalers/apache-kafka.md), each with a check of
# its value: KEDA reads every metadata value as a string.
_BOOL = re.compile(r"^(true|false)$")
_INT = re.compile(r"^\d+$")
KAFKA_TRIGGER_METADATA: dict[str, re.Pattern[str]] = {
    "bootstrapServers": re.compile(r"^[A-Za-z0-9_.\-]+:\d{1,5}(,[A-Za-z0-9_.\-]+:\d{1,5})*$"),
    "consumerGroup": re.compile(r"^.+$"),
    "topic": re.compile(r"^.+$"),
    "lagThreshold": _INT,
    "activationLagThreshold": _INT,
    "offsetResetPolicy": re.compile(r"^(latest|earliest)$"),
    "allowIdleConsumers": _BOOL,
    "scaleToZeroOnInvalidOffset": _BOOL,
    "excludePersistentLag": _BOOL,
    "limitToPartitionsWithLag": _BOOL,
    "ensureEvenDistributionOfPartitions": _BOOL,
    "version": re.compile(r"^\d+\.\d+\.\d+(\.\d+)?$"),
    "partitionLimitation": re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$"),
    "sasl": re.compile(r"^(plaintext|scram_sha256|scram_sha512|gssapi|oauthbearer|none)$"),
    "saslTokenProvider": re.compile(r"^(bearer|aws_msk_iam)$"),
    "tls": re.compile(r"^(enable|disable)$"),
    "unsafeSsl": _BOOL,
    "awsRegion": re.compile(r"^[a-z0-9-]+$"),
}


# --- building and reading ----------------------------------------------------------------------


def kustomize_build(folder: Path) -> list[Resource]:
    """The resources ``kustomize build`` writes (built once per folder; tests copy before
    changing one)."""
    if KUSTOMIZE is None or not KUSTOMIZE.is_file():
        pytest.skip(f"kustomize is not installed at {KUSTOMIZE} (make install runs go install)")
    return _build(folder)


@functools.cache
def _build(folder: Path) -> list[Resource]:
    assert KUSTOMIZE is not None
    done = subprocess.run(
        [str(KUSTOMIZE), "build", str(folder)], capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"kustomize build {folder} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def source_resources() -> list[tuple[str, Resource]]:
    """The resources written in the base and the overlay, as written (no kustomize)."""
    found = []
    for path in sorted([*BASE.glob("*.yaml"), *OVERLAY.glob("*.yaml")]):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                found.append((str(path.relative_to(ROOT)), doc))
    return found


@pytest.fixture(scope="module")
def base() -> list[Resource]:
    return kustomize_build(BASE)


@pytest.fixture(scope="module")
def overlay() -> list[Resource]:
    return kustomize_build(OVERLAY)


@pytest.fixture(scope="module", params=["base", "overlay"])
def built(request: pytest.FixtureRequest) -> list[Resource]:
    """Each build in turn: every check below holds for the base and for the overlay."""
    return kustomize_build(BASE if request.param == "base" else OVERLAY)


def one(resources: list[Resource], kind: str, name: str) -> Resource:
    found = [r for r in resources if r["kind"] == kind and r["metadata"]["name"].startswith(name)]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def config(resources: list[Resource]) -> dict[str, str]:
    data = one(resources, "ConfigMap", "rl-export-config")["data"]
    assert isinstance(data, dict)
    return {str(k): str(v) for k, v in data.items()}


def settings_of(resources: list[Resource], container: Resource | None = None) -> Settings:
    """The settings a container would load: the ConfigMap, then its own ``env``."""
    values = config(resources)
    for item in (container or {}).get("env", []):
        if "value" in item:
            values[item["name"]] = item["value"]
        else:  # the downward API: only the pod's name is used
            assert item["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
            values[item["name"]] = "rl-export-worker-5d8f7c9b4-x2x7q"
    return Settings.model_validate(
        {
            k.removeprefix(ENV_PREFIX).lower(): v
            for k, v in values.items()
            if k.startswith(ENV_PREFIX)
        }
    )


def pod_spec(deployment: Resource) -> Resource:
    spec = deployment["spec"]["template"]["spec"]
    assert isinstance(spec, dict)
    return spec


def container(deployment: Resource) -> Resource:
    containers = pod_spec(deployment)["containers"]
    assert len(containers) == 1
    assert isinstance(containers[0], dict)
    return containers[0]


def flag(command: list[str], name: str) -> str:
    index = command.index(name)
    return command[index + 1]


def served_port(deployment: Resource) -> int:
    """The port the container's rl-export command serves HTTP on."""
    command = container(deployment)["command"]
    return int(flag(command, "--web-port" if "worker" in command else "--port"))


def named_port(deployment: Resource, name: str) -> int:
    ports = {p["name"]: p["containerPort"] for p in container(deployment)["ports"]}
    return int(ports[name])


def selects(selector: Resource, labels: dict[str, str]) -> bool:
    wanted = selector.get("matchLabels", {})
    assert not selector.get("matchExpressions"), "only matchLabels is evaluated here"
    return all(labels.get(k) == v for k, v in wanted.items())


def pod_labels(deployment: Resource) -> dict[str, str]:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert isinstance(labels, dict)
    return labels


# --- schemas -------------------------------------------------------------------------------------


def schema_problems(resource: Resource, version: str) -> list[str]:
    try:
        kubernetes_validate.validate(resource, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{resource['kind']}/{resource['metadata']['name']}: {exc.message}"]
    return []


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_built_resources_validate_against_the_kubernetes_schemas(
    built: list[Resource], version: str
) -> None:
    kinds = {r["kind"] for r in built}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget",
            "NetworkPolicy", "ConfigMap"} <= kinds  # fmt: skip
    builtin = [r for r in built if not r["apiVersion"].startswith(CUSTOM_GROUPS)]
    assert [p for r in builtin for p in schema_problems(r, version)] == []


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_written_resources_validate_without_kustomize(version: str) -> None:
    """The files as written, so a machine without kustomize still checks them."""
    resources = [r for _, r in source_resources() if not r["apiVersion"].startswith(CUSTOM_GROUPS)]
    assert len(resources) >= 9
    assert [p for r in resources for p in schema_problems(r, version)] == []


def test_the_schema_check_catches_a_misspelt_field() -> None:
    """strict=True refuses fields the schema does not have (a check that can fail)."""
    _, deployment = next((path, r) for path, r in source_resources() if r["kind"] == "Deployment")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["terminationGracePeriod"] = 30
    assert schema_problems(broken, K8S_VERSIONS[0])


# --- the KEDA ScaledObject, field by field -------------------------------------------------------


def scaledobject_problems(obj: Resource) -> list[str]:
    """What in a ScaledObject KEDA 2.17's documentation does not describe, or refuses."""
    problems: list[str] = []
    if obj["apiVersion"] != "keda.sh/v1alpha1":
        problems.append(f"apiVersion {obj['apiVersion']}")
    spec = obj["spec"]
    problems += [
        f"spec.{k} is not a ScaledObject field" for k in set(spec) - SCALEDOBJECT_SPEC_FIELDS
    ]
    problems += [
        f"scaleTargetRef.{k}" for k in set(spec["scaleTargetRef"]) - SCALE_TARGET_REF_FIELDS
    ]
    for key in ("pollingInterval", "cooldownPeriod", "minReplicaCount", "maxReplicaCount"):
        if key in spec and not (isinstance(spec[key], int) and spec[key] >= 0):
            problems.append(f"spec.{key} must be a non-negative integer")
    if spec.get("minReplicaCount", 0) > spec.get("maxReplicaCount", 100):
        problems.append("minReplicaCount > maxReplicaCount")
    fallback = spec.get("fallback")
    if fallback is not None:
        problems += [f"fallback.{k}" for k in set(fallback) - FALLBACK_FIELDS]
        if not {"failureThreshold", "replicas"} <= set(fallback):
            problems.append("fallback needs failureThreshold and replicas")
        if fallback.get("behavior", "static") not in FALLBACK_BEHAVIORS:
            problems.append(f"fallback.behavior {fallback['behavior']}")
    advanced = spec.get("advanced", {})
    problems += [f"advanced.{k}" for k in set(advanced) - ADVANCED_FIELDS]
    hpa_config = advanced.get("horizontalPodAutoscalerConfig", {})
    problems += [f"horizontalPodAutoscalerConfig.{k}" for k in set(hpa_config) - HPA_CONFIG_FIELDS]
    if "behavior" in hpa_config:  # fed to the HPA as is: check it with the HPA's own schema
        hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
               "metadata": {"name": "keda-hpa"},
               "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "x"}, "maxReplicas": 1,
                        "behavior": hpa_config["behavior"]}}  # fmt: skip
        problems += schema_problems(hpa, K8S_VERSIONS[0])
    names = [t.get("name") for t in spec["triggers"]]
    if len(set(names)) != len(names):
        problems.append(f"trigger names repeat: {names}")
    for trigger in spec["triggers"]:
        where = f"trigger {trigger.get('name')}"
        problems += [f"{where}: field {k}" for k in set(trigger) - TRIGGER_FIELDS]
        if trigger.get("metricType", "AverageValue") not in METRIC_TYPES:
            problems.append(f"{where}: metricType {trigger['metricType']}")
        if trigger["type"] != "kafka":
            problems.append(f"{where}: type {trigger['type']} (only kafka is checked here)")
            continue
        metadata = trigger["metadata"]
        for key, value in metadata.items():
            pattern = KAFKA_TRIGGER_METADATA.get(key)
            if pattern is None:
                problems.append(f"{where}: {key} is not a Kafka scaler parameter")
            elif not isinstance(value, str) or not pattern.match(value):
                problems.append(
                    f"{where}: {key}={value!r} (KEDA reads a string like {pattern.pattern})"
                )
        for key in ("bootstrapServers", "consumerGroup"):
            if key not in metadata:
                problems.append(f"{where}: {key} is required")
        if metadata.get("limitToPartitionsWithLag") == "true" and (
            "topic" not in metadata or metadata.get("allowIdleConsumers") == "true"
        ):
            problems.append(f"{where}: limitToPartitionsWithLag needs a topic, no idle consumers")
    return problems


def test_scaledobject_follows_keda_docs(built: list[Resource]) -> None:
    obj = one(built, "ScaledObject", "rl-export-worker")
    assert scaledobject_problems(obj) == []


def test_scaledobject_checks_can_fail(base: list[Resource]) -> None:
    obj = yaml.safe_load(yaml.safe_dump(one(base, "ScaledObject", "rl-export-worker")))
    obj["spec"]["maxReplicas"] = 8  # the HPA's word, not KEDA's
    obj["spec"]["triggers"][0]["metadata"]["lagThreshold"] = 10  # not a string
    obj["spec"]["triggers"][0]["metadata"]["consumerGroupName"] = "x"  # not a parameter
    obj["spec"]["fallback"]["behavior"] = "currentReplicasIfBigger"
    problems = scaledobject_problems(obj)
    assert len(problems) == 4, problems


def test_keda_version_is_named_in_the_manifest() -> None:
    text = (BASE / "worker-scaledobject.yaml").read_text(encoding="utf-8")
    assert f"KEDA {KEDA_VERSION}" in text
    assert f"keda.sh/docs/{KEDA_VERSION}/scalers/apache-kafka/" in text


def test_scaledobject_scales_the_worker_up_to_the_partition_count(built: list[Resource]) -> None:
    obj = one(built, "ScaledObject", "rl-export-worker")
    worker = one(built, "Deployment", "rl-export-worker")
    assert obj["spec"]["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    assert obj["spec"].get("scaleTargetRef", {}).get("kind", "Deployment") == "Deployment"
    assert "replicas" not in worker["spec"], "KEDA owns the worker's replica count"
    assert obj["spec"]["maxReplicaCount"] == settings_of(built, container(worker)).partitions
    assert obj["spec"]["minReplicaCount"] >= 1
    for trigger in obj["spec"]["triggers"]:
        assert trigger["metadata"].get("allowIdleConsumers", "false") == "false"


def test_triggers_watch_the_groups_and_topics_the_worker_consumes(built: list[Resource]) -> None:
    """Brokers, groups and topics equal the settings the worker loads (DESIGN.md section 2:
    new groups start at the earliest offset, and KEDA must count lag the same way)."""
    settings = settings_of(built, container(one(built, "Deployment", "rl-export-worker")))
    triggers = one(built, "ScaledObject", "rl-export-worker")["spec"]["triggers"]
    watched = {(t["metadata"]["consumerGroup"], t["metadata"].get("topic")) for t in triggers}
    # The join's one trigger has no topic: KEDA sums its lag over the three input topics.
    assert watched == {(settings.app_id, None), (settings.sink_group, settings.topic_trajectories)}
    sink = next(t for t in triggers if t["metadata"]["consumerGroup"] == settings.sink_group)
    assert sink["metadata"]["excludePersistentLag"] == "true"  # an S3 outage adds no worker
    for trigger in triggers:
        assert trigger["metadata"]["bootstrapServers"] == settings.kafka_bootstrap
        assert trigger["metadata"]["offsetResetPolicy"] == "earliest"


def test_the_worker_runs_with_an_app_id_of_its_own(built: list[Resource]) -> None:
    settings = settings_of(built, container(one(built, "Deployment", "rl-export-worker")))
    check_app_id(settings)  # raises for the default app id on a cluster off the machine
    assert settings.instance_id  # static membership, from the pod's name


def test_overlay_changes_reach_the_triggers(base: list[Resource], overlay: list[Resource]) -> None:
    """The overlay changes the brokers only in the ConfigMap; the component copies them."""
    assert config(overlay)["RL_EXPORT_KAFKA_BOOTSTRAP"] != config(base)["RL_EXPORT_KAFKA_BOOTSTRAP"]
    for trigger in one(overlay, "ScaledObject", "rl-export-worker")["spec"]["triggers"]:
        assert (
            trigger["metadata"]["bootstrapServers"] == config(overlay)["RL_EXPORT_KAFKA_BOOTSTRAP"]
        )


# --- the manifests against the service -----------------------------------------------------------


def test_config_holds_only_real_settings(built: list[Resource]) -> None:
    names = {k for k in config(built) if k.startswith(ENV_PREFIX)}
    unknown = {n for n in names if n.removeprefix(ENV_PREFIX).lower() not in Settings.model_fields}
    assert unknown == set()
    for name in ("rl-export-worker", "rl-export-web"):  # and their values validate
        settings_of(built, container(one(built, "Deployment", name)))


@pytest.mark.parametrize("name", ["rl-export-worker", "rl-export-web"])
def test_settings_come_from_the_configmap_and_the_secret(built: list[Resource], name: str) -> None:
    deployment = one(built, "Deployment", name)
    sources = container(deployment)["envFrom"]
    configmaps = [s["configMapRef"]["name"] for s in sources if "configMapRef" in s]
    secrets = [s["secretRef"]["name"] for s in sources if "secretRef" in s]
    assert configmaps == [one(built, "ConfigMap", "rl-export-config")["metadata"]["name"]]
    assert secrets == ["rl-export-s3"]
    for item in container(deployment).get("env", []):
        assert item["name"].removeprefix(ENV_PREFIX).lower() in Settings.model_fields
    assert not {k for k in config(built) if k.startswith("AWS_") and "SECRET" in k}


def test_the_base_secret_has_the_s3_keys_and_the_overlay_leaves_it_out(
    base: list[Resource], overlay: list[Resource]
) -> None:
    secret = one(base, "Secret", "rl-export-s3")
    assert secret["metadata"]["name"] == "rl-export-s3"  # no hash: an out-of-band one matches
    assert set(secret["data"]) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    assert [r for r in overlay if r["kind"] == "Secret"] == []


@pytest.mark.parametrize("name", ["rl-export-worker", "rl-export-web"])
def test_pods_run_unprivileged_on_a_read_only_root(built: list[Resource], name: str) -> None:
    deployment = one(built, "Deployment", name)
    pod, box = pod_spec(deployment), container(deployment)
    assert pod["securityContext"]["runAsNonRoot"] is True
    dockerfile_uid = re.search(r"--uid (\d+)", DOCKERFILE.read_text(encoding="utf-8"))
    assert dockerfile_uid
    assert pod["securityContext"]["runAsUser"] == int(dockerfile_uid[1])
    assert box["securityContext"]["readOnlyRootFilesystem"] is True
    assert box["securityContext"]["allowPrivilegeEscalation"] is False
    assert box["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert pod["automountServiceAccountToken"] is False


@pytest.mark.parametrize("name", ["rl-export-worker", "rl-export-web"])
def test_every_writable_path_is_an_emptydir(built: list[Resource], name: str) -> None:
    """The data dir (RocksDB tables, the web index) and /tmp (export files) are the only
    places the service writes; each is an emptyDir, restored from Kafka and the corpora."""
    deployment = one(built, "Deployment", name)
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container(deployment)["volumeMounts"]}
    settings = settings_of(built, container(deployment))
    for path in (str(settings.data_dir), "/tmp"):
        assert path in mounts, f"{name}: nothing mounted at {path}"
        assert "emptyDir" in volumes[mounts[path]], f"{name}: {path} is not an emptyDir"
        assert volumes[mounts[path]]["emptyDir"].get("sizeLimit")
    assert settings.state_store == "rocksdb://" or name == "rl-export-web"


@pytest.mark.parametrize(
    ("name", "port_name"), [("rl-export-worker", "metrics"), ("rl-export-web", "http")]
)
def test_probes_ask_health_and_readiness_on_the_served_port(
    built: list[Resource], name: str, port_name: str
) -> None:
    deployment = one(built, "Deployment", name)
    box = container(deployment)
    assert named_port(deployment, port_name) == served_port(deployment)
    assert box["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port_name}
    assert box["startupProbe"]["httpGet"] == {"path": "/healthz", "port": port_name}
    assert box["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port_name}
    assert settings_of(built, box).web_host == "0.0.0.0"


def test_worker_startup_probe_outlasts_its_wait_for_the_broker(built: list[Resource]) -> None:
    """/healthz answers only once the worker has checked its topics, which waits up to
    RL_EXPORT_KAFKA_WAIT_S for a broker: liveness must not kill it before."""
    worker = one(built, "Deployment", "rl-export-worker")
    probe = container(worker)["startupProbe"]
    allowed = probe["periodSeconds"] * probe["failureThreshold"]
    assert allowed > settings_of(built, container(worker)).kafka_wait_s


def test_worker_is_given_the_time_its_stop_takes(built: list[Resource]) -> None:
    """The kubelet SIGKILLs after terminationGracePeriodSeconds; a worker takes up to its
    stop grace and 5 s more (:func:`rl_export.worker.runtime.run_stages`)."""
    worker = one(built, "Deployment", "rl-export-worker")
    grace = settings_of(built, container(worker)).stop_grace_s
    assert pod_spec(worker)["terminationGracePeriodSeconds"] > grace + 5.0


def test_web_is_given_the_time_its_stop_takes(built: list[Resource]) -> None:
    """The preStop pause, then uvicorn's graceful shutdown (10 s in rl_export.web.main)."""
    web = one(built, "Deployment", "rl-export-web")
    uvicorn_grace = re.search(
        r"timeout_graceful_shutdown=(\d+)",
        (ROOT / "services" / "rl_export" / "web" / "main.py").read_text(encoding="utf-8"),
    )
    assert uvicorn_grace
    pause = container(web)["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep"
    assert pod_spec(web)["terminationGracePeriodSeconds"] > int(pause[1]) + int(uvicorn_grace[1])


def quantity_mib(value: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "MB": 1e6 / 2**20, "GB": 1e9 / 2**20}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(Ki|Mi|Gi|MB|GB)", value)
    assert match, f"unexpected quantity {value!r}"
    return float(match[1]) * units[match[2]]


@pytest.mark.parametrize("name", ["rl-export-worker", "rl-export-web"])
def test_requests_and_limits_are_set(built: list[Resource], name: str) -> None:
    resources = container(one(built, "Deployment", name))["resources"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(resources[kind]), f"{name}: {kind}"
    assert quantity_mib(resources["limits"]["memory"]) >= quantity_mib(
        resources["requests"]["memory"]
    )


@pytest.mark.parametrize("name", ["rl-export-worker", "rl-export-web"])
def test_ephemeral_storage_covers_the_emptydirs_and_logs(built: list[Resource], name: str) -> None:
    deployment = one(built, "Deployment", name)
    resources = container(deployment)["resources"]
    limit = quantity_mib(resources["limits"]["ephemeral-storage"])
    assert 0 < quantity_mib(resources["requests"]["ephemeral-storage"]) <= limit
    empty_dirs = [v["emptyDir"]["sizeLimit"] for v in pod_spec(deployment)["volumes"]
                  if "emptyDir" in v]  # fmt: skip
    assert limit >= sum(quantity_mib(size) for size in empty_dirs) + 256  # and some logs


def test_worker_memory_covers_its_measured_peak(built: list[Resource]) -> None:
    """README, Performance: a worker with two join processes peaked at 372-399 MiB."""
    worker = container(one(built, "Deployment", "rl-export-worker"))
    assert settings_of(built, worker).join_processes == 2
    assert quantity_mib(worker["resources"]["requests"]["memory"]) >= 400
    assert quantity_mib(worker["resources"]["limits"]["memory"]) >= 800


def test_web_memory_limit_holds_duckdb_and_the_process(built: list[Resource]) -> None:
    """DuckDB's own limit, the web process (261 MiB measured) and an export process."""
    web = container(one(built, "Deployment", "rl-export-web"))
    duckdb = quantity_mib(settings_of(built, web).web_index_memory)
    assert quantity_mib(web["resources"]["limits"]["memory"]) >= duckdb + 261 + 200


def test_web_hpa_and_services_point_at_the_deployments(built: list[Resource]) -> None:
    web = one(built, "Deployment", "rl-export-web")
    hpa = one(built, "HorizontalPodAutoscaler", "rl-export-web")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": web["metadata"]["name"],
    }
    assert hpa["spec"]["minReplicas"] >= 2
    for name, service_name, port_name in (
        ("rl-export-web", "rl-export-web", "http"),
        ("rl-export-web", "rl-export-scrape-web", "metrics"),  # never on the public Service
        ("rl-export-worker", "rl-export-worker", "metrics"),
    ):
        deployment = one(built, "Deployment", name)
        service = one(built, "Service", service_name)
        assert selects({"matchLabels": service["spec"]["selector"]}, pod_labels(deployment))
        assert [p["targetPort"] for p in service["spec"]["ports"]] == [port_name]


@pytest.mark.parametrize("name", ["rl-export-worker", "rl-export-web"])
def test_each_deployment_has_a_disruption_budget(built: list[Resource], name: str) -> None:
    deployment = one(built, "Deployment", name)
    budgets = [
        pdb for pdb in built
        if pdb["kind"] == "PodDisruptionBudget"
        and selects(pdb["spec"]["selector"], pod_labels(deployment))
    ]  # fmt: skip
    assert len(budgets) == 1
    others = [d for d in built if d["kind"] == "Deployment" and d is not deployment]
    assert not any(selects(budgets[0]["spec"]["selector"], pod_labels(d)) for d in others)


# --- who may reach what: the NetworkPolicies, evaluated ------------------------------------------


def peer_allows(peer: Resource, source_namespace: dict[str, str], same_namespace: bool) -> bool:
    if "ipBlock" in peer:
        return not same_namespace  # an address range: traffic from outside the cluster
    if "namespaceSelector" in peer:
        return selects(peer["namespaceSelector"], source_namespace)
    return same_namespace and "podSelector" in peer  # a podSelector alone: this namespace


def ingress_allowed(
    policies: list[Resource], pod: Resource, port_name: str, *, source_namespace: dict[str, str],
    same_namespace: bool,
) -> bool:  # fmt: skip
    """Whether a connection to the pod's named port is let in (Kubernetes' rules: a pod that
    no policy selects accepts everything; else the union of the selecting policies' rules)."""
    port = named_port(pod, port_name)
    selecting = [p for p in policies if selects(p["spec"]["podSelector"], pod_labels(pod))
                 and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]  # fmt: skip
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports and not any(p.get("port") in (port, port_name) for p in ports):
                continue
            peers = rule.get("from")
            if not peers or any(peer_allows(p, source_namespace, same_namespace) for p in peers):
                return True
    return False


OTHER_NAMESPACE = {"kubernetes.io/metadata.name": "team-a"}
MONITORING = {"kubernetes.io/metadata.name": "monitoring"}


@pytest.mark.parametrize(
    ("name", "port_name", "outside"),
    [("rl-export-web", "http", True), ("rl-export-worker", "metrics", False)],
)
def test_only_the_web_port_is_open_beyond_the_namespace(
    built: list[Resource], name: str, port_name: str, outside: bool
) -> None:
    policies = [r for r in built if r["kind"] == "NetworkPolicy"]
    pod = one(built, "Deployment", name)
    assert ingress_allowed(policies, pod, port_name, source_namespace=OTHER_NAMESPACE,
                           same_namespace=False) is outside  # fmt: skip
    assert ingress_allowed(policies, pod, port_name, source_namespace={}, same_namespace=True)


def test_overlay_lets_monitoring_scrape_the_workers(
    base: list[Resource], overlay: list[Resource]
) -> None:
    for resources, expected in ((base, False), (overlay, True)):
        policies = [r for r in resources if r["kind"] == "NetworkPolicy"]
        worker = one(resources, "Deployment", "rl-export-worker")
        assert ingress_allowed(policies, worker, "metrics", source_namespace=MONITORING,
                               same_namespace=False) is expected  # fmt: skip


def test_kustomize_is_the_version_make_installs() -> None:
    if KUSTOMIZE is None or not KUSTOMIZE.is_file():
        pytest.skip(f"kustomize is not installed at {KUSTOMIZE} (make install runs go install)")
    done = subprocess.run([str(KUSTOMIZE), "version"], capture_output=True, text=True, check=True)
    assert KUSTOMIZE_VERSION
    assert done.stdout.strip() == KUSTOMIZE_VERSION[1]


def iter_containers(resources: list[Resource]) -> Iterator[Resource]:
    for resource in resources:
        if resource["kind"] == "Deployment":
            yield container(resource)


def test_both_deployments_run_the_same_image(built: list[Resource]) -> None:
    images = {box["image"] for box in iter_containers(built)}
    assert len(images) == 1
    assert all(box["command"][0] == "rl-export" for box in iter_containers(built))


# --- Strimzi: managed topics and least-privilege users (components/strimzi, in the overlay) ---


def test_the_kafkatopics_are_the_topics_the_worker_verifies(overlay: list[Resource]) -> None:
    settings = settings_of(overlay, container(one(overlay, "Deployment", "rl-export-worker")))
    assert settings.create_topics is False  # the worker only verifies them
    topics = {t["spec"]["topicName"]: t["spec"] for t in overlay if t["kind"] == "KafkaTopic"}
    wanted = {spec.name: spec for spec in topic_specs(settings)}
    assert set(topics) == set(wanted)
    for name, spec in wanted.items():
        assert topics[name]["partitions"] == settings.partitions, name
        config = topics[name]["config"]
        assert topics[name]["replicas"] >= 3
        assert int(config["min.insync.replicas"]) >= 2
        for key, value in spec.configs.items():  # what the worker would have created
            assert config[key] == value, (name, key)
    assert {t["metadata"]["labels"]["strimzi.io/cluster"]
            for t in overlay if t["kind"] in ("KafkaTopic", "KafkaUser")} == {"events"}  # fmt: skip


def acls(resources: list[Resource], user: str) -> dict[tuple[str, str, str], set[str]]:
    spec = one(resources, "KafkaUser", user)["spec"]
    assert spec["authentication"]["type"] == "scram-sha-512"
    return {(a["resource"]["type"], a["resource"]["name"], a["resource"]["patternType"]):
            set(a["operations"]) for a in spec["authorization"]["acls"]}  # fmt: skip


USERS = {"rl-export-worker": Role.WORKER, "rl-export-web": Role.WEB}
KAFKAUSERS = KUBE / "components" / "strimzi" / "kafkausers.yaml"


def test_the_kafkausers_are_what_rl_export_acls_prints() -> None:
    """Generated, never edited: the names a ConfigMap sets are placeholders (APP, SINK) that
    the component's replacements fill in (checked below, on builds)."""
    settings = Settings(app_id="APP", sink_group="SINK", create_topics=False)
    printed = "".join(
        "---\n" + strimzi_user(settings, role, name, cluster="events")
        for name, role in USERS.items()
    )
    written = KAFKAUSERS.read_text(encoding="utf-8")
    assert written[written.index("---\n") :] == printed


def test_the_users_have_exactly_the_acls_of_their_role(overlay: list[Resource]) -> None:
    settings = settings_of(overlay, container(one(overlay, "Deployment", "rl-export-worker")))
    for name, role in USERS.items():
        wanted = access.by_resource(access.grants(settings, role))
        assert acls(overlay, name) == {
            (r.kind.value, r.name, "prefix" if r.prefixed else "literal"): set(ops)
            for r, ops in wanted.items()
        }, name


def test_the_replacements_follow_every_name_the_configmap_sets(tmp_path: Path) -> None:
    """An overlay that renames every topic, the app id and the sink group: the users' ACLs
    are still exactly their roles' (the replacements point at the right ACLs)."""
    if KUSTOMIZE is None or not KUSTOMIZE.is_file():
        pytest.skip(f"kustomize is not installed at {KUSTOMIZE} (make install runs go install)")
    names = {"RL_EXPORT_TOPIC_TRACES": "t.traces", "RL_EXPORT_TOPIC_EVALUATIONS": "t.evals",
             "RL_EXPORT_TOPIC_LABELS": "t.labels", "RL_EXPORT_TOPIC_TRAJECTORIES": "t.traj",
             "RL_EXPORT_APP_ID": "renamed-app", "RL_EXPORT_SINK_GROUP": "renamed-sink"}  # fmt: skip
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(BASE, tmp_path)],
        "configMapGenerator": [{"name": "rl-export-config", "behavior": "merge",
                                "literals": [f"{k}={v}" for k, v in names.items()]}],
        "components": [os.path.relpath(KUBE / "components" / name, tmp_path)
                       for name in ("strimzi", "kafka-from-config")],
    }))  # fmt: skip
    done = subprocess.run(
        [str(KUSTOMIZE), "build", "--load-restrictor", "LoadRestrictionsNone", str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    renamed = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    settings = settings_of(renamed, container(one(renamed, "Deployment", "rl-export-worker")))
    assert (settings.topic_traces, settings.app_id) == ("t.traces", "renamed-app")
    for name, role in USERS.items():
        wanted = access.by_resource(access.grants(settings, role))
        assert acls(renamed, name) == {
            (r.kind.value, r.name, "prefix" if r.prefixed else "literal"): set(ops)
            for r, ops in wanted.items()
        }, name


@pytest.mark.parametrize("name", ["rl-export-worker", "rl-export-web"])
def test_each_deployment_logs_in_as_its_own_user(overlay: list[Resource], name: str) -> None:
    deployment = one(overlay, "Deployment", name)
    settings = settings_of(overlay, container(deployment))
    assert settings.kafka_security_protocol == "SASL_SSL"
    assert settings.kafka_sasl_username == name  # separate credentials for web and worker
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    mounted = {m["mountPath"]: volumes[m["name"]] for m in container(deployment)["volumeMounts"]}
    for path, secret in ((settings.kafka_sasl_password_file, name),
                         (settings.kafka_ssl_ca_file, "rl-export-kafka-ca")):  # fmt: skip
        assert path is not None
        volume = mounted[str(path.parent)]
        assert volume["secret"]["secretName"] == secret
        assert [i["path"] for i in volume["secret"]["items"]] == [path.name]


def test_keda_reads_the_lag_as_the_worker_over_tls(overlay: list[Resource]) -> None:
    obj = one(overlay, "ScaledObject", "rl-export-worker")
    auth = one(overlay, "TriggerAuthentication", "rl-export-kafka")["spec"]
    for trigger in obj["spec"]["triggers"]:
        assert trigger["authenticationRef"]["name"] == "rl-export-kafka"
        assert trigger["metadata"]["sasl"] == "scram_sha512"
        assert trigger["metadata"]["tls"] == "enable"
    given = [e["parameter"] for e in auth["env"]] + [
        s["parameter"] for s in auth["secretTargetRef"]
    ]
    assert sorted(given) == ["ca", "password", "username"]


def test_egress_reaches_only_dns_kafka_and_the_store(built: list[Resource]) -> None:
    policy = one(built, "NetworkPolicy", "rl-export-egress")
    assert policy["spec"]["policyTypes"] == ["Egress"]
    for name in ("rl-export-worker", "rl-export-web"):
        labels = pod_labels(one(built, "Deployment", name))
        assert selects(policy["spec"]["podSelector"], labels), name
    allowed: set[tuple[str, int]] = set()
    for rule in policy["spec"]["egress"]:
        for port in rule["ports"]:
            last = port.get("endPort", port["port"])
            allowed |= {(port["protocol"], p) for p in range(port["port"], last + 1)}
    settings = settings_of(built, container(one(built, "Deployment", "rl-export-worker")))
    kafka_ports = {int(s.rsplit(":", 1)[1]) for s in settings.kafka_bootstrap.split(",")}
    assert {("TCP", p) for p in kafka_ports} <= allowed
    assert {("UDP", 53), ("TCP", 53), ("TCP", 443)} <= allowed
    assert {p for _, p in allowed} <= {53, 443, *range(9092, 9097)}


@pytest.mark.parametrize("name", ["rl-export-worker", "rl-export-web"])
def test_each_deployment_has_its_own_service_account(built: list[Resource], name: str) -> None:
    """So each gets its own cloud role (IRSA, Workload Identity); no Kubernetes API token."""
    spec = pod_spec(one(built, "Deployment", name))
    assert spec["serviceAccountName"] == name
    account = one(built, "ServiceAccount", name)
    assert account["automountServiceAccountToken"] is False
    assert spec["automountServiceAccountToken"] is False


def test_the_overlay_binds_a_role_to_each_account(overlay: list[Resource]) -> None:
    key = "eks.amazonaws.com/role-arn"
    roles = {one(overlay, "ServiceAccount", name)["metadata"]["annotations"][key]
             for name in ("rl-export-worker", "rl-export-web")}  # fmt: skip
    assert len(roles) == 2  # separate credentials
