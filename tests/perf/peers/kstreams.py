"""The Kafka Streams peer: built with Maven into the cache, and its command line.

``tests/perf/peers/pom.xml`` and ``src/`` are a Maven project (kafka-streams from Maven
Central, Jackson, slf4j-simple). :func:`build` compiles it and copies its runtime jars into
``<cache>/kstreams-<digest>/`` (``classes/``, ``libs/``), once: the digest is of the pom, the
sources and the version asked for, so an edit or another version is a new folder. One build
at a time (a lock), as the broker's jars are resolved (:func:`rl_export.local.broker.kafka_libs`).

Two ways to run it (:func:`command`): Kafka Streams' defaults (one stream thread, the JVM's
default heap: a quarter of the machine's memory, its commits every 100 ms under
exactly-once), and tuned as its users would: a stream thread per core up to one per partition,
the heap sized and fixed (``-Xms`` = ``-Xmx``), the commit interval stated (100 ms, the
worker's batches).
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
from pathlib import Path

from rl_export.local.broker import check_prerequisites
from rl_export.model.errors import LocalStackError

PROJECT = Path(__file__).resolve().parent
MAIN_CLASS = "dev.rlexport.peers.MergeJoin"
COMMIT_INTERVAL_MS = 100


def digest(project: Path = PROJECT, version: str | None = None) -> str:
    """12 hex digits of the pom, every source file and the version asked for."""
    h = hashlib.sha256(f"version={version or ''}\n".encode())
    for path in [project / "pom.xml", *sorted((project / "src").rglob("*.java"))]:
        h.update(str(path.relative_to(project)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def build(cache: Path, version: str | None = None, project: Path = PROJECT) -> Path:
    """The folder of the built peer (``classes/``, ``libs/``), building it on first use."""
    target = cache / f"kstreams-{digest(project, version)}"
    done = target / ".complete"
    if done.exists():
        return target
    check_prerequisites()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".kstreams.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return target
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        cmd = [
            "mvn", "-q", "-B", "-f", str(project / "pom.xml"), f"-Dpeers.build={staging}",
            *([f"-Dkafka.streams.version={version}"] if version else []),
            "compile", "dependency:copy-dependencies",
        ]  # fmt: skip
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0 or not any((staging / "libs").glob("kafka-streams-*.jar")):
            output = (result.stdout + result.stderr).strip().splitlines()[-15:]
            raise LocalStackError(
                "Maven could not build the Kafka Streams peer:\n" + "\n".join(output)
            )
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        done.touch()
    return target


def tuned_threads(partitions: int, cores: int) -> int:
    """Stream threads as a user sizes them: one per core, no more than there are tasks."""
    return max(1, min(partitions, cores))


def command(
    built: Path, *, bootstrap: str, application_id: str, inputs: list[str], output: str,
    state_dir: Path, heap: str | None = None, threads: int | None = None,
    commit_interval_ms: int | None = None,
) -> list[str]:  # fmt: skip
    """The ``java`` command of the peer; ``None``: Kafka Streams' (or the JVM's) default."""
    jvm = ["java", *([f"-Xms{heap}", f"-Xmx{heap}"] if heap else [])]
    args = [
        "--bootstrap", bootstrap, "--application-id", application_id,
        "--inputs", ",".join(inputs), "--output", output, "--state-dir", str(state_dir),
    ]  # fmt: skip
    if threads is not None:
        args += ["--threads", str(threads)]
    if commit_interval_ms is not None:
        args += ["--commit-interval-ms", str(commit_interval_ms)]
    classpath = f"{built / 'classes'}:{built / 'libs'}/*"
    return [*jvm, "-cp", classpath, MAIN_CLASS, *args]
