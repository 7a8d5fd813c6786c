"""Training sets (DESIGN.md section 4): splits that stay put, deduplication, metadata filters,
pure and through exports of a corpus written the real way (replay)."""

from __future__ import annotations

import io
import json
import random
from typing import Any

import pytest

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import MemoryStore
from rl_export.export import ExportSummary, parse_dedup, parse_split, write_export
from rl_export.export.dedup import Dedup, Deduplicator, dedup_text, shingles
from rl_export.export.splits import split_point
from rl_export.formats.filters import parse_filters
from rl_export.model.errors import ExportError
from tests.exportdata import ORG, PROJECT, replay_events
from tests.trainingdata import best_of_groups, convo, kind, traffic, words

EVALUATOR = CorpusRef(ORG, PROJECT, "evaluator")
SPLITS = "train=0.8,eval=0.1,test=0.1"


# --- splits ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("train", None), "splits: --split needs --splits"),
        (("train", "train=0.9,eval=0.05"), "splits: the fractions sum to 0.95, not 1"),
        (("train", "train=0.5,eval=0.6"), "splits: the fractions sum to 1.1, not 1"),
        (("dev", "train=0.9,eval=0.1"), "split: 'dev' is not one of --splits (train, eval)"),
        (("train", "train=0.9,eval"), "splits: expected NAME=FRACTION"),
        (("train", "train=x,eval=0.1"), "splits: train: 'x' is not a number"),
        (("train", "train=1.5,eval=-0.5"), "splits: train: 1.5 is not a fraction in (0, 1]"),
        (("train", "train=0.5,train=0.5"), "splits: train is given twice"),
        (("train", "train=1", "colour"), "split-by: no record field 'colour'"),
        (("train", "train=1", "metadata."), "split-by: metadata. needs a key"),
        ((None, "train=1"), "splits: only applies with --split NAME"),
        ((None, None, "scenario"), "split-by: only applies with --split NAME"),
    ],
)
def test_bad_splits_are_precise_errors(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ExportError) as caught:
        parse_split(*args)
    assert str(caught.value).startswith(message)


def test_decimal_fractions_that_sum_to_one_in_decimal_are_accepted() -> None:
    split = parse_split("eval", "train=0.7,eval=0.2,test=0.1")
    assert split is not None
    assert [n for n, _ in split.splits] == ["train", "eval", "test"]


def test_a_row_s_split_depends_on_its_value_and_the_salt_only() -> None:
    split = parse_split("train", SPLITS)
    assert split is not None
    names = [split.of({"trace_id": f"tr-{n}"}) for n in range(4000)]
    shares = {name: names.count(name) / len(names) for name in ("train", "eval", "test")}
    assert shares["train"] == pytest.approx(0.8, abs=0.03)
    assert shares["eval"] == pytest.approx(0.1, abs=0.02)
    # The same value, whatever else the record holds, in any order: the same split.
    again = [split.of({"trace_id": f"tr-{n}", "reward": n % 7}) for n in reversed(range(4000))]
    assert again[::-1] == names
    salted = parse_split("train", SPLITS, salt="2027")
    assert salted is not None
    assert [salted.of({"trace_id": f"tr-{n}"}) for n in range(4000)] != names
    assert 0 <= split_point("", "x") < 1


def test_split_by_a_field_or_a_metadata_key_keeps_a_value_together() -> None:
    by_scenario = parse_split("eval", "train=0.5,eval=0.5", "scenario")
    by_region = parse_split("eval", "train=0.5,eval=0.5", "metadata.region")
    assert by_scenario is not None
    assert by_region is not None
    records = [
        {"trace_id": f"tr-{n}", "scenario": f"s{n % 5}", "metadata": {"region": f"r{n % 3}"}}
        for n in range(200)
    ]
    for split, value in ((by_scenario, lambda r: r["scenario"]),
                         (by_region, lambda r: r["metadata"]["region"])):  # fmt: skip
        seen: dict[str, str] = {}
        for record in records:
            assert seen.setdefault(value(record), split.of(record)) == split.of(record)
    # A record without the key (or without metadata) has the value null: one split for all.
    assert by_region.of({"trace_id": "a"}) == by_region.of({"trace_id": "b", "metadata": {}})


# --- dedup ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("fuzzy",), "dedup: 'fuzzy' is not exact or near"),
        (("near", "0"), "dedup-threshold: '0' is outside (0, 1]"),
        (("near", "1.01"), "dedup-threshold: '1.01' is outside (0, 1]"),
        (("near", "nan"), "dedup-threshold: 'nan' is outside (0, 1]"),
        (("near", "high"), "dedup-threshold: 'high' is not a number"),
        (("exact", "0.9"), "dedup-threshold: only applies with --dedup near"),
        ((None, "0.9"), "dedup-threshold: only applies with --dedup near"),
        (("exact", None, "title"), "dedup-on: 'title' is not conversation or prompt"),
        ((None, None, "prompt"), "dedup-on: only applies with --dedup"),
    ],
)
def test_bad_dedup_options_are_precise_errors(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ExportError) as caught:
        parse_dedup(*args)
    assert str(caught.value).startswith(message)


def test_dedup_text_collapses_whitespace_and_keeps_case() -> None:
    a = [{"role": "user", "content": "Hello   there\n\tfriend "},
         {"role": "assistant", "content": [{"type": "text", "text": "Hi!"}]}]  # fmt: skip
    b = [{"role": "user", "content": "Hello there friend"},
         {"role": "assistant", "content": "Hi!"}]  # fmt: skip
    assert dedup_text(a) == dedup_text(b) == "user Hello there friend assistant Hi!"
    assert dedup_text([{"role": "user", "content": "hello there friend"}]) != dedup_text(b[:1])
    assert dedup_text(a, "prompt") == "user Hello there friend"
    assert parse_dedup("near") == Dedup("near", 0.85, "conversation")


def test_whitespace_collapses_as_str_split_does_on_every_kind_of_text() -> None:
    # The fast path (ASCII, single spaces) and the slow one agree with " ".join(t.split()).
    alphabet = ["a", "b", " ", "  ", "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1f",
                "\x85", "\xa0", "\u2003", "\u3000", "é"]  # fmt: skip
    rng = random.Random(44)
    texts = ["", " ", "a", " a", "a ", "a b", "a  b", "a\u00a0b", "a\x1eb"]
    texts += ["".join(rng.choices(alphabet, k=rng.randint(1, 12))) for _ in range(2000)]
    for text in texts:
        assert dedup_text([{"role": "user", "content": text}]) == " ".join(
            ("user " + text).split()
        ), repr(text)


def test_exact_keeps_the_best_of_each_group_and_no_distinct_row_is_lost() -> None:
    dedup = Deduplicator(Dedup("exact"))
    base, other = words(300, 1), words(300, 2)
    dedup.add("c", 0.5, "2026-01-03T00:00:00Z", convo(base))
    dedup.add("a", 0.9, "2026-01-01T00:00:00Z", convo(" " + base.replace(" ", "  ")))
    dedup.add("b", 0.9, "2026-01-02T00:00:00Z", convo(base))  # ties a's reward, later: kept
    dedup.add("z", None, "2026-01-09T00:00:00Z", convo(base))  # no reward: below any
    dedup.add("d", 0.1, "2026-01-01T00:00:00Z", convo(other))
    dedup.add("e", 0.1, "2026-01-01T00:00:00Z", convo(other.upper()))  # case kept: distinct
    kept, removed = dedup.kept()
    assert kept == {"b", "d", "e"}
    assert removed == 3


def test_equal_rank_keeps_the_smallest_trace_id() -> None:
    dedup = Deduplicator(Dedup("exact"))
    for trace_id in ("tr-9", "tr-3", "tr-5"):
        dedup.add(trace_id, 0.5, "2026-01-01T00:00:00Z", convo("same"))
    assert dedup.kept() == ({"tr-3"}, 2)


def test_near_groups_small_edits_and_keeps_distinct_conversations() -> None:
    rows = []
    for n in range(40):
        text = words(400, 100 + n)
        rows.append((f"tr-{n:03d}-0", 0.5, text))
        edited = text.split(" ")
        edited[200] = "changed"  # one word in 400: Jaccard of 5-shingles about 0.98
        rows.append((f"tr-{n:03d}-1", 0.7, " ".join(edited)))
    dedup = Deduplicator(Dedup("near", 0.85))
    exact = Deduplicator(Dedup("exact"))
    for trace_id, reward, text in rows:
        dedup.add(trace_id, reward, "2026-01-01T00:00:00Z", convo(text))
        exact.add(trace_id, reward, "2026-01-01T00:00:00Z", convo(text))
    kept, removed = dedup.kept()
    assert kept == {f"tr-{n:03d}-1" for n in range(40)}  # the better reward of each pair
    assert removed == 40
    assert exact.kept() == ({r[0] for r in rows}, 0)  # no two are identical
    # Deterministic, whatever the order the rows came in.
    backwards = Deduplicator(Dedup("near", 0.85))
    for trace_id, reward, text in reversed(rows):
        backwards.add(trace_id, reward, "2026-01-01T00:00:00Z", convo(text))
    assert backwards.kept() == (kept, removed)


def test_near_with_a_threshold_of_one_is_exact_on_shingles() -> None:
    dedup = Deduplicator(Dedup("near", 1.0))
    text = words(100, 5)
    dedup.add("a", 0.5, "t", convo(text))
    dedup.add("b", 0.6, "t", convo(text + " extra words here now please"))
    assert dedup.kept() == ({"a", "b"}, 0)
    assert shingles("one two") == ["one two"]


# --- through exports ------------------------------------------------------------------------


async def export(store: MemoryStore, **kw: Any) -> tuple[list[dict[str, Any]], ExportSummary]:
    out = io.BytesIO()
    summary = await write_export(store, EVALUATOR, format="trajectory", out=out, **kw)
    return [json.loads(line) for line in out.getvalue().splitlines()], summary


async def test_splits_are_disjoint_complete_and_stay_put_as_the_corpus_grows() -> None:
    store = MemoryStore()
    await replay_events(store, traffic(60), "one")
    first = {}
    for name in ("train", "eval", "test"):
        rows, summary = await export(store, split=parse_split(name, SPLITS, "scenario"))
        first[name] = {r["trace_id"] for r in rows}
        assert summary.split_left_out == 60 - len(rows)
        assert len({r["scenario"] for r in rows}) <= 1 or name == "train"
    assert sum(len(v) for v in first.values()) == 60
    assert set().union(*first.values()) == {f"tr-{i:04d}" for i in range(60)}
    await replay_events(store, traffic(40, start=60), "two")
    for name in ("train", "eval", "test"):
        rows, _ = await export(store, split=parse_split(name, SPLITS, "scenario"))
        assert first[name] <= {r["trace_id"] for r in rows}


async def test_dedup_through_an_export_keeps_the_best_reward() -> None:
    store = MemoryStore()
    await replay_events(store, traffic(70), "one")
    every, _ = await export(store)
    assert len(every) == 70
    origin: dict[str, int] = {}
    for i in range(70):  # a copy is of the group of the trace before it
        origin[f"tr-{i:04d}"] = origin[f"tr-{i - 1:04d}"] if kind(i) != "new" and i else i
    for mode, key in (("exact", lambda r: dedup_text(r["messages"])),
                      ("near", lambda r: origin[r["trace_id"]])):  # fmt: skip
        rows, summary = await export(store, dedup=parse_dedup(mode))
        expected = best_of_groups(every, key)
        assert {r["trace_id"] for r in rows} == expected, mode
        assert summary.duplicates_removed == 70 - len(expected)
        assert len({dedup_text(r["messages"]) for r in rows}) == len(rows)
    assert len(best_of_groups(every, key)) < len(best_of_groups(every, lambda r: dedup_text(
        r["messages"])))  # fmt: skip


async def test_dedup_before_split_no_conversation_is_in_two_splits() -> None:
    store = MemoryStore()
    await replay_events(store, traffic(80), "one")
    texts: list[str] = []
    total = 0
    for name in ("train", "eval", "test"):
        rows, summary = await export(
            store, split=parse_split(name, SPLITS), dedup=parse_dedup("exact")
        )
        texts += [dedup_text(r["messages"]) for r in rows]
        total += summary.duplicates_removed
    assert len(texts) == len(set(texts))
    assert total == 80 - len(texts)


async def test_metadata_filters_through_an_export() -> None:
    store = MemoryStore()
    await replay_events(store, traffic(20), "one")
    rows, _ = await export(store, filters=parse_filters({"metadata": ["tier=gold", "region=r1"]}))
    assert {r["trace_id"] for r in rows} == {f"tr-{i:04d}" for i in range(20) if i % 4 == 1}
    assert all(r["metadata"] == {"tier": "gold", "region": "r1"} for r in rows)


async def test_the_card_says_the_split_and_what_the_dedup_removed(tmp_path: Any) -> None:
    store = MemoryStore()
    await replay_events(store, traffic(30), "one")
    out = tmp_path / "eval.jsonl"
    summary = await write_export(
        store, EVALUATOR, format="messages", out=out, card=True,
        split=parse_split("eval", "train=0.5,eval=0.5", "metadata.region"),
        dedup=parse_dedup("near", "0.9"),
    )  # fmt: skip
    card = (tmp_path / "README.md").read_text()
    header = json.loads(card.split("\nrl_export: ", 1)[1].split("\n", 1)[0])
    assert header["split"] == {"name": "eval", "splits": {"train": 0.5, "eval": 0.5},
                               "by": "metadata.region", "salt": "",
                               "left_out": summary.split_left_out}  # fmt: skip
    assert header["dedup"] == {"mode": "near", "on": "conversation", "threshold": 0.9,
                               "removed": summary.duplicates_removed}  # fmt: skip
    assert summary.duplicates_removed > 0
    assert '"split":"eval"' in card  # Hugging Face's split of the data file
    assert f"{summary.duplicates_removed} rows removed" in card


async def test_a_manifest_reproduces_the_export_byte_for_byte(tmp_path: Any) -> None:
    from rl_export.export.latest import ViewPosition
    from rl_export.export.lineage import manifest_path, read_manifest

    store = MemoryStore()
    await replay_events(store, traffic(40), "one")
    out = tmp_path / "train.jsonl"
    options: dict[str, Any] = {
        "filters": parse_filters({"metadata": ["tier=gold"], "min-reward": "0.3"}),
        "split": parse_split("train", "train=0.7,eval=0.3", "metadata.region", "s"),
        "dedup": parse_dedup("near", "0.9", "conversation"),
        "redact": "pii",
    }
    summary = await write_export(store, EVALUATOR, format="messages", out=out, card=True,
                                 **options)  # fmt: skip
    manifest = read_manifest(manifest_path(out))
    import hashlib

    assert manifest.sha256 == hashlib.sha256(out.read_bytes()).hexdigest() == summary.sha256
    assert (manifest.rows, manifest.bytes) == (summary.records, out.stat().st_size)
    assert manifest.filters == {"min-reward": "0.3", "metadata": ["tier=gold"]}
    assert manifest.split_of() == options["split"]
    assert manifest.dedup_of() == options["dedup"]
    assert manifest.redact == ["email", "phone", "credit_card", "iban", "ip"]
    # The corpus moves on; the manifest's position still reads what it read.
    await replay_events(store, traffic(20, start=40), "two")
    again = tmp_path / "again.jsonl"
    await write_export(
        store, EVALUATOR, format=manifest.format, out=again, at=manifest.view_position(),
        filters=parse_filters(manifest.filters), split=manifest.split_of(),
        dedup=manifest.dedup_of(), redact=",".join(manifest.redact),
    )  # fmt: skip
    assert again.read_bytes() == out.read_bytes()
    latest = tmp_path / "latest.jsonl"
    moved = await write_export(store, EVALUATOR, format="messages", out=latest, **options)
    assert latest.read_bytes() != out.read_bytes()  # the new traffic is in the latest view
    assert ViewPosition.from_json(moved.position) != manifest.view_position()


def test_a_file_that_is_not_a_manifest_is_a_precise_error(tmp_path: Any) -> None:
    from rl_export.export.lineage import read_manifest

    path = tmp_path / "x.manifest.json"
    path.write_text('{"org": "acme"}')
    with pytest.raises(ExportError, match=r"from-manifest: .* is not an export manifest"):
        read_manifest(path)
    with pytest.raises(ExportError, match="from-manifest: cannot read"):
        read_manifest(tmp_path / "missing.json")
