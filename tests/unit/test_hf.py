"""``rl_export.hf``: a corpus as a Hugging Face ``IterableDataset``, on corpora written the real
way (replay through the join and the sink, a compaction, a tail): ranks get disjoint shards
whose union is the corpus, a run stopped after k rows resumes with exactly the rest, and a
following dataset yields commits made after it started."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from datasets import IterableDataset
from datasets.distributed import split_dataset_by_node

from rl_export.corpora.compaction import compact
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import CorpusReader
from rl_export.corpora.replay import replay
from rl_export.corpora.store import LocalStore
from rl_export.formats.specs import CorpusSpec
from rl_export.hf import corpus_dataset, find_position, row_features
from rl_export.model.codec import dumps
from rl_export.model.errors import NoDataError
from rl_export.runtime.settings import load_settings
from tests.exportdata import ORG, PROJECT, build_story, replay_events
from tests.records import trace_events

EVALUATOR = CorpusRef(ORG, PROJECT, "evaluator")


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The export story in a local store: a compaction, then a tail that revises and deletes
    traces the compaction holds."""
    root = tmp_path_factory.mktemp("hf-store")
    asyncio.run(build_story(LocalStore(root)))
    return root


def identities(rows: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(r["trace_id"], r["revision"]) for r in rows]


async def reader_rows(root: Path, ref: CorpusRef, *, latest_only: bool) -> list[dict[str, Any]]:
    """What the corpora reader gives (the reference): live rows, tombstones dropped, and
    (every revision) the revisions of deleted traces dropped too; ``comparisons`` null where
    a trace has none (a declared column of trajectory rows)."""
    reader = CorpusReader(LocalStore(root), ref)
    rows = [r async for r in reader.records(latest_only=latest_only)]
    deleted = {r["trace_id"]: r["revision"] for r in rows if r.get("deleted")}
    return [{**r, "comparisons": r.get("comparisons")} for r in rows
            if not r.get("deleted") and r["revision"] > deleted.get(r["trace_id"], 0)]  # fmt: skip


@pytest.mark.parametrize("latest_only", [True, False])
async def test_rows_are_the_readers_for_every_store_url(story: Path, latest_only: bool) -> None:
    expected = await reader_rows(story, EVALUATOR, latest_only=latest_only)
    assert expected  # the story is not empty
    for url in (str(story), story.as_uri(), LocalStore(story)):
        dataset = corpus_dataset(url, ORG, PROJECT, "evaluator", latest_only=latest_only)
        assert isinstance(dataset, IterableDataset)
        rows = await asyncio.to_thread(list, dataset)
        assert sorted(identities(rows)) == sorted(identities(expected))
        by_id = {(r["trace_id"], r["revision"]): r for r in expected}
        assert all(r == by_id[r["trace_id"], r["revision"]] for r in rows)
    if latest_only:  # once per trace, and tr-003 (deleted in the tail) and tr-004 gone
        assert len({t for t, _ in identities(rows)}) == len(rows)
        assert {"tr-003", "tr-004"}.isdisjoint(t for t, _ in identities(rows))
    else:  # both of tr-001's revisions: the compaction's and the tail's
        assert sorted(r for t, r in identities(rows) if t == "tr-001") == [3, 4]


async def test_one_shard_per_committed_object(story: Path) -> None:
    from rl_export.export.latest import LatestView

    view = LatestView(LocalStore(story), EVALUATOR)
    await view.locate()
    objects = len(view.compaction_parts) + len(view.tail)
    dataset = corpus_dataset(str(story), ORG, PROJECT, "evaluator")
    assert dataset.num_shards == objects > 2


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("strategy", ["auto", "shards", "examples"])
async def test_nodes_get_disjoint_rows_whose_union_is_the_corpus(
    story: Path, world: int, strategy: str
) -> None:
    dataset = corpus_dataset(str(story), ORG, PROJECT, "evaluator", latest_only=False)
    if strategy == "shards" and dataset.num_shards < world:
        pytest.skip("fewer shards than nodes")
    everything = identities(await asyncio.to_thread(list, dataset))
    parts = []
    for rank in range(world):
        node = split_dataset_by_node(dataset, rank, world, strategy=strategy)
        if strategy == "shards":  # whole objects, one node each (some may hold only tombstones)
            assert node.num_shards in (dataset.num_shards // world, -(-dataset.num_shards // world))
        parts.append(identities(await asyncio.to_thread(list, node)))
    union = [row for part in parts for row in part]
    assert len(union) == len(set(union))  # disjoint
    assert sorted(union) == sorted(everything)  # and together the corpus


async def test_the_same_commits_give_the_same_order(story: Path) -> None:
    first = identities(list(corpus_dataset(str(story), ORG, PROJECT, "evaluator")))
    again = identities(list(corpus_dataset(story.as_uri(), ORG, PROJECT, "evaluator")))
    assert first == again


def take(iterator: Iterator[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    return [next(iterator) for _ in range(k)]


@pytest.mark.parametrize("latest_only", [True, False])
async def test_a_run_stopped_after_k_rows_resumes_with_exactly_the_rest(
    story: Path, latest_only: bool
) -> None:
    def run() -> None:
        everything = list(corpus_dataset(str(story), ORG, PROJECT, "evaluator",
                                          latest_only=latest_only))  # fmt: skip
        for k in range(len(everything) + 1):
            dataset = corpus_dataset(str(story), ORG, PROJECT, "evaluator",
                                     latest_only=latest_only)  # fmt: skip
            head = take(iter(dataset), k)
            state = dataset.state_dict()
            resumed = corpus_dataset(str(story), ORG, PROJECT, "evaluator",
                                     latest_only=latest_only)  # fmt: skip
            resumed.load_state_dict(state)
            assert head + list(resumed) == everything, k

    await asyncio.to_thread(run)


async def test_each_node_resumes_its_own_rows(story: Path) -> None:
    def run() -> None:
        dataset = corpus_dataset(str(story), ORG, PROJECT, "evaluator", latest_only=False)
        for rank in range(2):
            node = split_dataset_by_node(dataset, rank, 2)
            everything = list(node)
            stopped = split_dataset_by_node(dataset, rank, 2)
            head = take(iter(stopped), 2)
            again = split_dataset_by_node(
                corpus_dataset(str(story), ORG, PROJECT, "evaluator", latest_only=False), rank, 2
            )
            again.load_state_dict(stopped.state_dict())
            assert head + list(again) == everything

    await asyncio.to_thread(run)


async def test_a_changed_corpus_resumes_from_the_position_the_state_holds(
    tmp_path: Path,
) -> None:
    store = LocalStore(tmp_path)
    await build_story(store)
    dataset = corpus_dataset(str(tmp_path), ORG, PROJECT, "evaluator")
    everything = await asyncio.to_thread(list, dataset)
    stopped = corpus_dataset(str(tmp_path), ORG, PROJECT, "evaluator")
    head = await asyncio.to_thread(take, iter(stopped), 3)
    state = stopped.state_dict()
    # Meanwhile: a new trace, a new revision of one already read, and a new compaction.
    await replay_events(store, trace_events(30, score=0.5, passed=True, minute=40), "later")
    await compact(store, EVALUATOR, writer="test")
    changed = corpus_dataset(str(tmp_path), ORG, PROJECT, "evaluator")
    changed.load_state_dict(state)
    with pytest.raises(ValueError, match=r"resume_from=state"):
        await asyncio.to_thread(list, changed)
    # The compaction before it still exists (kept until the retention ends): the same
    # dataset again, and exactly the rest of it.
    resumed = corpus_dataset(str(tmp_path), ORG, PROJECT, "evaluator", resume_from=state)
    resumed.load_state_dict(state)
    assert head + await asyncio.to_thread(list, resumed) == everything
    assert find_position({"dataloader": [{"dataset_state": state}]}) == find_position(state)
    with pytest.raises(ValueError, match="no rl-export dataset state"):
        corpus_dataset(str(tmp_path), ORG, PROJECT, "evaluator", resume_from={"epoch": 1})


async def test_a_pinned_version_gives_the_rows_it_pinned(tmp_path: Path) -> None:
    from rl_export.export.versions import pin
    from rl_export.model.errors import VersionError

    store = LocalStore(tmp_path)
    await build_story(store)
    pinned_rows = await asyncio.to_thread(
        list, corpus_dataset(str(tmp_path), ORG, PROJECT, "evaluator", format="messages")
    )
    await pin(store, EVALUATOR, "v1")
    await replay_events(store, trace_events(30, score=0.5, passed=True, minute=40), "later")
    await compact(store, EVALUATOR, writer="test")
    latest = await asyncio.to_thread(
        list, corpus_dataset(str(tmp_path), ORG, PROJECT, "evaluator", format="messages")
    )
    assert latest != pinned_rows
    at_version = corpus_dataset(str(tmp_path), ORG, PROJECT, "evaluator", format="messages",
                                version="v1")  # fmt: skip
    assert await asyncio.to_thread(list, at_version) == pinned_rows
    with pytest.raises(VersionError, match=r"no version 'v2' of acme/bot/evaluator"):
        corpus_dataset(str(tmp_path), ORG, PROJECT, "evaluator", version="v2")
    with pytest.raises(ValueError, match="cannot follow it"):
        corpus_dataset(str(tmp_path), ORG, PROJECT, "evaluator", version="v1", follow=True,
                       topic="t", partitions=1)  # fmt: skip


def follow_dataset(root: Path, run: str, **kw: Any) -> IterableDataset:
    # Replays write chains replay-<run>-<p> (four partitions in these tests): follow those.
    return corpus_dataset(
        str(root), ORG, PROJECT, "evaluator", follow=True, topic=f"replay-{run}", partitions=4,
        poll_interval_s=0.05, **kw,
    )  # fmt: skip


def next_within(iterator: Iterator[dict[str, Any]], seconds: float = 60) -> dict[str, Any]:
    """The iterator's next row, read in a thread (a following dataset blocks until one)."""
    found: list[dict[str, Any]] = []
    reader = threading.Thread(target=lambda: found.append(next(iterator)), daemon=True)
    reader.start()
    reader.join(seconds)
    assert found, "no row within the time"
    return found[0]


async def test_follow_yields_a_commit_made_after_it_started(tmp_path: Path) -> None:
    story = tmp_path
    await build_story(LocalStore(story))
    run = "late1"  # the chains replay-late1-<p> do not exist yet: the replay below makes them
    dataset = follow_dataset(story, run)
    plain = corpus_dataset(str(story), ORG, PROJECT, "evaluator")
    assert dataset.num_shards == plain.num_shards + 4
    rows = iter(dataset)
    head = await asyncio.to_thread(take, rows, len(list(plain)))
    assert identities(head) == identities(list(plain))
    waiting: list[dict[str, Any]] = []
    reader = threading.Thread(target=lambda: waiting.append(next(rows)), daemon=True)
    reader.start()
    await asyncio.sleep(0.3)  # it polls, and finds nothing new
    assert not waiting
    await replay_events(LocalStore(story), trace_events(41, score=0.9, passed=True), run)
    await asyncio.to_thread(reader.join, 60)
    assert [r["trace_id"] for r in waiting] == ["tr-041"]


async def test_a_following_run_resumes_exactly_in_the_new_commits(tmp_path: Path) -> None:
    story = tmp_path
    await build_story(LocalStore(story))
    run = "late2"
    first = follow_dataset(story, run)
    base = len(list(corpus_dataset(str(story), ORG, PROJECT, "evaluator")))
    rows = iter(first)
    await asyncio.to_thread(take, rows, base)
    # Four new traces, in commits of three records at most, on the chains it follows.
    events = [e for n in (51, 52, 53, 54) for e in trace_events(n, score=0.5, passed=True)]
    await replay_events(LocalStore(story), events, run)
    head = [await asyncio.to_thread(next_within, rows) for _ in range(2)]
    state = first.state_dict()
    rest = [await asyncio.to_thread(next_within, rows) for _ in range(2)]
    assert sorted(r["trace_id"] for r in head + rest) == ["tr-051", "tr-052", "tr-053", "tr-054"]
    resumed = follow_dataset(story, run, resume_from=state)
    resumed.load_state_dict(state)
    again = iter(resumed)
    assert identities([await asyncio.to_thread(next_within, again) for _ in range(2)]) == (
        identities(rest))  # fmt: skip


async def test_a_following_dataset_may_start_before_the_corpus_exists(tmp_path: Path) -> None:
    dataset = follow_dataset(tmp_path, "first")
    rows = iter(dataset)
    await replay_events(LocalStore(tmp_path), trace_events(1, score=0.5, passed=True), "first")
    assert (await asyncio.to_thread(next_within, rows))["trace_id"] == "tr-001"
    with pytest.raises(NoDataError, match="no data for acme/bot/human"):
        corpus_dataset(str(tmp_path), ORG, PROJECT, "human")


async def test_any_formats_corpus_masks_included(tmp_path: Path) -> None:
    spec = CorpusSpec(name="sft", source="evaluator", format="messages",
                      mask_failed_turns=True)  # fmt: skip
    settings = load_settings(partitions=4, shard_max_records=3, corpora=[spec])
    failing = [{"type": "goal_met", "turn": 2, "decision": False}]
    events = trace_events(1, score=0.2, passed=False, outcomes=failing)
    events += trace_events(2, score=0.9, passed=True, minute=1)
    await replay(settings, LocalStore(tmp_path),
                 [(f"e:{n}", dumps(e)) for n, e in enumerate(events)])  # fmt: skip
    rows = await asyncio.to_thread(list, corpus_dataset(tmp_path.as_uri(), ORG, PROJECT, "sft"))
    assert sorted(r["trace_id"] for r in rows) == ["tr-001", "tr-002"]
    assert all(list(r) == ["trace_id", "revision", "messages"] for r in rows)
    weights = {r["trace_id"]: [m.get("weight") for m in r["messages"]] for r in rows}
    assert weights == {"tr-001": [None, None, 1, None, 1, None, 0],
                       "tr-002": [None, None, 1, None, 1, None, 1]}  # fmt: skip


async def test_stored_rows_have_the_features_of_the_format_the_settings_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = CorpusSpec(name="sft", source="evaluator", format="messages")
    settings = load_settings(partitions=4, shard_max_records=3, corpora=[spec])
    events = trace_events(1, score=0.2, passed=False) + trace_events(2, score=0.9, passed=True)
    await replay(
        settings, LocalStore(tmp_path), [(f"e:{n}", dumps(e)) for n, e in enumerate(events)]
    )
    unnamed = corpus_dataset(str(tmp_path), ORG, PROJECT, "sft")  # the default settings
    assert unnamed.features is None
    monkeypatch.setenv(
        "RL_EXPORT_CORPORA", '[{"name": "sft", "source": "evaluator", "format": "messages"}]'
    )
    named = corpus_dataset(str(tmp_path), ORG, PROJECT, "sft")
    assert named.features == row_features("messages", corpus_row=True)
    rows = await asyncio.to_thread(list, named)
    assert rows == await asyncio.to_thread(list, unnamed)
    assert all(named.features.encode_example(r) for r in rows)
    # A corpus whose rows are not of the format the settings name: said, not mistyped.
    monkeypatch.setenv(
        "RL_EXPORT_CORPORA", '[{"name": "sft", "source": "evaluator", "format": "kto"}]'
    )
    with pytest.raises(ValueError, match=r"acme/bot/sft: a row has columns \['messages'\]"):
        await asyncio.to_thread(list, corpus_dataset(str(tmp_path), ORG, PROJECT, "sft"))


def test_rl_export_imports_without_datasets_and_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['datasets'] = None\n"
        "import rl_export, rl_export.hf\n"
        "try:\n"
        "    rl_export.hf.corpus_dataset('/nowhere', 'a', 'b', 'c')\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "pip install 'rl-export[hf]'" in result.stdout


def test_a_dataset_pickles_for_worker_processes(story: Path, tmp_path: Path) -> None:
    import pickle

    dataset = corpus_dataset(str(story), ORG, PROJECT, "evaluator")
    expected = identities(list(dataset))
    (tmp_path / "ds.pickle").write_bytes(pickle.dumps(dataset))
    code = (  # a fresh interpreter, as a spawned DataLoader worker is
        "import pickle, sys\n"
        "ds = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "print([(r['trace_id'], r['revision']) for r in ds])\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ds.pickle")],
                            capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(expected)
