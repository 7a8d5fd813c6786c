"""The records and shards rl-export writes, byte for byte, on the bench's traffic shapes.

Trainers and other tools read the corpora; a faster join or sink must write exactly the
same bytes. The digest below is what the code of commit fd337d1 (before the layout, the
partitioner and the throughput work) writes for these events, replayed; a change that
alters any record or shard fails here. If a change of the contract is ever
intended, DESIGN.md says so first, and the digest is updated in the same commit.

One intended change since fd337d1 (issue 15, replays and the stream into the same corpora):
a deleted trace gets its tombstone in every corpus even where the corpus held nothing for it
(here ``tr-deleted``, deleted within its first batch), so that an older revision replayed
later on another chain finds the deletion. Those three tombstone lines are the whole
difference from fd337d1's output (compared line by line when the digest was updated).

A second (issue 29, DESIGN.md section 4's per-label detail): every record ends with
``"labels": [...]``, each current label as submitted. Compared line by line when the digest
was updated: each of the 1,102 lines is the line before with that field added before its
closing brace (tombstones unchanged), and each record's ``labels`` has ``labels_count``
entries.

A third (issue 42, record schema 3): ``labels`` is named ``human_labels``. Checked when the
digest was updated: with ``,"human_labels":[`` written back as ``,"labels":[`` in every
shard (1,097 records) and each shard's name re-hashed, the digest is the one before.

A fourth (issue 44, records carry the trace's ``metadata``): every record ends with
``"metadata": {...}``, the trace's object as received. Compared line by line when the digest
was updated: each of the 1,097 records is the line before with that field added before its
closing brace; the 5 tombstones are unchanged.

A fifth (issue 53, deletion wins wherever the trace came from: DESIGN.md section 3): a
deleted trace's tombstone has the revision 2**62 (``ERASED_REVISION``), greater than any
record's on any chain. Compared line by line when the digest was updated: the shards hold
the same lines at the same places but for ``tr-deleted``'s three tombstones (one per
corpus), whose revision went from 3 (the revision it was deleted at) to 2**62; the two
tombstones of trajectories that stopped being ready are unchanged.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from rl_export.corpora.replay import replay
from rl_export.corpora.store import MemoryStore
from rl_export.local.synthetic import SHAPES, generate
from rl_export.runtime.settings import Settings
from rl_export.stream import native
from tests.factories import event

EXPECTED = "06f289ea13aeaf4629e8aad5d350a4e24165de175aafb28004c60e1fe81168a0"


def special_events() -> list[dict[str, Any]]:
    """Content the synthetic shapes lack: unicode line separators, odd message shapes,
    attachments, a report with classifications, deletion and retraction."""
    at = "2026-02-01T00:00:0{}Z".format
    messages = [
        {"role": "system", "content": None},
        {
            "role": "user",
            "content": "line\u2028one\u2029two \u00e9\u4e2d \U0001f600",
            "x": [1, 2.5],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "</script>"}], "name": "a"},
    ]
    report = {
        "outcomes": [{"type": "goal", "turn": 1, "decision": True, "severity": 2}],
        "classifications": [
            {"type": "policy", "turn": 2,
             "assessments": [{"principle_id": "p1", "decision": "no", "explanation": "e"}]},
        ],
    }  # fmt: skip
    attachments = [{"name": "a.txt", "uri": "s3://b/a.txt", "content_type": "text/plain",
                    "size": 3, "extra": True}]  # fmt: skip
    u = {"trace_id": "tr-unicode", "org": "acme", "project": "bot"}
    d = {"trace_id": "tr-deleted", "org": "acme", "project": "bot"}
    return [
        event("trace.completed", "u-t", at(1), **u, messages=messages, attachments=attachments),
        event("evaluation.finished", "u-e", at(2), **u, report=report),
        event("label.submitted", "u-l1", at(3), **u, labeler="ana"),
        event("label.submitted", "u-l2", at(4), **u, labeler="bo", comment="x\u2028y"),
        event("label.retracted", "u-r", at(5), **u, labeler="ana"),
        event("trace.completed", "d-t", at(1), **d),
        event("label.submitted", "d-l", at(2), **d, labeler="ana"),
        event("trace.deleted", "d-d", at(3), **d),
    ]


def digest_of_replay(events: list[dict[str, Any]], **overrides: Any) -> tuple[str, int]:
    import asyncio

    store = MemoryStore()
    settings = Settings(**({"partitions": 4, "shard_max_records": 500} | overrides))
    lines = [(f"e:{n}", orjson.dumps(e)) for n, e in enumerate(events, 1)]
    asyncio.run(replay(settings, store, lines, run_id="golden"))
    data = sorted(  # the shards (their index sidecars are not records: test_sidecar.py)
        (k, v) for k, v in store.objects.items() if "/data/" in k and k.endswith(".jsonl")
    )
    digest = hashlib.sha256()
    for key, value in data:
        digest.update(key.encode() + b"\0" + value + b"\0")
    return digest.hexdigest(), sum(v.count(b"\n") for _, v in data)


@pytest.mark.parametrize("join_native", ["on", "off"])
def test_records_and_shards_are_byte_for_byte_what_they_were(join_native: str) -> None:
    """With the join's native core and with the Python rules alone."""
    if join_native == "on" and not native.available():
        pytest.skip("the join's native core is not built here (make install needs cargo)")
    start = datetime(2026, 1, 1, tzinfo=UTC)
    events = (
        generate(300, seed=11, shape=SHAPES["standard"], start=start)
        + generate(300, seed=12, shape=SHAPES["small"], start=start)
        + special_events()
    )
    digest, records = digest_of_replay(events, join_native=join_native)
    assert records > 1000
    assert digest == EXPECTED
