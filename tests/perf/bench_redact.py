"""``python -m tests.perf.bench_redact``: what redaction costs per KB of text, and what its
detectors find and miss on a planted set (printed; the numbers in docs/guides/redaction.md).

Cost: :meth:`Redactor.text` over clean prose (the gates alone), prose with one planted value
per KB, and prose dense with digits, per kind and for ``all``; loading the detectors
(imports) is timed on its own, first. Findings: each planted case says what it should become;
the table says what it became.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from rl_export.privacy.kinds import placeholder
from rl_export.privacy.redact import KINDS, Redactor, warm_up

WORDS = [
    "plan", "goal", "step", "budget", "weekly", "check", "progress", "habit", "sleep", "walk",
    "friend", "call", "schedule", "review", "order", "refund", "account", "reset", "summary",
    "revenue", "growth", "margin", "city", "flight", "hotel", "route",
]  # fmt: skip

# (text, the kind it should be redacted as, or None: must stay; what it shows)
CASES: list[tuple[str, str | None, str]] = [
    ("key AKIAIOSFODNN7EXAMPLE", "secrets", "AWS access key id"),
    ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "secrets", "GitHub token"),
    ("sk-proj-Zq8xY2vB4nM6kL0pR3tW5yU7iO9aS1dF", "secrets", "OpenAI key (our recognizer)"),
    ('password: "Sup3r-S3cret-Value!"', "secrets", "password assigned to a name"),
    ("my password is Sup3r-S3cret-Value!", "secrets", "password in prose (no assignment)"),
    ('password: "Sup3r-S3cret!" (example)', "secrets", "'example' near it (allow-listed)"),
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
]


def prose(rng: random.Random, size: int) -> str:
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < size:
        words.append(rng.choice(WORDS))
    return " ".join(words)


def cost(redactor: Redactor, texts: list[str], rounds: int) -> float:
    """µs per KB of text."""
    redactor.text(texts[0])
    start = time.perf_counter()
    for _ in range(rounds):
        for text in texts:
            redactor.text(text)
    elapsed = time.perf_counter() - start
    return elapsed * 1e6 / (rounds * sum(len(t.encode()) for t in texts) / 1024)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    rng = random.Random(7)
    started = time.perf_counter()
    warm_up(KINDS)
    loaded = time.perf_counter() - started
    print(f"loading the detectors (imports, spaCy with Presidio): {loaded:.1f} s")
    clean = [prose(rng, 1024) for _ in range(50)]
    planted = [f"{t} {CASES[n % 21][0]}" for n, t in enumerate(clean)]  # one value per KB
    digits = [f"{t} {rng.randrange(10**9)} on 2024-05-{n % 28 + 1:02d}, ref 2026-{n:04d}-77"
              for n, t in enumerate(clean)]  # fmt: skip
    print("cost, µs per KB of text (1 KB strings)")
    print(f"{'kinds':12s} {'clean':>9s} {'planted':>9s} {'digits':>9s}")
    for kinds in [*[(k,) for k in KINDS], KINDS]:
        redactor = Redactor(kinds)
        name = "all" if kinds == KINDS else kinds[0]
        row = [cost(redactor, texts, args.rounds) for texts in (clean, planted, digits)]
        print(f"{name:12s} " + " ".join(f"{v:9.1f}" for v in row))
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
