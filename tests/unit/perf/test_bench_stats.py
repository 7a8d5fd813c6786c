"""The arithmetic ``make bench`` reports with: histogram readings and their quantiles."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from rl_export.runtime.settings import Settings
from tests.harness.usage import busy_share, machine_cpu
from tests.perf.bench import histogram, quantile


def reading(values: list[float], registry: CollectorRegistry | None = None) -> str:
    registry = registry or CollectorRegistry()
    h = Histogram("x_seconds", "x", buckets=(0.1, 0.5, 1.0), registry=registry)
    for v in values:
        h.observe(v)
    return generate_latest(registry).decode()


def test_histogram_reads_cumulative_buckets_with_inf() -> None:
    assert histogram(reading([0.05, 0.3, 0.3, 2.0]), "x_seconds") == [
        (0.1, 1.0), (0.5, 3.0), (1.0, 3.0), (math.inf, 4.0),
    ]  # fmt: skip


def test_quantile_interpolates_inside_the_bucket_of_the_rank() -> None:
    after = [(0.1, 0.0), (0.5, 4.0), (1.0, 4.0), (math.inf, 4.0)]
    assert quantile([], after, 0.5) == 0.1 + (0.5 - 0.1) * 0.5  # rank 2 of 4 in (0.1, 0.5]
    assert quantile([], after, 1.0) == 0.5


def test_quantile_counts_only_what_happened_between_two_readings() -> None:
    before = [(0.1, 10.0), (0.5, 10.0), (1.0, 10.0), (math.inf, 10.0)]  # ten fast ones, earlier
    after = [(0.1, 10.0), (0.5, 10.0), (1.0, 12.0), (math.inf, 12.0)]  # then two slow ones
    assert 0.5 < quantile(before, after, 0.5) <= 1.0


def test_quantile_of_nothing_is_nan_and_beyond_the_last_bound_is_that_bound() -> None:
    assert math.isnan(quantile([], [(0.1, 0.0), (math.inf, 0.0)], 0.5))
    assert quantile([], [(0.1, 0.0), (1.0, 0.0), (math.inf, 3.0)], 0.99) == 1.0


def test_a_bench_worker_gets_only_the_settings_that_differ_from_the_defaults() -> None:
    """So a worker of an older checkout (``--baseline-python``) accepts the environment."""
    from pathlib import Path

    from rl_export.runtime.settings import Settings
    from tests.perf.bench import worker_env

    settings = Settings(app_id="bench-x-join", shard_max_age_s=1.0)
    env = worker_env(settings, 7000, Path("/tmp/w"))
    ours = {k: v for k, v in env.items() if k.startswith("RL_EXPORT_")}
    assert ours == {
        "RL_EXPORT_APP_ID": "bench-x-join",
        "RL_EXPORT_SHARD_MAX_AGE_S": "1.0",
        "RL_EXPORT_WORKER_WEB_PORT": "7000",
        "RL_EXPORT_DATA_DIR": "/tmp/w",
    }


def test_peak_rss_is_read_per_process_and_printed_with_its_parts() -> None:
    import os
    import subprocess
    import sys

    from tests.harness.usage import peak_rss_parts_mib
    from tests.perf.bench import rss_text

    child = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"up\n"
        parts = peak_rss_parts_mib(os.getpid())
    finally:
        child.kill()
        child.communicate()
    assert len(parts) >= 2  # this process, then its child (and any other children)
    assert all(p > 1 for p in parts)
    assert rss_text(495.2, [137.0, 183.4, 175.0]) == (
        "495 MiB (worker with the sink 137, join processes 183 + 175)"
    )
    assert rss_text(100.0, [100.0]) == "100 MiB (worker with the sink 100, join processes none)"


def test_the_highest_peak_rss_is_the_run_with_the_highest_sum() -> None:
    from tests.perf.bench import highest_rss

    runs = [
        {"peak_rss_parts_mib": [[100.0, 200.0, 150.0], [90.0]]},
        {"peak_rss_parts_mib": [[140.0, 180.0, 170.0], [300.0]]},  # 490: the highest
        {"peak_rss_parts_mib": [[150.0, 190.0, 100.0]]},  # the largest first process alone
    ]
    assert highest_rss(runs) == [140.0, 180.0, 170.0]


def test_the_baseline_line_says_whether_the_runs_apart_show_a_difference() -> None:
    from tests.perf.bench import shape_rows
    from tests.perf.significance import compare

    cpu = {"join": 60.0, "worker": 20.0, "broker": 10.0}
    rss = {"mib": 400.0, "parts": [150.0, 125.0, 125.0]}
    mine, theirs = [8_000.0, 12_000.0, 10_000.0], [9_000.0, 11_000.0, 10_500.0]
    r = {
        "shape": "small", "events": 110_079, "avg_event_bytes": 727.0, "org_projects": 3,
        "backlog_mib": 76.0, "runs": 3,
        "bare_consumer_events_per_s": 70_000.0, "bare_consumer_runs": [70_000.0] * 3,
        "bare_consumer_join_seconds": 3.0,
        "bare_default_events_per_s": 50_000.0, "bare_default_runs": [50_000.0] * 3,
        "worker_vs_bare_default": 0.2, "baseline_worker_start_seconds": 3.5,
        "baseline_worker_vs_bare_default": 0.21, "baseline_worker_vs_bare": 0.15,
        "worker_events_per_s": 10_000.0, "worker_runs": mine, "worker_start_seconds": 2.0,
        "worker_vs_bare": 0.143, "worker_peak_rss_mib": rss["mib"],
        "worker_peak_rss_parts_mib": rss["parts"], "worker_cpu_us_per_event": cpu,
        "at_least_once_events_per_s": 11_000.0, "at_least_once_runs": [11_000.0] * 3,
        "exactly_once_vs_at_least_once": 0.91, "at_least_once_cpu_us_per_event": cpu,
        "baseline_worker_events_per_s": 10_500.0, "baseline_worker_runs": theirs,
        "baseline_worker_peak_rss_mib": rss["mib"],
        "baseline_worker_peak_rss_parts_mib": rss["parts"],
        "baseline_worker_cpu_us_per_event": cpu, "worker_vs_baseline_worker": 10_000 / 10_500,
        "worker_vs_baseline_worker_test": compare(theirs, mine),
        "two_workers_events_per_s": 15_000.0, "two_workers_runs": [15_000.0] * 3,
        "two_vs_one": 1.5,
    }  # fmt: skip
    rows = shape_rows(r)
    line = dict(rows)["    this worker / baseline worker"]
    assert line == "0.95 (the medians); runs apart: ~ (p=1.000)"
    # Both workers' ratios to both bare consumers: this one's, then the baseline's.
    ratios = [b for a, b in rows if a == "    ratio to the bare consumer (default / tuned)"]
    assert ratios == ["0.200 / 0.143  (goal 0.15 / -)", "0.210 / 0.150"]
    assert dict(rows)["    ready after"] == "3.5 s"
    reference = "  bare consumer, max_records default (the reference), median of 3"
    assert dict(rows)[reference].startswith("50,000 events/s")


@pytest.mark.parametrize(
    ("compiled", "most", "expected"),
    [
        ([4.9, 2.0, 0.3, 9.0], 8, [4.9, 2.0, 0.3]),  # settled at the third
        ([4.9, 2.0, 1.5, 1.0], 2, [4.9, 2.0]),  # not settled, stopped at the most
        ([], 0, []),  # --warm-up 0
    ],
)
def test_warm_up_runs_untimed_catch_ups_until_the_jit_settles(
    compiled: list[float], most: int, expected: list[float],
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:  # fmt: skip
    from tests.perf import bench

    clock = iter([sum(compiled[:i]) for i in range(len(compiled) + 1) for _ in (0, 1)][1:])
    ran: list[str] = []
    made: list[Path] = []

    async def catch_up(settings: Settings, workers: int, data_dir: Path) -> dict[str, Any]:
        ran.append(settings.sink_group)
        made.append(data_dir)
        return {}

    monkeypatch.setattr(bench, "catch_up", catch_up)
    monkeypatch.setattr(bench, "compiler_cpu", lambda pid: next(clock))
    settings = Settings(kafka_bootstrap="127.0.0.1:1", store_url=str(tmp_path / "store"))
    got = asyncio.run(bench.warm_up(settings, tmp_path, 4242, most))
    assert got == pytest.approx(expected)
    assert len(set(ran)) == len(expected)  # each on fresh groups
    assert all("warm" in p.name for p in made)


def test_the_table_says_how_the_broker_was_warmed_up() -> None:
    from tests.perf.bench import warm_up_text

    assert warm_up_text([4.9, 2.04, 0.3]) == (
        "3 catch-ups; JIT compiler CPU in each: 4.9, 2.0, 0.3 s"
    )
    assert warm_up_text([4.9, 2.0]).endswith(", not yet under 0.5 s")
    assert warm_up_text([]).startswith("none (--warm-up 0)")


def test_busy_share_is_the_busy_part_of_the_cores_time_between_two_readings() -> None:
    assert busy_share((10.0, 100.0), (25.0, 120.0)) == 0.75  # 15 busy of 20 core-seconds
    assert busy_share((10.0, 100.0), (10.0, 100.0)) == 0.0  # no time passed


def test_machine_cpu_counts_a_busy_loop_as_busy() -> None:
    """Half a second of spinning on one core shows as at least 0.4 s of busy time (the other
    cores may add theirs), never more than the time that passed on all cores."""
    before = machine_cpu()
    started = time.process_time()
    while time.process_time() - started < 0.5:
        pass
    after = machine_cpu()
    busy, total = after[0] - before[0], after[1] - before[1]
    assert busy >= 0.4
    assert busy <= total + 1e-6  # seconds from ticks: the two differences round apart
    assert 0 < busy_share(before, after) <= 1
