"""A corpus as a Hugging Face ``datasets.IterableDataset``, for trainers (docs/concepts/corpora.md).

``corpus_dataset(store, org, project, corpus, *, latest_only=True, follow=False)`` reads any
corpus (any format) of any store (``file://``, a path, ``s3://``, or an opened store) with
the corpora reader's guarantees (chains followed without gap, every object's sha256 and
record count checked before any of its rows is handed out), as a dataset that:

- has **one shard per committed object** (the compaction's parts, then each chain's commits
  in chain order), so :func:`datasets.distributed.split_dataset_by_node` gives ranks
  disjoint rows, and DataLoader workers split a rank's shards further;
- yields, for the same commits, **the same rows in the same order** (objects are immutable
  and named by their content);
- resumes exactly after the last row yielded: ``state_dict()`` / ``load_state_dict()``
  (datasets' own, so torchdata's ``StatefulDataLoader`` and Accelerate save it) hold the
  shard and the rows of it already yielded, and, while following, a cursor per chain;
- with ``follow=True``, goes on yielding the rows of new commits once the shards are read,
  polling every ``poll_interval_s``, without end.

How a dataset is made (the steps match :func:`_plan`):

1. Find the corpus's objects as :class:`~rl_export.export.latest.LatestView` does (the
   latest compaction, then every chain after its positions), and where each chain ends: the
   dataset's *position*. A dataset made with ``resume_from`` (a saved state) is made at that
   state's position instead, so it is the same dataset again, commits made since included
   only by ``follow``.
2. ``latest_only=True`` (the latest revision of each trace): a pass over every row's
   identity first (the latest view's index, in bounded memory: spilled to disk past 200,000
   traces), which leaves one bitmap per object of the rows that are the latest revision of
   their trace and not deleted. A trace's latest revision may be in a later object than an
   earlier one: the pass sees every object before any row is yielded, so each shard yields
   exactly the rows that are the latest *as of the dataset's position*, and every trace
   appears once across all shards. ``latest_only=False`` (every revision the corpus holds:
   after a compaction, only its latest revision per trace and what came after): a pass for
   tombstones, and every revision of a deleted trace is left out. Tombstones are never rows.
3. Each shard, when iterated, reads its object (verified), and yields its kept rows as dicts
   (parsed by orjson, rendered by the row options, every declared column present), typed
   already to the declared ``features`` (:func:`row_features`), so ``datasets`` hands them
   out as made: its Json codec (pandas' ujson, about ten significant digits of a float) only
   runs on a copy materialised with the features (``from_generator``, ``to_parquet``).
4. ``follow=True`` adds one shard per chain of the stream (``<topic>-<p>`` for every partition
   ``p`` of the ``trajectories`` topic: ``RL_EXPORT_TOPIC_TRAJECTORIES`` and
   ``RL_EXPORT_PARTITIONS`` unless given), each starting where the dataset's position ends
   that chain. Whoever holds follow shards reads them together, round after round, after its
   other shards, and keeps a cursor per chain in its state. New commits' rows are yielded as
   they come (every non-tombstone row: a trace updated again is yielded again; a deletion
   cannot take back a row already yielded, so a trainer that must honour deletions makes a
   new dataset). Chains a replay starts after the dataset was made are not followed.

Splitting: ``split_dataset_by_node`` gives each rank whole shards when the shard count is a
multiple of the world size, else every rank reads every shard and keeps one row in
``world_size``. Both give disjoint rows whose union is the corpus without ``follow``; with
``follow`` pass ``strategy="shards"``, since rows that arrive while following come in the
order each rank polled them, which differs between ranks.

An opened store is used from this module's own event-loop thread; pass a URL when the
dataset goes to DataLoader worker processes (each opens its own). ``datasets`` is an
optional dependency (``pip install 'rl-export[hf]'``), imported only when a dataset is made.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cache, partial
from typing import TYPE_CHECKING, Any

import orjson

from rl_export.corpora.commits import (
    ChainError,
    Part,
    chain_keys,
    commit_part,
    object_blocks,
    read_commit,
)
from rl_export.corpora.identity import block_identities
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import ObjectStore, open_store
from rl_export.export.features import row_features
from rl_export.export.latest import LatestView, ViewPosition
from rl_export.export.rows import ROW_FORMATS, RowOptions, row_options
from rl_export.export.sft import SFT_COLUMNS, tokenize_for_sft, tokenize_row
from rl_export.export.versions import pinned
from rl_export.formats.filters import Filters
from rl_export.model.codec import dumps
from rl_export.model.errors import ObjectNotFoundError
from rl_export.model.records import upgrade_record
from rl_export.runtime.loopthread import LoopThread
from rl_export.runtime.settings import load_settings

__all__ = [
    "SFT_COLUMNS", "Plan", "RowOptions", "corpus_dataset", "find_position", "row_features",
    "row_options", "tokenize_for_sft", "tokenize_row",
]  # fmt: skip

if TYPE_CHECKING:
    import datasets

PIN_KEY = "rl_export_position"
"""The key of a dataset's position in its state dict (found there by ``resume_from``)."""
_MISSING = (
    "rl_export.hf needs the Hugging Face datasets library: pip install 'rl-export[hf]' "
    "(or pip install datasets)"
)


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise ImportError(_MISSING) from None
    return datasets


# --- an event loop of our own ---------------------------------------------------------------


# --- the plan: which objects, which rows ----------------------------------------------------


@dataclass(frozen=True)
class _Shard:
    """One committed object and which of its rows the dataset yields."""

    part: Part
    keep: bytes | None  # bit n set: row n is yielded; None: every live row not hidden


def _stored_format(corpus: str) -> str | None:
    """The format of a corpus the settings name (RL_EXPORT_CORPORA), else None."""
    for spec in load_settings().corpora:
        if spec.name == corpus:
            return spec.format
    return None


@dataclass(frozen=True)
class Plan:
    """What a dataset reads: see the module. Picklable when ``store`` is a URL."""

    store: str | ObjectStore
    ref: CorpusRef
    latest_only: bool
    position: ViewPosition
    shards: tuple[_Shard, ...]
    hidden: Mapping[str, int] = field(default_factory=dict)  # trace -> tombstone revision
    follow: tuple[str, ...] = ()  # chains followed after the shards
    poll_interval_s: float = 1.0
    options: RowOptions = field(default_factory=RowOptions)
    features: datasets.Features | None = None  # the rows' (see row_features)

    def rows(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rows of some live records as the options render them, every declared column
        present (null: a field older records lack); ValueError for a column not declared."""
        rows = self.options.rows(records)
        if self.features is None:
            return rows
        declared = self.features.keys()
        for row in rows:
            if not declared >= row.keys():
                raise ValueError(
                    f"corpus {self.ref.root}: a row has columns "
                    f"{sorted(row.keys() - declared)} that its format (as the settings' "
                    "RL_EXPORT_CORPORA name it) does not: read it with the settings that "
                    "wrote it"
                )
            if len(row) < len(declared):
                for name in declared - row.keys():
                    row[name] = None
        return rows

    @property
    def pin(self) -> str:
        """The position as text (what a state dict holds)."""
        return dumps({"latest_only": self.latest_only, **self.position.to_json()}).decode()


@contextlib.asynccontextmanager
async def _opened(store: str | ObjectStore) -> Any:
    """The store: opened (and closed after) for a URL, as it is for an opened one."""
    if not isinstance(store, str):
        yield store
        return
    opened = open_store(store)
    try:
        yield opened
    finally:
        await opened.close()


async def _version_position(store: str | ObjectStore, ref: CorpusRef, name: str) -> ViewPosition:
    async with _opened(store) as opened:
        return (await pinned(opened, ref, name, None)).at


async def _plan(
    store: str | ObjectStore,
    ref: CorpusRef,
    *,
    latest_only: bool,
    at: ViewPosition | None,
    follow: tuple[str, ...],
    poll_interval_s: float,
) -> Plan:
    async with _opened(store) as opened:
        view = LatestView(opened, ref, at=at)
        if follow and at is None and not await view.exists():
            # Following a corpus that has no commit yet: nothing to read before following.
            return Plan(store, ref, latest_only, ViewPosition(None), (), {}, follow,
                        poll_interval_s)  # fmt: skip
        hidden: dict[str, int] = {}
        if latest_only:  # 1. and 2.: the latest view's index and bitmaps
            await view.open()
            shards = tuple(_Shard(part, keep) for part, keep in view.kept_parts())
        else:  # 1., then 2.: the tombstones
            await view.locate()
            parts = [*view.compaction_parts, *view.tail]
            for part in parts:
                async for data, start, end in object_blocks(opened, part):
                    for identity in block_identities(data, start, end):
                        if identity.deleted:
                            revision = max(identity.revision, hidden.get(identity.trace_id, 0))
                            hidden[identity.trace_id] = revision
            shards = tuple(_Shard(part, None) for part in parts)
        return Plan(store, ref, latest_only, view.position, shards, hidden, follow,
                    poll_interval_s)  # fmt: skip


# --- reading --------------------------------------------------------------------------------


async def _object_rows(store: ObjectStore, part: Part) -> list[bytes]:
    """An object's lines, verified (sha256 and record count) before any is returned."""
    lines: list[bytes] = []
    async for data, start, end in object_blocks(store, part):
        lines += data[start:end].split(b"\n")[:-1]
    if len(lines) != part.records:
        raise ChainError(f"{part.key}: {len(lines)} records, {part.records} expected")
    return lines


def _live(row: dict[str, Any], hidden: Mapping[str, int]) -> bool:
    """Not a tombstone, nor a revision a later tombstone hides."""
    if row.get("deleted") is True:
        return False
    trace_id = row.get("trace_id")
    tombstone = hidden.get(trace_id) if isinstance(trace_id, str) else None
    revision = row.get("revision")
    return tombstone is None or not isinstance(revision, int) or revision > tombstone


def _shard_rows(plan: Plan, shard: _Shard, lines: list[bytes]) -> list[dict[str, Any]]:
    rows = []
    keep = shard.keep
    for n, line in enumerate(lines):
        if keep is not None and not keep[n >> 3] & (1 << (n & 7)):
            continue
        row = orjson.loads(line)
        if not isinstance(row, dict):
            raise ChainError(f"{shard.part.key}: line {n + 1} is not a JSON object")
        if keep is None and not _live(row, plan.hidden):
            continue
        rows.append(upgrade_record(row))  # record schema 2's labels: human_labels
    return plan.rows(rows)


async def _next_commit(
    store: ObjectStore, ref: CorpusRef, stream: str, position: int
) -> tuple[int, list[dict[str, Any]], str] | None:
    """The commit of ``stream`` at ``position``: (its next position, its rows, its key), or
    None when there is none yet. ChainError when later commits exist but not this one."""
    keys = await chain_keys(store, ref, stream, position)
    if not keys:
        return None
    if keys[0][0] != position:
        raise ChainError(
            f"{ref.manifest_prefix(stream)}: no commit at offset {position} but one at "
            f"{keys[0][0]} (a gap, or history the chain no longer holds)"
        )
    try:
        commit = await read_commit(store, keys[0][1])
    except ObjectNotFoundError:
        raise ChainError(f"{keys[0][1]}: listed but gone") from None
    if commit.stream != stream or commit.from_offset != position:
        raise ChainError(f"{keys[0][1]}: does not continue {stream} at {position}")
    part = commit_part(ref, commit)
    lines = await _object_rows(store, part)
    rows = [
        upgrade_record(r)
        for r in map(orjson.loads, lines)
        if isinstance(r, dict) and not r.get("deleted")
    ]
    return commit.last_offset + 1, rows, part.key


# --- the examples iterable ------------------------------------------------------------------


@cache
def _examples_class() -> type:
    """The examples iterable, made once ``datasets`` is imported (it subclasses its base)."""
    from datasets.iterable_dataset import _BaseExamplesIterable

    class CorpusExamples(_BaseExamplesIterable):  # type: ignore[misc]  # datasets is untyped
        """The rows of some shards of a plan (see the module), with an exact state."""

        def __init__(self, plan: Plan, shards: tuple[int, ...], follow: tuple[int, ...]):
            super().__init__()
            self.plan = plan
            self.shard_ids = shards
            self.follow_ids = follow
            self._sleep_on_threads_shutdown = False

        @property
        def is_typed(self) -> bool:  # made to the features: not decoded again (inexactly)
            return self.plan.features is not None

        @property
        def features(self) -> datasets.Features | None:
            return self.plan.features

        @property
        def num_shards(self) -> int:
            return len(self.shard_ids) + len(self.follow_ids)

        def _init_state_dict(self) -> dict[str, Any]:
            self._state_dict = {
                "shard_idx": 0,
                "shard_example_idx": 0,
                "follow": "",
                PIN_KEY: self.plan.pin,
                "type": "RlExportCorpusExamples",
            }
            return self._state_dict

        def shuffle_data_sources(self, generator: Any) -> CorpusExamples:
            order = generator.permutation(len(self.shard_ids))
            shards = tuple(self.shard_ids[i] for i in order)
            return CorpusExamples(self.plan, shards, self.follow_ids)

        def shard_data_sources(
            self, num_shards: int, index: int, contiguous: bool = True
        ) -> CorpusExamples:
            every = [(0, i) for i in self.shard_ids] + [(1, j) for j in self.follow_ids]
            indices = self.split_shard_indices_by_worker(num_shards, index, contiguous)
            picked = [every[k] for k in indices]
            return CorpusExamples(
                self.plan,
                tuple(i for kind, i in picked if kind == 0),
                tuple(j for kind, j in picked if kind == 1),
            )

        def reshard_data_sources(self) -> CorpusExamples:
            return self  # an object is the smallest shard

        def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
            yield from _iterate(self.plan, self.shard_ids, self.follow_ids, self._state_dict)

    # Pickled by name (DataLoader workers that spawn): found through the module's __getattr__.
    CorpusExamples.__qualname__ = CorpusExamples.__name__
    return CorpusExamples


def __getattr__(name: str) -> Any:
    if name == "CorpusExamples":
        return _examples_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _iterate(
    plan: Plan,
    shard_ids: tuple[int, ...],
    follow_ids: tuple[int, ...],
    state: dict[str, Any] | None,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The rows of the shards, then (following) of new commits; ``state`` moves before each
    row is handed out, so a state saved after a row resumes after it."""
    if state is not None and state.get(PIN_KEY, plan.pin) != plan.pin:
        raise ValueError(
            f"this state was saved by a dataset at {state[PIN_KEY]}, this one is at "
            f"{plan.pin}: make it with corpus_dataset(..., resume_from=state)"
        )
    loop = LoopThread.get()
    # A URL is opened here, for this iteration (in this process: DataLoader workers each
    # open their own), and closed when it ends; an opened store is the caller's.
    store = open_store(plan.store) if isinstance(plan.store, str) else None
    reading = store if store is not None else plan.store
    assert not isinstance(reading, str)
    try:
        start = state["shard_idx"] if state else 0
        for idx in range(start, len(shard_ids)):
            shard = plan.shards[shard_ids[idx]]
            skip = state["shard_example_idx"] if state and idx == start else 0
            lines = loop.run(partial(_object_rows, reading, shard.part))
            rows = _shard_rows(plan, shard, lines)
            for n in range(skip, len(rows)):
                if state is not None:
                    state["shard_example_idx"] = n + 1
                yield f"{shard.part.key}:{n}", rows[n]
            if state is not None:
                state["shard_idx"], state["shard_example_idx"] = idx + 1, 0
        if follow_ids:
            yield from _follow(plan, follow_ids, state, loop, reading)
    finally:
        if store is not None:
            opened = store
            # A dataset left half read is finalised whenever (and wherever) it is collected,
            # the interpreter's exit included: closing must not wait for ever.
            with contextlib.suppress(RuntimeError, TimeoutError):
                loop.run(opened.close, timeout=10)


def _follow(
    plan: Plan,
    follow_ids: tuple[int, ...],
    state: dict[str, Any] | None,
    loop: LoopThread,
    store: ObjectStore,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Round after round, the new commits of each chain followed (in name order), for ever."""
    streams = sorted(plan.follow[j] for j in follow_ids)
    cursor: dict[str, list[int]] = {s: [plan.position.ends.get(s, 0), 0] for s in streams}
    if state is not None and state["follow"]:
        cursor.update({s: list(v) for s, v in orjson.loads(state["follow"]).items()})
    while True:
        moved = False
        for stream in streams:
            position, skip = cursor[stream]
            found = loop.run(partial(_next_commit, store, plan.ref, stream, position))
            if found is None:
                continue
            moved = True
            after, records, key = found
            rows = plan.rows(records)
            for n in range(skip, len(rows)):
                cursor[stream] = [position, n + 1] if n + 1 < len(rows) else [after, 0]
                if state is not None:
                    state["follow"] = dumps(cursor).decode()
                yield f"{key}:{n}", rows[n]
            cursor[stream] = [after, 0]
            if state is not None:
                state["follow"] = dumps(cursor).decode()
        if not moved:
            loop.run(partial(asyncio.sleep, plan.poll_interval_s))


# --- the function trainers call -------------------------------------------------------------


def find_position(state: Any) -> ViewPosition | None:
    """The position held by a dataset's state dict, or by any state that nests one (a
    DataLoader's); None when there is none."""
    if isinstance(state, Mapping):
        if isinstance(state.get(PIN_KEY), str):
            found = orjson.loads(state[PIN_KEY])
            return ViewPosition.from_json({k: found[k] for k in ("generation", "ends")})
        values: Any = state.values()
    elif isinstance(state, list | tuple):
        values = state
    else:
        return None
    for value in values:
        position = find_position(value)
        if position is not None:
            return position
    return None


def corpus_dataset(
    store: str | ObjectStore,
    org: str,
    project: str,
    corpus: str,
    *,
    latest_only: bool = True,
    follow: bool = False,
    resume_from: Mapping[str, Any] | None = None,
    poll_interval_s: float = 1.0,
    topic: str | None = None,
    partitions: int | None = None,
    format: str = "trajectory",  # the export's name for it (--format)
    chat_style: str | None = None,
    system: str | None = None,
    mask_failed_turns: bool = False,
    mask_types: Iterable[str] | None = None,
    redact: str | Iterable[str] | None = None,
    filters: Filters | None = None,
    split: str | None = None,
    splits: str | Mapping[str, float] | None = None,
    split_by: str | None = None,
    split_salt: str | None = None,
    version: str | None = None,
    chat_template: str | None = None,
) -> datasets.IterableDataset:
    """The corpus as a ``datasets.IterableDataset`` (see the module).

    ``version``: read the corpus at that pinned version (``rl-export versions``), the same
    rows as ``export --version`` reads; VersionError for an unknown one, ValueError with
    ``follow`` or with a ``resume_from`` state of another position.

    ``resume_from``: a state saved from a dataset of this corpus (or a DataLoader's state
    holding one); the dataset is then made at that state's position, so that
    ``load_state_dict(state)`` resumes it exactly. ``topic`` and ``partitions`` name the
    chains ``follow`` follows (default: the settings' trajectories topic and partition
    count). Raises ChainError for a corpus whose chains are broken.

    The export's row options, for a corpus of trajectory records (the default corpora):
    ``format`` (any per-record format: ``messages``, ``prompt_completion``, ``kto``,
    ``rl_prompts``, ``executions``), ``chat_style`` (``hf`` by default) and ``system``,
    ``mask_failed_turns`` / ``mask_types``, ``redact`` (kinds) and ``filters`` (a
    :class:`~rl_export.formats.filters.Filters`): each record is filtered and rendered, and
    its row redacted, by the export's own code (the bytes ``rl-export export`` writes for
    it), and records without a row are left out. ValueError
    for an unknown value, and, when iterated, for a corpus of another format.

    ``chat_template``: the export's ``--chat-template`` (a file, or a name in
    ``RL_EXPORT_CHAT_TEMPLATES`` or a built-in) on a chat format: each row made for the
    template, with the trace's ``tools`` (JSON text) when it has them, and a row the template
    cannot render with every message's text left out (docs/guides/trainers.md).

    ``split`` / ``splits`` / ``split_by`` / ``split_salt``: the export's ``--split``
    (:mod:`rl_export.export.splits`): only the records of split ``split`` of ``splits``
    (``"train=0.9,eval=0.1"`` or ``{"train": 0.9, "eval": 0.1}``), hashed on ``split_by``
    (``trace_id`` by default), after the filters, as the export does.

    The dataset declares its ``features`` (:func:`row_features`): those of ``format``, or,
    for rows as stored, those of the corpus's format as the settings name it (a corpus the
    settings do not name has no features).
    """
    ds = _datasets()
    options = row_options(
        format, chat_style=chat_style, system=system, mask_failed_turns=mask_failed_turns,
        mask_types=mask_types, redact=redact, filters=filters, split=split, splits=splits,
        split_by=split_by, split_salt=split_salt, chat_template=chat_template,
    )  # fmt: skip
    if poll_interval_s <= 0:
        raise ValueError(f"poll_interval_s must be positive, got {poll_interval_s}")
    ref = CorpusRef(org, project, corpus)
    streams: tuple[str, ...] = ()
    if follow:
        settings = load_settings() if topic is None or partitions is None else None
        name = topic or (settings.topic_trajectories if settings else "")
        count = partitions if partitions is not None else (settings.partitions if settings
                                                          else 0)  # fmt: skip
        streams = tuple(f"{name}-{p}" for p in range(count))
    at = find_position(resume_from) if resume_from is not None else None
    if resume_from is not None and at is None:
        raise ValueError("resume_from holds no rl-export dataset state")
    if version is not None:
        if follow:
            raise ValueError("a version is a fixed position: follow=True cannot follow it")
        pinned_at = LoopThread.get().run(lambda: _version_position(store, ref, version))
        if at is not None and at != pinned_at:
            raise ValueError(f"resume_from holds another position than version {version!r}")
        at = pinned_at
    plan = LoopThread.get().run(lambda: _plan(
        store, ref, latest_only=latest_only, at=at, follow=streams,
        poll_interval_s=poll_interval_s,
    ))  # fmt: skip
    features: datasets.Features | None
    if options.as_stored:
        stored = _stored_format(corpus)
        features = row_features(stored, corpus_row=True) if stored in ROW_FORMATS else None
    else:
        features = row_features(options.format, tools=options.fit is not None)
    plan = replace(plan, options=options, features=features)
    examples = _examples_class()(
        plan, tuple(range(len(plan.shards))), tuple(range(len(plan.follow)))
    )
    info = ds.DatasetInfo(
        description=f"rl-export corpus {ref.root}"
        + (", latest revision per trace" if latest_only else ", every revision")
        + (", following new commits" if follow else ""),
        dataset_name=ref.root,
        features=features,
    )
    return ds.IterableDataset(examples, info=info, split=ds.Split.TRAIN)
