"""A pool's processes end when the process that started them is killed (it sends no word,
and they would wait for work forever); also those still starting then. An export's pool
for a chat template's rows (a cancelled job's process is terminated) and the web
service's export processes are such pools."""

from __future__ import annotations

import os
import threading

import pytest

from rl_export.runtime.orphans import end_with_parent
from tests.orphans import children_of_a_killed, gone

_KILLED_PARENT = """
import multiprocessing, os, sys
from concurrent.futures import ProcessPoolExecutor
from rl_export.runtime.orphans import end_with_parent

def pool():
    if sys.argv[2] == "export":  # an export's pool, for a chat template's rows
        from rl_export.export.scan import ExportSummary
        from rl_export.export.templated import Fitting, TemplateChoice
        from rl_export.formats.chat import HF
        from rl_export.formats.templates import load_template

        choice = TemplateChoice(load_template("chatml"), processes=2)
        return Fitting(choice, "messages", "jsonl", HF, ExportSummary()).pool
    if sys.argv[2] == "web":  # the web service's export processes
        from prometheus_client import CollectorRegistry
        from rl_export.corpora.store import MemoryStore
        from rl_export.runtime.metrics import WebMetrics
        from rl_export.runtime.settings import Settings
        from rl_export.web.jobs import Jobs

        settings = Settings(web_export_processes=2)
        return Jobs(settings, MemoryStore(), WebMetrics(CollectorRegistry()))._executor()
    return ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"),
                               initializer=end_with_parent)

if __name__ == "__main__":
    made = pool()
    futures = [made.submit(os.getpid) for _ in range(2)]
    if sys.argv[1] == "working":
        for future in futures:
            future.result()
    print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
    sys.stdin.read()
"""


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
@pytest.mark.parametrize("pool", ["plain", "export", "web"])
@pytest.mark.parametrize("when", ["working", "starting"])
def test_a_pool_s_processes_end_when_their_parent_is_killed(when: str, pool: str) -> None:
    assert gone(children_of_a_killed(_KILLED_PARENT, when, pool))


def test_outside_a_pool_it_does_nothing() -> None:
    before = threading.active_count()
    end_with_parent()
    assert threading.active_count() == before
