"""``python -m tests.perf.bench_redact``: what redaction finds, misses and costs (printed; the
numbers in docs/guides/redaction.md).

1. Loading the detectors: CPU seconds, once per process (the secrets kind's rule set from
   kingfisher's disk cache, its gates derived; Presidio's imports for personal data).
2. Coverage of the ``secrets`` kind on :mod:`tests.unit.privacy.secret_cases`: credentials
   replaced whole with the text around them kept (goal: at least 95 %), look-alikes and
   sentences changed (goal: none), and the formats issue 53 reported.
3. Cost per KB of :meth:`Redactor.text`, per kind and for ``all``: clean prose (the gates
   alone), prose with one planted value per KB, prose dense with digits.
4. Cost per record on the export benchmark's records (``scored_event_lines``: multi-turn
   conversations with tool calls, evaluations with reports, labels; built through replay):
   the line path over blocks of ``trajectory`` lines (what an export does) and the record
   path over ``messages`` rows, for ``secrets`` and ``all``; with ``--baseline``, another
   tree's code on the same lines, in a child process.
5. The export of ``--records`` records (the export benchmark's cached corpus, built once in
   ``var/bench``): ``trajectory`` with ``--redact none``, ``secrets`` and ``all``, to
   /dev/null, in child processes, with ``--baseline``'s code interleaved; the ratio to the
   export without redaction (goal: at most 2 x). ``--records 0`` leaves it out.
6. Findings on a planted set, every kind: what each case became.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rl_export.privacy.kinds import placeholder
from rl_export.privacy.redact import KINDS, Redactor, warm_up

ROOT = Path(__file__).resolve().parents[2]
WORDS = [
    "plan", "goal", "step", "budget", "weekly", "check", "progress", "habit", "sleep", "walk",
    "friend", "call", "schedule", "review", "order", "refund", "account", "reset", "summary",
    "revenue", "growth", "margin", "city", "flight", "hotel", "route",
]  # fmt: skip

# (text, the kind it should be redacted as, or None: must stay; what it shows)
CASES: list[tuple[str, str | None, str]] = [
    ("key AKIAIOSFODNN7EXAMPLE", "secrets", "AWS access key id"),
    ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "secrets", "GitHub token"),
    ("sk-proj-Zq8xY2vB4nM6kL0pR3tW5yU7iO9aS1dF", "secrets", "OpenAI key"),
    ('password: "Sup3r-S3cret-Value!"', "secrets", "password assigned to a name"),
    ("my password is Sup3r-S3cret-Value!", "secrets", "password in prose (no assignment)"),
    ("password: abc", "secrets", "short password (< 6 characters)"),
    ("postgres://admin:hunter2pass@db.internal.io/app", "secrets", "password in a URL"),
    ("jane.doe@acme-corp.com", "email", "e-mail address"),
    ("jane dot doe at acme-corp dot com", "email", "spelled-out e-mail"),
    ("(415) 555-2671", "phone", "US phone with separators"),
    ("+44 20 7946 0958", "phone", "UK phone, international"),
    ("4155552671", "phone", "bare run of digits (policy: order numbers look the same)"),
    ("call (415) 555-2671 +44 20 7946 0958", "phone", "two phones side by side: the second"),
    ("4111 1111 1111 1111", "credit_card", "Visa test number"),
    ("2221 0000 0000 0009", "credit_card", "Mastercard 2-series"),
    ("4111.1111.1111.1111", "credit_card", "card written with dots"),
    ("DE89 3704 0044 0532 0130 00", "iban", "German IBAN"),
    ("de89 3704 0044 0532 0130 00", "iban", "IBAN in lower case"),
    ("192.168.1.20", "ip", "IPv4"),
    ("2001:db8::8a2e:370:7334", "ip", "IPv6"),
    ("Jane Doe, 12 Baker Street, London", None, "name and address (no NLP model)"),
    ("Order #1234567890 on 2024-05-01", None, "order number, date"),
    ("v1.2.3 and 2026-01-02T03:04:05.123456Z", None, "version, datetime"),
    ("release 1.2.3.4", None, "four-part version (reads as an IPv4)"),
    ("4111 1111 1111 1112", None, "fails the Luhn check"),
    ("550e8400-e29b-41d4-a716-446655440000", None, "UUID"),
    ("$1,299.99", None, "price"),
    ("Set token_limit = 4096 and retry", None, "a limit assigned to a token's name"),
]


def prose(rng: random.Random, size: int) -> str:
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < size:
        words.append(rng.choice(WORDS))
    return " ".join(words)


def cost(redactor: Redactor, texts: list[str], rounds: int) -> float:
    """µs of CPU per KB of text, the best of three."""
    redactor.text(texts[0])
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        for _ in range(rounds):
            for text in texts:
                redactor.text(text)
        best = min(best, time.process_time() - start)
    return best * 1e6 / (rounds * sum(len(t.encode()) for t in texts) / 1024)


def coverage() -> None:
    """Step 2."""
    from rl_export.privacy.redact import redactor
    from tests.unit.privacy.secret_cases import (
        CREDENTIALS,
        LOOK_ALIKES,
        PROSE,
        REPORTED,
        formats,
        measure,
    )

    scrub = redactor(("secrets",))

    def redact(text: str) -> str:
        return scrub.text(text)[0]

    result = measure(redact)
    found = len(CREDENTIALS) - len(result["missed"])
    print(f"coverage of the secrets kind ({formats()} formats of our own making):")
    print(
        f"  credentials replaced whole: {found}/{len(CREDENTIALS)} "
        f"({100 * found / len(CREDENTIALS):.1f} %, goal 95 %); missed {result['missed']}"
    )
    print(
        f"  text around them changed: {len(result['context_changed'])} {result['context_changed']}"
    )
    print(
        f"  look-alikes changed: {len(result['look_alikes_changed'])}/{len(LOOK_ALIKES)} "
        f"{result['look_alikes_changed']}"
    )
    print(
        f"  sentences changed: {len(result['prose_changed'])}/{len(PROSE)} "
        f"{result['prose_changed']}"
    )
    reported = measure(redact, REPORTED)
    print(f"  issue 53's formats: {len(REPORTED) - len(reported['missed'])}/{len(REPORTED)} "
          f"replaced whole; missed {reported['missed']}")  # fmt: skip


# --- step 4: per record ----------------------------------------------------------------------


async def _sample_lines(traces: int, seed: int) -> bytes:
    """``trajectory`` lines of the export benchmark's recipe (through replay, as built)."""
    from rl_export.corpora.layout import CorpusRef
    from rl_export.corpora.replay import replay
    from rl_export.corpora.store import LocalStore
    from rl_export.export.exports import iter_export
    from rl_export.local.synthetic import scored_event_lines
    from rl_export.runtime.settings import load_settings

    with tempfile.TemporaryDirectory() as tmp:
        store = LocalStore(Path(tmp))
        await replay(load_settings(partitions=2), store, scored_event_lines(0, traces, seed),
                     run_id="bench-redact")  # fmt: skip
        chunks = [bytes(c) async for c in iter_export(
            store, CorpusRef("acme", "support-bot", "evaluator"), format="trajectory",
            redact="none")]  # fmt: skip
    return b"".join(chunks)


def per_record(path: str) -> dict[str, Any]:
    """µs of CPU per record of the lines in ``path``: the line path over blocks (what an
    export of ``trajectory`` runs) and the record path over ``messages`` rows; the best of
    three. Runs on whatever tree is imported (a child process for ``--baseline``)."""
    import orjson

    from rl_export.privacy.redact import redactor

    data = Path(path).read_bytes()
    lines = data.splitlines(keepends=True)
    rows = [{"messages": orjson.loads(line)["messages"]} for line in lines]
    out: dict[str, Any] = {"records": len(lines)}
    for name, kinds in (("secrets", ("secrets",)), ("all", KINDS)):
        scrub = redactor(kinds)
        scrub.text("warm up")

        def block(scrub: Any = scrub) -> int:
            parsed, pos = 0, 0
            hit = scrub.next_hit(data)
            while hit >= 0:
                start = data.rfind(b"\n", pos, hit) + 1 or pos
                end = data.find(b"\n", hit) + 1 or len(data)
                scrub.line(data[start:end])
                parsed, pos = parsed + 1, end
                hit = scrub.next_hit(data, pos)
            return parsed

        best_block = best_rows = float("inf")
        parsed = 0
        for _ in range(3):
            start = time.process_time()
            parsed = block()
            best_block = min(best_block, time.process_time() - start)
            start = time.process_time()
            for row in rows:
                scrub.record(row)
            best_rows = min(best_rows, time.process_time() - start)
        out[name] = {
            "line_path_us": best_block * 1e6 / len(lines),
            "lines_parsed": parsed,
            "row_path_us": best_rows * 1e6 / len(rows),
        }
    return out


def _per_record_in(tree: str | None, path: Path) -> dict[str, Any]:
    if tree is None:
        return per_record(str(path))
    code = ("import json, sys\nfrom tests.perf.bench_redact import per_record\n"
            "print(json.dumps(per_record(sys.argv[1])))\n")  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, str(ROOT)]))
    done = subprocess.run([sys.executable, "-c", code, str(path)], check=True,
                          capture_output=True, text=True, env=env)  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def records_cost(traces: int, baseline: str | None) -> None:
    """Step 4."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "lines.jsonl"
        path.write_bytes(asyncio.run(_sample_lines(traces, seed=13)))
        size = path.stat().st_size
        trees = {"this code": None} | ({"baseline": baseline} if baseline else {})
        results = {name: _per_record_in(tree, path) for name, tree in trees.items()}
    count = next(iter(results.values()))["records"]
    print(
        f"cost per record, µs of CPU ({count:,} records of the export benchmark's recipe, "
        f"{size / count:,.0f} bytes each):"
    )
    header = f"{'code':10s} {'kinds':8s} {'line path':>10s} {'lines parsed':>13s} {'row path':>9s}"
    print("  " + header)
    for name, result in results.items():
        for kinds in ("secrets", "all"):
            r = result[kinds]
            print(f"  {name:10s} {kinds:8s} {r['line_path_us']:10.1f} "
                  f"{r['lines_parsed']:13,} {r['row_path_us']:9.1f}")  # fmt: skip


# --- step 5: the export ---------------------------------------------------------------------

EXPORT_CASES = ("trajectory", "trajectory --redact secrets", "trajectory --redact all")


def export_cost(records: int, baseline: str | None, runs: int, base: Path) -> None:
    """Step 5: the export benchmark's corpus and its way of measuring a child process."""
    from tests.perf import bench_export

    seed, partitions = 13, 8
    directory = bench_export.corpus_dir(base, records, seed, partitions)
    asyncio.run(bench_export.build_corpus(directory, records, seed, partitions))
    store = directory / "store"
    out = base / "export-out" / "redact.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    trees = {"this code": None} | ({"baseline": baseline} if baseline else {})
    runs_of: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for n in range(runs):
        order = [(tree, case) for tree in trees for case in EXPORT_CASES]
        for tree, case in order[n % len(order) :] + order[: n % len(order)]:
            args = bench_export.CASES[case]
            runs_of.setdefault((tree, case), []).append(
                bench_export.measure(store, args, out, sink="null", pythonpath=trees[tree])
            )
    print(f"the export of {records:,} records, to /dev/null (median of {runs}):")
    print(f"  {'code':10s} {'case':28s} {'wall s':>7s} {'CPU s':>6s} {'x none (wall)':>13s} "
          f"{'x none (CPU)':>12s} {'peak RSS':>9s}")  # fmt: skip
    for tree in trees:
        plain = runs_of[(tree, "trajectory")]
        plain_wall = statistics.median(r["seconds"] for r in plain)
        plain_cpu = statistics.median(r["cpu_s"] for r in plain)
        for case in EXPORT_CASES:
            measured = runs_of[(tree, case)]
            wall = statistics.median(r["seconds"] for r in measured)
            cpu = statistics.median(r["cpu_s"] for r in measured)
            rss = max(r["peak_rss_mib"] for r in measured)
            print(f"  {tree:10s} {case:28s} {wall:7.1f} {cpu:6.1f} {wall / plain_wall:13.2f} "
                  f"{cpu / plain_cpu:12.2f} {rss:5.0f} MiB")  # fmt: skip
    print("  goal: at most 2 x the export without redaction")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--sample", type=int, default=5000,
                        help="traces of the per-record sample (step 4)")  # fmt: skip
    parser.add_argument("--records", type=int, default=1_000_000,
                        help="records of the export (step 5; 0: left out)")  # fmt: skip
    parser.add_argument("--runs", type=int, default=3, help="runs of each export case")
    parser.add_argument(
        "--baseline",
        metavar="SERVICES_DIR",
        help="another tree's services/ folder, measured beside this one",
    )
    parser.add_argument("--dir", default="var/bench")
    args = parser.parse_args(argv)
    baseline = str(Path(args.baseline).resolve()) if args.baseline else None
    rng = random.Random(7)
    for kinds, label in ((("secrets",), "secrets"), (KINDS, "all")):
        started = time.process_time()
        warm_up(kinds)
        print(f"loading the detectors of {label}: {time.process_time() - started:.2f} s of CPU")
    from rl_export.privacy.secrets import rule_counts

    rules = rule_counts()
    print(f"secrets rules: the rule set's {rules['rule_set']} ({rules['rule_set_used']} used; "
          f"without a gate: {', '.join(rules['rule_set_without_gate']) or 'none'}), "
          f"ours {rules['own']}")  # fmt: skip
    print()
    coverage()
    print()
    clean = [prose(rng, 1024) for _ in range(50)]
    planted = [f"{t} {CASES[n % 21][0]}" for n, t in enumerate(clean)]  # one value per KB
    digits = [f"{t} {rng.randrange(10**9)} on 2024-05-{n % 28 + 1:02d}, ref 2026-{n:04d}-77"
              for n, t in enumerate(clean)]  # fmt: skip
    print("cost, µs of CPU per KB of text (1 KB strings)")
    print(f"{'kinds':12s} {'clean':>9s} {'planted':>9s} {'digits':>9s}")
    for kinds in [*[(k,) for k in KINDS], KINDS]:
        redactor = Redactor(kinds)
        name = "all" if kinds == KINDS else kinds[0]
        row = [cost(redactor, texts, args.rounds) for texts in (clean, planted, digits)]
        print(f"{name:12s} " + " ".join(f"{v:9.1f}" for v in row))
    print()
    records_cost(args.sample, baseline)
    print()
    if args.records:
        export_cost(args.records, baseline, args.runs, Path(args.dir))
        print()
    print("findings (redact all)")
    redactor = Redactor(KINDS)
    for text, kind, what in CASES:
        out, counts = redactor.text(text)
        if kind is None:
            verdict = "kept" if out == text else f"CHANGED {counts}"
        else:
            verdict = "found" if placeholder(kind) in out else "MISSED"
            if kind == "phone" and what.startswith("two phones"):
                verdict = "found" if counts.get("phone", 0) == 2 else "MISSED"
        print(f"  {verdict:8s} {what:58s} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
