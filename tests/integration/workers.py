"""Run ``rl-export worker`` in child processes and read what they emit, for the tests."""

from __future__ import annotations

import os
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from rl_export.common.codec import dumps, loads
from rl_export.common.events import EVENT_ADAPTER, FAMILY_OF_TYPE
from rl_export.common.net import free_port
from rl_export.common.records import decode_snapshot
from rl_export.common.settings import Settings, child_env
from rl_export.common.specs import DEFAULT_CORPORA
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import CorpusReader
from rl_export.corpora.store import ObjectStore
from rl_export.local.process import ManagedProcess
from rl_export.stream.join import JoinConfig, RawEvent, TraceState, current_snapshot, merge
from rl_export.stream.produce import topic_for
from rl_export.stream.topics import ensure_service_topics


def settings_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment that configures a child process exactly like ``settings``."""
    return child_env(settings, os.environ, **extra)


class WorkerProcess(ManagedProcess):
    """One ``rl-export worker`` with its own data dir and web port."""

    name = "rl-export worker"

    def __init__(
        self,
        settings: Settings,
        label: str,
        *,
        store: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = settings.data_dir / label
        super().__init__(self.data_dir / "worker.log")
        self.web_port = free_port()
        self.env = settings_env(
            settings,
            RL_EXPORT_DATA_DIR=str(self.data_dir),
            RL_EXPORT_WORKER_WEB_PORT=str(self.web_port),
            RL_EXPORT_LOG_LEVEL="info",
            **({"RL_EXPORT_STATE_STORE": store} if store else {}),
            **(env or {}),
        )
        self.returncode: int | None = None

    def start(self, timeout_s: float = 90.0) -> WorkerProcess:
        self._spawn([sys.executable, "-m", "rl_export.cli", "worker"], env=self.env)
        self._wait_until(self.ready, timeout_s, "/readyz answered 200")
        return self

    def start_and_wait_for_exit(self, timeout_s: float) -> int:
        """Run until the process exits by itself (a fault-injected crash); return its code."""
        self._spawn([sys.executable, "-m", "rl_export.cli", "worker"], env=self.env)
        assert self.proc is not None
        try:
            self.returncode = self.proc.wait(timeout_s)
        finally:
            self.stop()
        return self.returncode

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url("/readyz"), timeout=1) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.web_port}{path}"

    def metric(self, name: str, **labels: str) -> float:
        """Read one sample from the worker's /metrics (0 when absent)."""
        with urllib.request.urlopen(self.url("/metrics"), timeout=5) as response:
            text = response.read().decode()
        want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
                       if labels else "")  # fmt: skip
        total = 0.0
        for line in text.splitlines():
            if line.startswith(want + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final commit or flush."""
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            self.proc = None


async def publish(
    settings: Settings, events: Iterable[dict[str, Any] | tuple[str, bytes, bytes]]
) -> int:
    """Publish events (dicts routed by type, or raw (topic, key, value) tuples)."""
    await ensure_service_topics(settings)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, linger_ms=5)
    await producer.start()
    count = 0
    try:
        futures = []
        for item in events:
            if isinstance(item, tuple):
                topic, key, value = item
            else:
                topic = topic_for(settings, FAMILY_OF_TYPE[item["event_type"]])
                key, value = item["trace_id"].encode(), orjson.dumps(item)
            futures.append(await producer.send(topic, value, key=key))
            count += 1
        for fut in futures:
            await fut
    finally:
        await producer.stop()
    return count


@dataclass
class TopicReader:
    """Reads a topic from the beginning, keeping every record in order."""

    settings: Settings
    topic: str

    async def read_until(
        self, done: Callable[[list[Any]], bool], timeout_s: float = 60.0
    ) -> list[Any]:
        consumer = AIOKafkaConsumer(
            self.topic,
            bootstrap_servers=self.settings.kafka_bootstrap,
            group_id=None,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            isolation_level="read_committed",  # the join writes in transactions
        )
        await consumer.start()
        records: list[Any] = []
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                for tp_records in batch.values():
                    records.extend(tp_records)
                if done(records):
                    break
        finally:
            await consumer.stop()
        return records


def plain(value: Any) -> Any:
    """A snapshot or record as JSON gives it back (messages parsed, not RawJson)."""
    return loads(dumps(value))


def snapshots(records: list[Any]) -> list[dict[str, Any]]:
    return [plain(decode_snapshot(r.value)) for r in records]


def latest_by_trace(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The highest-revision snapshot of each trace (the sink keeps the same)."""
    out: dict[str, dict[str, Any]] = {}
    for snap in items:
        current = out.get(snap["trace_id"])
        if current is None or snap["revision"] >= current["revision"]:
            out[snap["trace_id"]] = snap
    return out


def expected_final(
    events: list[dict[str, Any]], threshold: float = 0.7
) -> dict[str, dict[str, Any]]:
    """Fold the pure join over the events in the given order: the final snapshot per trace."""
    states: dict[str, TraceState] = {}
    config = JoinConfig(human_pass_threshold=threshold)
    for value in events:
        raw = orjson.dumps(value)
        event = EVENT_ADAPTER.validate_json(raw)
        result = merge(
            states.get(event.trace_id), event, RawEvent(raw), now=time.time(), config=config
        )
        states[event.trace_id] = result.state
    out = {}
    for trace_id, state in states.items():
        snap = current_snapshot(state, config)
        if snap is not None:
            out[trace_id] = plain(snap)
    return out


def comparable(snap: dict[str, Any]) -> dict[str, Any]:
    """A tombstone's revision depends on arrival order (later events emit nothing)."""
    return {k: v for k, v in snap.items() if not (snap["deleted"] and k == "revision")}


def expected_corpora(events: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """corpus -> trace_id -> record, as a reader's latest-revision view must show them."""
    finals = expected_final(events)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for spec in DEFAULT_CORPORA:
        rows = {}
        for trace_id, snap in finals.items():
            record = spec.record_for(snap)
            if record is not None and not record.get("deleted"):
                rows[trace_id] = record
        out[spec.name] = rows
    return out


async def corpus_view(store: ObjectStore, org: str, project: str) -> dict[str, dict[str, Any]]:
    out = {}
    for spec in DEFAULT_CORPORA:
        reader = CorpusReader(store, CorpusRef(org, project, spec.name))
        out[spec.name] = {r["trace_id"]: r async for r in reader.records(latest_only=True)}
    return out
