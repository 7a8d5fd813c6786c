"""Deduplication of an export's rows (DESIGN.md section 4, ``--dedup``; pure).

Agent traffic repeats itself: the same prompt per scenario, retried runs. ``--dedup exact``
groups rows whose normalised text is identical; ``--dedup near`` also groups rows whose
MinHash-estimated Jaccard similarity of word 5-shingles is at least ``--dedup-threshold``
(default 0.85). One row per group is kept: the highest reward (a null reward, the ``traces``
corpus, is below any), then the latest ``updated_at``, then the smallest ``trace_id``.

The text of a row (``--dedup-on``): ``conversation`` (every message) or ``prompt`` (the
messages up to and including the first user message, the prompt of ``rl_prompts`` and
``preference``). Each message is its role and its text (string content, the text parts of a
list, tool calls' names and arguments), one message per line; the whole with every run of
whitespace collapsed to one space (case kept).

:class:`Deduplicator` takes the rows of the first pass over the view (:meth:`add`, in the
view's order), then says which ``trace_id`` values stay (:meth:`kept`). Near duplicates go
through ``rensa``'s MinHash and LSH (Rust; measured against ``datasketch`` on the same rows:
the same groups, several times faster, see docs/guides/training-sets.md): every row's
signature is kept in one array of 32-bit integers, candidates come from the LSH bands, and a
candidate pair is grouped only when the signatures' estimated Jaccard similarity is at least
the threshold. Groups are the connected components of those pairs, so the result does not
depend on the order the rows came in. Deterministic: fixed seed, fixed permutations.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from rl_export.common.codec import RawJson
from rl_export.common.errors import ExportError

DEDUP_MODES: tuple[str, ...] = ("exact", "near")
DEDUP_ON: tuple[str, ...] = ("conversation", "prompt")
DEFAULT_THRESHOLD = 0.85
SHINGLE = 5  # words per shingle
NUM_PERM = 128  # MinHash permutations
SEED = 44  # of the MinHash permutations: fixed, so the groups are the same every time
_BATCH = 4096  # rows hashed and inserted into the LSH at a time

_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class Dedup:
    """What ``--dedup`` asks for."""

    mode: str  # exact | near
    threshold: float = DEFAULT_THRESHOLD
    on: str = "conversation"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode, "on": self.on}
        if self.mode == "near":
            out["threshold"] = self.threshold
        return out


def parse_dedup(
    mode: str | None, threshold: str | float | None = None, on: str | None = None
) -> Dedup | None:
    """``--dedup``, ``--dedup-threshold`` and ``--dedup-on`` -> :class:`Dedup` (None: no
    dedup); ExportError naming the flag for a bad value or a flag without ``--dedup``."""
    if mode is None:
        if threshold is not None:
            raise ExportError("dedup-threshold", "only applies with --dedup near")
        if on is not None:
            raise ExportError("dedup-on", "only applies with --dedup")
        return None
    if mode not in DEDUP_MODES:
        raise ExportError("dedup", f"{mode!r} is not exact or near")
    if on is not None and on not in DEDUP_ON:
        raise ExportError("dedup-on", f"{on!r} is not conversation or prompt")
    value = DEFAULT_THRESHOLD
    if threshold is not None:
        if mode != "near":
            raise ExportError("dedup-threshold", "only applies with --dedup near")
        try:
            value = float(threshold)
        except (TypeError, ValueError):
            raise ExportError("dedup-threshold", f"{threshold!r} is not a number") from None
        if not math.isfinite(value) or not 0 < value <= 1:
            raise ExportError(
                "dedup-threshold", f"{threshold!r} is outside (0, 1] (a Jaccard similarity)"
            )
    return Dedup(mode, value, on or "conversation")


def _message_text(message: Any) -> str:
    if not isinstance(message, dict):
        return str(message)
    parts = [str(message.get("role", ""))]
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                parts.append(str(function.get("name", "")))
                parts.append(str(function.get("arguments", "")))
    return " ".join(parts)


def dedup_text(messages: Any, on: str = "conversation") -> str:
    """The normalised text a row is compared on (see the module)."""
    if isinstance(messages, RawJson):
        messages = messages.value()
    if not isinstance(messages, list):
        return ""
    if on == "prompt":
        for n, message in enumerate(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                messages = messages[: n + 1]
                break
    text = "\n".join(_message_text(m) for m in messages)
    return _SPACES.sub(" ", text).strip()


def shingles(text: str, size: int = SHINGLE) -> list[str]:
    """The distinct word ``size``-shingles of a text (a shorter text: itself, as one)."""
    words = text.split(" ")
    if len(words) <= size:
        return [text]
    return list(dict.fromkeys(" ".join(words[n : n + size]) for n in range(len(words) - size + 1)))


Rank = tuple[float, str, str]
"""What a row is ranked by: its reward (-inf when null), ``updated_at``, ``trace_id``."""


def _rank(reward: Any, updated_at: Any, trace_id: str) -> Rank:
    value = reward if isinstance(reward, int | float) and not isinstance(reward, bool) else None
    return (-math.inf if value is None else float(value), str(updated_at or ""), trace_id)


def better(a: Rank, b: Rank) -> bool:
    """True when row ``a`` is kept before row ``b``: the highest reward, then the latest
    ``updated_at`` (UTC ``...Z`` strings of one shape: they sort as text), then the smallest
    ``trace_id``."""
    if a[0] != b[0]:
        return a[0] > b[0]
    if a[1] != b[1]:
        return a[1] > b[1]
    return a[2] < b[2]


class Deduplicator:
    """Groups the rows of an export and keeps the best of each (see the module)."""

    def __init__(self, dedup: Dedup) -> None:
        self.dedup = dedup
        self.rows = 0
        self._ids: list[str] = []
        self._ranks: list[Rank] = []
        self._counted: list[bool] = []
        self._best: dict[bytes, int] = {}  # exact: text digest -> best row so far
        self._pending: list[list[str]] = []  # near: shingles of rows not hashed yet
        self._blocks: list[np.ndarray[Any, np.dtype[np.uint32]]] = []  # _BATCH rows each
        self._parent: list[int] = []
        self._lsh: Any = None

    def add(
        self, trace_id: str, reward: Any, updated_at: Any, messages: Any, *, counted: bool = True
    ) -> None:
        """One row of the export (in the view's order); ``counted``: when it is removed, it
        counts in :meth:`kept`'s removed rows (a row of another split does not)."""
        text = dedup_text(messages, self.dedup.on)
        row = self.rows
        self.rows += 1
        self._counted.append(counted)
        self._ids.append(trace_id)
        self._ranks.append(_rank(reward, updated_at, trace_id))
        self._parent.append(row)
        key = hashlib.blake2b(text.encode(), digest_size=16).digest()
        first = self._best.setdefault(key, row)
        if first != row:
            self._union(first, row)  # an exact duplicate: no need to hash it
            if self.dedup.mode == "near":
                self._pending.append([])
            return
        if self.dedup.mode == "near":
            self._pending.append(shingles(text))
            if len(self._pending) >= _BATCH:
                self._flush()

    def _find(self, row: int) -> int:
        parent = self._parent
        root = row
        while parent[root] != root:
            root = parent[root]
        while parent[row] != root:
            parent[row], row = root, parent[row]
        return root

    def _union(self, a: int, b: int) -> None:
        a, b = self._find(a), self._find(b)
        if a != b:
            self._parent[max(a, b)] = min(a, b)

    def _flush(self) -> None:
        """Hash the pending rows, find their candidates in the LSH, insert them."""
        import rensa  # a compiled extension: loaded when a near dedup runs

        pending, self._pending = self._pending, []
        if not pending:
            return
        start = self.rows - len(pending)
        if self._lsh is None:
            self._lsh = rensa.RMinHashLSH(self.dedup.threshold, NUM_PERM, _bands(
                self.dedup.threshold))  # fmt: skip
        hashes: list[Any] = []
        for items in pending:
            if not items:  # an exact duplicate, grouped already
                hashes.append(None)
                continue
            minhash = rensa.RMinHash(NUM_PERM, SEED)
            minhash.update(items)
            hashes.append(minhash)
        block = np.zeros((len(pending), NUM_PERM), np.uint32)
        for n, minhash in enumerate(hashes):
            if minhash is not None:
                block[n] = minhash.digest()
        self._blocks.append(block)  # every block but the last holds _BATCH rows
        threshold = self.dedup.threshold
        blocks = self._blocks
        for n, minhash in enumerate(hashes):
            if minhash is None:
                continue
            row = start + n
            signature = block[n]
            for other in self._lsh.query(minhash):
                theirs = blocks[other // _BATCH][other % _BATCH]
                if np.count_nonzero(theirs == signature) >= threshold * NUM_PERM:
                    self._union(other, row)
            self._lsh.insert(row, minhash)

    def kept(self) -> tuple[set[str], int]:
        """The trace ids of the rows kept (one per group), and how many counted rows were
        removed."""
        self._flush()
        best: dict[int, int] = {}
        ranks = self._ranks
        for row in range(self.rows):
            root = self._find(row)
            held = best.get(root)
            if held is None or better(ranks[row], ranks[held]):
                best[root] = row
        ids, counted = self._ids, self._counted
        kept = set(best.values())
        removed = sum(1 for row in range(self.rows) if counted[row] and row not in kept)
        return {ids[row] for row in kept}, removed


RECALL = 0.95
"""The least probability that two rows of exactly the threshold's similarity share a band."""


def _bands(threshold: float) -> int:
    """The LSH band count b (NUM_PERM / b rows per band, b a divisor of NUM_PERM): the fewest
    bands (so the fewest candidates to check) with which two rows of the threshold's
    similarity s share a band with probability ``1 - (1 - s^r)^b`` >= :data:`RECALL` (a
    pair more similar shares one more often). Candidates are then checked against the
    threshold on their signatures."""
    for bands in [d for d in range(1, NUM_PERM + 1) if NUM_PERM % d == 0]:
        rows = NUM_PERM // bands
        if 1 - (1 - threshold**rows) ** bands >= RECALL:
            return bands
    return NUM_PERM
