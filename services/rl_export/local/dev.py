"""``rl-export dev``: the embedded stack on one machine, for trying rl-export out.

1. start the local Kafka broker (data under ``<data_dir>/kafka``) and wait until its group
   coordinator answers (a fresh broker creates and loads its offsets topic on first use);
2. create the topics;
3. start every stage as its own process, pointed at that broker and the store (under
   ``<data_dir>/store`` unless ``RL_EXPORT_STORE_URL`` names another): the worker (join and
   sink) and the web service;
4. reuse the development token of the last start (kept in ``<data_dir>/dev-token``, readable
   by its owner only) while it is still valid, else create one with every scope for the
   synthetic org/project (with ``rl-export tokens create``, as anyone would) and revoke the
   one it replaces; print where the page is;
5. publish synthetic traffic at a steady rate;
6. on Ctrl-C, SIGTERM or SIGHUP (its terminal closed), stop everything in reverse order.

Every child (the broker, each stage) also dies when this process dies, even by SIGKILL
(:func:`rl_export.local.process.dying_with_this_process`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from rl_export.kafka.client import SECURITY_SETTINGS
from rl_export.local.broker import LocalKafka
from rl_export.local.process import ManagedProcess
from rl_export.local.synthetic import SHAPES, trace_events
from rl_export.model.errors import LocalStackError
from rl_export.model.events import FAMILY_OF_TYPE
from rl_export.runtime.settings import Settings, env_name
from rl_export.runtime.storeurl import parse_store_url
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


SYNTHETIC_ORG, SYNTHETIC_PROJECT = "acme", "support-bot"  # what local.synthetic writes


def stages(settings: Settings) -> list[tuple[str, list[str]]]:
    """Return the stages the embedded stack runs, as (name, rl-export arguments)."""
    return [
        ("worker", ["worker", "--web-port", str(settings.worker_web_port)]),
        ("web", ["web", "--port", str(settings.web_port)]),
    ]


def web_url(settings: Settings) -> str:
    return f"http://{settings.web_host}:{settings.web_port}"


def wait_until_up(url: str, timeout_s: float = 60.0) -> bool:
    """Whether ``url`` answers 200 within the time (the web service has started)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    return False


async def wait_for_coordinators(bootstrap: str, groups: list[str], timeout_s: float = 60.0) -> None:
    """Wait until the broker names a coordinator for each group. A fresh broker creates its
    offsets topic on the first lookup and answers "not available" while it loads: stages
    started before then log a warning per retry ("Marking the coordinator dead")."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        deadline = time.monotonic() + timeout_s
        for group in groups:
            while True:
                try:
                    await admin.find_coordinator(group)
                    break
                except KafkaError:
                    if time.monotonic() > deadline:
                        raise LocalStackError(
                            f"the local broker named no coordinator for {group!r} within "
                            f"{timeout_s:.0f}s"
                        ) from None
                    await asyncio.sleep(0.2)
    finally:
        await admin.close()


DEV_SCOPES = "admin,raw,review"
TOKEN_FILE = "dev-token"


def _tokens(env: dict[str, str], *args: str) -> str:
    """``rl-export tokens ARGS``'s output (LocalStackError with its message when it fails)."""
    result = subprocess.run(
        [sys.executable, "-m", "rl_export.cli", "tokens", *args],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise LocalStackError(f"rl-export tokens {args[0]} failed: {result.stderr.strip()}")
    return result.stdout


def token_id(token: str) -> str | None:
    """The id of a token (``rlx_<id>_<secret>``), None for anything else."""
    parts = token.split("_")
    return parts[1] if len(parts) >= 3 and parts[0] == "rlx" and len(parts[1]) == 12 else None


def _still_valid(env: dict[str, str], token: str) -> bool:
    """Whether ``tokens list`` shows the token active, for the synthetic project, with every
    scope the stack gives."""
    found = token_id(token)
    if found is None:
        return False
    for line in _tokens(env, "list").splitlines():
        fields = line.split()
        if fields[:1] == [found]:
            return (fields[1] == f"{SYNTHETIC_ORG}/{SYNTHETIC_PROJECT}" and fields[-1] == "active"
                    and set(fields[3].split(",")) >= set(DEV_SCOPES.split(",")))  # fmt: skip
    return False


def dev_token(env: dict[str, str], data: Path) -> tuple[str, bool]:
    """The development token (every scope for the synthetic org/project) and whether it is
    new: the last start's, from ``<data>/dev-token``, while ``tokens list`` shows it active;
    else a new one from ``rl-export tokens create``, and the one it replaces revoked."""
    path = data / TOKEN_FILE
    old = path.read_text().strip() if path.exists() else ""
    if old and _still_valid(env, old):
        return old, False
    created = _tokens(env, "create", "--org", SYNTHETIC_ORG, "--project", SYNTHETIC_PROJECT,
                      "--subject", "dev", "--scopes", DEV_SCOPES)  # fmt: skip
    token = created.strip().splitlines()[-1]
    replaced = token_id(old) if old else None
    if replaced is not None:
        with contextlib.suppress(LocalStackError):  # unknown, or revoked already
            _tokens(env, "revoke", replaced)
    data.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    os.replace(path.with_suffix(".tmp"), path)
    return token, True


async def _traffic(settings: Settings, rate: float, stop: asyncio.Event) -> None:
    rng = random.Random()
    producer: AIOKafkaProducer = make_producer(settings)
    await producer.start()
    try:
        index = int(time.time())
        while not stop.is_set():
            # Completed a little while ago, so labels and evaluations stay in the past.
            completed = datetime.now(UTC) - timedelta(hours=6)
            for event in trace_events(rng, index, completed, SHAPES["dev"]):
                topic = topic_for(settings, FAMILY_OF_TYPE[event["event_type"]])
                await producer.send(topic, orjson.dumps(event), key=event["trace_id"].encode())
            index += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0 / rate)
    finally:
        await producer.stop()


async def _prepare(settings: Settings) -> None:
    """Steps 1 and 2 before any stage starts: a stage that finds its topics and groups ready
    logs no retries (a topic created a moment ago has no leader yet)."""
    await wait_for_coordinators(settings.kafka_bootstrap, [settings.app_id, settings.sink_group])
    await ensure_service_topics(settings)


async def _serve(settings: Settings, rate: float) -> None:
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


def dev_store_url(settings: Settings) -> str:
    """The stack's store: ``RL_EXPORT_STORE_URL`` when set, else ``<data_dir>/store`` (so
    ``--data-dir`` moves the store with the rest of the stack's data)."""
    if "store_url" in settings.model_fields_set:
        return settings.store_url
    return str(settings.data_dir.resolve() / "store")


def run_dev(settings: Settings, traffic_rate: float) -> int:
    """Run the embedded stack until interrupted; return the exit code."""
    # Until the event loop takes them over (and again after it): a closed terminal stops
    # the stack in order too.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    data = settings.data_dir.resolve()
    broker = LocalKafka(data / "kafka", settings.broker_port, rebalance_delay_ms=3000)
    running: list[Stage] = []
    try:
        _say(f"starting Apache Kafka (KRaft) on 127.0.0.1:{settings.broker_port} ...")
        broker.start()
        # The embedded broker is plaintext on 127.0.0.1, whatever the Kafka security settings say.
        local = settings.model_copy(update={"kafka_bootstrap": broker.bootstrap} | {
            name: Settings.model_fields[name].default for name in SECURITY_SETTINGS})  # fmt: skip
        asyncio.run(_prepare(local))
        store_url = dev_store_url(settings)
        store = parse_store_url(store_url)
        env = dict(os.environ)
        env[env_name("kafka_bootstrap")] = broker.bootstrap
        for name in SECURITY_SETTINGS:  # the embedded broker is plaintext on 127.0.0.1
            env.pop(env_name(name), None)
        env[env_name("data_dir")] = str(data)
        env[env_name("store_url")] = store_url
        for name, argv in stages(settings):
            running.append(Stage(name, argv, data / "logs" / f"{name}.log", env).start())
        token, fresh = dev_token(env, data)
        up = wait_until_up(web_url(settings) + "/readyz")
        _say("rl-export dev: the embedded stack is up")
        _say(f"  Kafka broker       {broker.bootstrap}  (data {broker.data_dir})")
        _say(f"  object store       {store}")
        for stage in running:
            _say(f"  {stage.name:<18} pid {stage.pid}  (log {stage.log_path})")
        _say(f"  worker metrics     http://127.0.0.1:{settings.worker_web_port}/metrics")
        _say(
            f"  web service        {web_url(settings)}  (API {web_url(settings)}/api/v1, "
            f"metrics http://{settings.web_host}:{settings.web_metrics_port}/metrics)"
            + ("" if up else "  NOT UP: see its log")
        )
        _say(
            f"  RL Export page     {web_url(settings)}/{SYNTHETIC_ORG}/{SYNTHETIC_PROJECT}"
            "/rl-export"
        )
        _say(f"  development token  {token}")
        _say(
            f"                     ({'new' if fresh else 'the last start'}: every scope, "
            f"{SYNTHETIC_ORG}/{SYNTHETIC_PROJECT}; kept in {data / TOKEN_FILE}; the page asks "
            "for it once)"
        )
        asyncio.run(_serve(local, traffic_rate))
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
