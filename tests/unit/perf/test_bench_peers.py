"""``make bench-peers``' pure parts: the peers' merge and its check, the clock's arithmetic,
the table and the goals, the Kafka Streams command line (the runs need a broker)."""

from __future__ import annotations

import json
import random
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl_export.local.synthetic import SHAPES, generate
from tests.perf.bench_peers import (
    GOAL_RATE,
    goal_lines,
    label,
    main,
    summarise,
    table,
    with_ratios,
)
from tests.perf.peers import kstreams
from tests.perf.peers.merge import check, expected_counts, merge
from tests.perf.peers.process import Sample, at, said, span

TYPES = ["trace.completed", "evaluation.finished", "label.submitted", "label.skipped"]


def fold(events: list[dict[str, Any]], *, stored: bool = True) -> dict[str, dict[str, Any]]:
    """What a peer's output ends with: each trace's events merged in the order given; with
    ``stored``, the state goes through JSON between events, as through a state store."""
    states: dict[str, dict[str, Any]] = defaultdict(dict)
    for event in events:
        state = states[event["trace_id"]]
        if stored:
            state = json.loads(json.dumps(state))
        states[event["trace_id"]] = merge(state, event)
    return dict(states)


events_st = st.lists(
    st.builds(
        lambda t, kind, n: {"trace_id": f"tr-{t}", "event_type": kind, "n": n},
        st.integers(0, 6), st.sampled_from(TYPES), st.integers(0, 99),
    ),
    min_size=1, max_size=60,
)  # fmt: skip


@given(events=events_st, seed=st.integers(0, 2**32))
def test_the_merge_of_every_event_in_any_order_checks_right(
    events: list[dict[str, Any]], seed: int
) -> None:
    shuffled = random.Random(seed).sample(events, len(events))
    checked = check(expected_counts(events), fold(shuffled))
    assert checked.ok
    assert checked.right == checked.traces == len({e["trace_id"] for e in events})
    assert checked.text() == f"{checked.traces:,} of {checked.traces:,} traces right"


@given(events=events_st, data=st.data())
def test_a_lost_or_a_repeated_event_makes_its_trace_wrong(
    events: list[dict[str, Any]], data: st.DataObject
) -> None:
    i = data.draw(st.integers(0, len(events) - 1))
    trace = events[i]["trace_id"]
    expected = expected_counts(events)
    for changed in (events[:i] + events[i + 1 :], [*events, events[i]]):
        checked = check(expected, fold(changed))
        assert not checked.ok
        assert checked.right == checked.traces - 1
        assert checked.wrong == 1
        assert checked.problems[0].startswith(f"{trace}: ")


def test_a_trace_merged_under_another_key_or_not_at_all_is_named() -> None:
    events = [{"trace_id": "tr-1", "event_type": "trace.completed"},
              {"trace_id": "tr-2", "event_type": "label.submitted"}]  # fmt: skip
    merged = fold(events)
    merged["tr-9"] = merged.pop("tr-2")
    checked = check(expected_counts(events), merged)
    assert (checked.right, checked.traces, checked.wrong) == (1, 2, 2)
    assert checked.problems == ["tr-2: no merged state",
                                "tr-9: merged, but no such trace in the backlog"]  # fmt: skip
    assert checked.text().startswith("1 of 2 traces right, 2 problems; the first: tr-2: no")


def test_the_benchs_own_backlog_merges_right_repeats_included() -> None:
    events = generate(40, seed=3, duplicate_rate=0.2, shape=SHAPES["small"])
    assert len({e["event_id"] for e in events}) < len(events)  # repeats are in it
    merged = fold(events)
    assert check(expected_counts(events), merged).ok
    deduplicated = list({e["event_id"]: e for e in events}.values())
    assert not check(expected_counts(events), fold(deduplicated)).ok


def test_the_merge_lays_the_events_fields_over_the_traces() -> None:
    state = merge({}, {"trace_id": "t", "event_type": "trace.completed", "messages": [1]})
    state = merge(state, {"trace_id": "t", "event_type": "label.submitted", "labeler": "ana"})
    assert state == {
        "trace_id": "t", "event_type": "label.submitted", "messages": [1], "labeler": "ana",
        "counts": {"trace.completed": 1, "label.submitted": 1},
    }  # fmt: skip


def s(t: float, own: float, broker: float = 0.0, busy: float = 0.0, total: float = 0.0) -> Sample:
    return Sample(t, own, broker, busy, total)


def test_the_counters_at_the_first_record_are_between_the_samples_around_it() -> None:
    samples = [s(10.0, 1.0, 5.0, 100.0, 200.0), s(10.5, 2.0, 6.0, 101.0, 201.0)]
    mid = at(samples, 10.125)
    assert (mid.own, mid.broker, mid.busy, mid.total) == (1.25, 5.25, 100.25, 200.25)
    assert at(samples, 9.0) == samples[0]
    assert at(samples, 11.0) == samples[-1]
    assert at(samples, 10.5) == samples[1]
    with pytest.raises(ValueError, match="no samples"):
        at([], 1.0)


@given(
    times=st.lists(st.floats(0, 1000), min_size=2, max_size=20, unique=True),
    moment=st.floats(0, 1000),
)
def test_interpolated_counters_never_leave_the_samples_range(
    times: list[float], moment: float
) -> None:
    samples = [s(t, t * 2) for t in sorted(times)]  # counters only grow
    got = at(samples, moment)
    assert samples[0].own <= got.own <= samples[-1].own
    assert got.own == pytest.approx(2 * min(max(moment, samples[0].at), samples[-1].at))


def test_a_span_is_what_was_used_between_two_readings() -> None:
    used = span(s(10.0, 1.0, 5.0, 100.0, 200.0), s(14.0, 3.0, 6.5, 103.0, 204.0))
    assert used == {
        "seconds": 4.0,
        "cpu_seconds": {"own": 2.0, "broker": 1.5},
        "machine_busy": 0.75,
    }


def test_what_a_process_said_is_its_json_lines_merged(tmp_path: Path) -> None:
    out = tmp_path / "peer.out"
    assert said(out) == {}
    out.write_text(
        '{"kafka_streams": "4.4.0"}\nSLF4J: a warning\n[1, 2]\n{"first_record_at": 2.5}\n'
    )
    assert said(out) == {"kafka_streams": "4.4.0", "first_record_at": 2.5}


def run(seconds: float, own: float, broker: float, rss: float, **more: Any) -> dict[str, Any]:
    return {
        "seconds": seconds, "cpu_seconds": {"own": own, "broker": broker},
        "machine_busy": 0.98, "start_seconds": 2.0, "peak_rss_mib": rss, **more,
    }  # fmt: skip


def rows() -> list[dict[str, Any]]:
    n = 100_000
    return with_ratios([
        summarise("worker", [run(10.0, 8.4, 1.5, 399.4), run(8.0, 8.0, 1.6, 380.0),
                             run(12.5, 9.0, 1.4, 390.0)], n),
        summarise("quix-0.1", [run(10.0, 5.9, 1.4, 398.0, output_seconds=9.0,
                                   said={"quixstreams": "3.28.1", "first_record_at": 1.0})], n),
        summarise("kstreams", [run(20.0, 22.9, 4.8, 2801.0, said={
            "kafka_streams": "4.4.0", "max_heap_mib": 6028, "stream_threads": 1,
            "commit_interval_ms": 100})], n),
    ])  # fmt: skip


def test_the_table_gives_medians_ranges_cpu_with_the_broker_apart_and_the_worker_share() -> None:
    lines = table(rows())
    assert lines[0] == (
        "| system | events/s (median, range) | CPU µs/event (+ broker) | peak RSS "
        "| of the worker | cores busy |"
    )
    assert lines[2] == (
        "| rl-export worker (join + sink to the store), exactly-once | 10,000 (8,000-12,500) "
        "| 84 (+15) | 399 MiB | 1.00 | 98 % |"
    )
    assert lines[3] == (
        "| Quix Streams 3.28.1, exactly-once, 0.1 s commits | 10,000 | 59 (+14) | 398 MiB "
        "| 1.00 | 98 % |"
    )
    assert lines[4].startswith(
        "| Kafka Streams 4.4.0, exactly_once_v2, defaults (1 stream thread, heap 6,028 MiB, "
        "commits 100 ms) | 5,000 | 229 (+48) | 2,801 MiB | 0.50 |"
    )


def test_a_row_says_the_threads_and_heap_it_ran_with() -> None:
    row = {"label": "Kafka Streams, exactly_once_v2, tuned", "said": {
        "kafka_streams": "3.9.1", "max_heap_mib": 512, "stream_threads": 2,
        "commit_interval_ms": 100}}  # fmt: skip
    assert label(row) == ("Kafka Streams 3.9.1, exactly_once_v2, tuned (2 stream threads, "
                          "heap 512 MiB, commits 100 ms)")  # fmt: skip
    assert label({"label": "bare"}) == "bare"


def test_without_a_worker_row_there_is_no_share_of_it() -> None:
    only = with_ratios([summarise("bare", [run(1.0, 0.5, 0.5, 100.0)], 1000)])
    assert only[0]["of_worker"] is None
    assert table(only)[2].endswith("| 100 MiB | - | 98 % |")
    assert goal_lines(only) == ["goals: not judged (they need the worker and quix-0.1 in the run)"]


@pytest.mark.parametrize(
    ("worker_cpu", "worker_rate", "cpu_verdict", "rate_verdict"),
    [
        (84.0, 13_619.0, "MISSED", "met"),  # issue 59's run: faster, but more CPU per event
        (59.0, 11_000.0, "MISSED", "MISSED"),  # level is not below
        (58.0, 12_000.0, "met", "met"),  # exactly 1.2 x is enough
        (40.0, 11_999.0, "met", "MISSED"),  # 1.20 x when rounded, and not enough
    ],
)
def test_the_goals_are_judged_against_quix_at_the_workers_commit_interval(
    worker_cpu: float, worker_rate: float, cpu_verdict: str, rate_verdict: str
) -> None:
    quix = {"system": "quix-0.1", "cpu_us_per_event": 59.0, "events_per_s": 10_000.0}
    worker = {"system": "worker", "cpu_us_per_event": worker_cpu, "events_per_s": worker_rate}
    cpu_line, rate_line = goal_lines([worker, quix])
    assert cpu_line.endswith(f"{worker_cpu:.1f} against 59.0 µs: {cpu_verdict}")
    assert rate_line.endswith(
        f"{worker_rate:,.0f} against 10,000, {worker_rate / 10_000:.2f} x: {rate_verdict}"
    )
    assert f"at least {GOAL_RATE} x" in rate_line


def test_kafka_streams_runs_with_its_defaults_or_tuned_as_its_users_would(tmp_path: Path) -> None:
    common: dict[str, Any] = {
        "bootstrap": "127.0.0.1:9092", "application_id": "a", "inputs": ["x", "y"],
        "output": "o", "state_dir": tmp_path,
    }  # fmt: skip
    defaults = kstreams.command(tmp_path / "b", **common)
    assert defaults[:2] == ["java", "-cp"]
    assert not any(a.startswith("-Xm") or a in ("--threads", "--commit-interval-ms")
                   for a in defaults)  # fmt: skip
    assert defaults[defaults.index("--inputs") + 1] == "x,y"
    tuned = kstreams.command(tmp_path / "b", heap="512m", threads=2, commit_interval_ms=100,
                             **common)  # fmt: skip
    assert tuned[1:3] == ["-Xms512m", "-Xmx512m"]
    assert tuned[-4:] == ["--threads", "2", "--commit-interval-ms", "100"]
    assert [kstreams.tuned_threads(p, c) for p, c in [(8, 2), (8, 16), (1, 4)]] == [2, 8, 1]


def test_the_kafka_streams_build_is_a_new_folder_for_another_source_or_version(
    tmp_path: Path,
) -> None:
    project = tmp_path / "peers"
    shutil.copytree(kstreams.PROJECT, project, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    first = kstreams.digest(project)
    assert kstreams.digest(project) == first
    assert kstreams.digest(project, "3.9.1") != first
    java = next((project / "src").rglob("MergeJoin.java"))
    java.write_text(java.read_text() + "\n")
    assert kstreams.digest(project) != first


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--systems", "worker,flink"], "unknown system 'flink'"),
        (["--systems", ","], "unknown system '(none)'"),
        (["--systems", "worker,worker"], "a system named twice"),
        (["--rounds", "0"], "--rounds must be at least 1"),
        (["--traces", "0"], "--traces must be at least 1"),
        (["--systems", "quix-5", "--peers-python", "/nonexistent/python"], "make bench-peers"),
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
