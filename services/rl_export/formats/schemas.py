"""Generate the JSON Schema files in ``schemas/`` from the pydantic models.

``python -m rl_export.formats.schemas [DIR]`` (or ``make schemas``) rewrites them; the test suite
fails when the checked-in files differ from what the models produce.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from rl_export.formats.rowmodels import ROW_MODELS
from rl_export.model.events import EVENT_ADAPTER, EVENT_MODELS
from rl_export.model.pairs import PairRecord
from rl_export.model.records import Tombstone, TrajectoryRecord

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _with_header(schema: dict[str, Any], name: str, title: str) -> dict[str, Any]:
    return {"$schema": SCHEMA_DIALECT, "$id": f"{name}.schema.json", "title": title, **schema}


def build_schemas() -> dict[str, dict[str, Any]]:
    """Return every schema, keyed by file name stem."""
    out: dict[str, dict[str, Any]] = {}
    for event_type, event_model in EVENT_MODELS.items():
        name = f"event.{event_type}"
        schema = event_model.model_json_schema(mode="validation")
        out[name] = _with_header(schema, name, event_type)
    out["event"] = _with_header(
        EVENT_ADAPTER.json_schema(mode="validation"), "event", "Any input event"
    )
    outputs: dict[str, type[BaseModel]] = {
        "record.trajectory": TrajectoryRecord,
        "record.tombstone": Tombstone,
        "record.pair": PairRecord,  # the comparisons corpus's records
    }
    for name, model in outputs.items():
        out[name] = _with_header(model.model_json_schema(mode="serialization"), name, name)
    # One schema per export format: the trajectory format is the record itself.
    formats: dict[str, type[BaseModel]] = {"trajectory": TrajectoryRecord, **ROW_MODELS}
    for fmt, model in formats.items():
        name = f"format.{fmt}"
        out[name] = _with_header(model.model_json_schema(mode="serialization"), name, name)
    return out


def render(schema: dict[str, Any]) -> str:
    """Render a schema the way it is checked in (stable key order, trailing newline)."""
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write_schemas(directory: Path) -> list[Path]:
    """Write every schema into ``directory``; return the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in build_schemas().items():
        path = directory / f"{name}.schema.json"
        path.write_text(render(schema), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":  # pragma: no cover - a thin command
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("schemas")
    for p in write_schemas(target):
        print(p)
