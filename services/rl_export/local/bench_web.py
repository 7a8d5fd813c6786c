"""``make bench-web`` (and ``make bench``): the web service's index over 1,000,000 records.

1. Build the corpora once, the real way, and cache them under ``var/bench/web-corpus-...``
   (``done.json`` marks them complete): synthetic traces that are all evaluated (one in a
   hundred deleted) go through ``replay`` (the join and the sink) into the ``traces`` and
   ``evaluator`` corpora, in chunks of 50,000 traces, each chunk a replay run with chains of
   its own, run in two processes side by side; after the first two chunks the corpora are
   compacted, so the index reads a compaction and a tail of commits, as in production.
2. Start ``rl-export web`` on that store with an empty index, create a token, ask for the
   stats of each corpus and time the index's catch-up (records/s, from its metrics).
3. Once indexed: latency of ``GET stats`` (without and with filters), ``GET records``
   (the preview) and ``GET queue``, p50/p99 over many requests, from a client on the same
   machine (so HTTP and JSON are included).
4. Label submission to visible in the stats: a broker, a worker and a web service on a small
   corpus of their own; a label is posted through the API and ``GET stats`` is polled until
   ``human_labeled`` counts it.

Results are printed and written as JSON to ``var/bench/web-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
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
from rl_export.local.bench_export import traces_for
from rl_export.local.synthetic import scored_trace_events

ORG, PROJECT = "acme", "support-bot"
SOURCES = ("traces", "evaluator")
CHUNK = 50_000
COMPACT_AFTER_CHUNKS = 2
VERSION = 1  # bump when the corpus's recipe changes, so caches are rebuilt


def log(message: str) -> None:
    print(f"[bench-web {time.strftime('%H:%M:%S')}] {message}", flush=True)


def corpus_dir(base: Path, records: int, seed: int, partitions: int) -> Path:
    return base / f"web-corpus-r{records}-s{seed}-p{partitions}-v{VERSION}"


def _events(first: int, count: int, seed: int) -> Iterator[tuple[str, bytes]]:
    """The event lines of traces ``first`` .. ``first + count - 1`` (trace i deleted iff
    i % 100 == 99)."""
    rng = random.Random(seed * 1_000_003 + first)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for index in range(first, first + count):
        at = start + timedelta(seconds=index)
        for event in scored_trace_events(rng, index, at, deleted=index % 100 == 99):
            yield f"trace {index}", dumps(event)


def _specs() -> tuple[CorpusSpec, ...]:
    return (
        CorpusSpec(name="traces", source=None),
        CorpusSpec(name="evaluator", source="evaluator"),
    )


def _replay_chunk(store_dir: str, partitions: int, chunk: tuple[int, int, int],
                  seed: int) -> dict[str, Any]:  # fmt: skip
    """One chunk (number, first trace, count), in a child process: a replay run with chains
    of its own."""
    n, first, count = chunk
    os.nice(10)  # the machine is shared: the benchmark's build is the least urgent work
    settings = load_settings(partitions=partitions, shard_max_records=10_000, corpora=_specs())
    store = LocalStore(Path(store_dir))
    report = asyncio.run(replay(settings, store, _events(first, count, seed), run_id=f"c{n:03d}"))
    if sum(report.invalid.values()):
        raise RuntimeError(f"the bench's events were rejected: {report.examples[:3]}")
    return {"lines": report.lines, "snapshots": report.snapshots}


def build_corpus(directory: Path, records: int, seed: int, partitions: int) -> dict[str, Any]:
    """Step 1 (cached)."""
    done = directory / "done.json"
    if done.exists():
        info: dict[str, Any] = json.loads(done.read_text())
        log(f"corpora cached in {directory} (built in {info['build_s']:.0f} s)")
        return info
    if directory.exists():
        shutil.rmtree(directory)
    store_dir = directory / "store"
    store_dir.mkdir(parents=True)
    traces = traces_for(records)
    chunks = [(n, first, min(CHUNK, traces - first))
              for n, first in enumerate(range(0, traces, CHUNK))]  # fmt: skip
    started = time.monotonic()
    lines = snapshots = 0

    def run(batch: list[tuple[int, int, int]]) -> None:
        nonlocal lines, snapshots
        with ProcessPoolExecutor(2) as pool:
            futures = [pool.submit(_replay_chunk, str(store_dir), partitions, chunk, seed)
                       for chunk in batch]  # fmt: skip
            for (n, first, count), future in zip(batch, futures, strict=True):
                result = future.result()
                lines += result["lines"]
                snapshots += result["snapshots"]
                log(f"chunk {n}: traces {first}..{first + count - 1}, {lines} events so far, "
                    f"{time.monotonic() - started:.0f} s")  # fmt: skip

    run(chunks[:COMPACT_AFTER_CHUNKS])
    store = LocalStore(store_dir)
    for source in SOURCES:
        made = asyncio.run(compact(store, CorpusRef(ORG, PROJECT, source), writer="bench"))
        log(f"{source} compacted: generation {made.generation if made else '-'}, "
            f"{made.records if made else 0} records")  # fmt: skip
    run(chunks[COMPACT_AFTER_CHUNKS:])
    info = {
        "records": records,
        "traces": traces,
        "events": lines,
        "snapshots": snapshots,
        "seed": seed,
        "partitions": partitions,
        "sources": list(SOURCES),
        "build_s": time.monotonic() - started,
        "bytes": sum(p.stat().st_size for p in store_dir.rglob("*") if p.is_file()),
    }
    done.write_text(json.dumps(info, indent=2))
    log(f"corpora built in {info['build_s']:.0f} s: {info}")
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_web", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--dir", default="var/bench")
    parser.add_argument("--build-only", action="store_true", help="only build the corpora")
    args = parser.parse_args(argv)
    directory = corpus_dir(Path(args.dir), args.records, args.seed, args.partitions)
    build_corpus(directory, args.records, args.seed, args.partitions)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
