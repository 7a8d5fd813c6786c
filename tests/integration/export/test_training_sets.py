"""Training sets end to end: traffic through the real broker and a worker (join and sink)
into SeaweedFS, then ``rl-export export`` as people run it: the trace's metadata in every
record and ``--metadata`` filters, splits disjoint, complete and unchanged as the corpus
grows, exact and near duplicates removed with the best reward kept, a pinned version read
again byte for byte after compactions and retention, precise errors."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rl_export.corpora.store import open_store
from rl_export.export import source_ref, stats
from rl_export.local.broker import LocalKafka
from rl_export.local.seaweed import LocalS3
from rl_export.runtime.settings import Settings
from tests.exportdata import ORG, PROJECT
from tests.integration.conftest import run_settings, unique
from tests.integration.webproc import wait_for
from tests.integration.workers import WorkerProcess, publish, settings_env
from tests.trainingdata import best_of_groups, dedup_key, kind, traffic

SPLITS = "train=0.6,eval=0.2,test=0.2"


class Corpus:
    """A worker fed by the test, its store on SeaweedFS; ``export`` runs the real command."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.env = settings_env(settings)
        self.published = 0

    def feed(self, n: int) -> None:
        """Publish n more traces of :func:`tests.trainingdata.traffic` and wait until the
        evaluator corpus holds them all."""
        asyncio.run(publish(self.settings, traffic(n, start=self.published)))
        self.published += n
        wait_for(f"{self.published} records in the evaluator corpus",
                 lambda: self.records() == self.published, timeout_s=120)  # fmt: skip

    def records(self) -> int:
        async def count() -> int:
            store = open_store(self.settings.store_url)
            try:
                found = await stats(store, source_ref(ORG, PROJECT, "evaluator"))
                return int(found["records"])
            except Exception:  # no commit yet
                return 0
            finally:
                await store.close()

        return asyncio.run(count())

    def export(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        argv = [sys.executable, "-m", "rl_export.cli", "export", "--store",
                self.settings.store_url, "--org", ORG, "--project", PROJECT, "--source",
                "evaluator", "--format", "trajectory", "--redact", "none", *args]  # fmt: skip
        return subprocess.run(argv, capture_output=True, timeout=120, env=self.env, check=False)

    def rows(self, *args: str) -> list[dict[str, Any]]:
        result = self.export(*args, "-o", "-")
        assert result.returncode == 0, result.stderr
        return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture(scope="module")
def corpus(
    kafka: LocalKafka, s3: LocalS3, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Corpus]:
    run = unique("ts")
    settings = run_settings(kafka, run, tmp_path_factory.mktemp("training") / "var",
                            f"s3://{s3.bucket}/{run}", shard_max_age_s=1.0)  # fmt: skip
    worker = WorkerProcess(settings, "worker").start()
    try:
        made = Corpus(settings)
        made.feed(90)
        yield made
    finally:
        worker.stop()


def test_records_carry_the_metadata_and_metadata_filters_select(corpus: Corpus) -> None:
    every = corpus.rows()
    assert len(every) == corpus.published
    for row in every:
        n = int(row["trace_id"][3:])
        assert row["metadata"] == {"tier": "gold" if n % 2 else "free", "region": f"r{n % 4}"}
    gold = corpus.rows("--metadata", "tier=gold", "--metadata", "region=r3")
    assert {r["trace_id"] for r in gold} == {r["trace_id"] for r in every
                                             if int(r["trace_id"][3:]) % 4 == 3}  # fmt: skip
    assert corpus.rows("--metadata", "tier=platinum") == []
    bad = corpus.export("--metadata", "tier", "-o", "-")
    assert bad.returncode == 2
    assert b"metadata: expected KEY=VALUE" in bad.stderr
    assert b"Traceback" not in bad.stderr


def test_exact_and_near_duplicates_go_the_best_reward_stays(corpus: Corpus) -> None:
    every = corpus.rows()
    origin: dict[str, int] = {}
    for i in range(corpus.published):  # a copy is of the group of the trace before it
        origin[f"tr-{i:04d}"] = origin[f"tr-{i - 1:04d}"] if kind(i) != "new" and i else i
    for mode, key in (("exact", dedup_key), ("near", lambda r: origin[r["trace_id"]])):
        result = corpus.export("--dedup", mode, "-o", "-")
        assert result.returncode == 0, result.stderr
        kept = {json.loads(line)["trace_id"] for line in result.stdout.splitlines()}
        expected = best_of_groups(every, key)
        assert kept == expected, mode
        removed = len(every) - len(expected)
        assert f"--dedup {mode}: {removed} duplicates removed".encode() in result.stderr
    # No distinct conversation is lost: every group keeps one row.
    assert len(best_of_groups(every, dedup_key)) > len(best_of_groups(every, lambda r: origin[
        r["trace_id"]]))  # fmt: skip
    bad = corpus.export("--dedup", "near", "--dedup-threshold", "0", "-o", "-")
    assert bad.returncode == 2
    assert b"dedup-threshold: '0' is outside (0, 1]" in bad.stderr


def test_splits_by_scenario_are_disjoint_complete_and_stay_put(
    corpus: Corpus, tmp_path: Path
) -> None:
    def split_ids() -> dict[str, set[str]]:
        out = {}
        for name in ("train", "eval", "test"):
            rows = corpus.rows("--split", name, "--splits", SPLITS, "--split-by", "scenario",
                               "--split-salt", "v2")  # fmt: skip
            out[name] = {r["trace_id"] for r in rows}
            # With this salt each of the three scenarios falls in a split of its own.
            assert len({r["scenario"] for r in rows}) == 1, name
        return out

    before = split_ids()
    names = list(before)
    for n, a in enumerate(names):
        for b in names[n + 1 :]:
            assert not before[a] & before[b], (a, b)
    assert set().union(*before.values()) == {f"tr-{i:04d}" for i in range(corpus.published)}
    corpus.feed(30)  # the corpus grows
    after = split_ids()
    for name in names:
        assert before[name] <= after[name], name
    assert set().union(*after.values()) == {f"tr-{i:04d}" for i in range(corpus.published)}
    bad = corpus.export("--split", "dev", "--splits", SPLITS, "-o", "-")
    assert bad.returncode == 2
    assert b"split: 'dev' is not one of --splits (train, eval, test)" in bad.stderr
    bad = corpus.export("--split", "train", "--splits", "train=0.9,eval=0.05", "-o", "-")
    assert b"splits: the fractions sum to 0.95, not 1" in bad.stderr


def test_from_manifest_writes_the_same_bytes_after_the_corpus_moved(
    corpus: Corpus, tmp_path: Path
) -> None:
    out = tmp_path / "eval.jsonl"
    result = corpus.export("--format", "messages", "--split", "eval", "--splits", SPLITS,
                           "--dedup", "near", "--metadata", "tier=gold", "--chat-style",
                           "openai", "--system", "merge", "--card", "-o", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "eval.jsonl.manifest.json").read_bytes())
    assert manifest["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert manifest["filters"] == {"metadata": ["tier=gold"]}
    assert manifest["split"]["name"] == "eval"
    assert manifest["dedup"] == {"mode": "near", "on": "conversation", "threshold": 0.85}
    assert manifest["rows"] == len(out.read_bytes().splitlines())
    assert (manifest["chat_style"], manifest["system"]) == ("openai", "merge")
    corpus.feed(15)  # new traffic after the export
    again = tmp_path / "again.jsonl"
    manifest_file = str(tmp_path / "eval.jsonl.manifest.json")
    argv = [sys.executable, "-m", "rl_export.cli", "export", "--store",
            corpus.settings.store_url, "--from-manifest", manifest_file,
            "-o", str(again)]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, timeout=120, env=corpus.env, check=False)
    assert result.returncode == 0, result.stderr
    assert again.read_bytes() == out.read_bytes()
    latest = corpus.export("--format", "messages", "--split", "eval", "--splits", SPLITS,
                           "--dedup", "near", "--metadata", "tier=gold", "--chat-style",
                           "openai", "--system", "merge", "-o", "-")  # fmt: skip
    assert latest.stdout != out.read_bytes()  # the latest view has the new traces
    result = subprocess.run([*argv[:-2], "--format", "kto", "-o", "-"], capture_output=True,
                            timeout=120, env=corpus.env, check=False)  # fmt: skip
    assert result.returncode == 2
    assert b"--from-manifest: takes the export's options from the manifest" in result.stderr


def test_a_pinned_version_gives_the_same_bytes_after_compactions_and_retention(
    corpus: Corpus, tmp_path: Path
) -> None:
    from rl_export.corpora.compaction import compact, expire
    from tests.factories import event

    def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
        argv = [sys.executable, "-m", "rl_export.cli", *args]
        return subprocess.run(argv, capture_output=True, timeout=120, env=corpus.env,
                              check=False)  # fmt: skip

    where = ["--store", corpus.settings.store_url, "--org", ORG, "--project", PROJECT]
    created = cli("versions", "create", *where, "--corpus", "evaluator", "pinned",
                  "--note", "integration")  # fmt: skip
    assert created.returncode == 0, created.stderr
    at_pin = tmp_path / "at-pin.jsonl"
    assert corpus.export("--version", "pinned", "-o", str(at_pin)).returncode == 0
    again = cli("versions", "create", *where, "--corpus", "evaluator", "pinned")
    assert again.returncode == 2
    assert b"version 'pinned' of acme/bot/evaluator already exists" in again.stderr

    before = {r["trace_id"]: r for r in corpus.rows()}
    old = "tr-0001"
    rescore = event(
        "evaluation.finished", f"e2-{old}", "2026-01-02T00:00:00Z", org=ORG, project=PROJECT,
        trace_id=old, evaluation_id=f"ev2-{old}",
        results=[{"evaluator": "judge", "score": 0.01, "passed": False, "reasoning": "again"}],
    )  # fmt: skip
    asyncio.run(publish(corpus.settings, [rescore]))
    wait_for("the re-score in the evaluator corpus",
             lambda: {r["trace_id"]: r for r in corpus.rows()}[old]["revision"]
             > before[old]["revision"], timeout_s=120)  # fmt: skip
    ref = source_ref(ORG, PROJECT, "evaluator")

    async def compact_and_expire() -> list[str]:
        store = open_store(corpus.settings.store_url)
        try:
            await compact(store, ref, writer="test")
            return await expire(store, ref, keep_generations=1, retention_s=0,
                                now=time.time() + 3600)  # fmt: skip
        finally:
            await store.close()

    deleted = []
    for _ in range(3):  # several compactions, each followed by a retention pass
        corpus.feed(6)
        deleted += asyncio.run(compact_and_expire())
    assert deleted  # the retention passes removed history the version does not need

    result = corpus.export("--version", "pinned", "-o", "-")
    assert result.returncode == 0, result.stderr
    assert result.stdout == at_pin.read_bytes()
    assert b"read at version pinned" in result.stderr
    assert corpus.export("-o", "-").stdout != at_pin.read_bytes()
    verified = cli("shards", "verify", "--store", corpus.settings.store_url)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    unknown = corpus.export("--version", "nope", "-o", "-")
    assert unknown.returncode == 2
    assert b"version: no version 'nope' of acme/bot/evaluator" in unknown.stderr
    assert cli("versions", "delete", *where, "--corpus", "evaluator", "pinned").returncode == 0
