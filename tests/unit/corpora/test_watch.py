"""``rl-export watch`` (corpora/watch.py, cli/watching.py): a command each N new records."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from rl_export.corpora.compaction import compact
from rl_export.corpora.store import LocalStore, MemoryStore
from rl_export.corpora.watch import CorpusWatch
from tests.unit.corpora.test_compaction import REF, Chains, rec, tomb


async def test_growth_is_counted_from_where_the_watch_started() -> None:
    store = MemoryStore()
    chains = Chains(store)
    await chains.add(0, [rec("a", 1), rec("b", 1)])
    watch = CorpusWatch(store, REF)
    await watch.start()
    assert (await watch.poll()).records == 0

    await chains.add(0, [rec("c", 1)])
    await chains.add(1, [rec("d", 1), tomb("a", 2)])  # a chain the watch has not seen yet
    grown = await watch.poll()
    assert (grown.records, grown.new_records) == (3, 3)  # commits without new_records: lines
    assert watch.position() == {"generation": None,
                                "chains": {"trajectories-0": 3, "trajectories-1": 2}}  # fmt: skip
    assert watch.reset().records == 3
    assert (await watch.poll()).records == 0


async def test_from_start_counts_the_compaction_and_the_tail() -> None:
    store = MemoryStore()
    chains = Chains(store)
    await chains.add(0, [rec("a", 1), rec("b", 1), rec("c", 1)])
    await compact(store, REF, writer="test")
    await chains.add(0, [rec("d", 1)])
    watch = CorpusWatch(store, REF)
    await watch.start(from_start=True)
    grown = await watch.poll()
    assert (grown.records, grown.new_records) == (4, 4)
    assert watch.position()["generation"] == 1


async def test_an_expired_cursor_moves_to_the_compaction() -> None:
    store = MemoryStore()
    chains = Chains(store)
    await chains.add(0, [rec("a", 1)])
    watch = CorpusWatch(store, REF)
    await watch.start(from_start=True)
    await chains.add(0, [rec("b", 1)])
    await chains.add(0, [rec("c", 1)])
    await compact(store, REF, writer="test")
    for key in [k for k in store.objects if "/_manifest/" in k and k.endswith("0.json")]:
        del store.objects[key]  # the commit at offset 0 expired
    await chains.add(0, [rec("e", 1)])
    grown = await watch.poll()
    assert grown.records == 1  # only what came after the compaction's position
    assert watch.chains == {"trajectories-0": 4}


def test_the_command_runs_with_the_growth_in_its_environment(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    chains = Chains(store)  # type: ignore[arg-type]
    asyncio.run(chains.add(0, [rec("a", 1)]))
    out = tmp_path / "seen.json"
    script = ("import json, os; json.dump({k: v for k, v in os.environ.items() "
              f"if k.startswith('RL_WATCH_')}}, open({str(out)!r}, 'w'))")  # fmt: skip
    watch = subprocess.Popen(
        [sys.executable, "-m", "rl_export.cli", "watch", "--store", str(tmp_path / "store"),
         "--org", REF.org, "--project", REF.project, "--corpus", REF.corpus, "--min-new", "2",
         "--interval", "0.1", "--once", "--", sys.executable, "-c", script],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert watch.stderr is not None
        started = watch.stderr.readline()  # it starts at the corpus's end: "a" is not growth
        assert started.startswith(f"rl-export watch: following {REF.root} from "), started
        asyncio.run(chains.add(0, [rec("b", 1)]))
        time.sleep(0.5)
        assert watch.poll() is None  # one new record: not yet
        asyncio.run(chains.add(1, [rec("c", 1), rec("b", 2)]))
        assert watch.wait(60) == 0
    finally:
        watch.kill()
        watch.communicate()  # closes its stderr
    seen = json.loads(out.read_text())
    assert json.loads(seen.pop("RL_WATCH_POSITION")) == {
        "generation": None, "chains": {"trajectories-0": 2, "trajectories-1": 2}}  # fmt: skip
    assert seen == {"RL_WATCH_ORG": REF.org, "RL_WATCH_PROJECT": REF.project,
                    "RL_WATCH_CORPUS": REF.corpus, "RL_WATCH_RECORDS": "3",
                    "RL_WATCH_NEW_RECORDS": "3", "RL_WATCH_RUN": "1"}  # fmt: skip


def test_bad_flags_are_one_line_and_exit_2(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "rl_export.cli", "watch", "--store", str(tmp_path),
            "--org", "o", "--project", "p", "--corpus", "c"]  # fmt: skip
    for extra, words in ((["--min-new", "0", "--", "true"], "--min-new"),
                         (["--min-new", "3"], "COMMAND")):  # fmt: skip
        result = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=60,
                                check=False)  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert words in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
