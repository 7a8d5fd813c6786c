"""Exports redact what they write: each kind planted in every place DESIGN.md section 4 names
(message strings and text parts, tool arguments and results, reasoning, explanations, label
comments, metadata values), written through the real join and sink, is gone from every
format, JSON Lines and tabular; what must not change comes out as stored."""

from __future__ import annotations

import csv
import io
import json
import zipfile
from typing import Any

import pyarrow.parquet as pq
import pytest

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.replay import replay
from rl_export.corpora.store import MemoryStore
from rl_export.export import ExportSummary, iter_export
from rl_export.formats.chat import Chat
from rl_export.formats.render import JSONL_FORMATS, TABULAR_FORMATS
from rl_export.model.codec import dumps
from rl_export.privacy.kinds import placeholder
from rl_export.privacy.redact import KINDS
from rl_export.runtime.settings import load_settings
from tests.factories import event

ORG, PROJECT = "acme", "bot"
# One value of each kind; each trace holds all of them, in every place.
VALUES = {
    "secrets": "AKIAIOSFODNN7EXAMPLE",
    "email": "jane.doe@acme-corp.com",
    "phone": "+44 20 7946 0958",
    "credit_card": "4111 1111 1111 1111",
    "iban": "DE89 3704 0044 0532 0130 00",
    "ip": "192.168.1.20",
}
KEEP = "Order #1234567890 of 2024-05-01, v1.2.3, $1,299.99, 4111 1111 1111 1112"
PLANT = "Here: " + "; ".join(VALUES.values()) + ". " + KEEP
PLACES = 10  # strings holding PLANT in each trace's record (the label's comment and the
# trace's metadata included)


def trace(n: int, *, prompt: str) -> list[dict[str, Any]]:
    trace_id = f"tr-{n}"
    messages = [
        {"role": "system", "content": PLANT},
        {"role": "user", "content": [{"type": "text", "text": prompt}]},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_{n}", "type": "function",
            "function": {"name": "lookup", "arguments": json.dumps({"q": PLANT, "n": n})}}]},
        {"role": "tool", "tool_call_id": f"call_{n}", "name": "lookup", "content": PLANT},
        {"role": "assistant", "content": [{"type": "text", "text": PLANT}],
         "metadata": {"note": PLANT, "latency_ms": 12}},
    ]  # fmt: skip
    at = f"2026-01-01T00:0{n}"
    return [
        event("trace.completed", f"{trace_id}-c", f"{at}:00Z", trace_id=trace_id,
              messages=messages, scenario="refund", metadata={"ticket": PLANT}),
        event("evaluation.finished", f"{trace_id}-e", f"{at}:01Z", trace_id=trace_id,
              evaluation_id=f"ev-{n}",
              results=[{"evaluator": "judge", "score": 0.2 + 0.2 * n, "passed": n > 1,
                        "reasoning": PLANT}],
              report={"outcomes": [], "classifications": [{"type": "policy", "turn": 1,
                      "assessments": [{"principle_id": "p1", "decision": True,
                                       "explanation": PLANT}]}]}),
        event("label.submitted", f"{trace_id}-l", f"{at}:02Z", trace_id=trace_id,
              labeler="ana", rubric={"correctness": 4, "helpfulness": 4, "efficiency": 3,
                                     "safety": 5}, comment=PLANT),
    ]  # fmt: skip


@pytest.fixture(scope="module")
async def store() -> MemoryStore:
    memory = MemoryStore()
    events = trace(1, prompt=PLANT) + trace(2, prompt=PLANT) + trace(3, prompt="Other " + PLANT)
    settings = load_settings(partitions=2)
    await replay(settings, memory, [(f"e:{n}", dumps(e)) for n, e in enumerate(events)])
    return memory


async def export(store: MemoryStore, fmt: str, redact: str, **extra: Any) -> tuple[bytes, Any]:
    summary = ExportSummary()
    ref = CorpusRef(ORG, PROJECT, "evaluator")
    chunks = iter_export(store, ref, format=fmt, redact=redact, summary=summary, **extra)
    return b"".join([c async for c in chunks]), summary


def text_of(fmt: str, data: bytes) -> str:
    """The export as text, whatever its format (Parquet and zip opened)."""
    if fmt == "parquet":
        return json.dumps(pq.read_table(io.BytesIO(data)).to_pylist())
    if fmt == "zip":
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return archive.read("data.csv").decode()
    return data.decode()


def strings_in(fmt: str, data: bytes) -> list[str]:
    """Every cell or line of the export, JSON decoded where it is JSON (so that an escaped
    value cannot hide)."""
    text = text_of(fmt, data)
    if fmt in ("csv", "zip"):
        return [cell for row in csv.reader(io.StringIO(text)) for cell in row]
    return [text, json.dumps(json.loads(text) if fmt in ("json", "parquet") else [
        json.loads(line) for line in text.splitlines()], ensure_ascii=False)]  # fmt: skip


@pytest.mark.parametrize("fmt", [*JSONL_FORMATS, *TABULAR_FORMATS])
async def test_every_kind_is_gone_from_every_format(store: MemoryStore, fmt: str) -> None:
    data, summary = await export(store, fmt, "all")
    found = "\n".join(strings_in(fmt, data))
    for kind, value in VALUES.items():
        assert value not in found, (fmt, kind)
        assert placeholder(kind) in found, (fmt, kind)
    assert KEEP in found  # order numbers, dates, versions, prices, non-Luhn numbers
    assert set(summary.redactions) == set(KINDS)
    assert all(n > 0 for n in summary.redactions.values()), summary.redactions


async def test_counts_are_per_substring_replaced(store: MemoryStore) -> None:
    data, summary = await export(store, "trajectory", "all")
    records = [json.loads(line) for line in data.splitlines()]
    assert len(records) == 3
    assert summary.redactions == dict.fromkeys(KINDS, 3 * PLACES)
    for kind in KINDS:
        assert data.decode().count(placeholder(kind)) == 3 * PLACES
    for record in records:
        assert record["human_labels"][0]["comment"].count("[REDACTED:") == len(KINDS)
        assert record["human_labels"][0]["labeler"] == "ana"


@pytest.mark.parametrize("style", ["raw", "openai", "hf"])
async def test_arguments_that_were_json_stay_json(store: MemoryStore, style: Any) -> None:
    data, _ = await export(store, "messages", "all", chat=Chat(style))
    for line in data.splitlines():
        call = json.loads(line)["messages"][2]["tool_calls"][0]["function"]
        # hf gives arguments as an object; raw and openai as the JSON text
        arguments = call["arguments"] if style == "hf" else json.loads(call["arguments"])
        assert set(arguments) == {"q", "n"}
        assert arguments["q"].startswith("Here: [REDACTED:SECRETS]; [REDACTED:EMAIL]")


async def test_only_the_kinds_asked_for_and_none_gives_the_data_back(store: MemoryStore) -> None:
    data, summary = await export(store, "trajectory", "email")
    assert summary.redactions == {"email": 3 * PLACES}
    assert VALUES["email"].encode() not in data
    assert VALUES["secrets"].encode() in data
    data, summary = await export(store, "trajectory", "none")
    assert summary.redactions == {}
    assert all(v.encode() in data for v in VALUES.values())
    default, summary = await export(store, "trajectory", None)  # type: ignore[arg-type]
    assert summary.redactions == {"secrets": 3 * PLACES}  # the default: secrets
    assert VALUES["secrets"].encode() not in default


async def test_filters_limits_and_preference(store: MemoryStore) -> None:
    from rl_export.formats.filters import parse_filters

    data, summary = await export(store, "trajectory", "all", filters=parse_filters({"limit": "1"}))
    assert len(data.splitlines()) == 1
    assert summary.redactions["email"] == PLACES  # what was written, not what was read
    data, summary = await export(store, "preference", "all")
    pairs = [json.loads(line) for line in data.splitlines()]
    assert len(pairs) == 1  # tr-1 and tr-2 share a prompt; tr-3's differs
    assert all(v not in data.decode() for v in VALUES.values())
    assert summary.redactions["email"] > 0


async def test_clean_text_is_byte_identical(store: MemoryStore) -> None:
    verbatim, _ = await export(store, "trajectory", "none")
    clean = MemoryStore()
    settings = load_settings(partitions=2)
    at = "2026-01-01T00:00:0"
    events = [event("trace.completed", "c", f"{at}0Z", trace_id="tr-9",
                    messages=[{"role": "user", "content": KEEP}]),
              event("evaluation.finished", "e", f"{at}1Z", trace_id="tr-9")]  # fmt: skip
    await replay(settings, clean, [(f"e:{n}", dumps(e)) for n, e in enumerate(events)])
    plain, _ = await export(clean, "trajectory", "none")
    scrubbed, summary = await export(clean, "trajectory", "all")
    assert scrubbed == plain
    assert summary.redactions == dict.fromkeys(KINDS, 0)
    assert verbatim != plain
