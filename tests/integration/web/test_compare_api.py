"""Comparisons through two web instances (DESIGN.md section 12 with section 8's rules), against
the real broker and store: two labelers compare on both instances and no pair ever gets more
comparisons than its target; items are blind; the routes check scopes and tenancy."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from rl_export.model.pairs import pair_id
from tests.integration.web.conftest import Stack
from tests.integration.web.test_team import Team, make_tokens, project_events
from tests.integration.webproc import WebProcess
from tests.integration.workers import publish

pytestmark = pytest.mark.integration

TRACES = 8  # every trace shares a prompt (tests.records.conversation); v1 and v2 alternate


@pytest.fixture(scope="module")
def second(stack: Stack) -> Iterator[WebProcess]:
    web = WebProcess(stack.settings, "web-cmp-2").start()
    try:
        yield web
    finally:
        web.stop()


class Comparing(Team):
    """A project whose traces alternate two agent versions."""

    def __init__(self, stack: Stack, second: WebProcess, project: str, labelers: list[str]) -> None:
        super().__init__(stack, second, project, 0, labelers)
        self.traces = TRACES
        events = project_events(project, TRACES)
        for event in events:
            if event["event_type"] == "trace.completed":
                number = int(event["trace_id"].rsplit("-", 1)[1])
                event["agent_version"] = f"v{1 + number % 2}"
        asyncio.run(publish(stack.settings, events))


def _blind(record: dict[str, Any]) -> bool:
    """Nothing of any labeler's work: no comparisons, labels, labelers, counts."""
    hidden = ("comparisons", "human_labels", "labelers", "labels_count", "revision", "updated_at")
    return all(record.get(name) is None for name in hidden)


def test_two_labelers_on_two_instances_compare_every_pair_to_its_target(
    stack: Stack, second: WebProcess
) -> None:
    labelers = ["cana", "cbo", "ccy"]
    team = Comparing(stack, second, "cmp-run", labelers)
    team.settle(comparisons_per_pair=2, lease_s=600)
    pairs = (TRACES // 2) ** 2  # v1 x v2, one prompt
    done: dict[str, list[str]] = {name: [] for name in labelers}
    errors: list[str] = []

    def work(name: str) -> None:
        rng = random.Random(name)
        clients = [team.client(name, 0), team.client(name, 1)]
        deadline = time.monotonic() + 240
        try:
            while time.monotonic() < deadline:
                got = clients[rng.randrange(2)].post("compare/claim", json={"limit": 1})
                if got.status_code != 200:
                    errors.append(f"{name}: claim {got.status_code} {got.text}")
                    return
                answer = got.json()
                if not answer["items"]:
                    if answer["team_remaining"] == 0:
                        return
                    time.sleep(0.2)
                    continue
                item = answer["items"][0]
                if not (_blind(item["a"]) and _blind(item["b"])):
                    errors.append(f"{name}: an item shows others' work: {item}")
                    return
                assert item["pair_id"] == pair_id(item["trace_a"], item["trace_b"])
                assert answer["claims"][0]["pair_id"] == item["pair_id"]
                first, other = item["trace_a"], item["trace_b"]
                if rng.random() < 0.5:  # the client may name them the other way round
                    first, other = other, first
                sent = clients[rng.randrange(2)].post("comparisons", json={
                    "trace_a": first, "trace_b": other,
                    "choice": rng.choice(["a", "b", "tie", "both_bad"]),
                    "strength": rng.randint(1, 3),
                })  # fmt: skip
                if sent.status_code != 202:
                    errors.append(f"{name}: comparison {sent.status_code} {sent.text}")
                    return
                done[name].append(item["pair_id"])
            errors.append(f"{name}: still comparing after the deadline")
        finally:
            for api in clients:
                api.close()

    threads = [threading.Thread(target=work, args=(name,)) for name in labelers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    per_pair = Counter(p for items in done.values() for p in items)
    assert len(per_pair) == pairs
    assert set(per_pair.values()) == {2}  # every pair exactly to its target, none over it
    for name, items in done.items():
        assert len(items) == len(set(items)), name  # nobody compared a pair twice
    for name in labelers:
        for n in range(2):
            with team.client(name, n) as api:
                queue = api.get("compare/queue").json()
                assert (queue["remaining"], queue["team_remaining"], queue["items"]) == (0, 0, [])
    # A retraction frees the place: the pair is back in that labeler's queue, and only there.
    name = labelers[0]
    mine = done[name][0]
    with team.client(name, 1) as api:
        assert api.delete(f"comparisons/{mine}").status_code == 202
        assert api.delete(f"comparisons/{mine}").status_code == 404  # nothing left to retract
    with team.client(name, 0) as api:
        queue = api.get("compare/queue").json()
        assert [i["pair_id"] for i in queue["items"]] == [mine]
        assert queue["team_remaining"] == 1
    other = next(n for n in labelers if mine not in done[n])
    with team.client(other, 0) as api:
        assert [i["pair_id"] for i in api.get("compare/queue").json()["items"]] == [mine]


def test_comparisons_check_scopes_tenancy_and_input(stack: Stack, second: WebProcess) -> None:
    team = Comparing(stack, second, "cmp-ten", ["tana"])
    team.settle()
    strangers = asyncio.run(make_tokens(stack, "cmp-other", ["tbo"]))
    a, b = "cmp-ten-tr-000", "cmp-ten-tr-001"
    with team.client("tana") as api:
        assert api.get("compare/queue").status_code == 200
        # A trace of another project is not found here, whatever its id.
        for other in ("tr-000", "cmp-other-tr-000"):
            answer = api.post("comparisons", json={"trace_a": a, "trace_b": other, "choice": "a"})
            assert answer.status_code == 404, answer.text
            assert answer.json()["error"]
        bad = [
            {"trace_a": a, "trace_b": a, "choice": "a"},
            {"trace_a": a, "trace_b": b, "choice": "c"},
            {"trace_a": a, "trace_b": b, "choice": "a", "strength": 4},
            {"trace_a": a, "trace_b": b, "choice": "a", "labeler": "someone"},
        ]
        for body in bad:
            assert api.post("comparisons", json=body).status_code == 422, body
        assert api.delete("comparisons/not-a-pair").status_code == 422
        assert api.get("comparisons/ratings").status_code == 403  # export scope
    with team.client("lead") as lead:
        ratings = lead.get("comparisons/ratings")
        assert ratings.status_code == 200, ratings.text
        assert set(ratings.json()) == {"ratings", "agreement"}
        assert lead.get("comparisons/ratings", params={"min_reward": "x"}).status_code == 422
    # A token of another project reaches nothing of this one.
    with team.webs[0].client(strangers["tbo"], project="cmp-ten") as api:
        assert api.get("compare/queue").status_code == 403
        assert api.post("compare/claim", json={}).status_code == 403
        body = {"trace_a": a, "trace_b": b, "choice": "a"}
        assert api.post("comparisons", json=body).status_code == 403
