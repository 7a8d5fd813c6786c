"""The page shell, its static files, and the health and metrics pages.

``/{org}/{project}/rl-export`` is server-rendered HTML (Jinja2, autoescaped) that holds no
data and needs no token: the page's script asks for a token once, keeps it in the browser
(localStorage) and calls ``/api/v1``. The script and the style sheet ship in the package
(``web/static``); nothing comes from a CDN and nothing is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from rl_export import __version__
from rl_export.export.columns import METADATA_COLUMNS, RECORD_FIELDS
from rl_export.formats.specs import SAFE_NAME
from rl_export.model.records import EvaluationView
from rl_export.model.rubrics import V0_NAMES
from rl_export.privacy.kinds import parse_kinds
from rl_export.privacy.redact import KINDS
from rl_export.web.services import Services

HERE = Path(__file__).parent

# What the columns dialog offers: the record's fields, and the keys of its fixed objects (the
# keys of evaluator_scores are the evaluators', read from the records themselves).
COLUMNS = {
    "fields": list(RECORD_FIELDS),
    "metadata_columns": list(METADATA_COLUMNS),
    "nested": {
        "rubric": list(V0_NAMES),
        "evaluation": list(EvaluationView.model_fields),
        "evaluation.report": ["outcomes", "classifications"],
    },
}
templates = Jinja2Templates(directory=str(HERE / "templates"))
router = APIRouter(include_in_schema=False)


def static_files() -> StaticFiles:
    return StaticFiles(directory=str(HERE / "static"))


def _services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


Svc = Annotated[Services, Depends(_services)]


@router.get("/{org}/{project}/rl-export", response_class=HTMLResponse)
async def rl_export_page(request: Request, org: str, project: str, svc: Svc) -> Response:
    if not (SAFE_NAME.match(org) and SAFE_NAME.match(project)):
        return HTMLResponse("<h1>Not found</h1>", status_code=404)
    config = {
        "org": org,
        "project": project,
        "pass_threshold": svc.settings.human_pass_threshold,
        "sync_export_max_records": svc.settings.web_sync_export_max_records,
        "redact_kinds": list(KINDS),
        "redact": list(parse_kinds(svc.settings.redact)),  # what the Redact control starts at
        **COLUMNS,
    }
    return templates.TemplateResponse(
        request,
        "rl_export.html",
        {"org": org, "project": project, "version": __version__, "config": config},
    )


@router.get("/healthz")
async def healthz() -> JSONResponse:
    return JSONResponse({"status": "ok"})


@router.get("/readyz")
async def readyz(svc: Svc) -> JSONResponse:
    """Ready when the object store answered lately (checked in the background, not per
    probe: :mod:`rl_export.web.storehealth`, which logs why a check failed) and the corpora of
    RL_EXPORT_WEB_WARM are indexed (the broker only matters to labels: a 503 there, and not
    ready when its ACLs refuse writing labels). The answer names no internal error."""
    if svc.store_health.problem() is not None:
        return JSONResponse({"ready": False, "store": "unavailable"}, status_code=503)
    if svc.labels_refused() is not None:  # the ACLs refuse writing labels: logged, named
        return JSONResponse({"ready": False, "labels": "not allowed"}, status_code=503)
    cold = svc.cold()
    if cold:
        return JSONResponse({"ready": False, "indexing": cold}, status_code=503)
    return JSONResponse({"ready": True})
