"""The bench's bare consumer (:func:`tests.perf.bench.bare_consumer`) in a process of its own.

So that ``make bench-peers`` counts its CPU and peak RSS apart from the harness, as it does
every other system's. It consumes the backlog once, then prints when its first and last
records came (``first_record_at``, ``last_record_at``: wall times, from the bare consumer's
own timing) and its group join, and waits for SIGTERM, so that its peak RSS can still be read.
Its peak RSS includes the harness modules it imports (rl-export's settings among them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path

from tests.perf.bench import bare_consumer, bench_settings, own_topics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bare", description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--prefix", required=True, help="the backlog's topic prefix (its shape)")
    parser.add_argument("--total", type=int, required=True, help="events in the backlog")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--run", type=int, default=0)
    args = parser.parse_args(argv)
    settings = own_topics(bench_settings(args.bootstrap, args.work), args.prefix)
    timed = asyncio.run(bare_consumer(settings, args.total, args.work / "bare.jsonl", args.run))
    last = time.time()
    print(json.dumps({"first_record_at": last - timed["seconds"], "last_record_at": last,
                      "join_seconds": timed["join_seconds"]}), flush=True)  # fmt: skip
    signal.pause()  # until the harness has read its peak RSS and sends SIGTERM
    return 0


if __name__ == "__main__":
    sys.exit(main())
