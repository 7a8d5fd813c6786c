"""``make bench-ab``: whole workers with different settings, side by side on one backlog.

The bench's before-and-after (``--baseline-python``) compares two checkouts; a change that
is a setting, or an environment variable of the worker (glibc's, CPython's), needs only one.
This produces one traffic shape's backlog on the local broker, then, ``--runs`` rounds
over, runs one worker per variant catching up on it, timed as the bench times it
(:func:`tests.perf.bench.catch_up`). Each round runs the variants in a rotated order:
on a shared 2-core machine the place of a run in its round moves it by up to 15 %, so
every variant gets every place as often as the rounds allow.

It prints, per variant, the median events/s (and every run), the median CPU µs per event
of the join processes, the worker's own process (the sink) and the broker, how busy the
machine's cores were meanwhile (near all of them: the catch-up was bound by CPU), and the
highest peak RSS (each process's peak, summed), and writes them as JSON to
``var/bench/ab-<time>.json``. Each later variant is compared with the first as benchstat
compares: the ratio of the medians, of events/s and of the whole CPU per event, with the
p of a Mann-Whitney U test over the runs (:mod:`tests.perf.significance`): ``~``
where the runs show no difference. Give four rounds or more: three never show one.

A variant is ``name=value`` pairs separated by commas: a setting (a field of
:class:`~rl_export.runtime.settings.Settings`, such as ``join_processes=1``), or with
``env:`` an environment variable of the worker (``env:MALLOC_ARENA_MAX=2``). The empty
variant is the defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rl_export.local.broker import LocalKafka
from rl_export.local.synthetic import SHAPES
from rl_export.runtime.net import free_port
from rl_export.runtime.settings import Settings
from tests.perf.bench import (
    DEFAULT_TRACES,
    MIB,
    bench_settings,
    busy_text,
    catch_up,
    cpu_per_event,
    cpu_text,
    fresh,
    highest_rss,
    log,
    own_topics,
    produce_backlog,
    rss_text,
    warm_up,
    warm_up_text,
)
from tests.perf.significance import SIGNIFICANT_P, compare, verdict


@dataclass(frozen=True)
class Variant:
    """One way to run the worker: settings changed from the defaults, environment added."""

    text: str
    settings: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.text or "(defaults)"


def parse_variant(text: str) -> Variant:
    """``join_processes=1,env:MALLOC_ARENA_MAX=2`` -> a :class:`Variant`; ValueError if wrong.

    Settings are validated as the worker would validate them, so that a typo fails here
    and not in a worker's log a minute later.
    """
    settings: dict[str, Any] = {}
    env: dict[str, str] = {}
    for pair in (p.strip() for p in text.split(",")):
        if not pair:
            continue
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"{pair!r} is not name=value")
        if name.startswith("env:"):
            if not name[4:]:
                raise ValueError(f"{pair!r} names no environment variable")
            env[name[4:]] = value
            continue
        if name not in Settings.model_fields:
            raise ValueError(f"{name!r} is not a setting (see rl_export.runtime.settings)")
        try:
            settings[name] = getattr(Settings.model_validate({name: value}), name)
        except ValidationError as exc:
            problem = exc.errors()[0]["msg"]
            raise ValueError(f"{pair!r}: {problem}") from None
    return Variant(text.strip(), settings, env)


def rotated(items: list[Any], round_: int) -> list[Any]:
    """The order of a round: each round starts one place further along."""
    start = round_ % len(items)
    return items[start:] + items[:start]


async def run(
    variants: list[Variant], shape_name: str, *, traces: int, runs: int, seed: int,
    warm_up_runs: int = 8,
) -> dict[str, Any]:  # fmt: skip
    """Produce the backlog, run the rounds; the results."""
    shape = SHAPES[shape_name]
    work = Path(tempfile.mkdtemp(prefix="rl-export-bench-ab-"))
    broker = LocalKafka(work / "kafka", free_port(), heap="1g")
    log(f"starting Kafka in {work}")
    broker.start()
    measured: dict[int, list[dict[str, Any]]] = {i: [] for i in range(len(variants))}
    try:
        settings = own_topics(bench_settings(broker.bootstrap, work), shape.name)
        events, size, _ = await produce_backlog(settings, shape, traces, seed)
        pid = broker.pid
        compiled = await warm_up(settings, work, pid, warm_up_runs) if pid else []
        for round_ in range(runs):
            for i in rotated(list(range(len(variants))), round_):
                variant = variants[i]
                log(f"round {round_ + 1} of {runs}: {variant.label}")
                tag = f"ab-{round_}-{i}"
                chosen = fresh(settings, tag, work / f"store-{tag}").model_copy(
                    update=variant.settings
                )
                measured[i].append(
                    await catch_up(chosen, 1, work / tag, broker_pid=broker.pid, env=variant.env)
                )
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    results = []
    for i, variant in enumerate(variants):
        rates = [len(events) / r["seconds"] for r in measured[i]]
        results.append({
            "variant": variant.text,
            "events_per_s": statistics.median(rates),
            "runs": rates,
            "cpu_us_per_event": cpu_per_event(measured[i], len(events)),
            "cpu_us_per_event_runs": [
                sum(r["cpu_seconds"].values()) / len(events) * 1e6 for r in measured[i]
            ],
            "machine_busy": statistics.median(r["machine_busy"] for r in measured[i]),
            "peak_rss_mib": sum(highest_rss(measured[i])),
            "peak_rss_parts_mib": highest_rss(measured[i]),
        })  # fmt: skip
    first = results[0]
    for later in results[1:]:
        later["vs_first"] = {
            "events_per_s": compare(first["runs"], later["runs"]),
            "cpu_us_per_event": compare(
                first["cpu_us_per_event_runs"], later["cpu_us_per_event_runs"]
            ),
        }
    return {
        "at": datetime.now(UTC).isoformat(),
        "shape": shape.name,
        "events": len(events),
        "avg_event_bytes": size / len(events),
        "backlog_mib": size / MIB,
        "rounds": runs,
        "warm_up_compile_seconds": compiled,
        "variants": results,
    }


def print_table(result: dict[str, Any], path: Path) -> None:
    print(f"\n  {result['shape']} backlog: {result['events']:,} events, "
          f"{result['avg_event_bytes'] / 1024:.2f} KiB avg; {result['rounds']} rounds, the "
          "order rotated each round")  # fmt: skip
    print(f"  broker warm-up, untimed: {warm_up_text(result.get('warm_up_compile_seconds', []))}")
    for v in result["variants"]:
        runs = " / ".join(f"{r:,.0f}" for r in v["runs"])
        cpu = v["cpu_us_per_event"]
        print(f"\n  {Variant(v['variant']).label}")
        print(f"    {v['events_per_s']:,.0f} events/s ({runs})")
        rss = rss_text(v["peak_rss_mib"], v["peak_rss_parts_mib"])
        print(f"    CPU per event: {cpu_text(cpu)}; peak RSS {rss}")
        print(f"    the machine's cores busy meanwhile: {busy_text(v.get('machine_busy'))}")
        if "vs_first" in v:
            print(f"    against the first: events/s {verdict(v['vs_first']['events_per_s'])}, "
                  f"CPU per event {verdict(v['vs_first']['cpu_us_per_event'])}")  # fmt: skip
    print(
        f"\n  a ratio is the medians' (this / the first); ~: the runs show no difference "
        f"(Mann-Whitney U, p >= {SIGNIFICANT_P})"
    )
    print(f"\n  results: {path}")


def add_round_arguments(parser: argparse.ArgumentParser) -> None:
    """The backlog and rounds arguments this tool shares with ``make bench-ceiling``."""
    parser.add_argument("--shape", choices=sorted(SHAPES), default="standard")
    parser.add_argument("--traces", type=int, help="traces (default: ~105k events)")
    parser.add_argument(
        "--runs",
        type=int,
        default=5,
        help="rounds of every variant (three never show a difference)",
    )
    parser.add_argument(
        "--warm-up", type=int, default=8, metavar="N",
        help="untimed catch-ups first, until the broker's JIT settles (at most N)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("var/bench"))


def traces_asked(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Check :func:`add_round_arguments`' arguments (exit 2 if wrong); the traces to make."""
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.warm_up < 0:
        parser.error("--warm-up must be 0 or more")
    if args.traces is not None and args.traces < 1:
        parser.error("--traces must be at least 1")
    return int(args.traces or DEFAULT_TRACES[args.shape])


def run_and_print(
    variants: list[Variant], args: argparse.Namespace, traces: int, name: str
) -> None:
    """Run the rounds; write the results to ``<out>/<name>-<time>.json`` and print them."""
    result = asyncio.run(
        run(variants, args.shape, traces=traces, runs=args.runs, seed=args.seed,
            warm_up_runs=args.warm_up)
    )  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{name}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(result, indent=2))
    print_table(result, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rl-export-bench-ab", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--variant", action="append", default=[], metavar="NAME=VALUE[,...]",
        help="a setting or env:VARIABLE per pair; repeat for each variant ('' = the defaults)",
    )  # fmt: skip
    add_round_arguments(parser)
    args = parser.parse_args(argv)
    if len(args.variant) < 2:
        parser.error("give at least two --variant (an empty one is the defaults)")
    traces = traces_asked(parser, args)
    try:
        variants = [parse_variant(text) for text in args.variant]
    except ValueError as exc:
        parser.error(f"--variant {exc}")
    run_and_print(variants, args, traces, "ab")
    return 0


if __name__ == "__main__":
    sys.exit(main())
