"""The training formats (DESIGN.md section 4) rendered from realistic trajectory records."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from rl_export.formats.chat import Chat, restyle
from rl_export.formats.render import (
    CORPUS_FORMATS,
    FORMAT_COLUMNS,
    JSONL_FORMATS,
    PAIR_FORMATS,
    corpus_row,
    preference_pairs,
    prompt_split,
    render_row,
    trace_index,
)
from rl_export.model.codec import RawJson, dumps, dumps_line, loads
from tests.records import PROMPT, SYSTEM, conversation, record

RAW = Chat("raw")


def test_prompt_completion_splits_after_the_last_user_turn() -> None:
    rec = record("tr-1")
    row = render_row("prompt_completion", rec)
    assert row is not None
    assert list(row) == list(FORMAT_COLUMNS["prompt_completion"])
    messages = restyle(rec["messages"])  # the default chat style, hf
    assert row["prompt"] == messages[:6]
    assert row["prompt"][-1]["role"] == "user"
    assert row["completion"] == messages[6:]
    assert (row["reward"], row["passed"], row["trace_id"]) == (0.8, True, "tr-1")


@pytest.mark.parametrize("fmt", ["messages", "prompt_completion", "kto"])
def test_chat_formats_are_hf_by_default(fmt: str) -> None:
    row = render_row(fmt, record("tr-1"))
    assert row is not None
    messages = row.get("messages") or row["prompt"] + row["completion"]
    assert all(isinstance(m["content"], str) for m in messages)
    call = messages[2]["tool_calls"][0]["function"]
    assert call["arguments"] == {"order": 12}
    assert render_row(fmt, record("tr-1"), chat=Chat("openai")) != row


def test_system_merge_folds_the_system_prompt_into_the_first_user_message() -> None:
    row = render_row("prompt_completion", record("tr-1"), chat=Chat("hf", "merge"))
    assert row is not None
    assert [m["role"] for m in row["prompt"]][:1] == ["user"]
    assert row["prompt"][0]["content"].startswith(SYSTEM["content"] + "\n\n")
    assert all(m["role"] != "system" for m in row["prompt"] + row["completion"])


def test_messages_pass_through_exactly() -> None:
    rec = record("tr-1")
    original = copy.deepcopy(rec["messages"])
    for fmt in ("messages", "prompt_completion", "kto", "executions"):
        row = render_row(fmt, rec, chat=RAW)
        assert row is not None
        joined = row.get("messages") or row.get("conversation") or row["prompt"] + row["completion"]
        assert joined == original, fmt  # null content, list content, unknown keys all kept
        assert dumps(joined) == dumps(original)
    assert rec["messages"] == original  # nothing changed in place
    assert original[2]["content"] is None
    assert "x_latency_ms" in original[4]


def test_raw_messages_are_copied_verbatim_or_parsed_to_split() -> None:
    rec = record("tr-1")
    raw = dumps(rec["messages"])
    rec["messages"] = RawJson(raw)
    assert render_row("messages", rec, chat=RAW) == {"messages": RawJson(raw)}
    assert render_row("messages", rec) == {"messages": restyle(loads(raw))}
    row = render_row("prompt_completion", rec)
    assert row is not None
    assert row["prompt"][0] == SYSTEM


def test_kto_labels_with_passed_and_skips_records_without_a_verdict() -> None:
    assert render_row("kto", record("a", passed=False), chat=RAW) == {
        "prompt": conversation(0)[:6],
        "completion": conversation(0)[6:],
        "label": False,
    }
    assert render_row("kto", record("b", passed=None, reward=None, source=None)) is None


@pytest.mark.parametrize(
    "messages",
    [
        [SYSTEM],  # no user turn
        [SYSTEM, PROMPT],  # nothing after the last user turn
        [],
    ],
)
def test_records_that_cannot_split_have_no_row(messages: list[dict[str, Any]]) -> None:
    rec = record("tr-1", messages=messages)
    assert render_row("prompt_completion", rec) is None
    assert render_row("kto", rec) is None
    assert render_row("messages", rec) == {"messages": messages}


def test_executions_rows_run_agenthub_scripts() -> None:
    rec = record("tr-9", outcomes=[{"type": "goal_met", "turn": 1, "decision": True,
                                    "severity": 2}])  # fmt: skip
    rec["evaluation"]["report"]["classifications"] = [
        {"type": "policy", "turn": 1,
         "assessments": [{"principle_id": "p1", "decision": False, "explanation": "leak"}]}
    ]  # fmt: skip
    row = loads(dumps_line(render_row("executions", rec)))
    assert list(row) == list(FORMAT_COLUMNS["executions"])
    # What an executions.jsonl script does, unchanged:
    assert row["id"] == "tr-9"
    assert [m["role"] for m in row["conversation"]][:2] == ["system", "user"]
    assert [m.get("content") for m in row["conversation"]][1] == PROMPT["content"]
    worst = max(o["severity"] for o in row["report"]["outcomes"])
    failed = [
        a["principle_id"]
        for c in row["report"]["classifications"]
        for a in c["assessments"]
        if a["decision"] is False and a["explanation"]
    ]
    assert (worst, failed, row["reward"], row["passed"]) == (2, ["p1"], 0.8, True)
    unevaluated = render_row("executions", record("tr-0", source="human", labels=1))
    assert unevaluated is not None
    assert unevaluated["report"] == {"outcomes": [], "classifications": []}


def test_corpus_rows_lead_with_identity_and_formats_are_known() -> None:
    rec = record("tr-1", revision=7)
    for fmt in CORPUS_FORMATS:
        row = corpus_row(fmt, rec)
        assert row is not None
        lead = ["trace_id", "org"] if fmt == "trajectory" else ["trace_id", "revision"]
        assert list(row)[:2] == lead, fmt
        assert (row["trace_id"], row["revision"]) == ("tr-1", 7)
    assert "preference" not in CORPUS_FORMATS
    with pytest.raises(ValueError, match="preference_pairs"):
        render_row("preference", rec)
    with pytest.raises(ValueError, match="unknown format 'xml'"):
        render_row("xml", rec)
    assert set(FORMAT_COLUMNS) == set(JSONL_FORMATS + PAIR_FORMATS) - {"trajectory"}


def test_prompt_split_first_and_last() -> None:
    messages = conversation(1)
    first = prompt_split(messages, at="first")
    last = prompt_split(messages, at="last")
    assert first is not None
    assert last is not None
    assert first[0] == messages[:2]
    assert last[0] == messages[:6]
    assert prompt_split([SYSTEM], at="first") is None


# --- preference -----------------------------------------------------------------------------


def pref(trace_id: str, reward: float | None, variant: int = 0, **kw: Any) -> dict[str, Any]:
    messages = conversation(variant)
    if kw.pop("other_prompt", False):
        messages[1] = {"role": "user", "content": "A different question"}
    if kw.pop("other_system", False):
        messages[0] = {"role": "system", "content": "Another system prompt"}
    return record(trace_id, reward=reward, messages=messages, **kw)


def pairs(records: list[dict[str, Any]], **kw: Any) -> list[tuple[str, str]]:
    return [(p["trace_chosen"], p["trace_rejected"]) for p in preference_pairs(records, **kw)]


def test_preference_pairs_only_identical_prompts() -> None:
    records = [
        pref("a", 0.9, 1),
        pref("b", 0.1, 2),
        pref("c", 0.2, 3, other_prompt=True),
        pref("d", 0.8, 4, other_system=True),  # the system message is part of the prompt
    ]
    rows = list(preference_pairs(records, completion="rest", chat=RAW))
    assert [(r["trace_chosen"], r["trace_rejected"]) for r in rows] == [("a", "b")]
    row = rows[0]
    assert list(row) == list(FORMAT_COLUMNS["preference"])
    assert row["prompt"] == conversation(1)[:2]
    assert row["chosen"] == conversation(1)[2:]
    assert row["rejected"] == conversation(2)[2:]
    assert (row["score_chosen"], row["score_rejected"]) == (0.9, 0.1)


def test_preference_turn_is_the_reply_to_the_prompt() -> None:
    rows = list(preference_pairs([pref("a", 0.9, 1), pref("b", 0.1, 2)]))
    assert len(rows) == 1
    row = rows[0]
    for side, n in (("chosen", 1), ("rejected", 2)):
        reply = conversation(n)[2:]
        reply = reply[: next(i for i, m in enumerate(reply) if m["role"] == "user")]
        assert row[side] == restyle(reply)
        assert all(m["role"] != "user" for m in row[side])
    assert row["prompt"] == restyle(conversation(1)[:2])


def test_preference_margin_equal_rewards_and_cap() -> None:
    records = [pref("a", 0.9), pref("b", 0.5), pref("c", 0.5), pref("d", 0.45), pref("e", 0.9)]
    assert pairs(records) == [("e", "d"), ("a", "b")]  # highest with lowest, once each
    assert pairs(records, margin=0.41) == [("e", "d")]
    assert pairs(records, margin=0.5) == []
    assert pairs([pref("a", 0.5), pref("b", 0.5)]) == []  # equal rewards never pair
    two = pairs(records, max_pairs=2)
    counts: dict[str, int] = {}
    for chosen, rejected in two:
        assert chosen != rejected
        counts[chosen] = counts.get(chosen, 0) + 1
        counts[rejected] = counts.get(rejected, 0) + 1
    assert max(counts.values()) == 2
    assert len(set(two)) == len(two)


def test_preference_pair_by_narrows_groups() -> None:
    records = [pref("a", 0.9, scenario="x"), pref("b", 0.1, scenario="y")]
    assert pairs(records) == [("a", "b")]
    assert pairs(records, pair_by=("scenario",)) == []


def test_preference_skips_records_without_reward_or_completion() -> None:
    records = [pref("a", None), pref("b", 0.1), record("c", reward=0.9, messages=[SYSTEM, PROMPT])]
    assert pairs(records) == []


def test_preference_is_deterministic_whatever_the_input_order() -> None:
    rng = random.Random(5)
    records = [pref(f"t{n}", round(rng.random(), 2), n % 3, other_prompt=n % 4 == 0)
               for n in range(60)]  # fmt: skip
    expected = list(preference_pairs(records, max_pairs=2, margin=0.1))
    assert expected
    for _ in range(5):
        rng.shuffle(records)
        assert list(preference_pairs(records, max_pairs=2, margin=0.1)) == expected
    for row in expected:
        assert row["score_chosen"] - row["score_rejected"] >= 0.1


def test_rl_prompts_rows_are_verls_columns() -> None:
    rec = record("tr-1", reward=0.25, passed=False, scenario="travel", agent_version="v9")
    row = render_row("rl_prompts", rec)
    assert row is not None
    assert list(row) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert list(row) == list(FORMAT_COLUMNS["rl_prompts"])
    assert row["data_source"] == "travel"
    assert row["prompt"] == rec["messages"][:2]  # the system prompt and the first user message
    assert row["prompt"][-1]["role"] == "user"
    assert row["ability"] == "agent"
    assert row["reward_model"] == {"style": "model", "ground_truth": None}
    assert row["extra_info"] == {"trace_id": "tr-1", "agent_version": "v9", "reward": 0.25,
                                 "passed": False, "index": trace_index("tr-1")}  # fmt: skip
    assert render_row("rl_prompts", record("tr-2", messages=[SYSTEM])) is None
    assert "rl_prompts" not in CORPUS_FORMATS  # verl's files: an export
    raw = {**rec, "messages": RawJson(dumps(rec["messages"]))}
    assert render_row("rl_prompts", raw) == row
    assert trace_index("tr-1") != trace_index("tr-2")
    assert 0 <= trace_index("tr-1") < 2**63
