"""``rl-export watch``: run a command each time a corpus grows by N records.

The corpus is followed in the store (:class:`~rl_export.corpora.watch.CorpusWatch`: commit
objects only), every ``--interval`` seconds. Once it has gained ``--min-new`` records (of
traces it did not hold; ``--lines``: every line committed, re-scores and deletions too) the
command runs, with the corpus, the counts and the position in its environment
(:func:`command_env`), and the watch waits for it before counting on. A command that fails
is reported on stderr and the watch goes on (``--once``: it ends, with the command's exit
code). SIGINT or SIGTERM end the watch with 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from rl_export.cli.flags import _open, _settings
from rl_export.model.codec import dumps
from rl_export.model.errors import ConfigError, StoreError

if TYPE_CHECKING:
    from rl_export.corpora.layout import CorpusRef


def command_env(
    base: Mapping[str, str], ref: CorpusRef, position: object, *, records: int,
    new_records: int, run: int,
) -> dict[str, str]:  # fmt: skip
    """The command's environment: ours, and what the watch saw (``RL_WATCH_*``)."""
    return {
        **base,
        "RL_WATCH_ORG": ref.org,
        "RL_WATCH_PROJECT": ref.project,
        "RL_WATCH_CORPUS": ref.corpus,
        "RL_WATCH_POSITION": dumps(position).decode(),
        "RL_WATCH_RECORDS": str(records),
        "RL_WATCH_NEW_RECORDS": str(new_records),
        "RL_WATCH_RUN": str(run),
    }


def cmd_watch(args: argparse.Namespace) -> int:
    from rl_export.corpora.layout import CorpusRef
    from rl_export.corpora.watch import CorpusWatch
    from rl_export.formats.specs import check_name

    settings = _settings(args, store_url="store")
    try:
        ref = CorpusRef(check_name("org", args.org), check_name("project", args.project),
                        check_name("corpus", args.corpus))  # fmt: skip
    except ValueError as exc:
        raise ConfigError("--org/--project/--corpus", str(exc)) from None
    command = list(args.run)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise ConfigError("COMMAND", "give the command to run after --")
    if args.min_new < 1:
        raise ConfigError("--min-new", f"must be at least 1, got {args.min_new}")
    if args.interval <= 0:
        raise ConfigError("--interval", f"must be positive, got {args.interval:g}")

    async def run() -> int:
        store = _open(args.store, settings)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        watch = CorpusWatch(store, ref)
        runs = 0
        try:
            await watch.start(from_start=args.from_start)
            print(f"rl-export watch: following {ref.root} from "
                  f"{dumps(watch.position()).decode()}", file=sys.stderr, flush=True)  # fmt: skip
            while not stop.is_set():
                try:
                    grown = await watch.poll()
                except StoreError as exc:
                    print(f"rl-export watch: the store failed ({exc}); trying again",
                          file=sys.stderr)  # fmt: skip
                else:
                    if (grown.records if args.lines else grown.new_records) >= args.min_new:
                        grown = watch.reset()
                        runs += 1
                        env = command_env(os.environ, ref, watch.position(),
                                          records=grown.records,
                                          new_records=grown.new_records, run=runs)  # fmt: skip
                        started = time.monotonic()
                        process = await asyncio.create_subprocess_exec(*command, env=env)
                        code = await process.wait()
                        print(f"rl-export watch: run {runs} ({grown.new_records} new records, "
                              f"{grown.records} lines) exited {code} after "
                              f"{time.monotonic() - started:.1f} s", file=sys.stderr)  # fmt: skip
                        if args.once:
                            return code
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), args.interval)
        finally:
            await store.close()
        return 0

    try:
        return asyncio.run(run())
    except FileNotFoundError as exc:
        raise ConfigError("COMMAND", f"cannot run {command[0]!r}: {exc.strerror}") from None


def add_watch(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The ``watch`` command's parser."""
    p = sub.add_parser(
        "watch", help="run a command each time a corpus grows by N records",
        description="Follow a corpus in the store and run COMMAND each time it has gained "
        "--min-new records (of traces it did not hold), with RL_WATCH_ORG, _PROJECT, _CORPUS, "
        "_POSITION (JSON: compaction generation and chain ends), _RECORDS, _NEW_RECORDS and "
        "_RUN in its environment.",
        usage="rl-export watch --store URL --org O --project P --corpus C --min-new N "
        "[--interval S] [--lines] [--from-start] [--once] -- COMMAND...",
    )  # fmt: skip
    p.add_argument("--store", metavar="URL", help="object store URL (default RL_EXPORT_STORE_URL)")
    p.add_argument("--org", required=True)
    p.add_argument("--project", required=True)
    p.add_argument("--corpus", required=True, help="human, evaluator, traces, ...")
    p.add_argument("--min-new", type=int, required=True, metavar="N",
                   help="run the command once the corpus has gained N records")  # fmt: skip
    p.add_argument("--interval", type=float, default=10.0, metavar="S",
                   help="seconds between two looks at the corpus (default 10)")  # fmt: skip
    p.add_argument("--lines", action="store_true",
                   help="count every line committed (re-scores, deletions too)")  # fmt: skip
    p.add_argument("--from-start", action="store_true",
                   help="count what the corpus already holds (default: from now)")  # fmt: skip
    p.add_argument("--once", action="store_true",
                   help="end after the first run, with the command's exit code")  # fmt: skip
    p.add_argument("run", nargs=argparse.REMAINDER, metavar="-- COMMAND...")
    p.set_defaults(func=cmd_watch)
