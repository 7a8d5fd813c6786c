"""The open table: a corpus's latest view as a Delta Lake table, ``<corpus>/_table/``.

DESIGN.md section 13; docs/guides/tables.md for readers. One row per live trace (the columns:
:mod:`rl_export.corpora.tablerows`), written with delta-rs (``deltalake``: no JVM) by
compaction, never by the sink, so the table costs nothing per event. How a write goes
(:func:`write_table`, blocking: callers run it in a thread):

1. Open the table, or create it (its statistics limited to ``revision`` and ``updated_at``:
   :data:`~rl_export.corpora.tablerows.STATS_COLUMNS`). Its Delta ``txn`` action for
   :data:`APP_ID` says which compaction generation it reflects (0: none yet); the commit's
   ``commitInfo`` carries ``rl_export_position`` (generation and chain ends) for people.
2. Already at or past the generation being written: nothing to do. At the generation the
   changes apply to: MERGE the changes on ``trace_id`` (a newer revision replaces the row, a
   tombstone of the same or a newer revision deletes it, a new trace is inserted). Anywhere
   else (the table was made late, or a write failed), or when the changes are many
   (``rewrite``: their bytes past :data:`MERGE_BYTES`): overwrite the table with every live
   record, streamed in Arrow batches (one commit that removes every earlier file).
3. A MERGE that changes nothing makes no Delta commit: an empty append records the position.
4. Deletion wins: when an erased trace's tombstone was written (or a table that was behind
   lost rows), every file the log no longer uses is deleted at once (``vacuum`` with no
   retention), so no version of the table returns the trace; reading an earlier version
   then fails rather than answers. Otherwise, past :data:`MAX_FILES` data files, the small
   files are compacted (``optimize``) and files older than the retention vacuumed, except
   those the Delta versions of pinned corpus versions read.

Writers commit with the store's conditional writes (a local directory: create-if-absent;
S3 and SeaweedFS: ``If-None-Match``), which delta-rs uses on its own: no lock service. Two
writers of one table race safely: the loser's commit fails (``CommitFailedError``), it
reloads the table and starts again at step 2.

The memory store has no tables (:func:`locate` gives None).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rl_export.corpora import tablerows
from rl_export.corpora.commits import read_chain
from rl_export.corpora.compacted import Compaction, read_compaction
from rl_export.corpora.erasures import erased_traces
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import LocalStore, ObjectStore, S3Store
from rl_export.corpora.versions import list_versions
from rl_export.model.codec import dumps
from rl_export.model.errors import ObjectNotFoundError, StoreError, TableError

log = logging.getLogger(__name__)

TABLE_FOLDER = "_table"
APP_ID = "rl-export"
"""The Delta ``txn`` application id whose version is the compaction generation reflected."""
POSITION_KEY = "rl_export_position"
MAX_FILES = 32
"""Data files past which a write compacts the table's small files (each merge adds one)."""
TARGET_FILE_BYTES = 128 << 20
CHECKPOINT_INTERVAL = 100
"""delta-rs writes a checkpoint every this many versions (``delta.checkpointInterval``)."""
MERGE_BYTES = 64 << 20
"""Changes past this many bytes of JSON (their records as the corpus holds them) rewrite the
table instead of merging into it. A MERGE holds its source in memory, parsed and as Arrow
(several times these bytes), and as trace ids are spread over every file of the table, a
merge of that many rows rewrites nearly every file anyway: overwriting the table from the
generation, streamed in batches, costs about the same writes in bounded memory."""
ATTEMPTS = 10
"""Commits tried against concurrent writers before a write gives up (the next compaction
tries again)."""


Records = Callable[[], Iterable[Mapping[str, Any]]]
"""Every live record of a position, read again at each call (a list, or a stream)."""


@dataclass(frozen=True)
class TableLocation:
    """Where a corpus's table is, as delta-rs names it (a path or ``s3://``), and how to
    reach it (``storage_options``: S3 credentials, region and endpoint)."""

    uri: str
    storage_options: dict[str, str] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class TableCommit:
    """What a write did: the Delta version naming the position, and the rows it changed."""

    version: int
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    full: bool = False  # the table was behind: rewritten from every live record
    vacuumed: bool = False  # files of earlier versions were deleted (an erasure)
    objects: int = 0  # files written: log entries, data files, checkpoints


def table_key(ref: CorpusRef) -> str:
    """The table's folder, as a store key prefix (no trailing slash)."""
    return f"{ref.root}/{TABLE_FOLDER}"


def locate(store: ObjectStore, ref: CorpusRef) -> TableLocation | None:
    """The table of ``ref`` in ``store``: a folder of a local store, or a prefix of an S3
    bucket with the credentials the process's AWS configuration gives (:func:`s3_options`);
    None for a store without tables (memory). Blocking (credentials may be fetched)."""
    while (inner := getattr(store, "inner", None)) is not None:  # a MeteredStore's
        store = inner
    if isinstance(store, LocalStore):
        return TableLocation(str(store.root / table_key(ref)))
    if isinstance(store, S3Store):
        uri = f"s3://{store.bucket}/{store.prefix}{table_key(ref)}"
        return TableLocation(uri, s3_options(store.endpoint_url))
    return None


def s3_options(endpoint_url: str | None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """delta-rs's S3 ``storage_options`` from the settings the store's own client uses:
    the credentials botocore finds (environment, profile, web identity, instance role; a
    session token when they are temporary, so they are asked for at every write), the
    region (``AWS_REGION``, else the profile's, else ``us-east-1``) and the endpoint
    (``AWS_ENDPOINT_URL``: SeaweedFS, MinIO; plain HTTP allowed when it is ``http://``)."""
    import botocore.session

    env = os.environ if env is None else env
    session = botocore.session.Session()
    options: dict[str, str] = {
        "AWS_REGION": env.get("AWS_REGION")
        or env.get("AWS_DEFAULT_REGION")
        or session.get_config_variable("region")
        or "us-east-1",
    }
    credentials = session.get_credentials()
    if credentials is not None:
        frozen = credentials.get_frozen_credentials()
        options["AWS_ACCESS_KEY_ID"] = frozen.access_key
        options["AWS_SECRET_ACCESS_KEY"] = frozen.secret_key
        if frozen.token:
            options["AWS_SESSION_TOKEN"] = frozen.token
    if endpoint_url:
        options["AWS_ENDPOINT_URL"] = endpoint_url
        if endpoint_url.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    return options


def _properties(position: Mapping[str, Any], generation: int | None) -> Any:
    from deltalake import CommitProperties, Transaction

    return CommitProperties(
        # userMetadata is the standard field (Spark's DESCRIBE HISTORY shows it).
        custom_metadata={POSITION_KEY: dict(position), "userMetadata": dumps(position).decode()},
        app_transactions=None if generation is None else [Transaction(APP_ID, generation)],
    )


def _open(location: TableLocation) -> Any:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(location.uri, storage_options=location.storage_options)
    except TableNotFoundError:
        return None


def _create(location: TableLocation, fmt: str) -> Any:
    from deltalake import DeltaTable

    return DeltaTable.create(
        location.uri,
        schema=tablerows.schema(fmt, tablerows.base_columns(fmt)),
        mode="ignore",  # another writer made it first: open theirs
        storage_options=location.storage_options,
        configuration={"delta.dataSkippingStatsColumns": tablerows.STATS_COLUMNS},
        commit_properties=_properties(tablerows.position(0, {}), 0),
    )


def table_generation(table: Any) -> int:
    """The compaction generation a table reflects (0: none, or not written by us)."""
    found = table.transaction_version(APP_ID)
    return 0 if found is None else int(found)


def read_generation(location: TableLocation) -> int | None:
    """The generation the table at ``location`` reflects; None when there is no table."""
    try:
        table = _open(location)
        return None if table is None else table_generation(table)
    except Exception as exc:  # delta-rs raises its own errors and OSError
        raise TableError(f"{location.uri}: {exc}") from exc


def write_table(
    location: TableLocation,
    fmt: str,
    *,
    changes: Sequence[Mapping[str, Any]],
    records: Records | None,
    applies_to: int,
    generation: int | None,
    position: Mapping[str, Any],
    erased: bool = False,
    keep_versions: Sequence[int] = (),
    retention_s: float = 7 * 86400.0,
    fields: Sequence[str] | None = None,
    rewrite: bool = False,
) -> TableCommit | None:
    """Bring the table up to ``position`` (see the module's steps); None when it already is,
    or when it is behind and ``records`` is None (nothing to rebuild it from).

    ``changes``: the final state (record or tombstone) of every trace that changed since
    generation ``applies_to``; ``records``: every live record at the position, for a table
    that is not at ``applies_to`` (read as a stream, in batches: called again for each
    attempt); ``fields``: every field those records hold, when known (else a first pass
    over ``records`` finds them); ``rewrite``: the changes are many, overwrite the
    table from ``records`` (``changes`` then need hold only the tombstones);
    ``generation``: the generation the table reflects after this write (None: a position
    within a generation, a pinned version's, which leaves the table's generation as it
    is); ``erased``: the changes delete an erased trace.
    Raises :class:`TableError` when delta-rs fails.
    """
    try:
        return _write(
            location, fmt, changes=changes, records=records, applies_to=applies_to,
            generation=generation, position=position, erased=erased,
            keep_versions=keep_versions, retention_s=retention_s, fields=fields,
            rewrite=rewrite,
        )  # fmt: skip
    except TableError:
        raise
    except Exception as exc:  # delta-rs raises DeltaError, OSError, arrow errors
        raise TableError(f"{location.uri}: {type(exc).__name__}: {exc}") from exc


def _write(
    location: TableLocation,
    fmt: str,
    *,
    changes: Sequence[Mapping[str, Any]],
    records: Records | None,
    applies_to: int,
    generation: int | None,
    position: Mapping[str, Any],
    erased: bool,
    keep_versions: Sequence[int],
    retention_s: float,
    fields: Sequence[str] | None,
    rewrite: bool,
) -> TableCommit | None:
    from deltalake.exceptions import CommitFailedError, DeltaError

    table = _open(location)  # 1.
    first = -1 if table is None else table.version()  # the log entries before ours
    if table is None:
        table = _create(location, fmt)
    for attempt in range(ATTEMPTS):
        current = table_generation(table)
        if generation is not None and current >= generation:  # 2.
            return None
        if generation is None and current > applies_to:  # a pin behind the table: never back
            return None
        full = current != applies_to
        if (full or rewrite) and records is None:
            if full:
                return None
            rewrite = False  # nothing to rewrite from: merge the changes
        try:
            if (full or rewrite) and records is not None:
                done = _overwrite(table, fmt, records, fields, full=full, generation=generation,
                                  position=position)  # fmt: skip
            else:
                done = _merge(table, fmt, changes, generation=generation, position=position)
        except DeltaError as exc:
            # Another writer committed first (CommitFailedError), or deleted files of the
            # version this one read (its vacuum after an erasure): read the table again,
            # decide again.
            if attempt + 1 == ATTEMPTS:
                raise
            kind = "a concurrent commit won" if isinstance(exc, CommitFailedError) else exc
            log.info("%s: %s (attempt %d); reloading", location.uri, kind, attempt + 1)
            time.sleep(0.05 * (attempt + 1))
            table = _open(location)
            continue
        break
    else:
        raise TableError(f"{location.uri}: {ATTEMPTS} commits lost to concurrent writers")
    # 4.
    vacuumed = erased or (done.full and done.deleted > 0)
    added = done.objects
    if vacuumed:
        table.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False,
                     commit_properties=_properties(position, None))  # fmt: skip
    elif len(table.file_uris()) > MAX_FILES:
        optimized = table.optimize.compact(
            target_size=TARGET_FILE_BYTES, commit_properties=_properties(position, None)
        )
        added += int(optimized.get("numFilesAdded", 0))
        table.vacuum(retention_hours=int(retention_s // 3600), dry_run=False,
                     enforce_retention_duration=False, keep_versions=list(keep_versions) or None,
                     commit_properties=_properties(position, None))  # fmt: skip
    last = table.version()
    checkpoints = sum(1 for v in range(first + 1, last + 1) if v and v % CHECKPOINT_INTERVAL == 0)
    # Each version a log entry; each checkpoint its file and _last_checkpoint.
    return _with(done, vacuumed=vacuumed, objects=added + (last - first) + 2 * checkpoints)


def _with(done: TableCommit, **changed: Any) -> TableCommit:
    return TableCommit(**{**done.__dict__, **changed})


def _merge(
    table: Any,
    fmt: str,
    rows: Sequence[Mapping[str, Any]],
    *,
    generation: int | None,
    position: Mapping[str, Any],
) -> TableCommit:
    """One MERGE of the changes (steps 2 and 3); its version and counts."""
    from deltalake import write_deltalake
    from deltalake.schema import Field, PrimitiveType

    columns = [f.name for f in table.schema().to_arrow()]
    added = tablerows.new_columns(columns, rows)
    properties = _properties(position, generation)
    if added:  # fields the record gained since the table was made: JSON string columns
        table.alter.add_columns(
            [Field(name, PrimitiveType("string"), nullable=True) for name in added],
            commit_properties=_properties(position, None),
        )
        columns += added
    before = table.version()
    if rows:
        source = tablerows.to_arrow(fmt, columns, rows)
        values = {c: f"s.{_quoted(c)}" for c in columns}
        merger = table.merge(
            source, "t.trace_id = s.trace_id", source_alias="s", target_alias="t",
            commit_properties=properties,
        )  # fmt: skip
        deleted = tablerows.DELETED
        merger = merger.when_matched_delete(f"s.{deleted} AND s.revision >= t.revision")
        merger = merger.when_matched_update(values, f"NOT s.{deleted} AND "
                                                    "s.revision > t.revision")  # fmt: skip
        merger = merger.when_not_matched_insert(values, f"NOT s.{deleted}")
        metrics = merger.execute()
    else:
        metrics = {}
    if table.version() == before:  # 3. nothing changed: no commit was made
        empty = tablerows.schema(fmt, columns).empty_table()
        write_deltalake(table, empty, mode="append", commit_properties=properties)
    return TableCommit(
        version=table.version(),
        inserted=int(metrics.get("num_target_rows_inserted", 0)),
        updated=int(metrics.get("num_target_rows_updated", 0)),
        deleted=int(metrics.get("num_target_rows_deleted", 0)),
        objects=int(metrics.get("num_target_files_added", 0)),
    )


REWRITE_BATCH_ROWS = 4096
"""Records per Arrow batch when a table is rewritten (a few MB each)."""


def _overwrite(
    table: Any,
    fmt: str,
    records: Records,
    fields: Sequence[str] | None,
    *,
    full: bool,
    generation: int | None,
    position: Mapping[str, Any],
) -> TableCommit:
    """The table overwritten with every live record of the position, streamed in batches
    (one Delta commit: every earlier file removed, the new ones added); the counts are
    those a MERGE would give (rows inserted, of another revision, no longer there)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import write_deltalake
    from deltalake.schema import Field, PrimitiveType

    columns = [f.name for f in table.schema().to_arrow()]
    if fields is None:
        added = tablerows.new_columns(columns, records())
    else:
        known = set(columns) | {"deleted", "deleted_at"}
        added = [name for name in fields if name not in known]
    if added:  # fields the record gained since the table was made: JSON string columns
        table.alter.add_columns(
            [Field(name, PrimitiveType("string"), nullable=True) for name in added],
            commit_properties=_properties(position, None),
        )
        columns += added
    before = pa.table(table.to_pyarrow_table(columns=list(tablerows.KEYS)))
    schema = tablerows.schema(fmt, columns)
    keys: list[pa.Table] = []

    def batches() -> Iterable[pa.RecordBatch]:
        batch: list[Mapping[str, Any]] = []

        def converted() -> list[pa.RecordBatch]:
            arrow = tablerows.to_arrow(fmt, columns, batch).drop_columns([tablerows.DELETED])
            keys.append(arrow.select(list(tablerows.KEYS)))
            converted_batches: list[pa.RecordBatch] = arrow.to_batches()
            return converted_batches

        for row in records():
            if row.get("deleted"):
                continue
            batch.append(row)
            if len(batch) == REWRITE_BATCH_ROWS:
                yield from converted()
                batch = []
        if batch:
            yield from converted()

    reader = pa.RecordBatchReader.from_batches(schema, batches())
    write_deltalake(table, reader, mode="overwrite", target_file_size=TARGET_FILE_BYTES,
                    commit_properties=_properties(position, generation))  # fmt: skip
    after = pa.concat_tables(keys) if keys else schema.empty_table().select(list(tablerows.KEYS))
    old = before.rename_columns(["trace_id", "old_revision"])
    both = after.join(old, "trace_id", join_type="inner")
    changed = pc.sum(pc.not_equal(both["revision"], both["old_revision"])).as_py() or 0
    return TableCommit(
        version=table.version(),
        inserted=after.num_rows - both.num_rows,
        updated=int(changed),
        deleted=before.num_rows - both.num_rows,
        full=full,
        objects=len(table.file_uris()),
    )


def _quoted(column: str) -> str:
    """A column name in delta-rs's SQL (backticks: ``metadata`` and friends are words)."""
    return "`" + column.replace("`", "``") + "`"


def latest_version(location: TableLocation) -> int | None:
    """The table's newest Delta version; None when there is no table."""
    try:
        table = _open(location)
    except Exception as exc:
        raise TableError(f"{location.uri}: {exc}") from exc
    return None if table is None else int(table.version())


@dataclass
class TableSync:
    """How compaction keeps the tables (:func:`rl_export.corpora.compaction.compact`), and
    what its last write did.

    ``formats``: each corpus name's format (a corpus not named is taken as ``trajectory``);
    ``catch_up``: when nothing is new, still bring a table that is behind up to the latest
    generation (``shards compact``; the worker leaves it to the next generation: asking
    every quiet corpus's table would cost requests at every pass).
    """

    formats: Mapping[str, str] = field(default_factory=dict)
    retention_s: float = 7 * 86400.0
    catch_up: bool = False
    merge_bytes: int = MERGE_BYTES
    written: TableCommit | None = None  # the last write (None: nothing written)
    error: TableError | None = None  # the last write's failure
    seconds: float = 0.0  # the last write's time

    def format_of(self, ref: CorpusRef) -> str:
        return self.formats.get(ref.corpus, "trajectory")

    def rewrites(self, changed: int, changed_bytes: int) -> bool:
        """Whether changes of ``changed`` traces (``changed_bytes`` of JSON) rewrite the table
        rather than MERGE into it (:data:`MERGE_BYTES`)."""
        return changed > 0 and changed_bytes > self.merge_bytes

    async def update(
        self,
        store: ObjectStore,
        ref: CorpusRef,
        *,
        applies_to: int,
        generation: int,
        positions: Mapping[str, int],
        changes: Sequence[Mapping[str, Any]],
        records: Records | None,
        fields: Sequence[str] | None = None,
        rewrite: bool = False,
    ) -> TableCommit | None:
        """Write generation ``generation`` (``positions``) to the corpus's table: the
        ``changes`` since ``applies_to``, or every record when the table is elsewhere or
        ``rewrite`` (:func:`write_table`).
        Never raises :class:`TableError`: it is logged and kept in :attr:`error` (the
        corpus itself is written; the next generation tries the table again)."""
        self.written = self.error = None
        started = time.monotonic()
        try:
            location = await asyncio.to_thread(locate, store, ref)
            if location is None:
                return None
            erased = False
            deleted = {c["trace_id"] for c in changes if c.get("deleted")}
            if deleted:  # an erased trace's tombstone: no version may keep it (step 4)
                erased = not deleted.isdisjoint(await erased_traces(store, ref.org, ref.project))
            keep = [v.delta_version for v in await list_versions(store, ref)
                    if v.delta_version is not None]  # fmt: skip
            self.written = await asyncio.to_thread(
                write_table, location, self.format_of(ref), changes=changes, records=records,
                applies_to=applies_to, generation=generation,
                position=tablerows.position(generation, positions), erased=erased,
                keep_versions=keep, retention_s=self.retention_s, fields=fields,
                rewrite=rewrite,
            )  # fmt: skip
        except StoreError as exc:  # TableError, or the erasures or versions unreadable
            log.error("the table of %s was not written: %s", ref.root, exc)
            self.error = exc if isinstance(exc, TableError) else TableError(str(exc))
        self.seconds = time.monotonic() - started
        return self.written


async def pin_table(
    store: ObjectStore,
    ref: CorpusRef,
    *,
    generation: int | None,
    ends: Mapping[str, int],
    fmt: str = "trajectory",
) -> int | None:
    """Write the table at a pinned position (a compaction generation and chain ends, which
    may reach past the generation): the Delta version a pinned corpus version records.

    The lines of the chains from the generation's positions up to ``ends`` are merged (the
    table's generation stays); a table that is not at the generation gets every record of
    the position. None for a store without tables; TableError when delta-rs fails.
    """
    location = await asyncio.to_thread(locate, store, ref)
    if location is None:
        return None
    base = None if generation is None else await _generation(store, ref, generation)
    starts = {} if base is None else dict(base.positions)
    latest: dict[str, Mapping[str, Any]] = {}
    for stream, end in sorted(ends.items()):
        for commit, rows in await read_chain(store, ref, stream, starts.get(stream, 0)):
            if commit.last_offset >= end:
                break
            _fold(latest, rows)
    changes = [latest[t] for t in sorted(latest)]
    deleted = {c["trace_id"] for c in changes if c.get("deleted")}
    erased = bool(deleted) and not deleted.isdisjoint(
        await erased_traces(store, ref.org, ref.project)
    )
    everything: list[Mapping[str, Any]] = []
    if base is not None:  # for a table that is elsewhere: the position's every record
        held: dict[str, Mapping[str, Any]] = {}
        _fold(held, await read_compaction(store, ref, base))
        _fold(held, changes)
        everything = [held[t] for t in sorted(held) if not held[t].get("deleted")]
    else:
        everything = [c for c in changes if not c.get("deleted")]
    written = await asyncio.to_thread(
        write_table, location, fmt, changes=changes, records=lambda: everything,
        applies_to=0 if generation is None else generation, generation=None,
        position={**tablerows.position(generation or 0, ends), "generation": generation},
        erased=erased,
    )  # fmt: skip
    return None if written is None else written.version


def _fold(latest: dict[str, Mapping[str, Any]], rows: Iterable[Mapping[str, Any]]) -> None:
    """The latest line per trace (a later line of an equal revision wins, as compaction's)."""
    for row in rows:
        current = latest.get(row["trace_id"])
        if current is None or row["revision"] >= current["revision"]:
            latest[row["trace_id"]] = row


async def _generation(store: ObjectStore, ref: CorpusRef, generation: int) -> Compaction:
    try:
        data = await store.get(ref.compaction_key(generation))
        return Compaction.model_validate_json(data)
    except (ObjectNotFoundError, ValueError) as exc:
        raise TableError(f"{ref.root}: generation {generation} cannot be read ({exc})") from None
