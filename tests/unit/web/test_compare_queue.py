"""The comparison queue over the pair book, corrected by fresh votes and claims, is the queue
the rules (rl_export.labeling.pairs) give pair by pair: its counts and its head, for random
votes in the corpora, fresh votes and retractions, and other labelers' claims."""

from __future__ import annotations

import asyncio
import random
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from rl_export.corpora.store import MemoryStore
from rl_export.index.pairbook import PairBook
from rl_export.index.queryindex import CorpusKey, QueryIndex
from rl_export.labeling.claims import ClaimBook, Claims
from rl_export.labeling.pairs import in_queue, order_key, short
from rl_export.labeling.settings import LabelingSettings
from rl_export.model.codec import dumps_line
from rl_export.runtime.metrics import WebMetrics
from rl_export.web.compare import CompareQueue
from rl_export.web.labels import comparison_retracted, label_compared
from rl_export.web.overlay import Overlay
from rl_export.web.team import Team
from tests.records import record

LABELERS = ["ana", "bo", "cy", "dee"]
NOW = datetime(2026, 3, 1, tzinfo=UTC)


class _Svc:
    def __init__(self, index: QueryIndex) -> None:
        self.index = index
        self.pairbook = PairBook(index, partners=3)
        self.overlay = Overlay(ttl_s=900)
        self.claim_book = ClaimBook(label_grace_s=900)

        async def broadcast(entry: Any) -> None:
            return None

        self.claims = Claims(MemoryStore(), self.claim_book, broadcast)
        self.metrics = WebMetrics(CollectorRegistry())


def _records(rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for n in range(24):
        prompt = [{"role": "user", "content": f"q{n % 3}"}]
        out.append(record(f"t{n:02d}", messages=[*prompt, {"role": "assistant", "content": str(n)}],
                          agent_version=f"v{n % 2}", reward=round(rng.random(), 2)))  # fmt: skip
        out[-1]["comparisons"] = []
    return out


@pytest.mark.parametrize("seed", [3, 4, 5, 6])
def test_the_queue_is_the_rules_pair_by_pair(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    values = _records(rng)
    index = QueryIndex(tmp_path / "index", threads=1)
    try:
        cid = index.corpus_id(CorpusKey("acme", "bot", "traces"))
        index.ingest(cid, b"".join(dumps_line(r) for r in values), {"t-0": 1})
        svc = _Svc(index)
        settings = LabelingSettings(comparisons_per_pair=2, order="uncertain")
        pairs = svc.pairbook.pairs(cid, settings).pairs
        by_id = {r["trace_id"]: r for r in values}
        # Votes in the corpora: on trace_a's record (the join mirrors them on trace_b's).
        corpus: dict[str, set[str]] = {}
        for pid, pair in pairs.items():
            for who in rng.sample(LABELERS, rng.choice([0, 0, 1, 2])):
                corpus.setdefault(pid, set()).add(who)
                by_id[pair.trace_a]["comparisons"].append(
                    {"pair_id": pid, "other": pair.trace_b, "outcome": "tie", "labeler": who}
                )
        changed = [{**by_id[p.trace_a], "revision": 9} for p in pairs.values()]
        index.ingest(cid, b"".join(dumps_line(r) for r in changed), {"t-0": 2})
        # Fresh votes and retractions (not in the corpora yet), and claims.
        fresh: dict[str, dict[str, bool]] = {}
        for n, (pid, pair) in enumerate(sorted(pairs.items())):
            if rng.random() < 0.3:
                who = rng.choice(LABELERS)
                when = NOW + timedelta(seconds=n)
                if who in corpus.get(pid, ()) and rng.random() < 0.6:
                    svc.overlay.note(
                        comparison_retracted(
                            "acme", "bot", pair.trace_a, pair.trace_b, labeler=who, now=when
                        )
                    )
                    fresh.setdefault(pid, {})[who] = False
                else:
                    svc.overlay.note(
                        label_compared(
                            "acme",
                            "bot",
                            pair.trace_b,
                            pair.trace_a,
                            who,
                            choice="b",
                            strength=None,
                            rubric=None,
                            rubric_version=0,
                            comment=None,
                            now=when,
                        )
                    )
                    fresh.setdefault(pid, {})[who] = True
        team = Team("acme", "bot", settings, {}, time.time())
        for pid in sorted(pairs):
            if rng.random() < 0.3:
                who = rng.choice(LABELERS)
                queue = CompareQueue(svc, cid, team, who, svc.pairbook.pairs(cid, settings))  # type: ignore[arg-type]
                asyncio.run(queue.claim_one(pairs[pid]))
        for labeler in LABELERS:
            queue = CompareQueue(svc, cid, team, labeler, svc.pairbook.pairs(cid, settings))  # type: ignore[arg-type]

            def voters(pid: str) -> set[str]:
                found = set(corpus.get(pid, ()))
                for who, voted in fresh.get(pid, {}).items():
                    (found.add if voted else found.discard)(who)
                return found

            def holders(pid: str, labeler: str = labeler) -> set[str]:
                return svc.claim_book.holders("acme", "bot/compare", pid, team.now, voters(pid))

            mine = [p for p in pairs.values()
                    if in_queue(labeler, voters(p.pair_id), holders(p.pair_id), 2)]  # fmt: skip
            counts = queue.counts()
            assert counts.remaining == len(mine)
            assert counts.team_remaining == sum(short(voters(p), 2) for p in pairs)
            expected = sorted(mine, key=order_key("uncertain", labeler))
            assert [p.pair_id for p in queue.head(5)] == [p.pair_id for p in expected[:5]]
    finally:
        index.close()
