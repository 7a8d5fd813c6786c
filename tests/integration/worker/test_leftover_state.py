"""A worker started on a data dir that an earlier run left behind reaches ready every time.

The dir holds the RocksDB stores of two join processes, written against another broker:
their changelog positions mean nothing on this one (so each store is rebuilt), and which
join process gets which partition changes from start to start (so a store may still be
open in the sibling that had it a moment ago). Ten starts in a row, each with events to
join, must all reach ready, join what they were given, and stop cleanly. Halfway, the dir
is put back as the other broker left it, and made older too: stores without the expiry
index, as a worker before it wrote them; and the start after it gets its own stores made
older, which it must keep and upgrade (scan once for their expiry index).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from rl_export.local.broker import LocalKafka
from rl_export.local.synthetic import generate
from rl_export.runtime.net import free_port
from rl_export.runtime.settings import Settings
from tests.integration.stream.test_join_loop import wait_for_final
from tests.integration.workers import WorkerProcess, expected_final, publish

STARTS = 10


def make_older(data_dir: Path) -> int:
    """Turn the RocksDB stores under ``data_dir`` into what a worker before the expiry index
    wrote: no ``expiry`` column family, no ``indexed`` flag. Returns how many it changed."""
    from rocksdict import Options, Rdict

    changed = 0
    for path in sorted(data_dir.rglob("partition-*")):
        options = Options(raw_mode=True)
        families = {name: Options(raw_mode=True) for name in Rdict.list_cf(str(path))
                    if name != "default"}  # fmt: skip
        db = Rdict(str(path), options, column_families=families)
        meta = db.get_column_family("meta")
        meta.delete(b"expiry_indexed")
        meta.close()
        db.drop_column_family("expiry")
        db.close()
        changed += 1
    return changed


@pytest.mark.soak  # ten worker starts, about a minute: make soak runs it, make test does not
async def test_ten_starts_on_a_dir_left_by_a_run_against_another_broker(
    settings: Settings, tmp_path: Path
) -> None:
    local = settings.model_copy(update={"state_store": "rocksdb://", "partitions": 8})
    other = LocalKafka(tmp_path / "other-kafka", free_port(), heap="256m")
    with other.start():
        elsewhere = local.model_copy(update={"kafka_bootstrap": other.bootstrap})
        events = generate(120, seed=81, duplicate_rate=0)
        with WorkerProcess(elsewhere, "w").start():
            await publish(elsewhere, events)
            await wait_for_final(elsewhere, expected_final(events))
    left = local.data_dir / "w"
    assert any(left.rglob("CURRENT")), "the earlier run left RocksDB stores"
    kept = tmp_path / "left-by-the-other-broker"
    shutil.copytree(left, kept)

    seen: list[dict[str, object]] = []
    took: list[float] = []
    for start in range(STARTS):
        logged = (left / "worker.log").stat().st_size if (left / "worker.log").exists() else 0
        started = time.monotonic()
        worker = WorkerProcess(local, "w").start(timeout_s=90)
        try:
            took.append(time.monotonic() - started)
            batch = generate(10, seed=100 + start, duplicate_rate=0)
            batch = [e | {"trace_id": f"{e['trace_id']}-s{start}"} for e in batch]
            seen += batch
            await publish(local, batch)
            await wait_for_final(local, expected_final(seen))
        finally:
            worker.stop()
        assert worker.proc is None
        log = worker.log_path.read_text(errors="replace")
        assert "StoreLockedError" not in log
        assert "exited with code" not in log
        if start == STARTS // 2 + 2:  # on its own stores, made older: kept and upgraded
            during = worker.log_path.read_bytes()[logged:]
            assert b"expiry index built once, from a scan" in during
        if start == STARTS // 2:  # the second half starts on the other broker's dir again
            shutil.rmtree(left)
            shutil.copytree(kept, left)
            assert make_older(left) > 0
        if start == STARTS // 2 + 1:
            # Stores the other broker left are rebuilt when their changelog positions are past
            # this broker's ends (which depends on how both runs batched): whether those got
            # scanned is luck. This run's own stores, made older, are restored and scanned.
            assert make_older(left) > 0
    print(f"time to ready per start: {', '.join(f'{t:.1f}s' for t in took)}")
