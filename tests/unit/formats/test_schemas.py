"""The checked-in JSON Schemas match the models, and they accept what the models accept."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest

from rl_export.formats.schemas import build_schemas, render
from rl_export.local.synthetic import generate
from rl_export.model.events import EVENT_MODELS
from tests.factories import event

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"


def test_checked_in_schemas_match_the_models() -> None:
    built = build_schemas()
    on_disk = {p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json")}
    assert on_disk == set(built), "schemas/ has extra or missing files: run `make schemas`"
    for name, schema in built.items():
        text = (SCHEMAS / f"{name}.schema.json").read_text(encoding="utf-8")
        assert text == render(schema), f"schemas/{name}.schema.json drifted: run `make schemas`"


@pytest.mark.parametrize("event_type", sorted(EVENT_MODELS))
def test_schema_accepts_valid_events(event_type: str) -> None:
    schema = build_schemas()["event"]
    jsonschema.validate(event(event_type), schema)
    jsonschema.validate(event(event_type), build_schemas()[f"event.{event_type}"])


def test_schema_accepts_synthetic_traffic() -> None:
    schema = build_schemas()["event"]
    for value in generate(20, seed=3):
        jsonschema.validate(value, schema)


def test_schema_rejects_a_rubric_of_six() -> None:
    value = event("label.submitted")
    value["rubric"]["correctness"] = 6
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(value, build_schemas()["event.label.submitted"])


def test_every_format_row_validates_against_its_schema() -> None:
    from rl_export.formats.render import JSONL_FORMATS, preference_pairs, render_row
    from rl_export.model.codec import dumps, loads
    from tests.records import conversation, record

    schemas = build_schemas()
    records = [record("a", reward=0.9), record("b", reward=0.2, passed=False, labels=1,
                                             messages=conversation(3))]  # fmt: skip
    for fmt in JSONL_FORMATS:
        schema = schemas[f"format.{fmt}"]
        if fmt == "preference":
            rows = list(preference_pairs(records))
        else:
            rows = [render_row(fmt, r) for r in records]
        assert rows, fmt
        assert all(r is not None for r in rows), fmt
        for row in rows:
            jsonschema.validate(loads(dumps(row)), schema)
    bad = loads(dumps(render_row("kto", records[0])))
    bad["label"] = "yes"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schemas["format.kto"])
