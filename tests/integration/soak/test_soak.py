"""The short soak: every kind of fault under load, then nothing lost, repeated or misfiled.

``make soak`` runs it (about 100 s, a fixed seed: ``RL_EXPORT_SOAK_SEED`` overrides it), then
the long one (24 SIGKILLs, ten minutes) with a new seed each time. ``make test`` leaves both
out: the faults each have their own integration tests there (the four slowest of which are
marked ``soak`` too, and run with this one).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rl_export.model.events import RejectReason
from tests.soak.soak import SHORT, Soak


@pytest.mark.soak
@pytest.mark.timeout(900)
async def test_a_short_soak_loses_and_repeats_nothing(tmp_path: Path) -> None:
    seed = int(os.environ.get("RL_EXPORT_SOAK_SEED", "15"))
    report = await Soak(seed, SHORT, tmp_path / "soak", quiet=True).run()
    text = "\n".join(report.lines())
    print(text)
    assert report.ok, text
    faults = "\n".join(report.faults)
    assert "skipped" not in faults, text
    for kind in ("SIGKILL worker", "SIGKILL join process", "broker restart",
                 "store unreachable", "SIGSTOP worker"):  # fmt: skip
        assert kind in faults, f"no {kind!r} injected:\n{text}"
    assert set(report.dead_letters) == {r.value for r in RejectReason}, text
    assert report.unread == {"join": 0, "sink": 0}
    assert sum(report.corpora.values()) > 0
