"""The Quix Streams peer of ``make bench-peers``: the worker's three input topics merged per trace.

One dataframe per input topic, concatenated (the topics are co-partitioned by trace_id, so a
trace's events meet in one partition's state), a stateful ``apply`` that merges each event
into the trace's dict (:func:`tests.perf.peers.merge.merge`) in Quix's State (RocksDB, with a
changelog topic), and the merged dict written to the output topic, with
``processing_guarantee="exactly-once"`` and the commit interval asked for. Everything else
is Quix's defaults, as a user would run it.

Run by the bench in the peers' virtualenv (``.cache/peers/venv``, the ``peers`` dependency
group), from the checkout's root::

    python -m tests.perf.peers.quix_join --bootstrap 127.0.0.1:9092 --group g \\
        --inputs a,b,c --output out --state-dir DIR --commit-interval 0.1

It prints one JSON object a line: its version once started, then the wall time it merged its
first record (``first_record_at``, seconds since the epoch), which starts the bench's clock.
SIGTERM stops it (Quix's own handler: the last checkpoint is committed or aborted).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from tests.perf.peers.merge import merge


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="quix_join", description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True, help="the consumer group (fresh per run)")
    parser.add_argument("--inputs", required=True, help="input topics, comma-separated")
    parser.add_argument("--output", required=True, help="the output topic (made by the bench)")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--commit-interval", type=float, default=5.0, help="seconds (Quix: 5)")
    args = parser.parse_args(argv)

    import quixstreams
    from quixstreams import Application, State

    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        commit_interval=args.commit_interval,
        state_dir=args.state_dir,
    )
    inputs = [
        app.topic(name, key_deserializer="str", value_deserializer="json")
        for name in args.inputs.split(",")
    ]
    output = app.topic(args.output, key_serializer="str", value_serializer="json")
    sdf = app.dataframe(inputs[0])
    for topic in inputs[1:]:
        sdf = sdf.concat(app.dataframe(topic))
    first: list[float] = []

    def merged(event: dict[str, Any], state: State) -> dict[str, Any]:
        if not first:
            first.append(time.time())
            say(first_record_at=first[0])
        value = merge(state.get("merged") or {}, event)
        state.set("merged", value)
        return value

    sdf = sdf.apply(merged, stateful=True)
    sdf.to_topic(output)
    say(quixstreams=quixstreams.__version__, commit_interval_s=args.commit_interval)
    app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
