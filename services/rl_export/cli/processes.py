"""The commands that run a process or feed one: ``broker``, ``worker``, ``web``, ``dev``,
``produce``, ``replay``."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from rl_export.model.errors import ConfigError

if TYPE_CHECKING:
    pass

from rl_export.cli.flags import _open, _settings


def _wait_for_signal() -> int:
    """Block until SIGINT, SIGTERM or SIGHUP (the terminal closed); return the signal number."""
    received: list[int] = []
    stop = threading.Event()

    def handler(signum: int, _frame: Any) -> None:
        received.append(signum)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)
    stop.wait()
    return received[0]


def cmd_broker(args: argparse.Namespace) -> int:
    from rl_export.local.broker import LocalKafka

    settings = _settings(args, broker_port="port", data_dir="data_dir")
    data_dir = settings.data_dir / "kafka" if args.data_dir is None else settings.data_dir
    broker = LocalKafka(data_dir, settings.broker_port)
    print(f"starting Apache Kafka (KRaft) on 127.0.0.1:{settings.broker_port} ...", flush=True)
    broker.start()
    try:
        print(f"Kafka ready: bootstrap {broker.bootstrap}", flush=True)
        print(f"  data {broker.data_dir}  log {broker.log_path}", flush=True)
        print("Press Ctrl-C to stop.", flush=True)
        _wait_for_signal()
        print("stopping Kafka ...", flush=True)
    finally:
        broker.stop()
    print("Kafka stopped.", flush=True)
    return 0


def cmd_produce(args: argparse.Namespace) -> int:
    from rl_export.runtime.progressbar import bar
    from rl_export.stream.produce import produce_lines, read_lines

    settings = _settings(args, kafka_bootstrap="bootstrap")
    missing = [p for p in args.files if not p.is_file()]
    if missing:
        raise ConfigError("FILE", f"no such file: {missing[0]}")
    with bar("producing", unit="events") as progress:
        report = asyncio.run(produce_lines(settings, read_lines(args.files), progress.update))
    for line in report.skipped[:20]:
        print(f"skipped {line}", file=sys.stderr)
    if len(report.skipped) > 20:
        print(f"... and {len(report.skipped) - 20} more skipped lines", file=sys.stderr)
    print(f"published {report.published} events, skipped {len(report.skipped)} lines")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from rl_export.worker.main import run_worker

    settings = _settings(
        args, kafka_bootstrap="bootstrap", store_url="store", worker_web_port="web_port"
    )
    return run_worker(settings)


def cmd_replay(args: argparse.Namespace) -> int:
    from rl_export.corpora.replay import replay, summary
    from rl_export.runtime.progressbar import bar
    from rl_export.stream.produce import read_lines

    settings = _settings(args, store_url="store")
    missing = [p for p in args.files if not p.is_file()]
    if missing:
        raise ConfigError("FILE", f"no such file: {missing[0]}")

    async def run() -> list[str]:
        store = _open(args.store, settings)
        try:
            await store.check()
            with bar("replaying", unit="events") as progress:
                report = await replay(
                    settings, store, read_lines(args.files), run_id=args.run_id,
                    progress=progress.update,
                )  # fmt: skip
        finally:
            await store.close()
        return summary(report)

    for line in asyncio.run(run()):
        print(line)
    return 0


def cmd_web(args: argparse.Namespace) -> int:
    from rl_export.web.main import run_web

    settings = _settings(args, web_port="port", web_metrics_port="metrics_port",
                         kafka_bootstrap="bootstrap", store_url="store")  # fmt: skip
    return run_web(settings)


def cmd_dev(args: argparse.Namespace) -> int:
    from rl_export.local.dev import run_dev

    settings = _settings(args, broker_port="port", data_dir="data_dir")
    return run_dev(settings, traffic_rate=args.rate)
