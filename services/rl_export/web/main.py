"""``rl-export web``: the web service's process (uvicorn serving the FastAPI app)."""

from __future__ import annotations

import logging
import re

import uvicorn

from rl_export.runtime.settings import Settings
from rl_export.web.app import create_app
from rl_export.web.services import build_services

_LEVELS = {"crit": "critical", "error": "error", "warn": "warning", "info": "info",
           "debug": "debug"}  # fmt: skip


_TOKEN = re.compile(r"rlx_([0-9a-f]{12})_[A-Za-z0-9_\-]{8,}")


class HideTokens(logging.Filter):
    """Mask anything shaped like a token in a log line's arguments (``rlx_<id>_***``): the
    access log shows paths and query strings, and a client may put a token in one."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                _TOKEN.sub(r"rlx_\1_***", a) if isinstance(a, str) else a for a in record.args
            )
        if isinstance(record.msg, str):
            record.msg = _TOKEN.sub(r"rlx_\1_***", record.msg)
        return True


def run_web(settings: Settings) -> int:
    """Serve the API and the page until SIGINT or SIGTERM; return the exit code.

    Raise :class:`KafkaSecurityError` when the broker refused our TLS handshake or login.
    """
    logging.basicConfig(
        level=_LEVELS[settings.log_level].upper(),
        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s",
        force=True,
    )
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    logging.getLogger("uvicorn.access").addFilter(HideTokens())
    services = build_services(settings)
    app = create_app(services)
    config = uvicorn.Config(
        app,
        host=settings.web_host,
        port=settings.web_port,
        log_level=_LEVELS[settings.log_level],
        # Access lines name paths and query strings, never headers: tokens stay out of logs.
        access_log=settings.log_level in ("info", "debug"),
        timeout_graceful_shutdown=10,
        server_header=False,
        # uvicorn believes X-Forwarded-For from any loopback peer by default: a header is
        # not an address. Only RL_EXPORT_WEB_TRUSTED_PROXIES's peers are believed, by the
        # app itself (rl_export.web.proxies).
        proxy_headers=False,
        forwarded_allow_ips="",
    )
    print(
        f"rl-export web: http://{settings.web_host}:{settings.web_port}  (metrics "
        f"http://{settings.web_host}:{settings.web_metrics_port}/metrics, store "
        f"{settings.store_url}, index {settings.index_dir})",
        flush=True,
    )
    server = uvicorn.Server(config)
    services.on_fatal = lambda: setattr(server, "should_exit", True)
    server.run()
    if services.fatal is not None:  # the command line reports it in one line
        raise services.fatal
    return 0 if server.started else 1
