"""``rl-export dev``: the embedded stack on one machine, for trying rl-export out.

1. start the local Kafka broker (data under ``<data_dir>/kafka``);
2. create the topics;
3. start every stage that exists as its own process, pointed at that broker and the store;
4. publish synthetic traffic at a steady rate;
5. on Ctrl-C, SIGTERM or SIGHUP (its terminal closed), stop everything in reverse order.

Every child (the broker, each stage) also dies when this process dies, even by SIGKILL
(:func:`rl_export.local.process.dying_with_this_process`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
from aiokafka import AIOKafkaProducer

from rl_export.common.events import FAMILY_OF_TYPE
from rl_export.common.settings import Settings, env_name
from rl_export.common.storeurl import parse_store_url
from rl_export.local.broker import LocalKafka
from rl_export.local.process import ManagedProcess
from rl_export.local.synthetic import trace_events
from rl_export.stream.produce import make_producer, topic_for
from rl_export.stream.topics import ensure_service_topics


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through the finally blocks that stop the children


class Stage(ManagedProcess):
    """One pipeline stage run as ``rl-export <command>`` in a child process."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str]) -> None:
        super().__init__(log_path)
        self.name = name
        self.argv = argv
        self.env = env

    def start(self) -> Stage:
        self._spawn([sys.executable, "-m", "rl_export.cli", *self.argv], env=self.env)
        return self


def stages(settings: Settings) -> list[tuple[str, list[str]]]:
    """Return the stages the embedded stack runs, as (name, rl-export arguments).

    Stages are added here as they are built (the sink and the web service come next).
    """
    return [("worker", ["worker", "--web-port", str(settings.worker_web_port)])]


async def _traffic(settings: Settings, rate: float, stop: asyncio.Event) -> None:
    rng = random.Random()
    producer: AIOKafkaProducer = make_producer(settings)
    await producer.start()
    try:
        index = int(time.time())
        while not stop.is_set():
            # Completed a little while ago, so labels and evaluations stay in the past.
            completed = datetime.now(UTC) - timedelta(hours=6)
            for event in trace_events(rng, index, completed):
                topic = topic_for(settings, FAMILY_OF_TYPE[event["event_type"]])
                await producer.send(topic, orjson.dumps(event), key=event["trace_id"].encode())
            index += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0 / rate)
    finally:
        await producer.stop()


async def _serve(settings: Settings, rate: float) -> None:
    await ensure_service_topics(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    traffic = asyncio.create_task(_traffic(settings, rate, stop)) if rate > 0 else None
    if rate > 0:
        _say(f"  synthetic traffic  {rate:g} traces/s to {', '.join(settings.input_topics)}")
    _say("Press Ctrl-C to stop.")
    await stop.wait()
    if traffic is not None:
        await traffic


def run_dev(settings: Settings, traffic_rate: float) -> int:
    """Run the embedded stack until interrupted; return the exit code."""
    # Until the event loop takes them over (and again after it): a closed terminal stops
    # the stack in order too.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    data = settings.data_dir.resolve()
    broker = LocalKafka(data / "kafka", settings.broker_port)
    running: list[Stage] = []
    try:
        _say(f"starting Apache Kafka (KRaft) on 127.0.0.1:{settings.broker_port} ...")
        broker.start()
        store = parse_store_url(settings.store_url)
        env = dict(os.environ)
        env[env_name("kafka_bootstrap")] = broker.bootstrap
        env[env_name("data_dir")] = str(data)
        for name, argv in stages(settings):
            running.append(Stage(name, argv, data / "logs" / f"{name}.log", env).start())
        _say("rl-export dev: the embedded stack is up")
        _say(f"  Kafka broker       {broker.bootstrap}  (data {broker.data_dir})")
        _say(f"  object store       {store}")
        for stage in running:
            _say(f"  {stage.name:<18} pid {stage.pid}  (log {stage.log_path})")
        _say(f"  worker metrics     http://127.0.0.1:{settings.worker_web_port}/metrics")
        asyncio.run(_serve(settings.model_copy(update={"kafka_bootstrap": broker.bootstrap}),
                           traffic_rate))  # fmt: skip
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP):  # asyncio.run put back the defaults
            signal.signal(sig, signal.SIG_IGN)  # stopping now; a second signal must not cut it
        for stage in reversed(running):
            stage.stop()
        _say("stopping Kafka ...")
        broker.stop()
    _say("stopped.")
    return 0


def _say(line: str) -> None:
    """Print a line; after SIGHUP the terminal is gone, which must not stop the shutdown."""
    with contextlib.suppress(OSError):
        print(line, flush=True)
