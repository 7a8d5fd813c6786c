"""Redaction: each kind planted in every place DESIGN.md section 4 names is found and replaced,
what must not change does not, JSON arguments stay JSON, and the gates never hide a finding."""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_export.model.codec import RawJson, dumps_line
from rl_export.privacy.kinds import PII_KINDS, RedactError, counts_header, parse_kinds, placeholder
from rl_export.privacy.redact import KINDS, Redactor, redactor
from tests.records import record

# One planted value per kind (and per secret format), each in a sentence.
PLANTED: dict[str, list[str]] = {
    "secrets": [
        "AKIAIOSFODNN7EXAMPLE",  # AWS access key id (detect-secrets)
        "ghp_abcdefghijklmnopqrstuvwxyz0123456789",  # GitHub (detect-secrets)
        "xoxb-123456789012-1234567890123-abcdefghijabcdefghijklmn",  # Slack (detect-secrets)
        "sk_live_abcdefghijklmnopqrstuvwx",  # Stripe (detect-secrets)
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4g"
        "RG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",  # JWT
        "sk-proj-Zq8xY2vB4nM6kL0pR3tW5yU7iO9aS1dF",  # OpenAI (ours)
        "AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",  # Google API key (ours)
        "glpat-Ab3De6Gh9Jk2Mn5Pq8St",  # GitLab (ours)
        "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567",  # Hugging Face (ours)
    ],
    "email": ["jane.doe@acme-corp.com"],
    "phone": ["(415) 555-2671", "+44 20 7946 0958"],
    "credit_card": ["4111 1111 1111 1111", "5500-0000-0000-0004"],
    "iban": ["DE89 3704 0044 0532 0130 00", "GB82WEST12345698765432"],
    "ip": ["192.168.1.20", "2001:db8::8a2e:370:7334"],
}
# Secrets whose detection needs what is around them: a name, a URL, a header, a PEM block.
SECRET_SENTENCES = [
    ('my password: "Sup3r-S3cret-Value!" ok', "Sup3r-S3cret-Value!"),
    ("export API_KEY=Zk29fj3KdQ8vLp2mXr7T", "Zk29fj3KdQ8vLp2mXr7T"),
    ("postgres://admin:hunter2pass@db.internal.io:5432/app", "hunter2pass"),
    ("Authorization: Bearer Abc123Def456Ghi789Jkl012Mno345", "Abc123Def456Ghi789Jkl012Mno345"),
    (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6"
        "ffAt0gun\n-----END RSA PRIVATE KEY-----",
        "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun",
    ),
]
# What must come out byte for byte.
UNCHANGED = [
    "Order #1234567890 shipped on 2024-05-01 (ref 20240501-7781).",
    "Updated 2026-01-02T03:04:05Z, then 2026-01-02T03:04:05.123456+02:00.",
    "Release v1.2.3 and 2.10.0-rc.1 of the agent; build 4.2.",
    "It costs $1,299.99 or 1.299,99 EUR; 0.6666666666666666 of the budget.",
    "trace 550e8400-e29b-41d4-a716-446655440000, commit 9f86d081884c7d659a2feaa0c55ad015a3bf",
    "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 is fine",
    "Card-like 4111 1111 1111 1112 fails the Luhn check, so does 1234567812345678.",
    "The token count was 1200 and the password reset page works.",
    "Ünïcödé text \u2028 with emoji \U0001f600 and a tab\tand nothing to hide.",
    "std::vector<int> is code, not an address.",
]


def planted() -> list[tuple[str, str]]:
    """(kind, value) of every planted value."""
    return [(kind, value) for kind, values in PLANTED.items() for value in values]


ALL = Redactor(KINDS)


@pytest.mark.parametrize(("kind", "value"), planted())
def test_each_planted_value_is_replaced_by_its_kind(kind: str, value: str) -> None:
    text, counts = ALL.text(f"Here it is: {value} (keep this).")
    assert value not in text
    assert text == f"Here it is: {placeholder(kind)} (keep this)."
    assert counts == {kind: 1}


@pytest.mark.parametrize(("sentence", "secret"), SECRET_SENTENCES)
def test_secrets_found_by_their_context(sentence: str, secret: str) -> None:
    text, counts = Redactor(("secrets",)).text(sentence)
    assert secret not in text
    assert placeholder("secrets") in text
    assert set(counts) == {"secrets"}


def test_a_password_in_a_url_is_a_secret_not_an_email() -> None:
    text, counts = ALL.text("postgres://admin:hunter2pass@db.internal.io:5432/app")
    # The credential is user and password: both go (DESIGN.md section 10).
    assert text == "postgres://[REDACTED:SECRETS]@db.internal.io:5432/app"
    assert counts == {"secrets": 1}


def test_a_private_key_block_goes_whole() -> None:
    sentence, _ = SECRET_SENTENCES[-1]
    text, _ = ALL.text(f"key:\n{sentence}\ndone")
    assert text == "key:\n[REDACTED:SECRETS]\ndone"


@pytest.mark.parametrize("text", UNCHANGED)
def test_what_must_not_change_is_byte_identical(text: str) -> None:
    assert ALL.text(text) == (text, {})


def test_low_entropy_and_placeholder_values_are_no_secrets() -> None:
    for text in ('password: "********"', "token = ${TOKEN}", "password: null", "api_key=abcdef"):
        assert ALL.text(text) == (text, {}), text


def test_only_the_kinds_asked_for() -> None:
    text = "mail jane.doe@acme-corp.com, key AKIAIOSFODNN7EXAMPLE, ip 10.0.0.1"
    assert Redactor(("email",)).text(text) == (
        "mail [REDACTED:EMAIL], key AKIAIOSFODNN7EXAMPLE, ip 10.0.0.1",
        {"email": 1},
    )
    assert Redactor(()).text(text) == (text, {})
    assert not Redactor(())


def test_deterministic_and_idempotent() -> None:
    text = " and then ".join(v for _, v in planted())
    once = ALL.text(text)
    assert once == ALL.text(text)
    assert ALL.text(once[0]) == (once[0], {})


@pytest.mark.parametrize(
    ("given", "kinds"),
    [
        (None, ("secrets",)),
        ("none", ()),
        ("", ()),
        ("pii", PII_KINDS),
        ("all", KINDS),
        ("email,secrets", ("secrets", "email")),
        (["IP", " phone "], ("phone", "ip")),
        ("secrets,pii", KINDS),
    ],
)
def test_parse_kinds(given: Any, kinds: tuple[str, ...]) -> None:
    assert parse_kinds(given) == kinds


def test_parse_kinds_names_the_setting_and_the_kind() -> None:
    with pytest.raises(RedactError, match=r"^redact: unknown kind 'emails' \(kinds: secrets"):
        parse_kinds("secrets,emails")
    with pytest.raises(RedactError, match=r"^RL_EXPORT_REDACT: 'none' cannot be combined"):
        parse_kinds("none,email", setting="RL_EXPORT_REDACT")


def test_counts_header_is_json() -> None:
    assert json.loads(counts_header({"secrets": 2, "email": 0})) == {"secrets": 2, "email": 0}


# --- records: every place of DESIGN.md section 4 ----------------------------------------------

TEXT = "one value {}, to go"


def places_record(value: str) -> dict[str, Any]:
    """A trajectory record with ``value`` planted in every place section 4 names, and in
    places it must never touch (ids, keys, names, enums)."""
    base = record("tr-1", labels=1, outcomes=[{"type": "goal_met", "turn": 1, "decision": True}])
    plant = TEXT.format(value)
    base["messages"] = [
        {"role": "system", "content": plant},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": plant},
                {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "send",
                        "arguments": json.dumps({"to": plant, "n": 3, "tags": [plant]}),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "name": "send", "content": plant},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "tu_1", "name": "lookup", "input": {"q": plant}},
                {
                    "type": "tool_result",
                    "tool_use_id": "tu_1",
                    "content": [{"type": "text", "text": plant}],
                },
            ],
            "metadata": {"note": plant, "nested": {"deeper": [plant]}, "count": 2},
        },
        {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": plant}},
    ]
    base["evaluation"]["results"][0]["reasoning"] = plant
    base["evaluation"]["report"]["classifications"] = [
        {
            "type": "policy",
            "turn": 1,
            "assessments": [{"principle_id": "p1", "decision": True, "explanation": plant}],
        }
    ]
    base["labels"] = [
        {
            "labeler": "ana",
            "rubric": {"correctness": 5, "helpfulness": 4, "efficiency": 4, "safety": 5},
            "comment": plant,
            "occurred_at": "2026-01-02T03:04:05Z",
        }
    ]
    base["metadata"] = {"customer": plant, "latency_ms": 12}
    return base


PLACES = 14  # how many strings of places_record hold the planted value (and must change)


@pytest.mark.parametrize(("kind", "value"), planted())
def test_every_place_of_a_record_is_redacted(kind: str, value: str) -> None:
    original = places_record(value)
    kept = copy.deepcopy(original)
    redacted, counts = ALL.record(original)
    assert original == kept  # pure: the input is untouched
    encoded = dumps_line(redacted).decode()
    assert value not in encoded
    assert json.dumps(value)[1:-1] not in encoded  # nor escaped, inside the arguments
    assert counts == {kind: PLACES}
    assert encoded.count(placeholder(kind)) == PLACES
    call = redacted["messages"][2]["tool_calls"][0]["function"]
    assert json.loads(call["arguments"]) == {
        "to": TEXT.format(placeholder(kind)),
        "n": 3,
        "tags": [TEXT.format(placeholder(kind))],
    }
    # Never: ids, keys, names, roles, numbers, datetimes.
    for key in ("trace_id", "org", "project", "revision", "updated_at", "completed_at"):
        assert redacted[key] == kept[key]
    assert redacted["messages"][3]["name"] == "send"
    assert redacted["labels"][0]["labeler"] == "ana"
    assert redacted["labels"][0]["occurred_at"] == "2026-01-02T03:04:05Z"


def test_a_record_without_anything_to_redact_is_the_same_object() -> None:
    clean = places_record("nothing at all")
    redacted, counts = ALL.record(clean)
    assert redacted is clean
    assert counts == {}
    line = dumps_line(clean)
    assert ALL.line(line) == (line, None, {})


def test_records_without_labels_or_evaluation_read_fine() -> None:
    old = places_record("jane.doe@acme-corp.com")
    del old["labels"], old["metadata"]
    old["evaluation"] = None
    redacted, counts = ALL.record(old)
    assert counts == {"email": 10}
    assert "labels" not in redacted
    assert redacted["evaluation"] is None


def test_raw_messages_stay_raw() -> None:
    rec = places_record("jane.doe@acme-corp.com")
    rec["messages"] = RawJson(orjson.dumps(rec["messages"]))
    redacted, counts = ALL.record(rec)
    assert isinstance(redacted["messages"], RawJson)
    assert b"jane.doe" not in redacted["messages"].data
    assert counts == {"email": 14}


def test_arguments_that_are_not_json_are_text() -> None:
    rec = {
        "messages": [
            {
                "role": "assistant",
                "tool_calls": [
                    {"function": {"name": "f", "arguments": "to jane.doe@acme-corp.com {"}}
                ],
            }
        ]
    }
    redacted, _ = ALL.record(rec)
    assert redacted["messages"][0]["tool_calls"][0]["function"]["arguments"] == (
        "to [REDACTED:EMAIL] {"
    )


def test_a_secret_named_by_its_key_in_json_arguments() -> None:
    args = json.dumps({"user": "bob", "password": "Tr0ub4dor&3xyz", "retries": 3})
    rec = {
        "messages": [
            {
                "role": "assistant",
                "tool_calls": [{"function": {"name": "login", "arguments": args}}],
            }
        ]
    }
    redacted, counts = Redactor(("secrets",)).record(rec)
    out = json.loads(redacted["messages"][0]["tool_calls"][0]["function"]["arguments"])
    assert out == {"user": "bob", "password": "[REDACTED:SECRETS]", "retries": 3}
    assert counts == {"secrets": 1}


def test_rows_of_other_formats() -> None:
    plant = TEXT.format("jane.doe@acme-corp.com")
    row = {
        "id": "tr-1",
        "conversation": [{"role": "user", "content": plant}],
        "report": {"outcomes": [], "classifications": [{"assessments": [{"explanation": plant}]}]},
        "results": [{"reasoning": plant}],
    }
    redacted, counts = ALL.record(row)
    assert counts == {"email": 3}
    assert "jane.doe" not in json.dumps(redacted)
    pair = {
        "prompt": [{"role": "user", "content": plant}],
        "chosen": [{"role": "assistant", "content": plant}],
        "rejected": [{"role": "assistant", "content": plant}],
    }
    assert ALL.record(pair)[1] == {"email": 3}


# --- the gates never hide a finding ----------------------------------------------------------

_pieces = st.sampled_from(
    [v for _, v in planted()]
    + [s for s, _ in SECRET_SENTENCES]
    + UNCHANGED
    + ["\n", "\\", '"', "/", "\u2028", "é", " ", ":", "password", "key=", "@", "\x01"]
    + ["2026-01-01", "2026-01-01T00:00:00Z ", "call_0_754100", "-", "0.30000000000000004"]
)
_texts = st.lists(_pieces, max_size=6).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(_texts, min_size=1, max_size=4),
    kinds=st.sampled_from([("secrets",), KINDS, ("email", "ip"), ("phone", "credit_card", "iban")]),
)
def test_a_line_the_gates_pass_over_has_nothing_to_redact(
    texts: list[str], kinds: tuple[str, ...]
) -> None:
    redact = redactor(kinds)
    rec = record("tr-1", labels=1)
    rec["messages"] = [
        {"role": "user", "content": texts[0]},
        {
            "role": "assistant",
            "tool_calls": [{"function": {"name": "f", "arguments": json.dumps({"a": texts[-1]})}}],
        },
    ]
    rec["evaluation"]["results"][0]["reasoning"] = texts[len(texts) // 2]
    line = dumps_line(rec)
    changed, _ = redact.record(rec)
    if changed is not rec:
        assert redact.may_hold(line)
    new_line, new_record, counts = redact.line(line)
    assert (new_line == line) == (changed is rec)
    if new_record is not None:
        assert new_line == dumps_line(new_record)
        assert counts


def test_a_records_structural_fields_are_never_redacted_nor_parsed_for() -> None:
    rec = record("tr-1", scenario="password_reset token AKIAIOSFODNN7EXAMPLE", labels=1,
                 messages=[{"role": "user", "content": "Where is my order?"}])  # fmt: skip
    rec["agent_version"] = "jane.doe@acme-corp.com"
    line = dumps_line(rec)
    assert ALL.may_hold(line) is False  # the gates open, on structural fields only
    assert ALL.line(line) == (line, None, {})
    rec["labels"] = [{"labeler": "ana", "rubric": {}, "comment": "mail jane.doe@acme-corp.com",
                      "occurred_at": "2026-01-02T03:04:05Z"}]  # fmt: skip
    _, new_record, counts = Redactor(("email",)).line(dumps_line(rec))
    assert counts == {"email": 1}
    assert new_record is not None
    assert new_record["agent_version"] == "jane.doe@acme-corp.com"  # never a free-text field
    # A messages row whose conversation holds an "evaluation" key is scanned whole.
    row = {"trace_id": "tr-1", "revision": 1, "messages": [
        {"role": "user", "content": "x", "metadata": {"evaluation": 1}},
        {"role": "user", "content": "key AKIAIOSFODNN7EXAMPLE"}]}  # fmt: skip
    assert Redactor(("secrets",)).line(dumps_line(row))[2] == {"secrets": 1}


def test_metadata_after_agent_version_is_scanned() -> None:
    # Issue 53: the line path trusted everything after ',"agent_version":"'.
    key = "sk-proj-" + "Zk29fj3KdQ8vLp2mXr7TabCDeFgHiJkLmNoPqRsT"
    rec = {"trace_id": "tr-1", "org": "acme", "project": "bot", "agent_version": "v3",
           "messages": [], "metadata": {"deploy": "prod", "agent_version": "v3",
                                        "OPENAI_API_KEY": key}}  # fmt: skip
    line = dumps_line(rec)
    new_line, new_record, counts = redactor(("secrets",)).line(line)
    assert key.encode() not in new_line
    assert counts == {"secrets": 1}
    assert new_record is not None
    assert new_record["metadata"]["agent_version"] == "v3"


@settings(max_examples=200, deadline=None)
@given(
    st.binary(max_size=200).map(
        lambda b: b.replace(b"\x00", b"a") + b" 2026-01-02T03:04:05Z (415) 555-2671 AKIA"
    ),
    st.integers(min_value=0, max_value=300),
)
def test_the_lean_byte_search_finds_what_re2s_search_finds(data: bytes, pos: int) -> None:
    import re2

    from rl_export.privacy.detectors import GATES, byte_search

    pattern = re2.compile("|".join(f"(?:{g})" for g in GATES.values()).encode())
    found = pattern.search(data, pos)
    assert byte_search(pattern)(data, pos) == (-1 if found is None else found.start())


def test_lines_proven_clean_are_passed_over() -> None:
    lines = b"".join(
        dumps_line(record(f"tr-{n}", labels=1, messages=[{"role": "user", "content": text}]))
        for n, text in enumerate(["hello", "see 2026-01-02T10:00Z then", "ring +44 20 7946 0958"])
    )
    start = ALL.next_hit(lines)
    assert lines[start:].startswith(b'{"trace_id":"tr-2"')  # the phone's line, past two
    assert ALL.next_hit(lines, lines.index(b"\n", start) + 1) == -1


@pytest.mark.parametrize("follower", ["T", "Z", "a", "é"])
def test_a_phone_a_letter_follows_is_no_phone_for_presidio_nor_the_gate(follower: str) -> None:
    text = f"call (415) 555-2671{follower} now, at 2026-01-02T03:04:05.123Z"
    assert Redactor(("phone",)).text(text) == (text, {})
    # The gate leaves out ASCII letters only (Presidio refuses any Latin one: the gate is a
    # necessary condition, it may open for more).
    assert Redactor(("phone",)).gates.open(text) == (not follower.isascii())
    # The same number with a space after it is one.
    assert Redactor(("phone",)).text("call (415) 555-2671 now")[1] == {"phone": 1}
