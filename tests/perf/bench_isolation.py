"""``make bench-isolation``: the API's latency while every export slot is held (DESIGN.md
section 10), and the web process's memory meanwhile.

1. A local broker and a local store; ``replay`` writes the ``traces`` and ``evaluator``
   corpora of ``--traces`` scored traces.
2. The web service in this process (:mod:`tests.harness.slowweb`), its exports reading from a
   source held shut, so an export holds its slot until its client leaves.
3. p50/p99 of ``GET stats``, ``GET queue``, ``POST queue/claim`` (each claim released) and
   ``GET /readyz``, from a client in another process (no shared GIL), first with no export,
   then with every thread of the export pool held (``RL_EXPORT_WEB_EXPORT_THREADS``, filled
   by subjects at their share each) and one more subject's export waiting; RSS of the web
   process at each step.

Results are printed and written as JSON to ``var/bench/isolation-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import socket
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rl_export.corpora.replay import replay
from rl_export.corpora.store import LocalStore
from rl_export.formats.specs import CorpusSpec
from rl_export.local.broker import LocalKafka
from rl_export.local.synthetic import scored_event_lines
from rl_export.runtime.net import free_port
from rl_export.runtime.settings import load_settings
from rl_export.web.tokens import Scope, TokenStore
from tests.harness.slowweb import Gate, InProcessWeb

ORG, PROJECT = "acme", "support-bot"
GOAL_P99_MS = 100.0
ROUTES = ("stats", "queue", "claim", "readyz")


def log(message: str) -> None:
    print(f"[bench-isolation {time.strftime('%H:%M:%S')}] {message}", flush=True)


def rss_mib() -> tuple[float, float]:
    """This process's resident and peak resident memory (MiB)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return (int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(port: int, token: str, rounds: int) -> dict[str, list[float]]:
    """In a child process: each route ``rounds`` times, in turn; latencies in ms."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    api = f"/api/v1/{ORG}/{PROJECT}/"
    out: dict[str, list[float]] = {route: [] for route in ROUTES}

    def call(method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        conn.request(method, path, body=body, headers=auth)
        response = conn.getresponse()
        return response.status, response.read()

    for _ in range(rounds):
        for route in ROUTES:
            began = time.perf_counter()
            if route == "stats":
                status, _ = call("GET", api + "stats?source=evaluator")
            elif route == "queue":
                status, _ = call("GET", api + "queue?limit=10")
            elif route == "readyz":
                status, _ = call("GET", "/readyz")
            else:
                status, body = call("POST", api + "queue/claim", b'{"limit": 1}')
            out[route].append((time.perf_counter() - began) * 1000)
            if status != 200:
                raise RuntimeError(f"{route} answered {status}")
            if route == "claim":
                for claim in json.loads(body)["claims"]:
                    status, _ = call("DELETE", api + f"queue/claims/{claim['trace_id']}")
                    if status != 204:
                        raise RuntimeError(f"releasing a claim answered {status}")
    conn.close()
    return out


def summary(latencies: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {
        route: {"n": len(s), "p50_ms": round(percentile(s, 0.5), 2),
                "p99_ms": round(percentile(s, 0.99), 2), "max_ms": round(max(s), 2)}
        for route, s in latencies.items()
    }  # fmt: skip


def hold(port: int, token: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        f"GET /api/v1/{ORG}/{PROJECT}/export?source=evaluator&format=trajectory HTTP/1.1\r\n"
        f"Host: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    )
    return sock


async def tokens(store: LocalStore, subjects: list[str]) -> dict[str, str]:
    book = TokenStore(store)
    out = {}
    for subject in subjects:
        scopes: tuple[Scope, ...] = ("admin",)
        _, out[subject] = await book.create(ORG, PROJECT, subject, scopes, datetime.now(UTC))
    return out


def wait(what: str, check: Any, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def run(traces: int, rounds: int, out_dir: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rl-export-bench-isolation-") as folder:
        data = Path(folder)
        broker = LocalKafka(data / "kafka", free_port()).start()
        try:
            settings = load_settings(
                kafka_bootstrap=broker.bootstrap, store_url=str(data / "store"), data_dir=data,
                corpora=(CorpusSpec(name="traces", source=None),
                         CorpusSpec(name="evaluator", source="evaluator")),
            )  # fmt: skip
            store = LocalStore(data / "store")
            log(f"replaying {traces:,} traces into the corpora")
            asyncio.run(replay(settings, store, scored_event_lines(0, traces, 7), run_id="b0"))
            threads, share = settings.web_export_threads, settings.web_exports_per_subject
            hogs = [f"hog-{n}" for n in range(-(-threads // share) + 1)]
            made = asyncio.run(tokens(store, ["bench", *hogs]))
            gate = Gate()
            web = InProcessWeb(settings, gate).start()
            result: dict[str, Any] = {"traces": traces, "rounds": rounds,
                                      "export_threads": threads, "per_subject": share}  # fmt: skip
            try:
                pool = web.services.exports
                live = traces - traces // 100
                wait("the index", lambda: _records(web.port, made["bench"]) == live, 300)
                with ProcessPoolExecutor(1) as client:
                    client.submit(measure, web.port, made["bench"], 5).result()  # warm up
                    result["rss_mib_idle"] = round(rss_mib()[0], 1)
                    log("latency with no export running")
                    result["idle"] = summary(
                        client.submit(measure, web.port, made["bench"], rounds).result()
                    )
                    held = [hold(web.port, made[hogs[n // share]]) for n in range(threads)]
                    held.append(hold(web.port, made[hogs[-1]]))  # waits for a thread
                    wait("every export thread held", lambda: gate.waiting >= threads)
                    result["exports_held"] = pool.running()
                    log(f"latency with {threads} exports held at the source and 1 waiting")
                    result["held"] = summary(
                        client.submit(measure, web.port, made["bench"], rounds).result()
                    )
                    result["rss_mib_held"] = round(rss_mib()[0], 1)
                    for sock in held:
                        sock.close()
                    wait("every slot freed", lambda: pool.running() == 0, 30)
                    result["exports_after_disconnect"] = pool.running()
                result["rss_mib_peak"] = round(rss_mib()[1], 1)
            finally:
                gate.open()
                web.stop()
        finally:
            broker.stop()
    result["goal_p99_ms"] = GOAL_P99_MS
    result["met"] = all(v["p99_ms"] < GOAL_P99_MS for v in result["held"].values())
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"isolation-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    log(f"written to {path}")
    return result


def _records(port: int, token: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", f"/api/v1/{ORG}/{PROJECT}/stats?source=evaluator",
                 headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return int(json.loads(body).get("records", 0)) if response.status == 200 else -1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path("var/bench"))
    args = parser.parse_args()
    result = run(args.traces, args.rounds, args.out)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
