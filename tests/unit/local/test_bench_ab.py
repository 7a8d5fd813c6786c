"""``make bench-ab``'s variants and the order of its rounds (the runs need a broker)."""

from __future__ import annotations

import pytest

from rl_export.local.bench_ab import Variant, main, parse_variant, rotated


def test_a_variant_is_settings_validated_as_the_worker_would_and_environment() -> None:
    variant = parse_variant(" join_processes=1, join_batch_bytes=0,env:MALLOC_ARENA_MAX=2 ")
    assert variant.settings == {"join_processes": 1, "join_batch_bytes": 0}
    assert variant.env == {"MALLOC_ARENA_MAX": "2"}
    assert variant.label == "join_processes=1, join_batch_bytes=0,env:MALLOC_ARENA_MAX=2"
    assert parse_variant("") == Variant("")
    assert parse_variant("").label == "(defaults)"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("join_processes", "is not name=value"),
        ("=1", "is not name=value"),
        ("joins=2", "'joins' is not a setting"),
        ("join_processes=two", "valid integer"),
        ("join_processes=-1", "greater than or equal to 0"),
        ("processing_guarantee=sometimes", "'exactly_once' or 'at_least_once'"),
        ("env:=1", "names no environment variable"),
    ],
)
def test_a_wrong_variant_says_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_variant(text)


def test_each_round_starts_one_place_further_along() -> None:
    assert [rotated(["a", "b", "c"], r) for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--variant", ""], "at least two --variant"),
        (["--variant", "", "--variant", "joins=2"], "--variant 'joins' is not a setting"),
        (["--variant", "", "--variant", "join_processes=1", "--runs", "0"], "--runs must be"),
    ],
)
def test_bad_arguments_exit_2_with_a_message_and_start_nothing(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
