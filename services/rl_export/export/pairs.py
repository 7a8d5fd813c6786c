"""The ``preference`` export's pairing, in bounded memory (step 3 of
:mod:`rl_export.export.exports`).

The view is read twice. Pass 1 takes each record's prompt group and reward; the candidates
are sorted by group on disk (:class:`CandidateRuns`) and paired group by group
(:func:`~rl_export.formats.render.pair_candidates`), the pairs written to a temporary file.
Pass 2 spills the paired records' halves (prompt, and the rest), found again by their
position in the view, from which the pairs are written.
"""

from __future__ import annotations

import heapq
import itertools
import tempfile
from array import array
from collections.abc import AsyncGenerator, Iterator, Sequence
from typing import IO, Any

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import ObjectStore
from rl_export.export.latest import LatestView
from rl_export.export.scan import ExportSummary, Scan
from rl_export.export.templated import Fitting, template_chat
from rl_export.formats.chat import HF, Chat
from rl_export.formats.render import (
    Candidate,
    Completion,
    pair_candidates,
    preference_group,
    preference_row,
    trace_tools,
)
from rl_export.model.codec import dumps, dumps_line, loads
from rl_export.privacy.kinds import add_counts
from rl_export.privacy.redact import Redactor

PREFERENCE_RUN = 200_000  # preference candidates sorted in memory before a run is spilled


class CandidateRuns:
    """Preference candidates sorted by group on disk (runs of ``run_size``), merged back one
    group at a time: memory holds one run, or one group, never every candidate."""

    def __init__(self, run_size: int | None = None) -> None:
        self.run_size = run_size or PREFERENCE_RUN
        self.pending: list[Candidate] = []
        self.files: list[IO[bytes]] = []

    def add(self, candidate: Candidate) -> None:
        self.pending.append(candidate)
        if len(self.pending) >= self.run_size:
            self._spill()

    def _spill(self) -> None:
        fh = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self.pending.sort(key=lambda c: c.group)
        fh.write(b"".join(
            dumps([c.group.hex(), c.reward, c.trace_id, c.position]) + b"\n"
            for c in self.pending
        ))  # fmt: skip
        fh.seek(0)
        self.files.append(fh)
        self.pending = []

    @staticmethod
    def _read(fh: IO[bytes]) -> Iterator[Candidate]:
        for line in fh:
            group, reward, trace_id, position = loads(line)
            yield Candidate(bytes.fromhex(group), reward, trace_id, position)

    def groups(self) -> Iterator[list[Candidate]]:
        """Every group's candidates, groups in digest order."""
        self.pending.sort(key=lambda c: c.group)
        streams = [self._read(fh) for fh in self.files]
        merged = heapq.merge(*streams, iter(self.pending), key=lambda c: c.group)
        for _, group in itertools.groupby(merged, key=lambda c: c.group):
            yield list(group)

    def close(self) -> None:
        for fh in self.files:
            fh.close()
        self.files = []


async def preference_chunks(
    store: ObjectStore,
    ref: CorpusRef,
    scan: Scan,
    *,
    pair_by: Sequence[str],
    margin: float,
    max_pairs: int,
    limit: int | None,
    summary: ExportSummary,
    redactor: Redactor | None = None,
    completion: Completion = "turn",
    chat: Chat = HF,
    fitting: Fitting | None = None,
) -> AsyncGenerator[bytes, None]:
    """The pairs of the records ``scan`` yields, as JSON Lines chunks (the module docstring):
    memory holds one run of candidates or one group, and two integers per record. With
    ``fitting`` (a chat template), pairs are made among trajectories whose agents had the
    same tools, and each pair is made for the template, or left out (counted)."""
    tools = fitting is not None
    if fitting is not None:
        chat = template_chat(chat)
    runs = CandidateRuns()
    position = 0
    if redactor is not None:
        summary.redactions = dict.fromkeys(redactor.kinds, 0)
    async for batch in scan.lines():  # pass 1: each record's group and reward
        for _, record in batch:
            grouped = preference_group(record, pair_by, completion, tools=tools)
            if grouped is None:
                summary.skipped += 1
            else:
                runs.add(Candidate(grouped[0], float(record["reward"]), record["trace_id"],
                                   position))  # fmt: skip
            position += 1
    needed = bytearray((position + 7) // 8)
    pairs = 0
    with tempfile.TemporaryFile() as pair_file, tempfile.TemporaryFile() as spill:
        try:
            for members in runs.groups():
                for chosen, rejected in pair_candidates(
                    members, margin=margin, max_pairs=max_pairs
                ):
                    if limit is not None and pairs >= limit and fitting is None:
                        break
                    pair_file.write(dumps([
                        [chosen.reward, chosen.trace_id, chosen.position],
                        [rejected.reward, rejected.trace_id, rejected.position],
                    ]) + b"\n")  # fmt: skip
                    for c in (chosen, rejected):
                        needed[c.position >> 3] |= 1 << (c.position & 7)
                    pairs += 1
        finally:
            runs.close()
        if not pairs:
            return
        # Pass 2: the paired records' prompt and rest, spilled; found by view position, so
        # read at the first pass's position (not the corpus's latest: commits since would
        # shift every line).
        offsets = array("q", bytes(16 * position))
        again = LatestView(store, ref, at=scan.view.position, erased_keys=scan.view.erased_keys)
        second = Scan(again, scan.filters, ExportSummary(), None, scan.fields)
        await second.view.open()
        n = 0
        async for batch in second.lines():
            for _, stored in batch:
                if needed[n >> 3] & (1 << (n & 7)):
                    record = stored
                    if redactor is not None:  # pairs were made on the prompts as stored
                        record, counts = redactor.record(stored)
                        add_counts(summary.redactions, counts)
                    grouped = preference_group(record, pair_by, completion, tools=tools)
                    if grouped is not None:
                        data = dumps(
                            [grouped[1], grouped[2], trace_tools(record) if tools else None]
                        )
                        offsets[2 * n], offsets[2 * n + 1] = spill.tell(), len(data)
                        spill.write(data)
                n += 1

        def halves(at: int) -> list[Any]:
            spill.seek(offsets[2 * at])
            value: list[Any] = loads(spill.read(offsets[2 * at + 1]))
            return value

        pair_file.seek(0)
        out: list[bytes] = []
        for line in pair_file:
            if limit is not None and summary.records >= limit:
                break
            (c_reward, c_id, c_at), (r_reward, r_id, r_at) = loads(line)
            prompt, chosen_rest, pair_tools = halves(c_at)
            _, rejected_rest, _ = halves(r_at)
            chosen = Candidate(b"", c_reward, c_id, c_at)
            rejected = Candidate(b"", r_reward, r_id, r_at)
            row: dict[str, Any] | None = preference_row(
                prompt, chosen, chosen_rest, rejected, rejected_rest, chat=chat,
                tools=pair_tools,
            )  # fmt: skip
            if fitting is not None:
                row = fitting.row(row, f"{c_id}, {r_id}") if row is not None else None
                if row is None:
                    continue
            out.append(dumps_line(row))
            summary.records += 1
            if len(out) >= 1000:
                yield b"".join(out)
                out = []
        if out:
            yield b"".join(out)
