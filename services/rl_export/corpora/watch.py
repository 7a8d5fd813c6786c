"""A corpus's growth, followed in the store: what ``rl-export watch`` runs a command on.

:class:`CorpusWatch` keeps a cursor per chain (the offset after the last commit it counted)
and, at each :meth:`~CorpusWatch.poll`, follows every chain of the corpus from its cursor and
adds up the new commits' ``records`` (lines: new traces, new revisions and tombstones) and
``new_records`` (records of traces the corpus did not hold; a commit written before that was
counted gives its ``records``). It reads only commit objects (a listing per chain and the
new commits), never shards, so a poll costs a few requests whatever the corpus's size.

It starts where the corpus is (``from_start``: at its beginning). A chain that appears later
(a replay's) is counted from its first commit. A cursor whose commit has expired (the watcher
was stopped longer than the shard retention) moves to the latest compaction's position for
that chain, counting nothing for what it skipped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from rl_export.corpora.commits import chain_keys, follow_chain
from rl_export.corpora.compacted import latest_compaction
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import ObjectStore

log = logging.getLogger(__name__)


@dataclass
class Growth:
    """What a corpus gained since the counts were last reset."""

    records: int = 0
    new_records: int = 0


@dataclass
class CorpusWatch:
    """Follows one corpus's chains from a cursor (see the module)."""

    store: ObjectStore
    ref: CorpusRef
    chains: dict[str, int] = field(default_factory=dict)  # stream -> offset after the last
    generation: int | None = None  # the latest compaction seen
    grown: Growth = field(default_factory=Growth)
    started: bool = False

    async def start(self, *, from_start: bool = False) -> None:
        """Put the cursors at the corpus's end (``from_start``: at its latest compaction,
        whose records count as grown, so the first poll counts everything it holds)."""
        if from_start:
            compaction = await latest_compaction(self.store, self.ref)
            if compaction is not None:
                self.chains = dict(compaction.positions)
                self.grown = Growth(compaction.records, compaction.records)
        else:
            await self._follow(count=False)
        self.started = True

    async def poll(self) -> Growth:
        """Follow every chain from its cursor; return the growth since the last reset."""
        if not self.started:
            await self.start()
        await self._follow(count=True)
        return self.grown

    def reset(self) -> Growth:
        """Return the growth counted so far and start counting from zero."""
        grown, self.grown = self.grown, Growth()
        return grown

    def position(self) -> dict[str, Any]:
        """Where the watch is: the latest compaction seen and every chain's cursor."""
        return {"generation": self.generation, "chains": dict(sorted(self.chains.items()))}

    async def _follow(self, *, count: bool) -> None:
        compaction = await latest_compaction(self.store, self.ref)
        base = {} if compaction is None else compaction.positions
        self.generation = None if compaction is None else compaction.generation
        for stream in await self.store.folders(self.ref.manifest_root()):
            start = self.chains.get(stream, 0 if count else base.get(stream, 0))
            commits = await follow_chain(self.store, self.ref, stream, start)
            if not commits and start < base.get(stream, 0):
                later = await chain_keys(self.store, self.ref, stream, start)
                if later and later[0][0] > start:  # our next commit expired: skip to the base
                    log.warning("%s %s: commits from offset %d on expired; counting from the "
                                "latest compaction's position %d", self.ref.root, stream,
                                start, base[stream])  # fmt: skip
                    start = base[stream]
                    commits = await follow_chain(self.store, self.ref, stream, start)
            for commit in commits:
                if count:
                    self.grown.records += commit.records
                    self.grown.new_records += (
                        commit.records if commit.new_records is None else commit.new_records
                    )
                start = commit.last_offset + 1
            self.chains[stream] = start
