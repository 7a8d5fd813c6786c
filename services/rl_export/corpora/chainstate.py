"""What a corpus holds, per trace, as a chain writer rebuilds it when it starts.

What a corpus holds (per trace: the latest revision and whether it is a tombstone) spans all
its chains: the stream's (``trajectories-<p>``) and any replay's (``replay-<run id>-<p>``,
partitioned the same way). A writer learns it when it starts (:func:`load_chain_state`):

1. from the latest compaction: its *holdings index* for the writer's partition (what the
   parts hold, as trace ids and revisions, written with the compaction, so no part is read),
   or, when there is no index for this partitioning, its parts; and its *tombstones*
   (deletions the parts leave out, kept until the tombstone retention ends, so that a
   deleted trace stays deleted whichever chain its older revisions are in);
2. then every chain of the writer's partition number from the compaction's positions on;
3. and the project's erasure log (:mod:`rl_export.corpora.erasures`, kept for good): the
   partition's traces that were deleted (``erased``), of which the corpus never takes a
   record again, whatever its revision and whoever sends it (a later backfill of the same
   trace, a stream whose join state for it expired).

So a replay over events already streamed, and a stream over events already replayed, write
no ``(trace_id, revision)`` the corpus holds, and no record of a deleted trace. Two writers
of one partition running at once on different chains (a replay while the stream writes the
same traces) do not see each other's new commits; ``shards verify`` reports the repeats that
may then appear.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rl_export.corpora.commits import Commit, read_chain
from rl_export.corpora.compacted import (
    latest_compaction,
    read_compaction,
    read_holdings,
    read_tombstones,
)
from rl_export.corpora.erasures import erased_traces
from rl_export.corpora.layout import CorpusRef, parse_stream
from rl_export.corpora.store import ObjectStore


@dataclass
class ChainState:
    """The head of one chain and what its corpus holds per trace (rebuilt from the store).

    ``held`` maps a trace id to ``revision * 2 + deleted``: at a million traces a plain int
    per trace instead of an object keeps the writers' memory down.
    """

    head: int = 0
    held: dict[str, int] = field(default_factory=dict)
    erased: frozenset[str] = frozenset()  # deleted traces (the erasure log): no record again
    # The chain's own commits read while loading (after the latest compaction), for the
    # change feed to announce again (ChainWriter.load); emptied once it has.
    commits: list[Commit] = field(default_factory=list)

    def hold(self, trace_id: str, revision: int, deleted: bool) -> None:
        self.held[trace_id] = revision * 2 + deleted

    def apply(self, rows: Iterable[dict[str, Any]]) -> None:
        held = self.held
        for row in rows:
            current = held.get(row["trace_id"])
            revision = row["revision"]
            if current is None or revision >= current >> 1:
                held[row["trace_id"]] = revision * 2 + bool(row.get("deleted"))

    def apply_holdings(self, traces: list[str], revisions: list[int]) -> None:
        """A holdings index part: live records (nothing held yet may be newer)."""
        held = self.held
        for trace_id, revision in zip(traces, revisions, strict=True):
            current = held.get(trace_id)
            if current is None or revision >= current >> 1:
                held[trace_id] = revision * 2


async def load_chain_state(
    store: ObjectStore,
    ref: CorpusRef,
    stream: str,
    belongs: Callable[[str], bool] | None = None,
    partitioning: tuple[str, int] | None = None,
) -> ChainState:
    """Rebuild a chain's head and what its corpus holds for the chain's traces.

    ``belongs(trace_id) -> bool`` says which traces are this chain's (its partition's);
    ``partitioning`` (partitioner, partition count) picks the compaction's holdings index.
    See the module docstring for the steps.
    """
    state = ChainState()
    _, partition = parse_stream(stream)
    compaction = await latest_compaction(store, ref)
    positions: dict[str, int] = {}
    if compaction is not None:
        positions = compaction.positions
        state.head = positions.get(stream, 0)
        index = compaction.holdings_part(partitioning, partition)
        if index is not None:
            state.apply_holdings(*await read_holdings(store, ref, index))
        else:
            base = await read_compaction(store, ref, compaction)
            state.apply(r for r in base if belongs is None or belongs(r["trace_id"]))
        tombstones = await read_tombstones(store, ref, compaction)
        state.apply(r for r in tombstones if belongs is None or belongs(r["trace_id"]))
    erased = await erased_traces(store, ref.org, ref.project)
    state.erased = frozenset(t for t in erased if belongs is None or belongs(t))
    for chain in await store.folders(ref.manifest_root()):
        try:
            if parse_stream(chain)[1] != partition:
                continue  # another partition's traces
        except ValueError:
            continue
        for commit, rows in await read_chain(store, ref, chain, positions.get(chain, 0)):
            if chain == stream:
                state.apply(rows)
                state.head = commit.last_offset + 1
                state.commits.append(commit)
            else:
                state.apply(r for r in rows if belongs is None or belongs(r["trace_id"]))
    return state
