"""The model ``make bench-tenants`` prints beside its measurements and extrapolates with."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.perf.bench_tenants import kind_of, simulate


def test_a_commit_per_chain_grows_with_tenants_until_every_line_is_a_commit() -> None:
    few, many, most = (simulate(n, 20, 600, 10, 8)["objects_per_event"] for n in (10, 200, 1000))
    assert few < many <= most
    # Each trace: two lines (traces, evaluator) from two events; a commit of one line writes
    # two objects, so two per event is the ceiling.
    assert most == pytest.approx(2.0)


def test_quiet_chains_waiting_write_fewer_objects_and_wait_at_most_their_bound() -> None:
    plain = simulate(200, 20, 1800, 10, 8)
    held = simulate(200, 20, 1800, 10, 8, quiet_age=120)
    assert held["objects_per_event"] < 1 < plain["objects_per_event"]
    assert plain["wait_p99_s"] <= 10
    assert held["wait_p99_s"] == pytest.approx(120, abs=0.1)  # at the first trace after


def test_commits_holding_their_lines_halve_the_objects_of_the_two_minutes_run() -> None:
    """The issue's shape: 200 projects, a trace and its evaluation each every 10 s, for two
    minutes with their last lines committed: each chain touched commits at least once, two
    objects each (over one a event) unless a commit holds its lines."""
    two = simulate(200, 20, 120, 10, 8, quiet_age=120)
    one = simulate(200, 20, 120, 10, 8, quiet_age=120, inline=True)
    assert two["objects_per_event"] > 1
    assert one["objects_per_event"] == pytest.approx(two["objects_per_event"] / 2)
    assert one["objects_per_event"] < 0.6


def test_objects_per_partition_do_not_grow_with_tenants() -> None:
    counts = {simulate(n, 20, 600, 10, 8, per_partition=True)["objects"] for n in (10, 10_000)}
    assert len(counts) == 1
    assert counts.pop() <= 2 * 8 * (600 / 10 + 1)  # two a partition a commit


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("acme/bot/traces/_manifest/trajectories-1/00000000000000000042.json", "commit entries"),
        ("acme/bot/traces/_compacted/00000000000000000002/_compaction.json", "compaction"),
        ("acme/bot/traces/data/trajectories-1/00000000000000000042-ab.jsonl", "data shards"),
        ("acme/bot/traces/data/trajectories-1/00000000000000000042-ab.parquet", "index sidecars"),
        ("_erasures/acme/bot/trajectories-1/00000000000000000042.dHI.json", "erasure entries"),
        ("acme/bot/traces/_table/_delta_log/00000000000000000003.json", "open tables"),
    ],
)
def test_store_files_are_counted_by_kind(path: str, kind: str) -> None:
    assert kind_of(Path(path)) == kind
