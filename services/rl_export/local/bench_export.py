"""``make bench-export`` (and ``make bench``): exports of a corpus of 1,000,000 records.

1. Build the corpus once, the real way, and cache it under ``var/bench/export-corpus-...``
   (keyed by its parameters; ``done.json`` marks it complete): synthetic traces that are
   all evaluated (multi-turn conversations with tool calls, reports with outcomes and
   assessments, a third with a human label, one in a hundred deleted) go through ``replay``
   (the join and the sink) into the ``evaluator`` corpus, in chunks of 50,000 traces (each
   chunk a replay run with chains of its own); after the first two chunks the corpus is
   compacted, so an export reads a compaction and a tail of commits after it, as in
   production. Its latest view holds exactly ``--records`` live records.
2. Export it with ``rl-export export`` in a child process, per case: ``trajectory`` JSON
   Lines, ``messages`` with ``--passed true``, and CSV with chosen columns (and, with
   ``--all``, ``executions``, Parquet and ``preference``). Wall time, records/s, CPU time
   and the child's peak RSS (its own VmHWM) are measured.
3. Profile each case once more under cProfile and report where the time goes.
4. Backfill (``--backfill``): a ``traces`` corpus whose one chain holds the history of
   ``--history`` traces (one partition's share of a large deployment; built once through
   replay and cached), then, in a child process, a new corpus (``messages`` of passed
   evaluator trajectories) seeded from it as the sink seeds it: seconds, records/s, peak RSS.

Results are printed and written as JSON to ``var/bench/export-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile  # noqa: F401 - named here so readers know what profiles; run as a module
import json
import os
import pstats
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from rl_export.common.codec import dumps
from rl_export.common.settings import load_settings
from rl_export.common.specs import CorpusSpec
from rl_export.corpora.compaction import compact
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.replay import replay
from rl_export.corpora.store import LocalStore
from rl_export.local.synthetic import scored_trace_events

ORG, PROJECT, SOURCE = "acme", "support-bot", "evaluator"
CHUNK = 50_000
COMPACT_AFTER_CHUNKS = 2
VERSION = 1  # bump when the corpus's recipe changes, so caches are rebuilt
CSV_COLUMNS = (
    "trace_id,scenario,agent_version,reward,passed,rubric.safety:safety,"
    "evaluator_scores.faithfulness:faithfulness,updated_at"
)


def log(message: str) -> None:
    print(f"[bench-export {time.strftime('%H:%M:%S')}] {message}", flush=True)


def corpus_dir(base: Path, records: int, seed: int, partitions: int) -> Path:
    return base / f"export-corpus-r{records}-s{seed}-p{partitions}-v{VERSION}"


def _events(first: int, count: int, seed: int) -> Iterator[tuple[str, bytes]]:
    """The event lines of traces ``first`` .. ``first + count - 1`` (trace i deleted iff
    i % 100 == 99)."""
    rng = random.Random(seed * 1_000_003 + first)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for index in range(first, first + count):
        at = start + timedelta(seconds=index)
        for event in scored_trace_events(rng, index, at, deleted=index % 100 == 99):
            yield f"trace {index}", dumps(event)


def traces_for(records: int) -> int:
    """How many traces give ``records`` live ones when one in a hundred is deleted."""
    n = records + records // 99
    while n - n // 100 < records:
        n += 1
    while n - 1 - (n - 1) // 100 >= records:
        n -= 1
    return n


async def build_corpus(directory: Path, records: int, seed: int, partitions: int) -> dict[str, Any]:
    """Step 1 (cached)."""
    done = directory / "done.json"
    if done.exists():
        info: dict[str, Any] = json.loads(done.read_text())
        log(f"corpus cached in {directory} (built in {info['build_s']:.0f} s)")
        return info
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    store = LocalStore(directory / "store")
    settings = load_settings(
        partitions=partitions,
        shard_max_records=10_000,
        corpora=(CorpusSpec(name=SOURCE, source="evaluator"),),
    )
    traces = traces_for(records)
    started = time.monotonic()
    lines = snapshots = 0
    for n, first in enumerate(range(0, traces, CHUNK)):
        count = min(CHUNK, traces - first)
        report = await replay(settings, store, _events(first, count, seed), run_id=f"c{n:03d}")
        lines += report.lines
        snapshots += report.snapshots
        if sum(report.invalid.values()):
            raise RuntimeError(f"the bench's events were rejected: {report.examples[:3]}")
        log(f"chunk {n}: traces {first}..{first + count - 1}, {lines} events so far, "
            f"{time.monotonic() - started:.0f} s")  # fmt: skip
        if n + 1 == COMPACT_AFTER_CHUNKS:
            made = await compact(store, CorpusRef(ORG, PROJECT, SOURCE), writer="bench")
            log(f"compacted: generation {made.generation if made else '-'}, "
                f"{made.records if made else 0} records")  # fmt: skip
    info = {
        "records": records,
        "traces": traces,
        "events": lines,
        "snapshots": snapshots,
        "seed": seed,
        "partitions": partitions,
        "build_s": time.monotonic() - started,
        "bytes": sum(p.stat().st_size for p in (directory / "store").rglob("*") if p.is_file()),
    }
    done.write_text(json.dumps(info, indent=2))
    log(f"corpus built in {info['build_s']:.0f} s: {info}")
    return info


CASES: dict[str, list[str]] = {
    "trajectory": ["--format", "trajectory"],
    "messages --passed true": ["--format", "messages", "--passed", "true"],
    "csv (8 columns)": ["--format", "csv", "--columns", CSV_COLUMNS],
}
MORE_CASES: dict[str, list[str]] = {
    "executions": ["--format", "executions"],
    "parquet (8 columns)": ["--format", "parquet", "--columns", CSV_COLUMNS],
    "preference --pair-by scenario": ["--format", "preference", "--pair-by", "scenario"],
}


def _export_argv(store: Path, args: list[str], out: Path) -> list[str]:
    return [
        "export", "--store", str(store), "--org", ORG, "--project", PROJECT,
        "--source", SOURCE, *args, "-o", str(out),
    ]  # fmt: skip


# The child reports its own peak RSS (VmHWM of its address space). The rusage of a child
# is no good here: Linux carries the parent's peak into the child across fork and exec.
_CHILD = (
    "import sys\n"
    "from rl_export.cli import main\n"
    "try:\n"
    "    code = main(sys.argv[1:])\n"
    "finally:\n"
    "    hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')]\n"
    "    sys.stderr.write('bench-export-vmhwm-kib: ' + hwm[0].split()[1] + '\\n')\n"
    "sys.exit(code)\n"
)


def measure(store: Path, args: list[str], out: Path) -> dict[str, Any]:
    """Step 2 for one case: a child process, timed; its peak RSS as it reports it."""
    argv = [sys.executable, "-c", _CHILD, *_export_argv(store, args, out)]
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.monotonic() - started
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"export failed ({proc.returncode}): {stderr.strip()}")
    lines = stderr.strip().splitlines()
    peak_kib = int(lines[-1].split(": ")[1])
    note = lines[-2]
    rows = int(note.split()[1])
    return {
        "rows": rows,
        "seconds": elapsed,
        "records_per_s": rows / elapsed,
        "peak_rss_mib": peak_kib / 1024,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "bytes": out.stat().st_size,
        "note": note,
    }


def profile(store: Path, args: list[str], out: Path, where: Path) -> list[dict[str, Any]]:
    """Step 3 for one case: cProfile in a child; the top functions by own time."""
    argv = [sys.executable, "-m", "cProfile", "-o", str(where), "-m", "rl_export.cli",
            *_export_argv(store, args, out)]  # fmt: skip
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stats = pstats.Stats(str(where))
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = []
    for (file, line, name), (_, calls, own, cumulative, _) in sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda item: -item[1][2],
    )[:10]:
        rows.append({
            "function": f"{Path(file).name}:{line}({name})" if line else name,
            "calls": calls, "own_s": own, "cumulative_s": cumulative,
            "own_share": own / total if total else 0.0,
        })  # fmt: skip
    return rows


async def build_history(directory: Path, traces: int, seed: int) -> dict[str, Any]:
    """Step 4's seed corpus (cached): ``traces`` with one chain of ``traces`` traces."""
    done = directory / "done.json"
    if done.exists():
        info: dict[str, Any] = json.loads(done.read_text())
        return info
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    settings = load_settings(
        partitions=1, shard_max_records=10_000, corpora=(CorpusSpec(name="traces", source=None),)
    )
    started = time.monotonic()
    report = await replay(settings, LocalStore(directory / "store"),
                          _events(0, traces, seed), run_id="history")  # fmt: skip
    info = {"traces": traces, "events": report.lines, "snapshots": report.snapshots,
            "build_s": time.monotonic() - started}  # fmt: skip
    done.write_text(json.dumps(info, indent=2))
    log(f"history built: {info}")
    return info


async def _seed_once(store_dir: Path) -> dict[str, Any]:
    """One seed of a new corpus from the history (run in a child process)."""
    from rl_export.corpora.backfill import seed_chain
    from rl_export.corpora.layout import ChainState

    store = LocalStore(store_dir)
    name = f"sft-{os.getpid()}"
    spec = CorpusSpec.model_validate(
        {"name": name, "source": "evaluator", "format": "messages", "filter": {"passed": True}}
    )
    started = time.monotonic()
    state = await seed_chain(
        store, CorpusRef(ORG, PROJECT, name), spec, CorpusRef(ORG, PROJECT, "traces"),
        ChainState(), stream="replay-history-0", belongs=lambda _: True,
        keep=lambda _state, _t, _r, deleted: not deleted, compression="none", writer="bench",
    )  # fmt: skip
    elapsed = time.monotonic() - started
    keys = await store.list(f"{ORG}/{PROJECT}/{name}/")
    commit = json.loads(await store.get(next(k for k in keys if "/_manifest/" in k)))
    for key in keys:
        await store.delete(key)
    return {"seconds": elapsed, "head": state.head, "records": commit["records"],
            "bytes": commit["bytes"]}  # fmt: skip


def measure_backfill(base: Path, history: int, seed: int) -> dict[str, Any]:
    """Step 4."""
    directory = base / f"export-history-t{history}-s{seed}-v{VERSION}"
    info = asyncio.run(build_history(directory, history, seed))
    code = (
        "import asyncio, json, sys\n"
        "from pathlib import Path\n"
        "from rl_export.local.bench_export import _seed_once\n"
        "result = asyncio.run(_seed_once(Path(sys.argv[1])))\n"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')]\n"
        "result['peak_rss_mib'] = int(hwm[0].split()[1]) / 1024\n"
        "print(json.dumps(result))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(directory / "store")], check=True,
                         capture_output=True)  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout)
    result["history_traces"] = info["traces"]
    result["history_records_per_s"] = info["snapshots"] / result["seconds"]
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(args.dir)
    directory = corpus_dir(base, args.records, args.seed, args.partitions)
    corpus = asyncio.run(build_corpus(directory, args.records, args.seed, args.partitions))
    store = directory / "store"
    cases = dict(CASES) | (MORE_CASES if args.all else {})
    if args.only:
        cases = {k: v for k, v in cases.items() if k.split()[0] in args.only}
    results: dict[str, Any] = {}
    out_dir = base / "export-out"
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, case in cases.items():
        out = out_dir / ("out." + case[1])
        runs = []
        for n in range(args.runs):
            log(f"{name}: run {n + 1} of {args.runs}")
            runs.append(measure(store, case, out))
        best = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
        result = {**best, "runs": [r["seconds"] for r in runs]}
        if args.profile:
            log(f"{name}: profiling")
            result["profile"] = profile(store, case, out, out_dir / "profile.out")
        results[name] = result
        out.unlink(missing_ok=True)
    backfill = measure_backfill(base, args.history, args.seed) if args.backfill else None
    return {
        "at": datetime.now(UTC).isoformat(),
        "corpus": corpus,
        "cases": results,
        "backfill": backfill,
        "targets": {"trajectory_records_per_s": 100_000, "peak_rss_mib": 200},
    }


def print_table(result: dict[str, Any], path: Path) -> None:
    corpus = result["corpus"]
    print()
    print(f"export benchmark: {corpus['records']:,} live records ({corpus['traces']:,} traces, "
          f"{corpus['snapshots']:,} snapshots, {corpus['bytes'] / 2**30:.2f} GiB on disk; "
          f"built in {corpus['build_s']:.0f} s)")  # fmt: skip
    print(f"{'case':28} {'rows':>10} {'seconds':>8} {'records/s':>10} {'peak RSS':>10}")
    for name, r in result["cases"].items():
        print(f"{name:28} {r['rows']:>10,} {r['seconds']:>8.1f} {r['records_per_s']:>10,.0f} "
              f"{r['peak_rss_mib']:>7.0f} MiB")  # fmt: skip
    trajectory = result["cases"].get("trajectory")
    if trajectory:
        worst = max(r["peak_rss_mib"] for r in result["cases"].values())
        print(f"trajectory vs the 100,000 records/s target: "
              f"{trajectory['records_per_s'] / 100_000:.2f} x; worst peak RSS vs 200 MiB: "
              f"{worst / 200:.2f} x")  # fmt: skip
    for name, r in result["cases"].items():
        if "profile" in r:
            print(f"where the time goes, {name} (own time, top 5):")
            for p in r["profile"][:5]:
                print(f"  {p['own_share']:6.1%}  {p['function']}")
    backfill = result.get("backfill")
    if backfill:
        print(f"backfill: a new messages corpus seeded from a traces chain of "
              f"{backfill['history_traces']:,} traces in {backfill['seconds']:.1f} s "
              f"({backfill['history_records_per_s']:,.0f} history records/s, "
              f"{backfill['records']:,} rows, "
              f"peak RSS {backfill['peak_rss_mib']:.0f} MiB)")  # fmt: skip
    print(f"written to {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_export", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--runs", type=int, default=1, help="runs per case (median reported)")
    parser.add_argument("--all", action="store_true", help="also executions, parquet, preference")
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument("--only", nargs="*", help="only these cases (first word: trajectory ...)")
    parser.add_argument("--dir", default="var/bench")
    parser.add_argument("--build-only", action="store_true", help="only build the corpus")
    parser.add_argument("--backfill", action="store_true", help="also measure a backfill")
    parser.add_argument("--history", type=int, default=125_000, help="--backfill's traces")
    args = parser.parse_args(argv)
    if args.build_only:
        directory = corpus_dir(Path(args.dir), args.records, args.seed, args.partitions)
        asyncio.run(build_corpus(directory, args.records, args.seed, args.partitions))
        return 0
    result = run(args)
    path = Path(args.dir) / f"export-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    path.write_text(json.dumps(result, indent=2))
    print_table(result, path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
