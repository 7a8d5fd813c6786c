"""What the corpora must hold for a set of events: the pure join folded over them.

The integration tests and the soak compare what the pipeline wrote with this: every event
merged into its trace's state in the order given (:func:`rl_export.stream.join.merge`, the
rules of DESIGN.md section 3, whose final result does not depend on the order), then each
corpus's record for the final snapshot (:meth:`rl_export.formats.specs.CorpusSpec.record_for`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from rl_export.formats.specs import DEFAULT_CORPORA, CorpusSpec
from rl_export.model.codec import dumps, loads
from rl_export.model.events import EVENT_ADAPTER
from rl_export.stream.join import JoinConfig, RawEvent, TraceState, current_snapshot, merge


def plain(value: Any) -> Any:
    """A snapshot or record as JSON gives it back (messages parsed, not RawJson)."""
    return loads(dumps(value))


def expected_final(
    events: Iterable[dict[str, Any] | bytes],
    threshold: float = 0.7,
    now: float | None = None,
) -> dict[str, dict[str, Any]]:
    """Fold the pure join over the events in the given order: the final snapshot per trace.

    Events are dicts or their JSON bytes; every one must be valid (``decode_event`` would
    accept it).
    """
    states: dict[str, TraceState] = {}
    config = JoinConfig(human_pass_threshold=threshold)
    clock = time.time() if now is None else now
    for value in events:
        raw = value if isinstance(value, bytes) else orjson.dumps(value)
        event = EVENT_ADAPTER.validate_json(raw)
        result = merge(states.get(event.trace_id), event, RawEvent(raw), now=clock, config=config)
        states[event.trace_id] = result.state
    out = {}
    for trace_id, state in states.items():
        snap = current_snapshot(state, config)
        if snap is not None:
            out[trace_id] = plain(snap)
    return out


def comparable(snap: dict[str, Any]) -> dict[str, Any]:
    """A tombstone's revision depends on arrival order (later events emit nothing)."""
    return {k: v for k, v in snap.items() if not (snap["deleted"] and k == "revision")}


def expected_corpora(
    events: Iterable[dict[str, Any] | bytes],
    specs: Sequence[CorpusSpec] = DEFAULT_CORPORA,
    threshold: float = 0.7,
) -> dict[str, dict[str, dict[str, Any]]]:
    """corpus -> trace_id -> record, as a reader's latest-revision view must show them."""
    finals = expected_final(events, threshold)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for spec in specs:
        rows = {}
        for trace_id, snap in finals.items():
            record = spec.record_for(snap)
            if record is not None and not record.get("deleted"):
                rows[trace_id] = record
        out[spec.name] = rows
    return out
