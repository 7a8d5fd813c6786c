"""Reading a corpus at a pinned version (DESIGN.md section 5, "Versions"): the same bytes
after new traffic, a re-score, compactions and expiry; ``shards verify`` checks versions;
the command line."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from rl_export.cli import main
from rl_export.corpora.commits import ChainError, chain_keys, read_commit
from rl_export.corpora.compaction import compact, expire
from rl_export.corpora.erasures import erased_traces
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import CorpusReader
from rl_export.corpora.store import LocalStore, MemoryStore, ObjectStore
from rl_export.corpora.verify import verify
from rl_export.corpora.versions import create_version, delete_version, version_key
from rl_export.export import stats, write_export
from rl_export.export.latest import LatestView, ViewPosition
from rl_export.export.versions import pin, pinned
from rl_export.model.codec import loads
from rl_export.model.errors import NoDataError, VersionError
from tests.exportdata import ORG, PROJECT, FirstCommitLate, replay_events
from tests.factories import event
from tests.records import trace_events
from tests.trainingdata import traffic

EVALUATOR = CorpusRef(ORG, PROJECT, "evaluator")


def rescore(trace: int, score: float) -> dict[str, Any]:
    tid = f"tr-{trace:04d}"
    return event(
        "evaluation.finished", f"e2-{tid}", "2026-01-02T00:00:00Z", org=ORG, project=PROJECT,
        trace_id=tid, evaluation_id=f"ev2-{tid}",
        results=[{"evaluator": "judge", "score": score, "passed": False, "reasoning": "again"}],
    )  # fmt: skip


async def export_at(store: ObjectStore, out: Path, name: str | None = None) -> str:
    """The sha256 of the export's bytes (of the version ``name``, else the latest view)."""
    at = None if name is None else (await pinned(store, EVALUATOR, name, None)).at
    summary = await write_export(store, EVALUATOR, format="trajectory", out=out, at=at)
    return summary.sha256


async def churn(store: ObjectStore, rounds: int) -> None:
    """New traffic, a re-score of an old trace, a compaction and an expiry with no retention
    left, ``rounds`` times."""
    for n in range(rounds):
        await replay_events(store, [*traffic(6, start=100 + 6 * n), rescore(n + 1, 0.05)],
                            f"more-{n}")  # fmt: skip
        assert await compact(store, EVALUATOR, writer="test") is not None
        await expire(store, EVALUATOR, keep_generations=1, retention_s=0, now=time.time() + 60)


async def test_a_version_reads_the_same_bytes_after_traffic_compactions_and_expiry(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    await replay_events(store, traffic(12), "one")
    await compact(store, EVALUATOR, writer="test")
    await replay_events(store, traffic(6, start=12), "two")  # a tail after the compaction
    pinned_at = await export_at(store, tmp_path / "at-pin.jsonl")
    version = await pin(store, EVALUATOR, "v1", "the first run")
    assert version.generation == 1
    assert version.ends

    await churn(store, 3)

    assert await export_at(store, tmp_path / "again.jsonl", "v1") == pinned_at
    assert await export_at(store, tmp_path / "latest.jsonl") != pinned_at
    report = await verify(store)
    assert report.ok, report.problems
    assert report.versions == 1
    assert report.summary().endswith(", 1 versions")

    # Deleting the version releases what only it kept: the next expiry removes it.
    await delete_version(store, EVALUATOR, "v1")
    deleted = await expire(store, EVALUATOR, keep_generations=1, retention_s=0,
                           now=time.time() + 60)  # fmt: skip
    assert EVALUATOR.compaction_key(1) in deleted
    assert (await verify(store)).ok


def deleted(*traces: int) -> list[dict[str, Any]]:
    """The traces' events again, each followed by its ``trace.deleted`` (a replay run has a
    join of its own: the deletion must come after the trace in the same run)."""
    out = []
    for trace in traces:
        tid = f"tr-{trace:04d}"
        out += [e for e in traffic(trace + 1) if e["trace_id"] == tid]
        out.append(event("trace.deleted", f"d-{tid}", "2026-01-03T00:00:00Z", org=ORG,
                         project=PROJECT, trace_id=tid))  # fmt: skip
    return out


def trace_ids(path: Path) -> list[str]:
    return [loads(line)["trace_id"] for line in path.read_bytes().splitlines()]


@pytest.mark.parametrize("compacted", [False, True], ids=["in-the-tail", "in-a-compaction"])
async def test_a_trace_deleted_after_the_pin_is_left_out_of_the_version(
    tmp_path: Path, compacted: bool
) -> None:
    store = MemoryStore()
    await replay_events(store, traffic(12), "one")
    if compacted:  # the deleted traces' records are in the version's compaction, not its tail
        await compact(store, EVALUATOR, writer="test")
    await pin(store, EVALUATOR, "v1")
    before = tmp_path / "before.jsonl"
    at = (await pinned(store, EVALUATOR, "v1", None)).at
    summary = await write_export(store, EVALUATOR, format="trajectory", out=before, at=at)
    assert summary.erased == 0
    assert {"tr-0003", "tr-0007"} <= set(trace_ids(before))

    # Two traces deleted (one of them twice: the second deletion changes nothing), then a
    # compaction.
    await replay_events(store, [*deleted(3, 7), *deleted(3)[-1:]], "deleted")
    await compact(store, EVALUATOR, writer="test")

    after = tmp_path / "after.jsonl"
    at = (await pinned(store, EVALUATOR, "v1", None)).at
    summary = await write_export(store, EVALUATOR, format="trajectory", out=after, at=at)
    assert summary.erased == 2
    assert trace_ids(after) == [t for t in trace_ids(before) if t not in {"tr-0003", "tr-0007"}]
    assert summary.records == len(trace_ids(before)) - 2
    # Every line it kept is the version's, byte for byte; the latest view agrees on what is
    # gone; stats at the version do not count them either, and say so.
    kept = set(after.read_bytes().splitlines())
    assert kept <= set(before.read_bytes().splitlines())
    latest = tmp_path / "latest.jsonl"
    await write_export(store, EVALUATOR, format="trajectory", out=latest)
    assert not {"tr-0003", "tr-0007"} & set(trace_ids(latest))
    figures = await stats(store, EVALUATOR, at=at)
    assert (figures["records"], figures["erased"]) == (summary.records, 2)
    # One entry per deletion in the erasure log, whichever corpora committed it.
    assert await erased_traces(store, ORG, PROJECT) == {"tr-0003", "tr-0007"}
    assert await erased_traces(store, ORG, "other") == frozenset()


async def test_every_way_the_view_reads_leaves_out_the_same_erased_traces() -> None:
    # Sidecars or the objects' lines, one index or many spilled runs, a compaction and a
    # tail: the erased traces' lines settle as any other's.
    store = MemoryStore()
    await replay_events(store, traffic(12), "one")
    await compact(store, EVALUATOR, writer="test")
    await replay_events(store, [*traffic(4, start=12), rescore(5, 0.1)], "two")
    await pin(store, EVALUATOR, "v1")
    await replay_events(store, deleted(2, 5, 13), "deleted")
    at = (await pinned(store, EVALUATOR, "v1", None)).at
    seen = set()
    for sidecars in (True, False):
        for spill_at in (1, 3, 1000):
            view = LatestView(store, EVALUATOR, at=at, sidecars=sidecars, spill_at=spill_at)
            await view.open()
            lines = [line async for batch in view.lines() for line in batch]
            ids = [loads(line)["trace_id"] for line in lines]
            assert not {"tr-0002", "tr-0005", "tr-0013"} & set(ids)
            assert (view.erased, view.total, len(ids)) == (3, len(ids), len(set(ids)))
            seen.add(tuple(lines))
    assert len(seen) == 1


async def test_the_reader_reads_a_version_less_the_traces_deleted_since() -> None:
    store = MemoryStore()
    await replay_events(store, traffic(12), "one")
    await compact(store, EVALUATOR, writer="test")
    await replay_events(store, traffic(16, start=12), "two")
    version = await pin(store, EVALUATOR, "v1")
    at = (await pinned(store, EVALUATOR, "v1", None)).at
    view = LatestView(store, EVALUATOR, at=at)
    pinned_lines = [line async for batch in view.lines() for line in batch]
    await replay_events(store, [*traffic(3, start=40), rescore(2, 0.1)], "three")
    await compact(store, EVALUATOR, writer="test")
    await replay_events(store, deleted(5, 13), "deleted")

    reader = CorpusReader(store, EVALUATOR)
    latest = [r async for r in reader.records(latest_only=True, version=version)]
    expected = [loads(line) for line in pinned_lines]
    gone = {"tr-0005", "tr-0013"}
    assert sorted(r["trace_id"] for r in latest) == sorted(
        r["trace_id"] for r in expected if r["trace_id"] not in gone
    )
    assert {(r["trace_id"], r["revision"]) for r in latest} <= {
        (r["trace_id"], r["revision"]) for r in expected
    }
    # Every revision the version holds, resumable from a cursor taken in the middle.
    everything = [r async for r in reader.records(version=version)]
    assert not gone & {r["trace_id"] for r in everything}
    assert not {"tr-0040", "tr-0041", "tr-0042"} & {r["trace_id"] for r in everything}
    first = []
    async for row in reader.records(version=version):
        first.append(row)
        if len(first) == 7:
            break
    rest = [r async for r in reader.records(reader.cursor, version=version)]
    assert first + rest == everything
    # A version that ends inside its chains (their first commits): nothing after the ends.
    ends = dict(version.ends)
    for stream in ends:
        if stream.startswith("replay-two-"):  # the tail's chains (run one's are compacted)
            _, first_commit = (await chain_keys(store, EVALUATOR, stream))[0]
            ends[stream] = (await read_commit(store, first_commit)).last_offset + 1
    early = await create_version(store, EVALUATOR, "early", generation=version.generation,
                                 ends=ends)  # fmt: skip
    assert ends != dict(version.ends)
    view = LatestView(store, EVALUATOR, at=ViewPosition(version.generation, ends))
    at_early = {(r["trace_id"], r["revision"]) async for batch in view.lines()
                for r in map(loads, batch)}  # fmt: skip
    read_early = [r async for r in reader.records(latest_only=True, version=early)]
    assert {(r["trace_id"], r["revision"]) for r in read_early} == {
        t for t in at_early if t[0] not in gone
    }
    with pytest.raises(ValueError, match="is not of acme/bot/traces"):
        _ = [r async for r in CorpusReader(store, CorpusRef(ORG, PROJECT, "traces")).records(
            version=version)]  # fmt: skip


async def test_the_erasure_entry_is_written_before_the_commit_holding_the_tombstone() -> None:
    store = MemoryStore()
    await replay_events(store, traffic(3), "one")
    writes: list[str] = []
    put, put_if_absent = store.put, store.put_if_absent

    async def recorded_put(key: str, data: bytes) -> None:
        writes.append(key)
        await put(key, data)

    async def recorded_put_if_absent(key: str, data: bytes) -> None:
        writes.append(key)
        await put_if_absent(key, data)

    store.put, store.put_if_absent = recorded_put, recorded_put_if_absent  # type: ignore[method-assign]
    await replay_events(store, deleted(1), "deleted")
    entries = [n for n, key in enumerate(writes) if key.startswith("_erasures/")]
    commits = [n for n, key in enumerate(writes) if "/_manifest/" in key]
    assert entries
    assert commits
    assert entries[0] < commits[0]
    assert {writes[n] for n in entries} == {writes[entries[0]]}  # the same key every time


async def test_an_erasure_entry_that_is_not_one_fails_the_pinned_read(tmp_path: Path) -> None:
    store = MemoryStore()
    await replay_events(store, traffic(3), "one")
    await pin(store, EVALUATOR, "v1")
    await store.put(f"_erasures/{ORG}/{PROJECT}/x/00000000000000000001.json", b"[1]")
    at = (await pinned(store, EVALUATOR, "v1", None)).at
    with pytest.raises(ChainError, match="not an erasure entry"):
        await write_export(store, EVALUATOR, format="trajectory", out=tmp_path / "o", at=at)


async def test_without_the_version_expiry_removes_what_it_read(tmp_path: Path) -> None:
    """The control of the test above: the same churn with no version pinned leaves the
    position unreadable, so keeping objects is what makes the bytes come back."""
    store = MemoryStore()
    await replay_events(store, traffic(12), "one")
    await compact(store, EVALUATOR, writer="test")
    await replay_events(store, traffic(6, start=12), "two")
    version = await pin(store, EVALUATOR, "v1")
    await delete_version(store, EVALUATOR, "v1")
    await churn(store, 3)
    assert EVALUATOR.compaction_key(1) not in await store.list(EVALUATOR.compacted_prefix())
    with pytest.raises(ChainError, match="no longer exists"):
        await write_export(store, EVALUATOR, format="trajectory", out=tmp_path / "x.jsonl",
                           at=ViewPosition.from_json(version.position()))  # fmt: skip


async def test_verify_names_a_version_that_no_longer_resolves() -> None:
    store = MemoryStore()
    await replay_events(store, traffic(12), "one")
    await compact(store, EVALUATOR, writer="test")
    await pin(store, EVALUATOR, "v1")
    await store.delete(EVALUATOR.compaction_key(1))  # behind expiry's back
    report = await verify(store)
    assert not report.ok
    assert any(p.startswith(f"{version_key(EVALUATOR, 'v1')}: its compaction") and "gone" in p
               for p in report.problems)  # fmt: skip


async def test_pinning_a_corpus_without_data_or_an_unknown_version_is_an_error() -> None:
    store = MemoryStore()
    with pytest.raises(NoDataError, match="nothing to pin"):
        await pin(store, EVALUATOR, "v1")
    with pytest.raises(VersionError, match=r"no version 'nope' of acme/bot/evaluator"):
        await pinned(store, EVALUATOR, "nope", None)


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    store = LocalStore(root)
    asyncio.run(replay_events(store, traffic(12), "one"))
    common = ["--store", str(root), "--org", ORG, "--project", PROJECT]
    assert main(["versions", "create", *common, "--corpus", "evaluator", "v1",
                 "--note", "run 7"]) == 0  # fmt: skip
    created = capsys.readouterr().out
    assert '"name":"v1"' in created
    assert '"note":"run 7"' in created
    assert main(["versions", "create", *common, "--corpus", "evaluator", "v1"]) == 2
    assert "version 'v1' of acme/bot/evaluator already exists" in capsys.readouterr().err
    pin_file = tmp_path / "pin.jsonl"
    assert main(["export", *common, "--source", "evaluator", "--format", "trajectory",
                 "-o", str(pin_file)]) == 0  # fmt: skip
    asyncio.run(replay_events(store, [*traffic(6, start=50), rescore(1, 0.05)], "two"))
    again = tmp_path / "again.jsonl"
    assert main(["export", *common, "--source", "evaluator", "--format", "trajectory",
                 "--version", "v1", "-o", str(again)]) == 0  # fmt: skip
    assert "read at version v1" in capsys.readouterr().err
    assert again.read_bytes() == pin_file.read_bytes()
    assert main(["export", *common, "--source", "evaluator", "--format", "trajectory",
                 "--as-of", "2999-01-01T00:00:00Z", "-o", str(again)]) == 0  # fmt: skip
    assert again.read_bytes() == pin_file.read_bytes()
    capsys.readouterr()
    assert main(["stats", *common, "--source", "evaluator", "--version", "v1"]) == 0
    assert '"records":12' in capsys.readouterr().out
    assert main(["versions", "list", *common, "--corpus", "evaluator"]) == 0
    assert capsys.readouterr().out.count('"name":') == 1
    # shards cat --latest at a version: the lines the export wrote.
    assert main(["shards", "cat", *common, "--corpus", "evaluator", "--latest",
                 "--version", "v1"]) == 0  # fmt: skip
    cat = capsys.readouterr().out.encode()
    assert sorted(cat.splitlines()) == sorted(pin_file.read_bytes().splitlines())
    assert main(["shards", "ls", "--store", str(root), "--version", "v1"]) == 2
    assert "shards ls reads no version (only cat does)" in capsys.readouterr().err
    # agreement at a version of the traces corpus: the traces of the second run not in it.
    assert main(["versions", "create", *common, "--corpus", "traces", "t1"]) == 0
    asyncio.run(replay_events(store, traffic(4, start=80), "three"))
    capsys.readouterr()
    assert main(["agreement", *common, "--version", "t1"]) == 0
    at_version = loads(capsys.readouterr().out)
    assert main(["agreement", *common]) == 0
    latest = loads(capsys.readouterr().out)
    assert at_version != latest
    assert main(["agreement", *common, "--version", "nope"]) == 2
    assert "no version 'nope' of acme/bot/traces" in capsys.readouterr().err
    assert main(["versions", "delete", *common, "--corpus", "evaluator", "v1"]) == 0
    capsys.readouterr()
    for argv, message in [
        (["stats", *common, "--source", "evaluator", "--version", "v1"],
         "rl-export: error: version: no version 'v1' of acme/bot/evaluator"),
        (["stats", *common, "--source", "evaluator", "--as-of", "yesterday"],
         "rl-export: error: --as-of: 'yesterday' is not an RFC 3339 time"),
        (["stats", *common, "--source", "evaluator", "--as-of", "2000-01-01T00:00:00Z"],
         "rl-export: error: version: no version created at or before 2000-01-01"),
        (["stats", *common, "--source", "evaluator", "--version", "a", "--as-of", "2000-01-01"],
         "rl-export: error: --version: give --version NAME or --as-of RFC3339, not both"),
        (["versions", "create", *common, "--corpus", "evaluator", "../x"],
         "rl-export: error: version: version name '../x' is not valid"),
    ]:  # fmt: skip
        assert main(argv) == 2
        assert capsys.readouterr().err.startswith(message)
    with pytest.raises(SystemExit) as exited:  # argparse's usage error, one line
        main(["versions", "show", *common, "--corpus", "evaluator"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith(
        "rl-export versions show: error: the following arguments are required: NAME"
    )


async def test_a_first_commit_landing_while_pinning_is_pinned() -> None:
    """The pin found no chain, then saw the corpus exists: it looks again rather than pin
    an empty view of a corpus that has a commit."""
    store = FirstCommitLate()
    await replay_events(store, trace_events(1, score=0.9, passed=True), "first")
    store.looked = False  # the pin's first look at the chains shows none
    version = await pin(store, EVALUATOR, "v1")
    assert store.looked
    assert version.position()["ends"]  # the commit's chain, not an empty position
