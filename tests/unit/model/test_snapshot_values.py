"""Snapshots on the trajectories topic: one JSON object any consumer reads, laid out so the
sink takes every corpus's record from its bytes without encoding them again."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rl_export.model.codec import RawJson, dumps, dumps_line
from rl_export.model.records import render
from rl_export.model.snapshots import (
    HEADER_RECORD_AT,
    SnapshotLines,
    decode_snapshot,
    encode_snapshot,
)

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": 'line\u2028sep \u00e9 "q"'}]},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "x": 1.5e300}]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"ok": true}', "extra": [None]},
]


def live(**fields: Any) -> dict[str, Any]:
    return {
        "trace_id": 'tr-\u00e9"1',
        "org": "acme",
        "project": "bot",
        "revision": 3,
        "deleted": False,
        "human": {"reward": 0.6, "passed": False},
        "evaluator": None,
        "rubric": {"correctness": 3.0, "helpfulness": 3.0, "efficiency": 3.0, "safety": 3.0},
        "labels_count": 1,
        "labelers": ["ana"],
        "skipped_by": [],
        "evaluator_scores": None,
        "evaluation": None,
        "messages": RawJson(dumps(MESSAGES)),
        "agent_version": "v4",
        "scenario": "s \u2029",
        "attachments": [],
        "completed_at": "2026-01-01T00:00:00Z",
        "updated_at": "2026-01-01T00:00:05.250000Z",
        "pass_threshold": 0.7,
        "rules_version": 1,
    } | fields


def test_the_value_is_one_json_object_that_json_loads_reads() -> None:
    value, headers = encode_snapshot(live())
    parsed = json.loads(value)  # the standard library, as another team's consumer would
    assert parsed["messages"] == MESSAGES
    assert parsed["trace_id"] == 'tr-\u00e9"1'
    assert parsed["human"] == {"reward": 0.6, "passed": False}
    assert parsed["deleted"] is False
    assert b"\\u2028" in value  # JSON Lines safety: escaped, as everywhere
    assert [k for k, _ in headers] == [HEADER_RECORD_AT]


@pytest.mark.parametrize(
    "snapshot",
    [live(), live(evaluator={"reward": 0.25, "passed": True}, human=None),
     live(evaluation={"evaluation_id": "e", "occurred_at": "2026-01-01T00:00:01Z",
                      "results": [{"evaluator": "j", "score": 1.0, "passed": True}],
                      "report": {"outcomes": [], "classifications": []}},
          evaluator_scores={"j": 1.0}, evaluator={"reward": 1.0, "passed": True})],
)  # fmt: skip
def test_the_sink_takes_every_corpuss_line_from_the_value_byte_for_byte(
    snapshot: dict[str, Any],
) -> None:
    value, headers = encode_snapshot(snapshot)
    lines = SnapshotLines.from_record(value, dict(headers)[HEADER_RECORD_AT])
    assert lines is not None
    assert (lines.trace_id, lines.org, lines.project, lines.revision) == (
        snapshot["trace_id"], "acme", "bot", 3)  # fmt: skip
    assert lines.updated_at == snapshot["updated_at"]
    for source in (None, "human", "evaluator"):
        record = render(snapshot, source)
        assert lines.ready(source) is (record is not None)
        if record is not None:
            assert lines.line(source) == dumps_line(record)
            assert lines.value(source, "reward") == record["reward"]
            assert lines.value(source, "scenario") == record["scenario"]  # parsed on demand


def test_decoding_the_whole_value_gives_the_snapshot_back() -> None:
    snapshot = live()
    value, _ = encode_snapshot(snapshot)
    decoded = decode_snapshot(value)
    assert decoded == snapshot
    assert decoded["messages"] == RawJson(dumps(MESSAGES))


def test_a_header_that_does_not_fit_the_bytes_is_refused_and_the_value_read_whole() -> None:
    value, headers = encode_snapshot(live())
    a, b, c, d, e, f = map(int, dict(headers)[HEADER_RECORD_AT].split(b","))
    for wrong in (f"{a + 1},{b},{c},{d}", f"{a},{b},{c},{d - 1}", f"{a},{b + 4},{c},{d}",
                  "1,2,3", "x", f"{a},{b},{c},{len(value) + 5}", f"{a},{b},{c},{d},{e + 1},{f}",
                  f"{a},{b},{c},{d},{e},{d + 1}", f"{a},{b},{c},{d},{e}"):  # fmt: skip
        assert SnapshotLines.from_record(value, wrong.encode()) is None
    assert SnapshotLines(decode_snapshot(value)).line("human") == dumps_line(
        render(live(), "human")
    )


def test_a_tombstone_is_the_tombstone_object_without_headers() -> None:
    tomb = {"trace_id": "tr-1", "org": "acme", "project": "bot", "revision": 4, "deleted": True}
    value, headers = encode_snapshot(tomb)
    assert headers == []
    assert json.loads(value) == tomb
    assert decode_snapshot(value) == tomb


def test_values_in_the_older_encodings_still_decode() -> None:
    snapshot = live()
    head = dumps({k: v for k, v in snapshot.items() if k != "messages"})
    two_lines = head + b"\n" + dumps(snapshot["messages"])
    one_object = head[:-1] + b',"messages":' + dumps(snapshot["messages"]) + b"}"
    assert decode_snapshot(two_lines) == decode_snapshot(one_object) == snapshot


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"trace_id": 1, "org": "a", "project": "b"}',
        b'{"trace_id": "t", "org": "a", "project": "b", "deleted": false}',
    ],
)
def test_what_is_not_a_snapshot_is_refused(value: bytes) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - any of several messages
        decode_snapshot(value)


def test_the_record_fields_but_the_messages_are_read_without_parsing_the_messages() -> None:
    """The index sidecars' fields: from the six-number header, the value less its messages
    (which are not even valid JSON here, to show they are never parsed); a header of four
    numbers (a join of before) still makes lines, and its fields come from the whole value."""
    snapshot = live()
    value, headers = encode_snapshot(snapshot)
    record_at = dict(headers)[HEADER_RECORD_AT]
    a, b, c, d, e, f = map(int, record_at.split(b","))
    assert value[e:f] == dumps(snapshot["messages"])
    broken = value[:e] + b"[" * (f - e) + value[f:]  # the same length, not JSON
    lines = SnapshotLines.from_record(broken, record_at)
    assert lines is not None
    got = lines.fields()
    want = {k: v for k, v in snapshot.items() if k not in ("messages", "human", "evaluator")}
    assert {k: got[k] for k in want} == want
    assert got["messages"] is None
    old = SnapshotLines.from_record(value, f"{a},{b},{c},{d}".encode())
    assert old is not None
    assert old.line("human") == dumps_line(render(snapshot, "human"))
    assert old.fields()["labels_count"] == snapshot["labels_count"]
