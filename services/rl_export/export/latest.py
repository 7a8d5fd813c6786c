"""The latest view of a corpus in bounded memory: the latest revision per trace from the latest
compaction plus the commits after it, tombstones dropped, as JSON Lines lines.

How a view is made (:class:`LatestView`; the steps match the code):

1. Find the latest compaction (its records are already the latest per trace, sorted by
   ``trace_id``) and, per chain, the commits after its position (the *tail*), following each
   chain as the reader does (a gap is a :class:`~rl_export.corpora.commits.ChainError`).
2. Index the tail: number its lines in read order and keep, per trace, the best line
   (greatest revision; on an equal revision a tombstone; else the first read, as the
   reader's latest view does) as ``key -> one int`` (the key is the ``trace_id``'s UTF-8
   bytes; revision, tombstone flag and line number packed so that the best line is the
   greatest: :func:`pack`). Only each line's head is read, with one regular expression
   (:data:`~rl_export.corpora.identity.HEAD`; a line it does not fit is parsed in full).
   Every line starts as kept (one bit a line); a line that loses to another of its trace,
   and a tombstone, is cleared as soon as it is seen. Past ``spill_at`` traces the index is
   sorted and pickled to a temporary run file, and a new one starts, so memory holds at
   most ``spill_at`` entries whatever the corpus size.
3. Merge the runs and settle the compaction against them (:mod:`rl_export.export.settling`;
   in batches: what every run holds up to the smallest of their current
   slices' last keys, sorted together, so runs that do not interleave cost nothing per
   entry), clearing a trace's lines that lose across runs; and read the compaction once,
   a block (a 4 MiB chunk) at a time: its first and last keys say which tail traces it can
   hold, and only those are looked up in it (binary search over the block's lines, or
   every line's key when they are many). A compaction line whose trace has a later
   revision in the tail (or a tombstone of the same one) is cleared, and so is a tail line
   not newer than its trace's compaction line. A block with no tail trace in its range
   costs one ``find`` per line (its line count, and the tombstone check).
4. :meth:`LatestView.blocks` reads the compaction and the tail again and passes the
   surviving lines on, verbatim, as views of what was read: compaction lines first (by
   ``trace_id``), then the tail's in chain order. An object whose lines all survive goes
   out whole; from others the runs of surviving lines are cut out (many short runs of a
   block are copied into one). :meth:`LatestView.ranges` does the same for a filtered
   export with a *prefilter* (:mod:`rl_export.export.prefilter`): an object's lines its
   sidecar says do not match are left out, and counted, and an object none of whose
   surviving lines may match is not read at all.

Index sidecars (:mod:`rl_export.corpora.sidecar`): where an uncompressed object has one,
steps 2 and 3 take each line's ``trace_id``, ``revision`` and tombstone flag from its
columns instead of the object's bytes (the next object's sidecar fetched while this one is
indexed), and the object is hashed whole in a worker thread meanwhile (the store's
``sha256``, :data:`VERIFY_AHEAD` objects at once), so the guarantee below holds for them
too: a mismatch fails the view before step 4. A sidecar that is missing or refused is
logged and counted (:attr:`LatestView.sidecars_refused`) and its object read as before;
so are objects written before sidecars existed. On the benchmark's 1,000,000 records this
turned the first pass from a Python scan of 3.8 GiB into 297 small Parquet reads and a
hash.

A view is of the corpus as it is when it opens, or as it was at a :class:`ViewPosition`
(``at``: a compaction generation and where each chain ended), which makes the same view
again while those objects exist. :attr:`LatestView.position` is where an opened view is;
:meth:`LatestView.kept_parts` gives each object with the bitmap of its surviving lines (the
Hugging Face dataset's shards, :mod:`rl_export.hf`).

Every object is read in 4 MiB chunks (:func:`~rl_export.corpora.commits.object_blocks`,
the next chunk read in a thread while this one is worked on); in steps 2 and 3 its sha256
(hashed in a thread too) and line count are checked when it ends, and a mismatch raises
ChainError (an export then fails, and leaves no file), so every byte is verified before the
first one is passed on; step 4 does not hash again. The compaction's order is checked at
its blocks' edges. Memory: the index (at most ``spill_at`` entries, one bytes and one int
each), a slice of each run while merging, one bit per line, a chunk or two.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rl_export.corpora.commits import (
    ChainError,
    Part,
    block_lines,
    chain_keys,
    check_count,
    commit_part,
    object_blocks,
    read_commit,
)
from rl_export.corpora.compacted import Compaction, compaction_part, latest_compaction
from rl_export.corpora.erasures import erased_traces, note_erased
from rl_export.corpora.identity import NotARecordError, key_of
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import list_streams
from rl_export.corpora.store import ObjectStore
from rl_export.corpora.versions import check_chain_end
from rl_export.export.kept import Candidates, kept_lines, kept_ranges
from rl_export.export.prefilter import may_match
from rl_export.export.runs import (
    SLICE,
    Cursor,
    Identities,
    Runs,
    bits_of,
    block_identities,
    clear_bit,
    index_rows,
    ones,
    pack,
    popcount,
    row_of,
)
from rl_export.export.settling import LOOKUP_SHARE, Settler, UnsortedError
from rl_export.formats.filters import Filters
from rl_export.model.codec import loads
from rl_export.model.errors import NoDataError, ObjectNotFoundError
from rl_export.model.records import ERASED_REVISION

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class ViewPosition:
    """Which objects a view is made of: the compaction ``generation`` (None: none) and, per
    chain, the offset after its last commit in the view (``ends``; a chain not named is not
    in the view)."""

    generation: int | None
    ends: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"generation": self.generation, "ends": dict(sorted(self.ends.items()))}

    @classmethod
    def from_json(cls, value: object) -> ViewPosition:
        """ValueError when ``value`` is not what :meth:`to_json` gives."""
        if not isinstance(value, dict) or set(value) != {"generation", "ends"}:
            raise ValueError(f"not a view position: {str(value)[:200]}")
        generation, ends = value["generation"], value["ends"]
        if generation is not None and (isinstance(generation, bool)
                                       or not isinstance(generation, int)):  # fmt: skip
            raise ValueError(f"not a compaction generation: {generation!r}")
        if not isinstance(ends, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in ends.items()
        ):
            raise ValueError(f"not chain ends: {str(ends)[:200]}")
        return cls(generation, ends)


SPILL_AT = 200_000
VERIFY_AHEAD = 2
"""Objects whose lines came from their sidecars hashed at once while the view goes on."""


class LatestView:
    """The latest revision per trace of one corpus, tombstones dropped (see the module)."""

    def __init__(
        self,
        store: ObjectStore,
        ref: CorpusRef,
        *,
        spill_at: int = SPILL_AT,
        tmpdir: str | os.PathLike[str] | None = None,
        lookup_share: int = LOOKUP_SHARE,
        at: ViewPosition | None = None,
        sidecars: bool = True,
        erased_keys: frozenset[bytes] | None = None,
    ) -> None:
        if spill_at < 1:
            raise ValueError(f"spill_at must be at least 1, got {spill_at}")
        self.store = store
        self.ref = ref
        self.spill_at = spill_at
        self.lookup_share = lookup_share
        self.tmpdir = None if tmpdir is None else str(Path(tmpdir))
        self.compaction: Compaction | None = None
        self.compaction_parts: list[Part] = []
        self.tail: list[Part] = []
        self.tail_lines = 0
        self.runs = 0  # how many sorted runs the index spilled (for the benchmark)
        self.looked_up = 0  # tail traces looked up in the compaction by binary search
        self.scanned_blocks = 0  # compaction blocks whose every line's key was read
        self.sidecars = sidecars  # read identities (and prefilters) from index sidecars
        self.sidecars_read = 0
        self.sidecars_refused = 0
        self._verifying: set[asyncio.Future[None]] = set()
        self._keep_compaction = bytearray()
        self._keep_tail = bytearray()
        self.total = 0  # lines the view yields
        self.at = at
        self.position = ViewPosition(None)  # where the view is, once found (step 1)
        # A view leaves out every trace the erasure log names (or ``erased_keys``: another
        # view's of the same read): at a past position those deleted since; at the latest, a
        # record a writer wrote while it did not know of the deletion (a replay that began
        # before it), until a compaction drops it. It keeps the best (revision, tombstone)
        # of each seen, to count the records it left out (:attr:`erased`).
        self.erased_keys: frozenset[bytes] = erased_keys or frozenset()
        self._erased_given = erased_keys is not None
        self._erased_best: dict[bytes, tuple[int, bool]] = {}
        self.erased = 0
        self._opened = False

    async def exists(self) -> bool:
        """Whether the corpus has any commit or compaction."""
        return bool(await self.store.list(f"{self.ref.root}/_manifest/")) or bool(
            await self.store.list(self.ref.compacted_prefix())
        )

    async def open(self) -> LatestView:
        """Steps 1 to 3; raise NoDataError when the corpus has no data at all."""
        if self._opened:
            return self
        await self._find()
        if self.compaction is None and not self.tail:
            if not await self.exists():
                raise NoDataError(
                    "source",
                    f"no data for {self.ref.root} in {self.store.url} (no corpus there: check "
                    f"--org, --project and --source)",
                )
            await self._find()  # its first commit landed after step 1 looked: look again
        expected = sum(part.records for part in self.tail)
        runs = max(1, -(-expected // self.spill_at))
        spilled = Runs(self.tmpdir, max(256, min(SLICE, self.spill_at // runs)))
        try:
            index = await self._index(spilled)
            await self._merge(spilled, index)
            await self._verified()
        finally:
            spilled.close()
            for task in self._verifying:  # left over when the view failed: not waited for
                if task.done() and not task.cancelled():
                    task.exception()  # seen (the view's own error was raised)
                task.cancel()
        self.total = popcount(self._keep_compaction) + popcount(self._keep_tail)
        self.erased = sum(1 for _, gone in self._erased_best.values() if not gone)
        self._opened = True
        return self

    async def locate(self) -> ViewPosition:
        """Step 1 alone: find the view's objects (:attr:`compaction_parts`, :attr:`tail`)
        and return where it is."""
        if not self.compaction_parts and not self.tail and self.compaction is None:
            await self._find()
        return self.position

    async def _pinned_compaction(self, generation: int | None) -> Compaction | None:
        if generation is None:
            return None
        key = self.ref.compaction_key(generation)
        try:
            return Compaction.model_validate(loads(await self.store.get(key)))
        except ObjectNotFoundError:
            raise ChainError(f"{key}: the view's compaction no longer exists") from None
        except ValueError as exc:
            raise ChainError(f"{key}: unreadable compaction ({exc})") from None

    async def _find(self) -> None:
        """Step 1 (up to :attr:`at` when it is given)."""
        if self.at is None:
            self.compaction = await latest_compaction(self.store, self.ref)
        else:
            self.compaction = await self._pinned_compaction(self.at.generation)
        if not self._erased_given:
            erased = await erased_traces(self.store, self.ref.org, self.ref.project)
            self.erased_keys = frozenset(key_of(trace_id) for trace_id in erased)
        positions: dict[str, int] = {}
        if self.compaction is not None:
            positions = dict(self.compaction.positions)
            try:
                self.compaction_parts = [
                    compaction_part(self.ref, p) for p in self.compaction.parts
                ]
            except (KeyError, TypeError, AttributeError) as exc:
                raise ChainError(
                    f"{self.ref.compaction_key(self.compaction.generation)}: a part without {exc}"
                ) from None
        ends: dict[str, int] = {}
        streams = await list_streams(self.store, self.ref)
        if self.at is not None:
            # A chain whose commits all expired after the compaction covered them is not
            # listed any more: the view needs none of them.
            missing = sorted(
                stream for stream, end in self.at.ends.items()
                if stream not in streams and end != positions.get(stream, 0)
            )  # fmt: skip
            if missing:
                raise ChainError(f"{self.ref.root}: no chain {missing[0]} (the view's)")
            streams = [s for s in streams if s in self.at.ends]
        for stream in streams:
            by_offset = dict(await chain_keys(self.store, self.ref, stream))
            position = positions.get(stream, 0)
            end = None if self.at is None else self.at.ends[stream]
            while position in by_offset and (end is None or position < end):
                try:
                    commit = await read_commit(self.store, by_offset[position])
                except ObjectNotFoundError:
                    raise ChainError(f"{by_offset[position]}: listed but gone") from None
                if commit.stream != stream or commit.from_offset != position:
                    raise ChainError(f"{by_offset[position]}: does not continue {stream}")
                self.tail.append(commit_part(self.ref, commit))
                position = commit.last_offset + 1
            check_chain_end(self.ref, stream, position, end, by_offset)
            if position or stream in positions:
                ends[stream] = position
        generation = self.compaction.generation if self.compaction is not None else None
        self.position = ViewPosition(generation, ends)

    async def _index(self, runs: Runs) -> dict[bytes, int]:
        """Step 2."""
        expected = sum(part.records for part in self.tail)
        keep = self._keep_tail = ones(expected)
        index: dict[bytes, int] = {}
        if self.erased_keys:
            # Each erased trace enters the index as a tombstone newer than any revision, on
            # a line of its own past the tail's (never kept), so step 3 settles it as any
            # other: every line of the trace, in the tail or the compaction, loses to it.
            erased = sorted(self.erased_keys)
            keep.extend(bytes((expected + len(erased) + 7) // 8 - len(keep)))
            for k, key in enumerate(erased):
                index[key] = pack(ERASED_REVISION, True, expected + k)
        row = 0
        async for part, identities in self._ahead(self.tail, self._identities):
            first = row
            if identities is not None:
                await self._verify_soon(part)
                if self.erased_keys:
                    note_erased(self._erased_best, self.erased_keys, *identities)
                row = index_rows(identities, row, index, keep)
                if len(index) >= self.spill_at:
                    runs.spill(index)
                    self.runs += 1
                    index = {}
                continue
            async for block in object_blocks(self.store, part):
                try:
                    found = block_identities(block)
                    if self.erased_keys:
                        note_erased(self._erased_best, self.erased_keys, *found)
                    row = index_rows(found, row, index, keep)
                except NotARecordError as exc:
                    raise ChainError(f"{part.key}: {exc}") from None
                except IndexError:  # more lines than the commits say
                    raise ChainError(
                        f"{part.key}: more records than its commit says ({part.records})"
                    ) from None
                if len(index) >= self.spill_at:
                    runs.spill(index)
                    self.runs += 1
                    index = {}
            check_count(part, row - first)
        self.tail_lines = row
        return index

    async def _sidecar(self, part: Part, columns: Sequence[str]) -> Any:
        """The ``columns`` of the part's index sidecar (a pyarrow Table), or None to read the
        object itself: it has none, the view was made with ``sidecars=False``, or the sidecar
        is refused (logged and counted in :attr:`sidecars_refused`)."""
        if not self.sidecars or part.index is None:
            return None
        from rl_export.corpora.sidecar import usable_sidecar  # pyarrow: on use

        table = await usable_sidecar(self.store, self.ref, part, columns=columns,
                                     refused=self._refused)  # fmt: skip
        if table is not None:
            self.sidecars_read += 1
        return table

    def _refused(self, _reason: str) -> None:
        self.sidecars_refused += 1

    async def _identities(self, part: Part) -> Identities | None:
        """Each line's key, revision and tombstone flag from the part's sidecar; None to read
        the object (no usable sidecar, or one with a line of no id or revision)."""
        table = await self._sidecar(part, _IDENTITY)
        if table is None:
            return None
        if table.column("trace_id").null_count or table.column("revision").null_count:
            log.warning("%s: its sidecar has a line without trace_id or revision, reading "
                        "the object instead", part.key)  # fmt: skip
            self.sidecars_refused += 1
            return None
        import pyarrow as pa

        keys = table.column("trace_id").cast(pa.binary()).to_pylist()
        return Identities(
            keys, table.column("revision").to_pylist(), table.column("deleted").to_pylist()
        )

    async def _ahead(
        self, parts: list[Part], fetch: Callable[[Part], Awaitable[T]]
    ) -> AsyncIterator[tuple[Part, T]]:
        """Each part with what ``fetch`` gives for it (its sidecar's), the next part's fetched
        while the caller works on this one."""
        ahead: asyncio.Future[T] | None = None
        try:
            for k, part in enumerate(parts):
                current = ahead or asyncio.ensure_future(fetch(part))
                ahead = None
                if k + 1 < len(parts):
                    ahead = asyncio.ensure_future(fetch(parts[k + 1]))
                yield part, await current
        finally:
            if ahead is not None:
                ahead.cancel()

    async def _verify_soon(self, part: Part) -> None:
        """Start verifying an object (:meth:`_verify`) while the view goes on, with at most
        :data:`VERIFY_AHEAD` at once (the hashing lets go of the GIL: the objects are hashed
        on another core while the sidecars are indexed on this one)."""
        while len(self._verifying) >= VERIFY_AHEAD:
            await self._settle()
        self._verifying.add(asyncio.ensure_future(self._verify(part)))

    async def _verified(self) -> None:
        """Every verification started has ended well (else its ChainError)."""
        while self._verifying:
            await self._settle()

    async def _settle(self) -> None:
        """Wait for a verification to end; raise its ChainError."""
        done, _ = await asyncio.wait(self._verifying, return_when=asyncio.FIRST_COMPLETED)
        self._verifying -= done
        for task in done:
            task.result()

    async def _verify(self, part: Part) -> None:
        """The sha256 of an object whose lines' identities came from its sidecar (ChainError),
        so that no byte is passed on unverified. Its line count is the sidecar's (checked
        against the commit): the sidecar names the object's sha256, and its line places tile
        the object."""
        try:
            digest = await self.store.sha256(part.key)
        except ObjectNotFoundError:
            raise ChainError(f"{part.key}: missing (expired while reading?)") from None
        if digest != part.sha256:
            raise ChainError(f"{part.key}: sha256 {digest[:16]}… does not match")

    async def _merge(self, runs: Runs, index: dict[bytes, int]) -> None:
        """Step 3 (entries packed: see :func:`pack`)."""
        keep_tail = self._keep_tail
        records = self.compaction.records if self.compaction is not None else 0
        self._keep_compaction = ones(records)

        def lose(packed: int) -> None:
            clear_bit(keep_tail, row_of(packed))

        if not runs.files and not self.compaction_parts:
            return  # one run, no compaction: step 2 decided every line
        cursor = Cursor(runs.spans(index, lose))
        settler = Settler(
            self._keep_compaction, keep_tail, cursor,
            erased_keys=self.erased_keys, erased_best=self._erased_best,
            lookup_share=self.lookup_share,
        )  # fmt: skip
        n = 0
        previous: bytes | None = None
        try:
            async for part, identities in self._ahead(self.compaction_parts, self._identities):
                first_row = n
                if identities is not None:
                    await self._verify_soon(part)
                    try:
                        n, previous = settler.rows(identities, n, previous)
                    except UnsortedError:
                        raise ChainError(f"{part.key}: compaction not sorted by trace_id") from None
                    continue
                async for block in object_blocks(self.store, part):
                    try:
                        n, previous = settler.block(block, n, previous)
                    except NotARecordError as exc:
                        raise ChainError(f"{part.key}: {exc}") from None
                    except UnsortedError:
                        raise ChainError(f"{part.key}: compaction not sorted by trace_id") from None
                    except IndexError:
                        raise ChainError(
                            f"{part.key}: more records than the compaction says ({records})"
                        ) from None
                check_count(part, n - first_row)
        finally:
            self.looked_up += settler.looked_up
            self.scanned_blocks += settler.scanned_blocks
        cursor.drain()  # the tail's traces after the compaction's last: runs still merge
        if n != records:
            raise ChainError(
                f"{self.ref.compaction_key(self.compaction.generation if self.compaction else 0)}"
                f": {n} records, it says {records}"
            )

    def kept_parts(self) -> list[tuple[Part, bytes]]:
        """Every object of an opened view, compaction parts first, then the tail in chain
        order, with the bitmap of its surviving lines (bit ``n`` of byte ``n // 8``, from
        the lowest: line ``n`` survives)."""
        if not self._opened:
            raise RuntimeError("open the view first")
        out = []
        for parts, bits in ((self.compaction_parts, self._keep_compaction),
                            (self.tail, self._keep_tail)):  # fmt: skip
            whole = int.from_bytes(bits, "little")
            n = 0
            for part in parts:
                mine = (whole >> n) & ((1 << part.records) - 1)
                out.append((part, mine.to_bytes((part.records + 7) // 8, "little")))
                n += part.records
        return out

    async def blocks(self) -> AsyncIterator[tuple[memoryview, int]]:
        """Step 4: the surviving lines, as views of what was read (never copied), and how
        many lines each adds. An object whose lines all survive is passed on as it is read
        (its count comes with an empty view after it); in others the runs of surviving
        lines are cut out between line ends. Objects are not hashed again: steps 2 and 3
        verified each of them."""
        async for data, start, end, count, _ in self._surviving(None):
            yield memoryview(data)[start:end], count

    async def ranges(
        self, prefilter: Filters | None = None
    ) -> AsyncIterator[tuple[bytes, int, int, int]]:
        """Step 4 as ``(data, start, end, passed_over)``: ``data[start:end]`` is surviving
        whole lines (maybe none), and ``passed_over`` how many surviving lines were left
        out before them because their sidecar says they do not match ``prefilter`` (the
        part of the export's filters a sidecar answers: :mod:`rl_export.export.prefilter`;
        a line of an object without a sidecar is always passed on)."""
        async for data, start, end, _, passed_over in self._surviving(prefilter):
            if end > start or passed_over:
                yield data, start, end, passed_over

    async def _surviving(
        self, prefilter: Filters | None
    ) -> AsyncIterator[tuple[bytes, int, int, int, int]]:
        if not self._opened:
            await self.open()
        for parts, bits in ((self.compaction_parts, self._keep_compaction),
                            (self.tail, self._keep_tail)):  # fmt: skip
            n = 0
            matching = self._ahead(parts, lambda part: self._may_match(part, prefilter))
            async for part, candidates in matching:
                first = n
                n += part.records
                if candidates is None:
                    async for out in kept_lines(self.store, part, bits, first):
                        yield out
                    continue
                here = bits_of(bits, first, part.records)
                kept = here & candidates.bits
                passed_over = here.bit_count() - kept.bit_count()
                if passed_over:
                    yield b"", 0, 0, 0, passed_over
                if kept:
                    async for out in kept_ranges(self.store, part, kept, candidates):
                        yield out

    async def _may_match(self, part: Part, prefilter: Filters | None) -> Candidates | None:
        """The part's lines ``prefilter`` may match, and where each line is, from its sidecar;
        None when there is no prefilter or no usable sidecar."""
        if prefilter is None:
            return None
        table = await self._sidecar(part, sorted(prefilter.fields()))
        if table is None:
            return None
        from rl_export.corpora.sidecar import int64s  # pyarrow: loaded with the table

        offsets, lengths = int64s(table, "line_offset"), int64s(table, "line_length")
        if offsets is None or lengths is None:  # read_sidecar refuses such a sidecar
            return None
        return Candidates(may_match(prefilter, table), offsets, lengths)

    async def lines(self) -> AsyncIterator[list[bytes]]:
        """Step 4, line by line: the surviving lines, newline included, in batches."""
        async for data, start, end, _ in self.ranges():
            yield block_lines((data, start, end))


_IDENTITY = ("trace_id", "revision", "deleted")
