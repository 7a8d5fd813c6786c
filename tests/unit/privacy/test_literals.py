"""The gates derived from the rules' patterns are necessary conditions (DESIGN.md section 10:
a fast path may skip only what it proves holds nothing): every string a rule's pattern
matches opens the rule's gate on text, and its JSON spelling opens the rule's gate on JSON
text. Strings are generated from each pattern (hypothesis), for every rule of the installed
rule set and every rule of ours."""

from __future__ import annotations

import re
from functools import cache

import orjson
import pytest
import re2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_export.privacy.detectors import json_gate
from rl_export.privacy.literals import (
    _python_pattern,
    gate_for,
    literal_gate,
    regex_gate,
    required_literals,
)
from rl_export.privacy.literals import (
    json_gate as skeleton,
)
from rl_export.privacy.secret_rules import RULES
from rl_export.privacy.secrets import COMMON_WORDS, secrets_detector
from rl_export.privacy.structural import layout_words

_OPTIONS = re2.Options()
_OPTIONS.max_mem = 64 << 20


@cache
def patterns() -> dict[str, str]:
    """Every rule the detector uses, by id: the rule set's and ours."""
    import kingfisher_sdk

    detector = secrets_detector()
    rules = kingfisher_sdk.Rules()
    found = {rid: rules.detail(rid)["detection_regex"] for rid in sorted(detector.kept)}
    return found | {f"own:{rule.name}": rule.pattern for rule in RULES}


def python_regex(pattern: str) -> re.Pattern[str] | None:
    parsed = _python_pattern(pattern)
    if parsed is None:
        return None
    text, flags, icase = parsed
    try:
        return re.compile(text, flags | (re.IGNORECASE if icase else 0))
    except re.error:
        return None


@cache
def rule_ids() -> list[str]:
    return sorted(patterns())


@pytest.mark.parametrize("rule", rule_ids())
def test_each_rules_gates_are_necessary_conditions(rule: str) -> None:
    pattern = patterns()[rule]
    gates = gate_for(pattern, layout_words() | COMMON_WORDS)
    assert gates is not None, rule
    text_gate = re2.compile(gates[0], _OPTIONS)
    line_gate = re2.compile(f"(?:{gates[1]})|\\\\u|\\\\/".encode(), _OPTIONS)
    regex = python_regex(pattern)
    if regex is None:
        pytest.skip("Python's parser cannot read it (the gate was derived from a reading of it)")

    @settings(max_examples=8, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(st.from_regex(regex))
    def holds(text: str) -> None:
        if any("\ud800" <= c <= "\udfff" for c in text):
            return
        assert text_gate.search(text) is not None, (rule, text)
        assert line_gate.search(orjson.dumps(text)) is not None, (rule, text)

    holds()


def test_the_rules_are_nearly_all_used_and_ours_all() -> None:
    detector = secrets_detector()
    assert len(detector.left_out) <= 0.02 * detector.rule_count, detector.left_out
    assert len(detector.kept) >= 400
    for rule in RULES:
        assert gate_for(rule.pattern) is not None, rule.name


def test_neither_the_layouts_keys_nor_common_words_open_the_gate_on_json_text() -> None:
    # Not needed for correctness; needed for speed: every line holds these keys.
    gate = re2.compile(json_gate(("secrets",)).encode(), _OPTIONS)
    for word in layout_words():
        assert gate.search(orjson.dumps({word: 1})) is None, word
    for word in COMMON_WORDS:  # nor prose that says them
        assert gate.search(orjson.dumps({"text": f"the {word} was reset"})) is None, word


@pytest.mark.parametrize(
    ("pattern", "literals"),
    [
        (r"\bghp_[A-Za-z0-9]{36}", {"ghp_"}),
        (r"\b(?:AKIA|ASIA)[A-Z0-9]{16}", {"AKIA", "ASIA"}),
        (r"gh[pousr]_[A-Za-z0-9]{36}", {"ghp_", "gho_", "ghu_", "ghs_", "ghr_"}),
        (r"(?i)\b(?:algolia)[ \t]{0,3}[=:]", {"algolia"}),
        (r"\bA{16,}[0-9]", {"A" * 16}),
        (r"x?yz", {"yz"}),
        (r"[0-9a-f]{32}", None),
        (r"(?:abc|.)def", {"def"}),
    ],
)
def test_required_literals(pattern: str, literals: set[str] | None) -> None:
    found = required_literals(pattern)
    assert (None if found is None else set(found[0])) == literals


def test_gates_of_patterns_with_escaped_characters() -> None:
    # A quote, a backslash, a control character: JSON writes them escaped.
    assert literal_gate(r'key"=[a-z]{8}') == "key"
    assert regex_gate(r"[^\s]{8}") is None
    line = skeleton(r'(?i)token["\s]{0,3}=\s*([a-z0-9]{32})')
    assert line is not None
    gate = re2.compile(line.encode(), _OPTIONS)
    assert gate.search(orjson.dumps('token" = ' + "a" * 32)) is not None
    assert gate.search(orjson.dumps({"token": "x", "other": "=" + "a" * 32})) is None
