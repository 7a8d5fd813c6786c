"""``make bench-ab``'s variants and the order of its rounds (the runs need a broker)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.perf.bench_ab import Variant, main, parse_variant, print_table, rotated
from tests.perf.significance import compare


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


def test_the_table_gives_each_process_peak_beside_their_sum(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def variant(text: str, rate: float, parts: list[float]) -> dict[str, Any]:
        return {
            "variant": text, "events_per_s": rate, "runs": [rate, rate * 2, rate / 2],
            "cpu_us_per_event": {"join": 60.0, "worker": 20.0, "broker": 10.0},
            "peak_rss_mib": sum(parts), "peak_rss_parts_mib": parts,
        }  # fmt: skip

    result = {
        "shape": "small", "events": 110_079, "avg_event_bytes": 727.0, "rounds": 3,
        "variants": [variant("", 10_000.0, [150.2, 180.0, 170.6]),
                     variant("state_cache_mib=4", 12_000.0, [140.0, 150.0, 149.4])],
    }  # fmt: skip
    print_table(result, tmp_path / "ab.json")
    out = capsys.readouterr().out
    assert "(defaults)\n    10,000 events/s (10,000 / 20,000 / 5,000)\n" in out
    assert "state_cache_mib=4\n    12,000 events/s (12,000 / 24,000 / 6,000)\n" in out
    assert "peak RSS 501 MiB (worker with the sink 150, join processes 180 + 171)" in out
    assert "peak RSS 439 MiB (worker with the sink 140, join processes 150 + 149)" in out


def test_later_variants_are_compared_with_the_first_in_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def variant(text: str, runs: list[float], vs: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "variant": text, "events_per_s": runs[1], "runs": runs,
            "cpu_us_per_event": {"join": 60.0, "worker": 20.0, "broker": 10.0},
            "peak_rss_mib": 400.0, "peak_rss_parts_mib": [150.0, 125.0, 125.0],
            **({"vs_first": vs} if vs else {}),
        }  # fmt: skip

    control, tried = [1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]
    vs = {"events_per_s": compare(control, tried), "cpu_us_per_event": compare(tried, control)}
    result = {
        "shape": "small", "events": 110_079, "avg_event_bytes": 727.0, "rounds": 4,
        "variants": [variant("", control, None), variant("join_processes=3", tried, vs)],
    }  # fmt: skip
    print_table(result, tmp_path / "ab.json")
    out = capsys.readouterr().out
    assert "against the first: events/s 2.60 (p=0.029), CPU per event 0.38 (p=0.029)" in out
    assert out.count("against the first") == 1
