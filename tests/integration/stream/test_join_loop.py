"""The join worker against the real broker: final snapshots right whatever the order."""

from __future__ import annotations

import random
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from rl_export.local.synthetic import generate
from rl_export.runtime.settings import Settings
from rl_export.stream.topics import ensure_service_topics, topic_max_bytes
from tests.factories import RUBRIC, event
from tests.integration.workers import (
    TopicReader,
    WorkerProcess,
    comparable,
    expected_final,
    latest_by_trace,
    publish,
    snapshots,
)

ALL_3 = {"correctness": 3, "helpfulness": 3, "efficiency": 3, "safety": 3}
ALL_5 = {"correctness": 5, "helpfulness": 5, "efficiency": 5, "safety": 5}


def at(second: int) -> str:
    return f"2026-01-01T00:00:{second:02d}Z"


def scenario() -> list[dict[str, Any]]:
    """Hand-made traces: re-sent traces, re-evaluations, re-labels, retractions, deletion."""
    a = {"trace_id": "tr-a"}
    b = {"trace_id": "tr-b"}
    c = {"trace_id": "tr-c"}
    return [
        # A: re-sent trace, re-evaluation, a re-label, a retraction and a skip.
        event("trace.completed", "a-t1", at(0), **a, scenario="first"),
        event("trace.completed", "a-t2", at(5), **a, scenario="resent"),
        event("evaluation.finished", "a-e1", at(1), **a, evaluation_id="ev-1"),
        event("evaluation.finished", "a-e2", at(3), **a, evaluation_id="ev-2", results=[
            {"evaluator": "judge", "score": 0.25, "passed": False, "reasoning": "meh"},
            {"evaluator": "check", "score": 0.75, "passed": True, "reasoning": "ok"}]),
        event("label.submitted", "a-l1", at(2), **a, labeler="ana", rubric=ALL_3),
        event("label.submitted", "a-l2", at(4), **a, labeler="ana", rubric=ALL_5),
        event("label.submitted", "a-l3", at(2), **a, labeler="bo", rubric=RUBRIC),
        event("label.retracted", "a-l4", at(6), **a, labeler="bo"),
        event("label.skipped", "a-s1", at(2), **a, labeler="chen"),
        # B: labels that come before the trace; one from another org is dead-lettered.
        event("label.submitted", "b-l1", at(1), **b, labeler="ana", rubric=ALL_3),
        event("label.submitted", "b-l2", at(1), **b, labeler="bo", rubric=ALL_3,
              org="someone-else"),
        event("trace.completed", "b-t1", at(0), **b),
        # C: deleted; a later label is accepted but changes nothing.
        event("trace.completed", "c-t1", at(0), **c),
        event("label.submitted", "c-l1", at(1), **c, labeler="ana", rubric=ALL_5),
        event("trace.deleted", "c-d1", at(5), **c),
        event("label.submitted", "c-l2", at(9), **c, labeler="bo", rubric=ALL_5),
    ]  # fmt: skip


def shuffled_with_duplicates(events: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = events + [rng.choice(events) for _ in range(len(events) // 5)]
    rng.shuffle(out)
    return out


async def wait_for_final(
    settings: Settings, expected: dict[str, dict[str, Any]], timeout_s: float = 90.0
) -> dict[str, dict[str, Any]]:
    want = {k: comparable(v) for k, v in expected.items()}

    def done(records: list[Any]) -> bool:
        got = latest_by_trace(snapshots(records))
        return {k: comparable(v) for k, v in got.items()} == want

    records = await TopicReader(settings, settings.topic_trajectories).read_until(done, timeout_s)
    return latest_by_trace(snapshots(records))


async def test_out_of_order_events_give_the_right_final_snapshots(settings: Settings) -> None:
    events = shuffled_with_duplicates(scenario() + generate(60, seed=5), seed=1)
    expected = expected_final(events)
    with WorkerProcess(settings, "w1").start():
        await publish(settings, events)
        final = await wait_for_final(settings, expected)

    assert {k: comparable(v) for k, v in final.items()} == {
        k: comparable(v) for k, v in expected.items()
    }
    a = final["tr-a"]
    assert a["scenario"] == "resent"
    assert a["evaluation"]["evaluation_id"] == "ev-2"
    assert a["evaluator"] == {"reward": 0.5, "passed": False}
    assert a["labelers"] == ["ana"]
    assert a["human"] == {"reward": 1.0, "passed": True}
    assert a["skipped_by"] == ["chen"]
    assert a["revision"] == 9
    b = final["tr-b"]
    assert b["labelers"] == ["ana"]
    assert b["revision"] == 2  # the other org's label never counts
    assert final["tr-c"]["deleted"] is True


async def test_invalid_events_go_to_the_dead_letter_topic_and_the_stream_goes_on(
    settings: Settings,
) -> None:
    good = event("trace.completed", "ok-1", trace_id="tr-ok")
    bad_rubric = event("label.submitted", "bad-1", trace_id="tr-ok")
    bad_rubric["rubric"]["correctness"] = 6
    wrong_org = event("label.submitted", "bad-2", trace_id="tr-ok", org="other")
    unknown = event("label.skipped", "bad-3", trace_id="tr-ok") | {"event_type": "label.nope"}
    raw_bad = [
        (settings.topic_labels, b"tr-ok", b'{"event_id": '),
        (settings.topic_labels, b"tr-ok", orjson.dumps(bad_rubric)),
        (settings.topic_labels, b"tr-ok", orjson.dumps(unknown)),
        (settings.topic_traces, b"tr-ok", orjson.dumps(event("label.skipped", "bad-4",
                                                             trace_id="tr-ok"))),
        (settings.topic_labels, b"tr-ok",
         orjson.dumps(event("label.skipped", "bad-5", "2099-01-01T00:00:00Z", trace_id="tr-ok"))),
    ]  # fmt: skip
    with WorkerProcess(settings, "w1").start() as worker:
        await publish(settings, [*raw_bad, good, wrong_org])
        final = await wait_for_final(settings, expected_final([good]))
        letters = await TopicReader(settings, settings.topic_dead_letter).read_until(
            lambda r: len(r) >= 6
        )
        reasons = {}
        for letter in letters:
            headers = {k: v.decode() for k, v in letter.headers}
            reasons[headers["rl-export-reason"]] = (letter.value, headers)
        assert worker.metric("rl_export_dead_letters_total", reason="bad_json") == 1

    assert final["tr-ok"]["revision"] == 1
    assert set(reasons) == {
        "bad_json", "invalid", "unknown_event_type", "wrong_topic", "future", "org_mismatch",
    }  # fmt: skip
    value, headers = reasons["bad_json"]
    assert value == b'{"event_id": '  # the original bytes, untouched
    assert headers["rl-export-source-topic"] == settings.topic_labels
    assert int(headers["rl-export-source-offset"]) >= 0
    assert "rubric.correctness" in reasons["invalid"][1]["rl-export-detail"]


async def test_the_largest_event_a_topic_accepts_fits_in_the_dead_letter_topic(
    settings: Settings,
) -> None:
    """A dead letter is the original record plus our headers: larger than any input record.

    The largest record the traces topic accepts (one byte more is refused) is oversized for
    the join; its dead letter, headers and all, is sent and kept.
    """
    local = settings.model_copy(update={"max_event_bytes": 64 * 1024})
    await ensure_service_topics(local)
    limit = topic_max_bytes(local)
    key = b"tr-huge"
    producer = AIOKafkaProducer(
        bootstrap_servers=local.kafka_bootstrap, max_request_size=2 * limit, acks="all"
    )
    await producer.start()
    try:
        # A record batch is 61 bytes of header and the record (its length, attributes,
        # deltas, key and value lengths and header count, about 11 bytes, and the key):
        # from a little above that, the first size the broker takes is the largest.
        size = limit - 61 - len(key)
        while True:
            try:
                sent = await producer.send_and_wait(local.topic_traces, b"x" * size, key=key)
                break
            except KafkaError as exc:
                if "TooLarge" not in type(exc).__name__:
                    raise
                size -= 1
        assert size < limit - 61 - len(key)  # something larger was refused
    finally:
        await producer.stop()
    with WorkerProcess(local, "w1").start():
        letters = await TopicReader(local, local.topic_dead_letter).read_until(
            lambda r: len(r) >= 1, timeout_s=60
        )
    [letter] = letters
    headers = dict(letter.headers)
    assert letter.value == b"x" * size  # the original bytes
    assert headers["rl-export-reason"] == b"oversized"
    assert headers["rl-export-source-offset"] == str(sent.offset).encode()
    with_headers = len(letter.value) + len(key) + sum(len(k) + len(v) for k, v in letter.headers)
    assert with_headers > limit - 61  # it would not have fit where it came from


def revisions_by_trace(records: list[Any]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for snap in snapshots(records):
        out.setdefault(snap["trace_id"], set()).add(snap["revision"])
    return out


async def test_a_restarted_worker_recovers_its_table_and_emits_no_new_revision(
    settings: Settings,
) -> None:
    first = scenario()
    trajectories = TopicReader(settings, settings.topic_trajectories)
    worker = WorkerProcess(settings, "w1", store="rocksdb://").start()
    try:
        await publish(settings, first)
        before_final = await wait_for_final(settings, expected_final(first))
        before = revisions_by_trace(await trajectories.read_until(lambda r: False, timeout_s=2))
        worker.kill()  # no clean shutdown, no final commit
        # A fresh worker (memory store, new data dir) can only recover from the changelog.
        worker = WorkerProcess(settings, "w2", store="memory://").start()
        more = event("label.submitted", "a-l9", at(30), trace_id="tr-a", labeler="dee",
                     rubric=ALL_3)  # fmt: skip
        await publish(settings, [*first, more])  # every event again, then one new one
        after_final = await wait_for_final(settings, expected_final([*first, more]))
        after = revisions_by_trace(await trajectories.read_until(lambda r: False, timeout_s=3))
    finally:
        worker.stop()

    new_revision = before_final["tr-a"]["revision"] + 1
    assert after_final["tr-a"]["revision"] == new_revision
    assert after_final["tr-a"]["labelers"] == ["ana", "dee"]
    # Redelivered events only re-emitted revisions that existed before the restart.
    assert after["tr-b"] == before["tr-b"]
    assert after["tr-c"] == before["tr-c"]
    assert after["tr-a"] == before["tr-a"] | {new_revision}


async def test_two_workers_share_the_partitions_with_the_same_result(settings: Settings) -> None:
    events = shuffled_with_duplicates(scenario() + generate(120, seed=9), seed=2)
    expected = expected_final(events)
    with WorkerProcess(settings, "w1").start() as one, WorkerProcess(settings, "w2").start() as two:
        await publish(settings, events)
        final = await wait_for_final(settings, expected)
        counts = [w.metric("rl_export_join_snapshots_total") for w in (one, two)]

    assert {k: comparable(v) for k, v in final.items()} == {
        k: comparable(v) for k, v in expected.items()
    }
    assert all(c > 0 for c in counts), f"both workers should have emitted: {counts}"


async def test_rebalances_in_the_middle_of_a_run_lose_nothing(settings: Settings) -> None:
    """A worker joins mid-stream, then the first one is killed: the result is unchanged."""
    events = shuffled_with_duplicates(scenario() + generate(300, seed=13), seed=3)
    third = len(events) // 3
    expected = expected_final(events)
    one = WorkerProcess(settings, "w1").start()
    two = WorkerProcess(settings, "w2")
    try:
        await publish(settings, events[:third])
        two.start()  # a rebalance while the first third is being processed
        await publish(settings, events[third : 2 * third])
        one.kill()  # its partitions move to the survivor after the session timeout
        await publish(settings, events[2 * third :])
        final = await wait_for_final(settings, expected, timeout_s=120)
    finally:
        one.stop()
        two.stop()

    assert {k: comparable(v) for k, v in final.items()} == {
        k: comparable(v) for k, v in expected.items()
    }
