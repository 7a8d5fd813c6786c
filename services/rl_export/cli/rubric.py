"""``rl-export rubric get|set FILE``: a project's rubric as JSON (docs/guides/rubrics.md).

``get`` prints the newest version (or ``--version N``) as one JSON object, the form ``set``
takes: ``{version, guidelines, questions, created_by, created_at}``. ``set FILE`` (``-`` for
stdin) makes the next version from the file's ``guidelines`` and ``questions`` (a version
number or creation fields in it are ignored), unless it equals the newest; it prints the
version. A file that is not a rubric is one line naming what is wrong, exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from pathlib import Path

import orjson
from pydantic import ValidationError

from rl_export.cli.flags import _open, _settings
from rl_export.model.errors import ConfigError
from rl_export.model.rubrics import RubricSpec


def _read_spec(path: str) -> RubricSpec:
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError("FILE", f"cannot read {path}: {exc.strerror}") from None
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ConfigError("FILE", f"{path} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError("FILE", f"{path} holds no JSON object")
    content = {k: value[k] for k in ("guidelines", "questions") if k in value}
    try:
        return RubricSpec.model_validate(content)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "rubric"
        message = str(first["msg"]).removeprefix("Value error, ")
        raise ConfigError("FILE", f"{where}: {message}") from None


def cmd_rubric(args: argparse.Namespace) -> int:
    from rl_export.corpora.rubrics import RubricVersions  # the command's own: on use

    settings = _settings(args, store_url="store")
    if args.action == "set" and args.file is None:
        raise ConfigError("FILE", "rubric set needs the rubric's JSON file ('-': stdin)")
    spec = _read_spec(args.file) if args.action == "set" else None

    async def run() -> bytes:
        store = _open(args.store, settings)
        versions = RubricVersions(store, latest_cache_s=0)
        try:
            if spec is None:
                version = args.version
                if version is None:
                    version = await versions.latest_version(args.org, args.project)
                found = await versions.get(args.org, args.project, version)
                if found is None:
                    raise ConfigError("--version", f"{args.org}/{args.project} has no rubric "
                                      f"version {version}")  # fmt: skip
                return orjson.dumps(found.to_json(), option=orjson.OPT_INDENT_2)
            made, created = await versions.create(
                args.org, args.project, spec, by=args.by, now=datetime.now(UTC)
            )
            what = "made" if created else "unchanged: equal to"
            return f"{args.org}/{args.project}: rubric version {made.version} {what}".encode()
        finally:
            await store.close()

    sys.stdout.buffer.write(asyncio.run(run()) + b"\n")
    sys.stdout.flush()
    return 0
