"""The default ``secrets`` redaction replaces whole credentials of the formats in common use
and leaves look-alikes alone (DESIGN.md section 10), on the set of
:mod:`tests.unit.privacy.secret_cases` (synthetic values)."""

from __future__ import annotations

import pytest

from rl_export.privacy.redact import redactor
from tests.unit.privacy.secret_cases import BENIGN, CREDENTIALS, measure, replaced_whole


def scrub(text: str) -> str:
    return redactor(("secrets",)).text(text)[0]


def test_the_set_is_large_enough() -> None:
    assert len({name for name, *_ in CREDENTIALS}) >= 40
    assert len(BENIGN) >= 20


def test_at_least_95_percent_are_replaced_whole_and_no_look_alike_changes() -> None:
    missed, changed = measure(scrub)
    assert len(missed) <= 0.05 * len(CREDENTIALS), missed
    assert changed == []


@pytest.mark.parametrize(("name", "before", "secret", "after"), CREDENTIALS,
                         ids=[c[0] for c in CREDENTIALS])  # fmt: skip
def test_each_format(name: str, before: str, secret: str, after: str) -> None:
    assert replaced_whole(scrub(before + secret + after), before, secret, after), name


def test_no_tail_is_left_of_a_longer_key() -> None:
    # bc-detect-secrets' Stripe pattern takes 24 characters: the rest is the same token.
    key = "rk_live_" + "Ab1" * 30
    assert scrub(f"key {key}.") == "key [REDACTED:SECRETS]."


def test_the_measure_can_fail() -> None:
    _, before, secret, after = CREDENTIALS[0]
    assert not replaced_whole(before + secret + after, before, secret, after)
    assert not replaced_whole(f"{before}[REDACTED:SECRETS]{secret[-8:]}{after}", before,
                              secret, after)  # fmt: skip
    assert measure(lambda text: text) == ([c[0] for c in CREDENTIALS], [])
