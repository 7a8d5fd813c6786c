"""The JSON-text gate's search with Hyperscan in front of RE2 gives RE2's answer, everywhere."""

from __future__ import annotations

import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_export.model.codec import dumps_line
from rl_export.privacy.detectors import byte_search, json_gate
from rl_export.privacy.gatescan import FOLDED_OUTSIDE_ASCII, gate_search
from tests.records import record

re2 = pytest.importorskip("re2")
hyperscan = pytest.importorskip("hyperscan")

SECRETS = json_gate(("secrets",))


def _re2(pattern: str) -> object:
    options = re2.Options()
    options.max_mem = 64 << 20
    return byte_search(re2.compile(pattern.encode(), options))


EXACT = _re2(SECRETS)
FILTERED = gate_search(SECRETS)

# Pieces that open the secrets gate, pieces that nearly do, and the characters where bytes
# and UTF-8 characters part ways.
PIECES = [
    "AKIAIOSFODNN7EXAMPLE", "ghp_abcdefghijklmnopqrstuvwxyz0123456789", "password=hunter2",
    "api_key: x", "token", "Bearer abc", "https://user:pw@host/", "\u017fecret=1", "\u212aEY=2",
    "\u017f\u212a", "sk-", "ghp", "AKIA", "p\u00e4ssword=1", "\\u0041", "caf\u00e9", "\u4e2d\u6587",
    "line\nbreak", 'quote"d', "back\\slash", "x" * 40, "", " ", "\t",
]  # fmt: skip


def test_the_filter_is_in_front_where_hyperscan_is() -> None:
    assert FILTERED is not EXACT
    assert FILTERED.__qualname__.startswith("_filtered")  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=12)), max_size=6),
        min_size=1,
        max_size=6,
    ),
    st.floats(min_value=0, max_value=1),
)
def test_every_search_answers_as_re2_over_the_whole_text(texts: list[list[str]], at: float) -> None:
    data = b"".join(
        dumps_line(record(f"tr-{n}", messages=[{"role": "user", "content": " ".join(parts)}],
                          metadata={"agent_version": "v1", " ".join(parts[:1]): parts[-1:]}))
        for n, parts in enumerate(texts)
    )  # fmt: skip
    positions = {0, int(at * len(data)), len(data), len(data) + 1}
    positions |= {i + 1 for i, b in enumerate(data) if b == 0x0A}  # every line's start
    for pos in sorted(positions):
        assert FILTERED(data, pos) == EXACT(data, pos), pos  # type: ignore[operator]


@pytest.mark.parametrize("spelling", ["\u017fecret", "\u212aEY", "to\u212aen"])
def test_a_letter_re2_folds_outside_ascii_still_opens_the_gate(spelling: str) -> None:
    data = dumps_line(record("tr-1", messages=[{"role": "user", "content": f"{spelling}=abc"}]))
    assert FILTERED(data, 0) == EXACT(data, 0)  # type: ignore[operator]


def test_re2_folds_ascii_letters_to_no_other_character_than_the_filter_lets_through() -> None:
    # Every code point (surrogates aside) that RE2's case-insensitive ASCII letters match.
    letters = re2.compile("(?i:[a-z])")
    text = "".join(chr(c) for c in range(0x80, sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF)
    assert "".join(sorted({m.group() for m in letters.finditer(text)})) == "".join(
        sorted(FOLDED_OUTSIDE_ASCII)
    )


def test_a_gate_outside_ascii_is_searched_by_re2_alone() -> None:
    pattern = json_gate(("secrets", "phone"))  # the phone gate has \\x{...} characters
    search = gate_search(pattern)
    assert not search.__qualname__.startswith("_filtered")


@pytest.mark.parametrize(
    ("pattern", "filtered"),
    [
        (r"AKIA[0-9A-Z]{16}", True),
        (r"(?i:secret)\\u", True),  # an escaped backslash before a 'u' is no escape
        (r"\x41\x7f", True),
        (r"caf\x{e9}", False),
        (r"\xe9", False),
        (r"\p{Nd}{4}", False),
        (r"\PL", False),
        (r"a\C", False),
        (r"\101", False),
        ("caf\u00e9", False),
    ],
)
def test_only_a_pattern_of_ascii_characters_gets_the_filter(pattern: str, filtered: bool) -> None:
    search = gate_search(pattern)
    assert search.__qualname__.startswith("_filtered") is filtered
