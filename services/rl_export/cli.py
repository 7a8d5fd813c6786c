"""The ``rl-export`` command line (DESIGN.md section 6).

Every command turns an :class:`RlExportError` into one line on stderr and a non-zero exit;
argparse already answers bad flags with a usage line and exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl_export import __version__
from rl_export.errors import ConfigError, RlExportError
from rl_export.settings import Settings, load_settings

EXIT_ERROR = 1
EXIT_CONFIG = 2


def _settings(args: argparse.Namespace, **mapping: str) -> Settings:
    """Load settings with flag overrides; ``mapping`` maps setting names to flag attributes."""
    overrides = {name: getattr(args, attr, None) for name, attr in mapping.items()}
    return load_settings(**overrides)


def _wait_for_signal() -> int:
    """Block until SIGINT or SIGTERM; return the signal number."""
    received: list[int] = []
    stop = threading.Event()

    def handler(signum: int, _frame: Any) -> None:
        received.append(signum)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)
    stop.wait()
    return received[0]


def cmd_broker(args: argparse.Namespace) -> int:
    from rl_export.broker import LocalKafka

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
    from rl_export.produce import produce_lines, read_lines
    from rl_export.progress import Progress

    settings = _settings(args, kafka_bootstrap="bootstrap")
    missing = [p for p in args.files if not p.is_file()]
    if missing:
        raise ConfigError("FILE", f"no such file: {missing[0]}")
    progress = Progress("producing")
    report = asyncio.run(produce_lines(settings, read_lines(args.files), progress))
    progress.close()
    for line in report.skipped[:20]:
        print(f"skipped {line}", file=sys.stderr)
    if len(report.skipped) > 20:
        print(f"... and {len(report.skipped) - 20} more skipped lines", file=sys.stderr)
    print(f"published {report.published} events, skipped {len(report.skipped)} lines")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from rl_export.worker import run_worker

    settings = _settings(
        args, kafka_bootstrap="bootstrap", store_url="store", worker_web_port="web_port"
    )
    return run_worker(settings)


def cmd_dev(args: argparse.Namespace) -> int:
    from rl_export.dev import run_dev

    settings = _settings(args, broker_port="port", data_dir="data_dir")
    return run_dev(settings, traffic_rate=args.rate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rl-export",
        description="Turn scored agent runs into continuously refreshed JSONL training corpora.",
    )
    parser.add_argument("--version", action="version", version=f"rl-export {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("broker", help="run the local single-node Apache Kafka (KRaft)")
    p.add_argument("--port", type=int, help="listener port on 127.0.0.1 (default 9092)")
    p.add_argument("--data-dir", type=Path, help="log directory (default var/kafka)")
    p.set_defaults(func=cmd_broker)

    p = sub.add_parser("dev", help="the embedded stack: Kafka, every stage, synthetic traffic")
    p.add_argument("--port", type=int, help="Kafka port on 127.0.0.1 (default 9092)")
    p.add_argument("--data-dir", type=Path, help="where the stack keeps data (default var)")
    p.add_argument(
        "--rate", type=float, default=5.0, help="synthetic traces per second (0 for none)"
    )
    p.set_defaults(func=cmd_dev)

    p = sub.add_parser("worker", help="a stream-processing worker (the join)")
    p.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers")
    p.add_argument("--store", metavar="URL", help="object store URL")
    p.add_argument("--web-port", type=int, help="port of /metrics, /healthz, /readyz")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("produce", help="publish event JSONL files to the input topics")
    p.add_argument("files", nargs="+", type=Path, metavar="FILE")
    p.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers")
    p.set_defaults(func=cmd_produce)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # aiokafka warns about every retry while topic leaders settle; errors still show.
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        print(f"rl-export: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except RlExportError as exc:
        print(f"rl-export: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
