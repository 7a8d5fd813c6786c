"""The web service's Prometheus metrics, on a port of their own (docs/concepts/web-service.md).

Metrics name routes, corpora and counts an outsider has no business reading, and a scrape is
work: so ``/metrics`` is not on the public port but on ``RL_EXPORT_WEB_METRICS_PORT``, which
a deployment opens to its monitoring only (the Kubernetes NetworkPolicy does). A small aiohttp
site on the API's event loop: nothing else is served there.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST


async def serve_metrics(host: str, port: int, text: Callable[[], bytes]) -> web.AppRunner:
    """Serve ``GET /metrics`` (``text()``) on ``host:port`` until the runner is cleaned up."""

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=text(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
