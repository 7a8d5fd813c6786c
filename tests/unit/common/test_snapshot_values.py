"""Snapshots on the trajectories topic: one JSON object any consumer reads, and the sink's
header that lets it copy the messages without parsing them."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from rl_export.common.codec import RawJson, dumps
from rl_export.common.records import decode_snapshot, encode_snapshot

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "line\u2028sep \u00e9"}]},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "x": 1.5e300}]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"ok": true}', "extra": [None]},
]


def live(**fields: Any) -> dict[str, Any]:
    return {
        "trace_id": "tr-1",
        "org": "acme",
        "project": "bot",
        "revision": 3,
        "deleted": False,
        "human": {"reward": 0.6, "passed": False},
        "messages": RawJson(orjson.dumps(MESSAGES)),
        "scenario": "s",
    } | fields


def test_the_value_is_one_json_object_that_json_loads_reads() -> None:
    value, messages_at = encode_snapshot(live())
    parsed = json.loads(value)  # the standard library, as another team's consumer would
    assert parsed["messages"] == MESSAGES
    assert parsed["trace_id"] == "tr-1"
    assert list(parsed)[-1] == "messages"  # last, so the header can point at it
    assert value[messages_at:].startswith(b'[{"role":"system"')
    assert b"\\u2028" in value  # JSON Lines safety: escaped, as everywhere


def test_the_header_path_and_the_whole_parse_agree() -> None:
    value, messages_at = encode_snapshot(live())
    fast = decode_snapshot(value, messages_at)
    slow = decode_snapshot(value)
    assert fast == slow
    assert isinstance(fast["messages"], RawJson)
    assert orjson.loads(dumps(fast["messages"])) == MESSAGES


def test_a_header_that_does_not_fit_the_bytes_falls_back_to_parsing_it_all() -> None:
    value, messages_at = encode_snapshot(live())
    assert messages_at is not None
    for wrong in (messages_at - 1, messages_at + 3, 5, len(value) + 10):
        assert decode_snapshot(value, wrong) == decode_snapshot(value)


def test_a_tombstone_has_no_messages_and_no_header() -> None:
    tomb = {"trace_id": "tr-1", "org": "acme", "project": "bot", "revision": 4, "deleted": True}
    value, messages_at = encode_snapshot(tomb)
    assert messages_at is None
    assert json.loads(value) == tomb
    assert decode_snapshot(value) == tomb


def test_values_in_the_older_two_line_encoding_still_decode() -> None:
    snapshot = live()
    head = dumps({k: v for k, v in snapshot.items() if k != "messages"})
    old = head + b"\n" + dumps(snapshot["messages"])
    assert decode_snapshot(old) == decode_snapshot(*encode_snapshot(snapshot))


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
