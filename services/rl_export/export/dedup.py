"""Deduplication of an export's rows (docs/guides/exports.md, ``--dedup``; pure).

Agent traffic repeats itself: the same prompt per scenario, retried runs. ``--dedup exact``
groups rows whose normalised text is identical; ``--dedup near`` also groups rows whose
MinHash-estimated Jaccard similarity of word 5-shingles is at least ``--dedup-threshold``
(default 0.85). One row per group is kept: the highest reward (a null reward, the ``traces``
corpus, is below any), then the latest ``updated_at``, then the smallest ``trace_id``.

The text of a row (``--dedup-on``): ``conversation`` (every message) or ``prompt`` (the
messages up to and including the first user message, the prompt of ``rl_prompts`` and
``preference``). Each message is its role and its text (string content, the text parts of a
list, tool calls' names and arguments), one after another; the whole with every run of
whitespace (``str.isspace``) collapsed to one space and none at either end (case kept).

:class:`Deduplicator` takes the rows of the first pass over the view (:meth:`add`, in the
view's order), then says which ``trace_id`` values stay (:meth:`kept`). Near duplicates go
through ``rensa``'s MinHash (Rust; measured against ``datasketch`` on the same rows: the same
groups, many times faster, see docs/guides/training-sets.md). All rows are known before any
is written, so the LSH is done offline in NumPy, in bounded memory (rensa's own LSH index
holds about 1.3 KiB per row; this about 330 bytes): each row's band keys (32-bit) and its
signature (16 bits per permutation) are kept, rows sharing a band key are candidates, and a
candidate pair is grouped only when the signatures' estimated Jaccard similarity is at least
the threshold. Groups are the connected components of those pairs, so the result does not
depend on the order the rows came in. Deterministic: fixed seed, fixed permutations.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from array import array
from dataclasses import dataclass
from typing import Any

import numpy as np

from rl_export.model.codec import RawJson
from rl_export.model.errors import ExportError

DEDUP_MODES: tuple[str, ...] = ("exact", "near")
DEDUP_ON: tuple[str, ...] = ("conversation", "prompt")
DEFAULT_THRESHOLD = 0.85
SHINGLE = 5  # words per shingle
NUM_PERM = 128  # MinHash permutations
SEED = 44  # of the MinHash permutations: fixed, so the groups are the same every time
_BATCH = 1024  # rows hashed at a time (their shingles are held meanwhile)


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
    role = str(message.get("role", ""))
    content = message.get("content")
    calls = message.get("tool_calls")
    if isinstance(content, str) and not calls:  # most messages: no list to walk
        return f"{role} {content}"
    parts = [role]
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
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
    parts: list[str] = []
    for message in messages:
        if type(message) is dict:  # most messages: a role and string content, no tool calls
            role, content = message.get("role", ""), message.get("content")
            if type(role) is str and type(content) is str and not message.get("tool_calls"):
                parts.append(role)
                parts.append(content)
                continue
        parts.append(_message_text(message))
    return _collapse(" ".join(parts))


def _collapse(text: str) -> str:
    """``text`` with every run of whitespace (``str.isspace``) one space, none at either end.
    ``" ".join(text.split())`` makes an object per word: a text that is ASCII and has no
    whitespace but single spaces inside (most) is returned as it is, found by searches in C
    several times faster."""
    if (
        text.isascii()
        and "  " not in text
        and text[:1] != " "
        and text[-1:] != " "
        and not any(c in text for c in _ASCII_SPACE)
    ):
        return text
    return " ".join(text.split())


_ASCII_SPACE = "\t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"
"""The ASCII characters ``str.isspace`` holds true for, but the space."""


def shingles(text: str) -> list[str]:
    """The word 5-shingles of a text, repeats included (a MinHash ignores them); a shorter
    text is one shingle, itself."""
    words = text.split(" ")
    if len(words) <= SHINGLE:
        return [text]
    # zip over shifted lists and map: the shingles made in C, no Python loop per shingle.
    return list(map(" ".join, zip(*(words[n:] for n in range(SHINGLE)))))  # noqa: B905


Rank = tuple[float, str, str]
"""What a row is ranked by: its reward (-inf when null), ``updated_at``, ``trace_id``."""


def _reward(reward: Any) -> float:
    value = reward if isinstance(reward, int | float) and not isinstance(reward, bool) else None
    return -math.inf if value is None else float(value)


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
    """Groups the rows of an export and keeps the best of each (see the module).

    Memory is what bounds it on a large corpus (a million rows and more), so a row costs
    what it must and no Python object more: its ``trace_id`` and ``updated_at`` strings,
    its reward and union-find parent in arrays, a flag byte, its text's digest in a dict
    (exact copies are grouped as they come, and not hashed); a near dedup adds a 32-bit key
    a band and a 16-bit value a permutation, appended to flat buffers (about 320 bytes).
    """

    def __init__(self, dedup: Dedup) -> None:
        self.dedup = dedup
        self.rows = 0
        self._ids: list[str] = []
        self._updated: list[str] = []
        self._rewards = array("d")
        self._counted = bytearray()
        self._parent = array("q")
        self._best: dict[bytes, int] = {}  # text digest -> its first row
        # near: the rows waiting to be hashed (row, text), then each hashed row's number,
        # one buffer of 32-bit keys a band and one of 16-bit signatures
        self._pending: list[tuple[int, str]] = []
        self._hashed = array("q")
        self._bands = _bands(dedup.threshold) if dedup.mode == "near" else 0
        self._keys = [bytearray() for _ in range(self._bands)]
        self._signatures = bytearray()

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
        self._updated.append(str(updated_at or ""))
        self._rewards.append(_reward(reward))
        self._parent.append(row)
        key = hashlib.blake2b(text.encode(), digest_size=16).digest()
        first = self._best.setdefault(key, row)
        if first != row:
            self._union(first, row)  # an exact duplicate: no need to hash it
            return
        if self.dedup.mode == "near":
            self._pending.append((row, text))
            if len(self._pending) >= _BATCH:
                self._flush()

    def rank(self, row: int) -> Rank:
        return (self._rewards[row], self._updated[row], self._ids[row])

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
        """The pending rows' MinHash (in one call to ``rensa``), kept as band keys and
        signatures: 16 bits of each value (two different values agree by chance once in
        65,536, which moves an estimate by less than that)."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        import rensa  # a compiled extension: loaded when a near dedup runs

        matrix = rensa.RMinHash.digest_matrix_from_token_sets(
            [shingles(text) for _, text in pending], NUM_PERM, SEED
        )
        digests = np.array(matrix.to_rows(), dtype=np.uint32)
        self._hashed.extend(row for row, _ in pending)
        per = NUM_PERM // self._bands
        # A band's key: its values mixed by fixed odd multipliers (wrapping in 64 bits), the
        # high 32 bits of the sum. Two equal bands have equal keys; a collision of unequal
        # ones is checked away on the signatures.
        mixed = digests.astype(np.uint64).reshape(len(pending), self._bands, per) * _MIX[:per]
        keys = (mixed.sum(axis=2, dtype=np.uint64) >> np.uint64(32)).astype(np.uint32)
        for band, buffer in enumerate(self._keys):
            buffer.extend(np.ascontiguousarray(keys[:, band]).tobytes())
        self._signatures.extend(digests.astype(np.uint16).tobytes())

    def _group_near(self) -> None:
        """Candidates are rows that share a band key; a pair is grouped when its signatures
        agree on at least the threshold's share of the permutations."""
        self._flush()
        if not self._hashed:
            return
        rows = np.frombuffer(self._hashed, dtype=np.int64)
        signatures = np.frombuffer(self._signatures, dtype=np.uint16).reshape(-1, NUM_PERM)
        need = self.dedup.threshold * NUM_PERM
        for buffer in self._keys:
            column = np.frombuffer(buffer, dtype=np.uint32)
            order = np.argsort(column, kind="stable")
            ordered = column[order]
            starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
            sizes = np.diff(np.r_[starts, len(ordered)])
            del ordered
            # Buckets of two (most) compared at once; a larger bucket pair by pair (buckets
            # are small: exact copies are grouped before hashing), a very large one along a
            # chain, each member to the next.
            twos = starts[sizes == 2]
            a, b = order[twos], order[twos + 1]
            for more in np.flatnonzero(sizes > 2):
                members = order[starts[more] : starts[more] + sizes[more]].tolist()
                pairs = (itertools.combinations(members, 2) if len(members) <= _ALL_PAIRS
                         else itertools.pairwise(members))  # fmt: skip
                extra = np.array(list(pairs), dtype=np.int64).reshape(-1, 2)
                a, b = np.r_[a, extra[:, 0]], np.r_[b, extra[:, 1]]
            for at in range(0, len(a), _PAIRS):
                left, right = a[at : at + _PAIRS], b[at : at + _PAIRS]
                agree = np.count_nonzero(signatures[left] == signatures[right], axis=1)
                for x, y in zip(left[agree >= need].tolist(), right[agree >= need].tolist(),
                                strict=True):  # fmt: skip
                    self._union(int(rows[x]), int(rows[y]))

    def kept(self) -> tuple[set[str], int]:
        """The trace ids of the rows kept (one per group), and how many counted rows were
        removed."""
        if self.dedup.mode == "near":
            self._group_near()
        best = array("q", bytes(8 * self.rows))  # a group's root -> its best row + 1 (0: none)
        rank = self.rank
        for row in range(self.rows):
            root = self._find(row)
            held = best[root] - 1
            if held < 0 or better(rank(row), rank(held)):
                best[root] = row + 1
        keep = bytearray(self.rows)
        for row in best:
            if row:
                keep[row - 1] = 1
        ids, counted = self._ids, self._counted
        removed = sum(1 for row in range(self.rows) if counted[row] and not keep[row])
        return {ids[row] for row in range(self.rows) if keep[row]}, removed


_MIX = np.array(
    [0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93,
     0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 0x94D049BB133111EB, 0xBF58476D1CE4E5B9] * 16,
    dtype=np.uint64,
)  # fmt: skip
_ALL_PAIRS = 64  # a bucket of more rows is compared along a chain
_PAIRS = 65_536  # candidate pairs compared at once


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
