"""MinHash LSH libraries side by side on the same rows: ``rensa`` against ``datasketch``.

``--dedup near`` (:mod:`rl_export.export.dedup`) needs MinHash signatures of word 5-shingles
and an LSH index. Both libraries run the very same grouping here (query the LSH for each row,
keep a candidate whose signatures agree on at least the threshold's share of permutations,
connected components of those pairs), with the same permutation count and bands, over the
same synthetic conversations with planted near duplicates (a few words changed) and exact
ones. Reported: rows/s of each (signatures, LSH inserts and queries, checks), the groups each
finds, and how many rows the two put in different groups; and what rl-export itself runs
(:class:`~rl_export.export.dedup.Deduplicator`: rensa's MinHash, the LSH offline in NumPy,
the text normalised and shingled too): its rows/s and the rows it removes.

    .venv/bin/python -m tests.perf.bench_minhash --rows 20000
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rl_export.export.dedup import (
    NUM_PERM,
    SEED,
    Dedup,
    Deduplicator,
    _bands,
    dedup_text,
    shingles,
)
from rl_export.local.synthetic import SHAPES, generate


def texts(rows: int, seed: int) -> tuple[list[str], list[int]]:
    """``rows`` normalised conversation texts: a fifth of them near copies of an earlier one
    (each a few words changed), a tenth exact copies; and the original of each row."""
    rng = random.Random(seed)
    originals = max(rows * 7 // 10, 1)
    events = generate(originals, seed=seed, shape=SHAPES["standard"])
    base = [dedup_text(e["messages"]) for e in events if e.get("event_type") == "trace.completed"]
    base = list(dict.fromkeys(base))[:originals]
    out, origin = list(base), list(range(len(base)))
    while len(out) < rows:
        n = rng.randrange(len(base))
        words = base[n].split(" ")
        if rng.random() < 1 / 3:
            out.append(base[n])  # an exact copy
        else:
            for _ in range(max(1, len(words) // 200)):  # about 0.5 % of the words changed
                words[rng.randrange(len(words))] = rng.choice(["foo", "bar", "baz", "qux"])
            out.append(" ".join(words))
        origin.append(n)
    return out, origin


def group(  # noqa: PLR0917 - the two libraries' hooks, side by side at each call
    items: list[list[str]],
    threshold: float,
    signature: Callable[[list[str]], Any],
    digest: Callable[[Any], np.ndarray[Any, Any]],
    index: Any,
    insert: Callable[[Any, int, Any], None],
    query: Callable[[Any, Any], list[int]],
) -> list[int]:
    parent = list(range(len(items)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    signatures = np.zeros((len(items), NUM_PERM), np.uint64)
    for row, shingled in enumerate(items):
        minhash = signature(shingled)
        signatures[row] = digest(minhash)
        for other in query(index, minhash):
            if np.count_nonzero(signatures[other] == signatures[row]) >= threshold * NUM_PERM:
                a, b = find(int(other)), find(row)
                if a != b:
                    parent[max(a, b)] = min(a, b)
        insert(index, row, minhash)
    return [find(r) for r in range(len(items))]


def run_rensa(items: list[list[str]], threshold: float) -> list[int]:
    import rensa

    def signature(s: list[str]) -> Any:
        m = rensa.RMinHash(NUM_PERM, SEED)
        m.update(s)
        return m

    index = rensa.RMinHashLSH(threshold, NUM_PERM, _bands(threshold))
    return group(
        items, threshold, signature, lambda m: np.asarray(m.digest(), np.uint64), index,
        lambda ix, row, m: ix.insert(row, m), lambda ix, m: list(ix.query(m)),
    )  # fmt: skip


def run_datasketch(items: list[list[str]], threshold: float) -> list[int]:
    from datasketch import MinHash, MinHashLSH

    bands = _bands(threshold)
    template = MinHash(num_perm=NUM_PERM, seed=SEED)  # the permutations, made once

    def signature(s: list[str]) -> Any:
        m = MinHash(
            num_perm=NUM_PERM, seed=SEED, permutations=template.permutations, scheme=template.scheme
        )
        m.update_batch([x.encode() for x in s])
        return m

    index = MinHashLSH(num_perm=NUM_PERM, params=(bands, NUM_PERM // bands))
    return group(
        items, threshold, signature, lambda m: m.hashvalues.astype(np.uint64), index,
        lambda ix, row, m: ix.insert(row, m), lambda ix, m: list(ix.query(m)),
    )  # fmt: skip


def components(roots: list[int]) -> set[frozenset[int]]:
    groups: dict[int, set[int]] = {}
    for row, root in enumerate(roots):
        groups.setdefault(root, set()).add(row)
    return {frozenset(g) for g in groups.values() if len(g) > 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--threshold", type=float, default=0.85)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    rows, origin = texts(args.rows, args.seed)
    items = [shingles(t) for t in rows]
    result: dict[str, Any] = {"rows": len(rows), "threshold": args.threshold,
                              "num_perm": NUM_PERM, "bands": _bands(args.threshold)}  # fmt: skip
    found = {}
    for name, fn in (("rensa", run_rensa), ("datasketch", run_datasketch)):
        started = time.perf_counter()
        roots = fn(items, args.threshold)
        seconds = time.perf_counter() - started
        found[name] = components(roots)
        result[name] = {"seconds": round(seconds, 2), "rows_per_s": round(len(rows) / seconds),
                        "groups": len(found[name]),
                        "rows_removed": len(rows) - len(set(roots))}  # fmt: skip
    # What rl-export runs: rensa's MinHash, the LSH offline in NumPy (Deduplicator).
    started = time.perf_counter()
    grouping = Deduplicator(Dedup("near", args.threshold))
    for n, text in enumerate(rows):
        grouping.add(f"{n:09d}", 0.5, "", [{"role": "user", "content": text}])
    _, removed = grouping.kept()
    seconds = time.perf_counter() - started
    result["rl_export_dedup"] = {"seconds": round(seconds, 2),
                                 "rows_per_s": round(len(rows) / seconds),
                                 "rows_removed": removed}  # fmt: skip
    truth = components(origin)
    for name in ("rensa", "datasketch"):
        result[name]["planted_groups_found_whole"] = len(truth & found[name])
    result["planted_groups"] = len(truth)
    result["same_groups"] = found["rensa"] == found["datasketch"]
    differ = {r for g in found["rensa"] ^ found["datasketch"] for r in g}
    result["rows_in_groups_that_differ"] = len(differ)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
