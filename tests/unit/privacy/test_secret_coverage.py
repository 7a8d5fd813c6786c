"""The default ``secrets`` redaction replaces whole credentials of the formats in common use,
keeps the text around them, and leaves look-alikes and prose alone (DESIGN.md section 10), on
the set of :mod:`tests.unit.privacy.secret_cases` (synthetic values of our own making)."""

from __future__ import annotations

import pytest

from rl_export.privacy.redact import redactor
from tests.unit.privacy.secret_cases import (
    CREDENTIALS,
    LOOK_ALIKES,
    PROSE,
    REPORTED,
    Case,
    context_kept,
    formats,
    measure,
    replaced_whole,
)


def scrub(text: str) -> str:
    return redactor(("secrets",)).text(text)[0]


def test_the_set_is_large_enough() -> None:
    assert formats(CREDENTIALS) >= 60
    assert len(LOOK_ALIKES) >= 30
    assert len(PROSE) >= 20
    assert not {name for name, *_ in CREDENTIALS} & {name for name, *_ in REPORTED}


def test_at_least_95_percent_whole_and_nothing_else_changed() -> None:
    result = measure(scrub)
    assert len(result["missed"]) <= 0.05 * len(CREDENTIALS), result["missed"]
    assert result["context_changed"] == []
    assert result["look_alikes_changed"] == []
    assert result["prose_changed"] == []


@pytest.mark.parametrize("case", CREDENTIALS + REPORTED, ids=[c[0] for c in CREDENTIALS + REPORTED])
def test_each_format(case: Case) -> None:
    name, before, secret, after = case
    out = scrub(before + secret + after)
    assert replaced_whole(out, before, secret, after), (name, out)
    assert context_kept(out, before, after), (name, out)


@pytest.mark.parametrize("text", PROSE)
def test_prose_is_unchanged(text: str) -> None:
    assert scrub(text) == text


@pytest.mark.parametrize(("name", "text"), LOOK_ALIKES, ids=[n for n, _ in LOOK_ALIKES])
def test_look_alikes_are_unchanged(name: str, text: str) -> None:
    assert scrub(text) == text, name


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("Set token_limit = 4096 and retry", None),
        ("Your password: must be at least 12 characters", None),
        ("The secret: keep retries low", None),
        ("password: Tr0ub4dor&3x and then we log in",
         "password: [REDACTED:SECRETS] and then we log in"),
        ("jdbc:mysql://db:3306/app?user=app&password=Tr0ub4dor3x&useSSL=true",
         "jdbc:mysql://db:3306/app?user=app&password=[REDACTED:SECRETS]&useSSL=true"),
        ("host=db user=app password=Tr0ub4dor3x dbname=app",
         "host=db user=app password=[REDACTED:SECRETS] dbname=app"),
        ("Server=db;User Id=app;Password=Tr0ub4dor3x;Encrypt=True",
         "Server=db;User Id=app;Password=[REDACTED:SECRETS];Encrypt=True"),
        ("retries = 12 and key = value", None),
    ],
)  # fmt: skip
def test_an_assignment_replaces_its_value_only(text: str, kept: str | None) -> None:
    assert scrub(text) == (text if kept is None else kept)


def test_no_tail_is_left_of_a_longer_key() -> None:
    key = "rk_live_" + "Ab1" * 30
    assert scrub(f"key {key}.") == "key [REDACTED:SECRETS]."


def test_the_measure_can_fail() -> None:
    _, before, secret, after = CREDENTIALS[0]
    assert not replaced_whole(before + secret + after, before, secret, after)
    assert not replaced_whole(f"{before}[REDACTED:SECRETS]{secret[-8:]}{after}", before,
                              secret, after)  # fmt: skip
    assert not context_kept("[REDACTED:SECRETS]", before, after)
    result = measure(lambda text: text)
    assert result["missed"] == [c[0] for c in CREDENTIALS]
    assert measure(lambda text: "x")["look_alikes_changed"] == [n for n, _ in LOOK_ALIKES]
