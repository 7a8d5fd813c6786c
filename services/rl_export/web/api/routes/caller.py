"""``GET whoami`` (any scope): who the token is, for the page's header and for scripts that
check a token before using it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from rl_export.web.api.deps import OrgPath, ProjectPath, caller
from rl_export.web.models import WhoamiOut
from rl_export.web.tokens import Caller

router = APIRouter(prefix="/api/v1/{org}/{project}", tags=["caller"])


@router.get("/whoami", summary="Who the token is: its subject, org/project and scopes (any scope)")
async def get_whoami(
    *, org: OrgPath, project: ProjectPath, who: Annotated[Caller, Depends(caller)]
) -> WhoamiOut:
    return WhoamiOut(subject=who.subject, org=who.org, project=who.project, scopes=list(who.scopes))
