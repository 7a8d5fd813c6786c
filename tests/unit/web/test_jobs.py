"""Export jobs: run into the store, report progress and failure, go stale, expire."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from rl_export.corpora.commits import encode_lines
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import LocalStore, MemoryStore, open_store
from rl_export.model.codec import dumps_line
from rl_export.runtime.metrics import WebMetrics
from rl_export.runtime.settings import Settings
from rl_export.web import jobs as jobs_module
from rl_export.web.errors import TooMany
from rl_export.web.jobs import JobRequest, Jobs, JobStatus, _run, file_key, may_see, write_status
from tests.records import record

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def new_status(org: str, project: str, request: JobRequest, now: datetime) -> JobStatus:
    """A job of ana's, not raw."""
    return jobs_module.new_status(org, project, request, now, subject="ana", raw=False)


async def seed(store: LocalStore, n: int) -> None:
    """A one-commit evaluator corpus of n records (the layout the sink writes)."""
    ref = CorpusRef("acme", "bot", "evaluator")
    lines = [dumps_line(record(f"tr-{i}")) for i in range(n)]
    shard = encode_lines(lines, [], "none")
    key = ref.data_key("t-0", 0, shard.sha256, "none")
    await store.put(key, shard.data)
    commit = {"topic": "t", "partition": 0, "from_offset": 0, "last_offset": n - 1,
              "shard": ref.relative(key), "records": n, "bytes": len(shard.data),
              "sha256": shard.sha256, "compression": "none", "schema_version": 1,
              "min_updated_at": None, "max_updated_at": None, "writer": "test",
              "created_at": "2026-01-01T00:00:00Z"}  # fmt: skip
    await store.put(ref.manifest_key("t-0", 0), dumps_line(commit))


async def test_a_job_writes_its_file_and_says_ready(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    await seed(store, 5)
    settings = Settings(store_url=str(tmp_path / "store"), web_export_heartbeat_s=0.05)
    status = new_status("acme", "bot", JobRequest(source="evaluator", format="csv",
                        columns="trace_id:id"), NOW)  # fmt: skip
    assert await _run(settings, status) == ("ready", {"secrets": 0})  # the default: secrets
    data = await store.get(file_key(status))
    assert data.decode().splitlines() == ["id", *(f"tr-{i}" for i in range(5))]
    jobs = Jobs(settings, open_store(settings.store_url), WebMetrics(CollectorRegistry()))
    done = await jobs.get("acme", "bot", status.id)
    assert done is not None
    assert (done.status, done.progress, done.records) == ("ready", 1.0, 5)
    assert done.redactions == {"secrets": 0}


async def test_a_job_that_fails_says_why(tmp_path: Path) -> None:
    settings = Settings(store_url=str(tmp_path / "store"))
    status = new_status("acme", "nothing", JobRequest(source="human", format="trajectory"), NOW)
    assert await _run(settings, status) == ("failed", {})
    jobs = Jobs(settings, open_store(settings.store_url), WebMetrics(CollectorRegistry()))
    failed = await jobs.get("acme", "nothing", status.id)
    assert failed is not None
    assert failed.status == "failed"
    assert failed.error is not None
    assert "no data for acme/nothing/human" in failed.error


async def test_stale_jobs_fail_and_finished_ones_expire() -> None:
    store = MemoryStore()
    settings = Settings(web_export_retention_s=3600, web_export_heartbeat_s=1)
    jobs = Jobs(settings, store, WebMetrics(CollectorRegistry()))
    now = datetime.now(UTC)
    request = JobRequest(source="human", format="trajectory")
    alive = new_status("acme", "bot", request, now - timedelta(seconds=5))
    alive = alive.model_copy(update={"updated_at": now})
    stale = new_status("acme", "bot", request, now - timedelta(minutes=5))
    old = new_status("acme", "bot", request, now - timedelta(hours=3)).model_copy(
        update={"status": "ready", "finished_at": now - timedelta(hours=2)}
    )
    fresh = new_status("acme", "bot", request, now).model_copy(
        update={"status": "ready", "finished_at": now}
    )
    for status in (alive, stale, old, fresh):
        await write_status(store, status)
    await store.put(file_key(old), b"data")
    assert (await jobs.get("acme", "bot", alive.id)).status == "processing"  # type: ignore[union-attr]
    gone = await jobs.get("acme", "bot", stale.id)
    assert gone is not None
    assert gone.status == "failed"
    assert "start it again" in (gone.error or "")
    assert await jobs.sweep() == 1
    assert await jobs.get("acme", "bot", old.id) is None
    assert not [k for k in store.objects if old.id in k]
    assert await jobs.get("acme", "bot", fresh.id) is not None
    assert await jobs.get("acme", "other", fresh.id) is None  # jobs belong to their project
    assert await jobs.get("acme", "bot", "../../_tokens") is None


async def test_a_raw_jobs_audit_runs_only_once_the_job_has_its_place(tmp_path: Path) -> None:
    """``before`` (a raw job's audit entry) is not written for a job refused with 429, and a
    failure there starts nothing and gives the place back."""
    settings = Settings(store_url=str(tmp_path / "store"), web_jobs_per_subject=1)
    jobs = Jobs(settings, open_store(settings.store_url), WebMetrics(CollectorRegistry()))
    request = JobRequest(source="evaluator", format="trajectory")
    audited: list[str] = []

    async def audit(job_id: str) -> None:
        audited.append(job_id)

    async def refused(job_id: str) -> None:
        raise OSError("the store did not take the entry")

    with pytest.raises(OSError, match="did not take"):
        await jobs.start("acme", "bot", request, "ana", before=refused)
    assert jobs.limit._held == {}  # the place is given back
    held = jobs.limit.acquire(("acme", "bot", "ana"))  # the subject's one place, taken
    with pytest.raises(TooMany):
        await jobs.start("acme", "bot", request, "ana", before=audit)
    assert audited == []  # no entry for a job that never started
    held.release()


async def test_a_raw_jobs_audit_entry_names_the_job(tmp_path: Path) -> None:
    settings = Settings(store_url=str(tmp_path / "store"))
    jobs = Jobs(settings, open_store(settings.store_url), WebMetrics(CollectorRegistry()))
    audited: list[str] = []

    async def audit(job_id: str) -> None:
        audited.append(job_id)

    request = JobRequest(source="evaluator", format="trajectory", redact="none")
    try:
        started = await jobs.start("acme", "bot", request, "rae", raw=True, before=audit)
        assert audited == [started.id]
        stored = await jobs.get("acme", "bot", started.id)
        assert stored is not None
        assert (stored.subject, stored.raw) == ("rae", True)
        assert [s.id for s in await jobs.of_project("acme", "bot")] == [started.id]
        assert await jobs.of_project("acme", "other") == []
    finally:
        await jobs.close()


@pytest.mark.parametrize("raw", [False, True])
@pytest.mark.parametrize("admin", [False, True])
@pytest.mark.parametrize("owner", ["ana", None])
def test_a_job_is_seen_by_its_subject_and_by_admins_unless_raw(
    owner: str | None, admin: bool, raw: bool
) -> None:
    status = new_status("acme", "bot", JobRequest(source="human", format="trajectory"), NOW)
    status = status.model_copy(update={"subject": owner, "raw": raw})
    # Its subject always (whatever the scopes: the download asks for raw again) ...
    assert may_see(status, "ana", admin=admin, raw=raw) is (owner == "ana" or (admin and not raw))
    # ... another subject only as an admin, and never a raw job; a job of no subject (made
    # before jobs had owners) likewise.
    assert may_see(status, "bo", admin=admin, raw=raw) is (admin and not raw)
