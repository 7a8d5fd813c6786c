"""``make bench-export`` (and ``make bench``): exports of a corpus of 1,000,000 records.

1. Build the corpus once, the real way, and cache it (the web benchmark's corpora under
   ``var/bench/web-corpus-...``, keyed by their parameters; ``done.json`` marks them
   complete; their ``evaluator`` corpus is the one exported): synthetic traces that are
   all evaluated (multi-turn conversations with tool calls, reports with outcomes and
   assessments, a third with a human label, one in a hundred deleted) go through ``replay``
   (the join and the sink) into the ``evaluator`` corpus, in chunks of 50,000 traces (each
   chunk a replay run with chains of its own); after the first two chunks the corpus is
   compacted, so an export reads a compaction and a tail of commits after it, as in
   production. Its latest view holds exactly ``--records`` live records.
2. Export it with ``rl-export export`` in a child process, per case: ``trajectory`` JSON
   Lines without redaction, with the default ``--redact secrets`` and with ``--redact all``
   (side by side: the redaction's cost), ``messages`` with ``--passed true``, ``messages``
   made for a chat template (``--chat-template``: every row rendered and checked), CSV with
   chosen columns, ``trajectory`` with ``--dedup exact`` and ``--dedup near`` and ``messages``
   of one ``--split`` (and, with ``--all``, ``executions``, Parquet and ``preference``). Wall
   time, records/s, CPU time and the child's peak RSS (its own VmHWM) are measured.
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
import fnmatch
import hashlib
import json
import os
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.replay import replay
from rl_export.corpora.store import LocalStore
from rl_export.formats.specs import CorpusSpec
from rl_export.local.synthetic import scored_event_lines
from rl_export.runtime.settings import load_settings
from tests.perf import bench_web

ORG, PROJECT, SOURCE = "acme", "support-bot", "evaluator"
PINNED = "bench-1m"
"""The version the ``--version`` case reads, pinned over the built corpus if it is not."""
VERSION = 1  # of the backfill's history: bump when its recipe changes, so caches are rebuilt
ROOT = Path(__file__).resolve().parents[2]  # the checkout, so a child can import this module
CSV_COLUMNS = (
    "trace_id,scenario,agent_version,reward,passed,rubric.safety:safety,"
    "evaluator_scores.faithfulness:faithfulness,updated_at"
)


def log(message: str) -> None:
    print(f"[bench-export {time.strftime('%H:%M:%S')}] {message}", flush=True)


def corpus_dir(base: Path, records: int, seed: int, partitions: int) -> Path:
    return bench_web.corpus_dir(base, records, seed, partitions)


async def build_corpus(directory: Path, records: int, seed: int, partitions: int) -> dict[str, Any]:
    """Step 1 (cached): the web benchmark's corpora (``make bench-web``), whose ``evaluator``
    corpus is this recipe; one build of 1,000,000 records serves both benchmarks."""
    return await asyncio.to_thread(bench_web.build_corpus, directory, records, seed, partitions)


# Without redaction (--redact none) unless the case says otherwise: the cases measure what
# they always did, and the redaction cases are side by side with the first.
CASES: dict[str, list[str]] = {
    "trajectory": ["--format", "trajectory", "--redact", "none"],
    "trajectory --redact secrets": ["--format", "trajectory", "--redact", "secrets"],
    "trajectory --redact all": ["--format", "trajectory", "--redact", "all"],
    "messages --passed true": ["--format", "messages", "--passed", "true", "--redact", "none"],
    # Rows made for a chat template (issue 55's goal on 1M records: at least 20,000 records/s;
    # rendering is the cost, in a process pool): Llama 3.1's JSON tool-calling template.
    "messages --chat-template": [
        "--format",
        "messages",
        "--chat-template",
        "llama3_1_json_tools",
        "--redact",
        "none",
    ],
    "csv (8 columns)": ["--format", "csv", "--columns", CSV_COLUMNS, "--redact", "none"],
    # Training sets (issue 44's goals on 1M records: exact >= 20,000 records/s, near >= 5,000,
    # peak RSS <= 1 GiB).
    "trajectory --dedup exact": ["--format", "trajectory", "--dedup", "exact", "--redact", "none"],
    "trajectory --dedup near": ["--format", "trajectory", "--dedup", "near", "--redact", "none"],
    # A version pinned once the corpus is built (bench-1m): as fast as the latest view.
    "trajectory --version": ["--format", "trajectory", "--version", PINNED, "--redact", "none"],
    "messages --split train": [
        "--format",
        "messages",
        "--split",
        "train",
        "--splits",
        "train=0.9,eval=0.05,test=0.05",
        "--redact",
        "none",
    ],
}
MORE_CASES: dict[str, list[str]] = {
    "executions": ["--format", "executions", "--redact", "none"],
    "parquet (8 columns)": ["--format", "parquet", "--columns", CSV_COLUMNS, "--redact", "none"],
    "preference --pair-by scenario": [
        "--format",
        "preference",
        "--pair-by",
        "scenario",
        "--redact",
        "none",
    ],
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


SINKS = ("null", "file")
"""Where an export's bytes go: ``null`` is ``-o -`` into /dev/null (what the export itself
costs), ``file`` is ``-o <path>`` (written beside the corpus and fsynced: this machine's disk
too)."""


def pin_version(store: Path) -> None:
    """The ``--version`` case's version, pinned over the corpus as built (once)."""
    if (store / "_versions" / ORG / PROJECT / SOURCE / f"{PINNED}.json").exists():
        return
    argv = [sys.executable, "-m", "rl_export.cli", "versions", "create", PINNED, "--store",
            str(store), "--org", ORG, "--project", PROJECT, "--corpus", SOURCE]  # fmt: skip
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)


def understands(case: list[str], pythonpath: str | None) -> bool:
    """Whether a tree's ``rl-export export`` has every option of a case (a baseline from
    before an option skips that case)."""
    argv = [sys.executable, "-m", "rl_export.cli", "export", "--help"]
    shown = subprocess.run(
        argv, check=True, capture_output=True, text=True, env=_env(pythonpath)
    ).stdout
    return all(arg in shown for arg in case if arg.startswith("--"))


def _env(pythonpath: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + (os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env
                                          else "")  # fmt: skip
    return env


def measure(
    store: Path, args: list[str], out: Path, *, sink: str = "file", pythonpath: str | None = None
) -> dict[str, Any]:
    """Step 2 for one case: a child process, timed; its peak RSS as it reports it.

    ``pythonpath`` runs another tree's code (``--baseline``); ``sink`` is one of
    :data:`SINKS`."""
    target = Path("-") if sink == "null" else out
    argv = [sys.executable, "-c", _CHILD, *_export_argv(store, args, target)]
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=_env(pythonpath))  # fmt: skip
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
    scanned = re.search(r" from (\d+) latest records", note)
    cpu = usage.ru_utime + usage.ru_stime
    return {
        "rows": rows,
        "records": int(scanned.group(1)) if scanned else rows,  # the latest records read
        "seconds": elapsed,
        "records_per_s": rows / elapsed,
        "peak_rss_mib": peak_kib / 1024,
        "cpu_s": cpu,
        "records_per_cpu_s": rows / cpu if cpu else 0.0,
        "bytes": int(note.split(", ")[1].split()[0]),
        "sink": sink,
        "note": note,
    }


def digest(store: Path, args: list[str], *, pythonpath: str | None = None) -> dict[str, Any]:
    """The sha256 and size of an export's bytes (``-o -``, read from the pipe; not timed)."""
    argv = [sys.executable, "-m", "rl_export.cli", *_export_argv(store, args, Path("-"))]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env(pythonpath))  # fmt: skip
    assert proc.stdout is not None
    sha, size = hashlib.sha256(), 0
    while piece := proc.stdout.read(1 << 22):
        sha.update(piece)
        size += len(piece)
    _, stderr = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"export failed ({proc.returncode}): {stderr.decode().strip()}")
    return {"sha256": sha.hexdigest(), "bytes": size}


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
                          scored_event_lines(0, traces, seed), run_id="history")  # fmt: skip
    info = {"traces": traces, "events": report.lines, "snapshots": report.snapshots,
            "build_s": time.monotonic() - started}  # fmt: skip
    done.write_text(json.dumps(info, indent=2))
    log(f"history built: {info}")
    return info


async def _seed_once(store_dir: Path) -> dict[str, Any]:
    """One seed of a new corpus from the history (run in a child process)."""
    from rl_export.corpora.backfill import seed_chain
    from rl_export.corpora.chainstate import ChainState

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
        "from tests.perf.bench_export import _seed_once\n"
        "result = asyncio.run(_seed_once(Path(sys.argv[1])))\n"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')]\n"
        "result['peak_rss_mib'] = int(hwm[0].split()[1]) / 1024\n"
        "print(json.dumps(result))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(directory / "store")], check=True,
                         capture_output=True, env=_env(str(ROOT)))  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout)
    result["history_traces"] = info["traces"]
    result["history_records_per_s"] = info["snapshots"] / result["seconds"]
    return result


def _median(runs: list[dict[str, Any]], key: str) -> float:
    values = sorted(r[key] for r in runs)
    return float(statistics.median(values))


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rows = runs[0]["rows"]
    seconds, cpu = _median(runs, "seconds"), _median(runs, "cpu_s")
    return {
        "rows": rows,
        "records": runs[0]["records"],
        "bytes": runs[0]["bytes"],
        "seconds": seconds,
        "records_per_s": rows / seconds,
        "cpu_s": cpu,
        "records_per_cpu_s": rows / cpu if cpu else 0.0,
        "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
        "runs": runs,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(args.dir)
    directory = corpus_dir(base, args.records, args.seed, args.partitions)
    corpus = asyncio.run(build_corpus(directory, args.records, args.seed, args.partitions))
    store = directory / "store"
    pin_version(store)
    cases = dict(CASES) | (MORE_CASES if args.all else {})
    if args.only:
        cases = {k: v for k, v in cases.items()
                 if any(fnmatch.fnmatchcase(k, pattern) for pattern in args.only)}  # fmt: skip
        if not cases:
            raise SystemExit(f"bench_export: --only {args.only}: no such case; the cases: "
                             + ", ".join(repr(k) for k in (*CASES, *MORE_CASES)))  # fmt: skip
    trees: dict[str, str | None] = {"current": None}
    if args.baseline:
        trees["baseline"] = str(Path(args.baseline).resolve())
    sinks = SINKS if args.sink == "both" else (args.sink,)
    results: dict[str, Any] = {}
    out_dir = base / "export-out"
    out_dir.mkdir(parents=True, exist_ok=True)
    load = [os.getloadavg()[0]]
    able = {name: {tree: path for tree, path in trees.items() if understands(case, path)}
            for name, case in cases.items()}  # fmt: skip
    # Interleaved: every case, tree and sink once per round, the order turning each round,
    # so a change in the machine's load (it drifts by a third here from one minute to the
    # next) falls on all of them alike, and the ratios between cases (the redaction's cost)
    # compare runs made side by side.
    order = [(name, tree, sink) for name in cases for tree in able[name] for sink in sinks]
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for n in range(args.runs):
        for name, tree, sink in order[n % len(order) :] + order[: n % len(order)]:
            case = cases[name]
            log(f"{name}: round {n + 1} of {args.runs}, {tree} code, to {sink}")
            runs.setdefault((name, tree, sink), []).append(measure(
                store, case, out_dir / ("out." + case[1]), sink=sink, pythonpath=trees[tree]
            ))  # fmt: skip
            load.append(os.getloadavg()[0])
    for name, case in cases.items():
        out = out_dir / ("out." + case[1])
        result: dict[str, Any] = {
            tree: {sink: _summary(runs[(name, tree, sink)]) for sink in sinks}
            for tree in able[name]
        }
        if args.digest:
            digests = {}
            for tree, path in able[name].items():
                log(f"{name}: sha256 of the {tree} code's export")
                digests[tree] = digest(store, case, pythonpath=path)
            result["digest"] = digests
            if len({d["sha256"] for d in digests.values()}) > 1:
                raise RuntimeError(f"{name}: the exports differ: {digests}")
        if args.profile:
            log(f"{name}: profiling")
            result["profile"] = profile(store, case, out, out_dir / "profile.out")
        results[name] = result
        out.unlink(missing_ok=True)
    backfill = measure_backfill(base, args.history, args.seed) if args.backfill else None
    return {
        "at": datetime.now(UTC).isoformat(),
        "corpus": corpus,
        "view": asyncio.run(view_shape(store)),
        "load_average": {"min": min(load), "max": max(load)},
        "cpus": os.cpu_count(),
        "cases": results,
        "backfill": backfill,
        "targets": {"trajectory_records_per_s": 100_000, "peak_rss_mib": 200},
    }


async def view_shape(store_dir: Path) -> dict[str, Any]:
    """What the export reads: the compaction's and the tail's records and bytes."""
    from rl_export.export.latest import LatestView

    view = LatestView(LocalStore(store_dir), CorpusRef(ORG, PROJECT, SOURCE))
    await view._find()
    compaction = view.compaction
    return {
        "compaction_records": compaction.records if compaction else 0,
        "compaction_bytes": sum(p["bytes"] for p in compaction.parts) if compaction else 0,
        "tail_objects": len(view.tail),
        "tail_records": sum(p.records for p in view.tail),
        "tail_bytes": sum((store_dir / p.key).stat().st_size for p in view.tail),
    }


def print_table(result: dict[str, Any], path: Path) -> None:
    corpus, shape = result["corpus"], result["view"]
    print()
    print(f"export benchmark: {corpus['records']:,} live records ({corpus['traces']:,} traces, "
          f"{corpus['snapshots']:,} snapshots, {corpus['bytes'] / 2**30:.2f} GiB on disk; "
          f"built in {corpus['build_s']:.0f} s)")  # fmt: skip
    print(f"the view reads a compaction of {shape['compaction_records']:,} records "
          f"({shape['compaction_bytes'] / 2**30:.2f} GiB) and a tail of "
          f"{shape['tail_records']:,} lines in {shape['tail_objects']} objects "
          f"({shape['tail_bytes'] / 2**30:.2f} GiB); load average "
          f"{result['load_average']['min']:.1f} to {result['load_average']['max']:.1f} "
          f"on {result['cpus']} CPUs")  # fmt: skip
    print(f"{'case':28} {'code':9} {'to':5} {'rows':>10} {'wall s':>7} {'records/s':>10} "
          f"{'CPU s':>6} {'per CPU-s':>10} {'peak RSS':>9}")  # fmt: skip
    worst = 0.0
    for name, r in result["cases"].items():
        for tree in ("current", "baseline"):
            for sink, m in r.get(tree, {}).items():
                if "--dedup" not in name:  # a dedup's own goal is 1 GiB (below)
                    worst = max(worst, m["peak_rss_mib"])
                print(
                    f"{name:28} {tree:9} {sink:5} {m['rows']:>10,} {m['seconds']:>7.1f} "
                    f"{m['records_per_s']:>10,.0f} {m['cpu_s']:>6.1f} "
                    f"{m['records_per_cpu_s']:>10,.0f} {m['peak_rss_mib']:>5.0f} MiB"
                )
        if "digest" in r:
            same = len({d["sha256"] for d in r["digest"].values()}) == 1
            first = next(iter(r["digest"].values()))
            print(
                f"{'':28} sha256 {first['sha256'][:16]}… ({first['bytes']:,} bytes)"
                + (", the same from both trees" if same and len(r["digest"]) > 1 else "")
            )
    trajectory = result["cases"].get("trajectory", {}).get("current")
    if trajectory:
        for sink, m in trajectory.items():
            print(f"trajectory to {sink} vs the 100,000 records/s target: "
                  f"{m['records_per_s'] / 100_000:.2f} x wall-clock, "
                  f"{m['records_per_cpu_s'] / 100_000:.2f} x per CPU-second")  # fmt: skip
        print(f"worst peak RSS but a dedup's vs 200 MiB: {worst / 200:.2f} x")
        for name in ("trajectory --redact secrets", "trajectory --redact all"):
            scrubbed = result["cases"].get(name, {}).get("current")
            for sink, m in (scrubbed or {}).items():
                plain = trajectory[sink]
                print(f"{name} to {sink} vs without redaction: "
                      f"{m['seconds'] / plain['seconds']:.2f} x the wall time, "
                      f"{m['cpu_s'] / plain['cpu_s']:.2f} x the CPU time (goal: at most 2 x), "
                      f"peak RSS {m['peak_rss_mib']:.0f} vs "
                      f"{plain['peak_rss_mib']:.0f} MiB")  # fmt: skip
        goals = {"trajectory --dedup exact": 20_000, "trajectory --dedup near": 5_000}
        for name, goal in goals.items():
            deduped = result["cases"].get(name, {}).get("current")
            for sink, m in (deduped or {}).items():
                print(f"{name} to {sink}: {m['records_per_s']:,.0f} records/s, "
                      f"{m['records_per_s'] / goal:.2f} x the goal of {goal:,}; peak RSS "
                      f"{m['peak_rss_mib']:.0f} MiB, {m['peak_rss_mib'] / 1024:.2f} x the "
                      f"goal of 1 GiB")  # fmt: skip
        pinned = result["cases"].get("trajectory --version", {}).get("current")
        for sink, m in (pinned or {}).items():
            plain = trajectory[sink]
            print(
                f"trajectory --version to {sink} vs the latest view: "
                f"{m['seconds'] / plain['seconds']:.2f} x the wall time (goal: as fast), "
                f"peak RSS {m['peak_rss_mib']:.0f} vs {plain['peak_rss_mib']:.0f} MiB"
            )
    # Issue 55's goal: rows made for a chat template (every row rendered and checked) at
    # 20,000 records/s or more on the 1M-record export. Records, not rows: a record the
    # template cannot show is read, rendered and counted, not written.
    templated = result["cases"].get("messages --chat-template", {}).get("current")
    for sink, m in (templated or {}).items():
        print(f"messages --chat-template to {sink}: {m['records'] / m['seconds']:,.0f} "
              f"records/s ({m['rows']:,} rows written), "
              f"{m['records'] / m['seconds'] / 20_000:.2f} x the goal of 20,000; "
              f"{m['records'] / m['cpu_s']:,.0f} per CPU-second, peak RSS "
              f"{m['peak_rss_mib']:.0f} MiB")  # fmt: skip
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
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3, help="runs per case (median reported)")
    parser.add_argument(
        "--sink",
        choices=(*SINKS, "both"),
        default="both",
        help="null: -o - into /dev/null; file: -o a file (fsynced)",
    )
    parser.add_argument(
        "--baseline",
        metavar="SERVICES_DIR",
        help="also run another tree's code (its services/ folder), interleaved",
    )
    parser.add_argument(
        "--digest",
        action="store_true",
        help="sha256 of each export (from both trees with --baseline: must match)",
    )
    parser.add_argument("--all", action="store_true", help="also executions, parquet, preference")
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument(
        "--only", nargs="*",
        help="only these cases, by name or pattern: 'messages --chat-template', "
        "'trajectory*' (every trajectory case)",
    )  # fmt: skip
    parser.add_argument("--dir", default="var/bench")
    parser.add_argument("--build-only", action="store_true", help="only build the corpus")
    parser.add_argument("--backfill", action="store_true", help="also measure a backfill")
    parser.add_argument("--history", type=int, default=125_000, help="--backfill's traces")
    args = parser.parse_args(argv)
    if args.build_only:
        directory = corpus_dir(Path(args.dir), args.records, args.seed, args.partitions)
        asyncio.run(build_corpus(directory, args.records, args.seed, args.partitions))
        return 0
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    result = run(args)
    path = Path(args.dir) / f"export-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    path.write_text(json.dumps(result, indent=2))
    print_table(result, path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
