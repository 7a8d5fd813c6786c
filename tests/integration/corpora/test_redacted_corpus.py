"""A corpus spec with ``redact`` is written scrubbed, from its backfilled history and from the
stream alike, while the default corpora stay verbatim: real workers, the real broker, the
real store."""

from __future__ import annotations

import json
from typing import Any

from rl_export.formats.specs import DEFAULT_CORPORA, CorpusSpec
from rl_export.model.codec import dumps_line
from rl_export.privacy.redact import KINDS
from rl_export.runtime.settings import Settings
from tests.factories import event
from tests.integration.corpora.test_backfill import view, wait_for_views
from tests.integration.corpora.test_sink import (
    ORG,
    PROJECT,
    assert_verified,
    wait_for_corpora,
    workload,
)
from tests.integration.workers import WorkerProcess, expected_final, publish

VALUES = ("AKIAIOSFODNN7EXAMPLE", "jane.doe@acme-corp.com", "+44 20 7946 0958",
          "4111 1111 1111 1111", "DE89 3704 0044 0532 0130 00", "192.168.1.20")  # fmt: skip
PLANT = "Reach me: " + ", ".join(VALUES) + "."

ADDED = (
    CorpusSpec(name="scrubbed", source="evaluator", redact=KINDS),
    # No redact of its own: RL_EXPORT_REDACT's default, secrets.
    CorpusSpec(name="sft-clean", source="evaluator", format="messages"),
)


def planted(n: int) -> list[dict[str, Any]]:
    """A trace of acme/support-bot holding every kind in its messages, its evaluation's
    reasoning and explanation, and a label's comment."""
    trace_id, at = f"planted-{n}", f"2026-01-01T00:00:{n:02d}Z"
    common = {"trace_id": trace_id, "org": ORG, "project": PROJECT}
    return [
        event("trace.completed", f"{trace_id}-c", at, **common, messages=[
            {"role": "user", "content": PLANT},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type":
             "function", "function": {"name": "f", "arguments": json.dumps({"q": PLANT})}}]},
            {"role": "tool", "tool_call_id": "c1", "content": PLANT},
            {"role": "assistant", "content": [{"type": "text", "text": PLANT}]}]),
        event("evaluation.finished", f"{trace_id}-e", at, **common, evaluation_id=f"ev-{n}",
              results=[{"evaluator": "judge", "score": 0.9, "passed": True,
                        "reasoning": PLANT}],
              report={"outcomes": [], "classifications": [{"type": "policy", "turn": 1,
                      "assessments": [{"principle_id": "p", "decision": True,
                                       "explanation": PLANT}]}]}),
        event("label.submitted", f"{trace_id}-l", at, **common, labeler="ana",
              rubric={"correctness": 5, "helpfulness": 5, "efficiency": 5, "safety": 5},
              comment=PLANT),
    ]  # fmt: skip


def expected(events: list[dict[str, Any]], spec: CorpusSpec) -> dict[str, dict[str, Any]]:
    """What the corpus must hold: each ready row, redacted as the spec says."""
    spec = spec.with_redact_default(("secrets",))
    out = {}
    for trace_id, snap in expected_final(events).items():
        if snap["org"] != ORG or snap["project"] != PROJECT:
            continue
        row = spec.record_for(snap)
        if row is not None and not row.get("deleted"):
            out[trace_id] = json.loads(spec.scrub(dumps_line(row))[0])
    return out


async def test_a_redacted_corpus_is_scrubbed_from_its_history_and_from_the_stream(
    settings: Settings,
) -> None:
    settings = settings.model_copy(update={"shard_max_age_s": 1.0})
    events = workload(40, seed=37)
    half = len(events) // 2
    before = events[:half] + planted(1) + planted(2)
    after = events[half:] + planted(3) + planted(4)
    await publish(settings, before)
    with WorkerProcess(settings, "w1").start():
        await wait_for_corpora(settings, before)

    grown = settings.model_copy(update={"corpora": (*DEFAULT_CORPORA, *ADDED)})
    with WorkerProcess(grown, "w2").start() as worker:
        await publish(grown, after)  # the stream goes on while the new corpora are seeded
        await wait_for_corpora(grown, before + after)
        want = {spec.name: expected(before + after, spec) for spec in ADDED}
        got = await wait_for_views(grown, want)
        seeded = worker.metric("rl_export_sink_backfilled_records_total", corpus="scrubbed")
        emails = worker.metric("rl_export_redactions_total", kind="email")
        secrets = worker.metric("rl_export_redactions_total", kind="secrets")
        traces = await view(grown, "traces")
    assert got == want
    scrubbed = json.dumps(got["scrubbed"])
    assert all(v not in scrubbed for v in VALUES)
    assert {f"planted-{n}" for n in range(1, 5)} <= set(got["scrubbed"])
    assert got["scrubbed"]["planted-1"]["human_labels"][0]["comment"] == (
        "Reach me: [REDACTED:SECRETS], [REDACTED:EMAIL], [REDACTED:PHONE], "
        "[REDACTED:CREDIT_CARD], [REDACTED:IBAN], [REDACTED:IP]."
    )
    clean = json.dumps(got["sft-clean"])
    assert VALUES[0] not in clean  # secrets by default
    assert VALUES[1] in clean  # personal data only on request
    # The default corpora, which every export reads, keep the text as it came.
    assert PLANT in json.dumps(traces["planted-3"])
    assert seeded > 0  # planted-1 and -2 came through the backfill, -3 and -4 the stream
    assert emails > 0
    assert secrets > 0
    await assert_verified(grown)
