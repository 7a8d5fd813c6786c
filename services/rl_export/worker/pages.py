"""The health and metrics pages of a worker or a join process: healthz, readyz, metrics."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web


async def serve_pages(
    host: str,
    port: int,
    ready: Callable[[], Awaitable[bool]],
    metrics_text: Callable[[], Awaitable[bytes]],
) -> web.AppRunner:
    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        is_ready = await ready()
        return web.json_response({"ready": is_ready}, status=200 if is_ready else 503)

    async def metrics_page(request: web.Request) -> web.Response:
        return web.Response(body=await metrics_text(), content_type="text/plain")

    app = web.Application()
    app.add_routes(
        [
            web.get("/healthz", healthz),
            web.get("/readyz", readyz),
            web.get("/metrics", metrics_page),
        ]
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
