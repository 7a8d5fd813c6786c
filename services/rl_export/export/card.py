"""Dataset cards: the ``README.md`` that goes with an export, in Hugging Face's form (pure).

A Hugging Face dataset card is Markdown with a YAML header. Ours says what the file holds
and how it was made, so a dataset pushed to the Hub (or kept beside a training run) carries
its own provenance::

    ---
    pretty_name: acme/bot evaluator corpus, messages
    tags: [rl-export]
    configs: [{config_name: default, data_files: [{split: train, path: <the file>}]}]
    dataset_info: {features: [...] (Parquet files: their exact Arrow types),
                   splits: [{name: train, num_examples: <records>}]}
    rl_export: {format, file, records, counts, corpus, source, reward_source, filters,
                masks, chat_style, chat_template, features, rules_versions,
                schema_version, row_schema, redaction}
    ---

``features`` (under ``rl_export``) names every column with its JSON type, from the format's
row schema (``schemas/format.<format>.schema.json``); Parquet files also get Hugging Face's
own ``dataset_info.features``, from the file's Arrow schema, so ``datasets`` and the Hub read
them as the loader would. ``rules_versions`` are the join rules versions of the records
exported; ``schema_version`` the corpus layout's. ``redaction`` is what the export redacted:
``{kinds, replaced: {kind: substrings replaced}}`` (``kinds`` empty with ``--redact none``).
``chat_style`` is ``{style, system}`` for the chat formats (null for the others);
``chat_template`` the template the rows were made for (``--chat-template``: its name, origin
and sha256, how it is read, the adaptations every row got and the rows left out by reason;
null without one); ``masks``
the turn masks with how many failing outcomes named a turn outside their conversation, and
``counts`` how the rows came to be: latest records read, matching the filters, without a row
in the format. The card holds no clock time: the same export of the same corpus gives the
same card, byte for byte.

The header is written as YAML flow style that is also JSON (each value one JSON text), so
no YAML library is needed to write it and any YAML parser reads it, and so
:func:`card_describes` reads back which data file a card of ours describes (an export
writes over a ``README.md`` only when it is the card of the same output:
:mod:`rl_export.export.targets`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import BaseModel

from rl_export.corpora.layout import SCHEMA_VERSION, CorpusRef
from rl_export.export.columns import Column
from rl_export.export.dedup import Dedup
from rl_export.export.scan import ExportSummary
from rl_export.export.splits import Split
from rl_export.export.tabular import arrow_type, parquet_schema, rl_prompts_schema
from rl_export.formats.chat import Chat
from rl_export.formats.filters import Filters
from rl_export.formats.render import TABULAR_FORMATS
from rl_export.formats.rowmodels import ROW_MODELS
from rl_export.formats.turns import TurnMask
from rl_export.model.codec import dumps
from rl_export.model.records import TrajectoryRecord

if TYPE_CHECKING:
    import pyarrow as pa

CARD_NAME = "README.md"
REWARD_SOURCES = {"human": "human", "evaluator": "evaluator", "traces": None}


@dataclass
class CardFacts:
    """What a card says of one export file."""

    ref: CorpusRef
    format: str  # the export's format (``zip`` for an archive)
    file_name: str  # the data file, as the card's ``configs`` point at it
    file: str  # jsonl, parquet, csv or json: how the data file is encoded
    records: int
    filters: Filters
    mask: TurnMask | None = None
    rules_versions: Sequence[int] = ()
    columns: Sequence[Column] | None = None  # tabular formats
    arrow_schema: pa.Schema | None = None  # Parquet files
    redaction: Sequence[str] = ()  # the kinds redacted (none: --redact none)
    redactions: dict[str, int] = field(default_factory=dict)  # substrings replaced per kind
    chat: Chat | None = None  # the chat style of a chat format
    scanned: int = 0  # latest records read
    matched: int = 0  # of them, matching the filters
    skipped: int = 0  # of those, without a row in the format
    turns_outside: int = 0  # with masks: failing outcomes outside their conversation
    template: dict[str, Any] | None = None  # --chat-template: which, read how
    adaptations: Sequence[str] = ()  # what every row got for it
    unrenderable: dict[str, int] = field(default_factory=dict)  # rows left out, by reason
    extra: dict[str, Any] = field(default_factory=dict)


def _type_of(schema: dict[str, Any]) -> str:
    """A short JSON type of a JSON Schema property: ``number | null``, ``array of object``."""
    if "anyOf" in schema:
        return " | ".join(_type_of(s) for s in schema["anyOf"])
    if "const" in schema:
        return dumps(schema["const"]).decode()
    if "enum" in schema:
        return " | ".join(dumps(v).decode() for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        return f"array of {_type_of(schema.get('items', {}))}"
    if isinstance(kind, str):
        return kind
    if "$ref" in schema:
        return "object"
    return "any"


def _model_features(model: type[BaseModel]) -> list[dict[str, str]]:
    properties = model.model_json_schema(mode="serialization")["properties"]
    return [{"name": name, "type": _type_of(prop)} for name, prop in properties.items()]


_ARROW_NAMES = {"string": "string", "int64": "integer", "double": "number", "bool": "boolean"}


def features_of(fmt: str, columns: Sequence[Column] | None = None) -> list[dict[str, str]]:
    """Every column of a format's rows with its JSON type (tabular: the columns chosen)."""
    if fmt in TABULAR_FORMATS:
        if columns is None:
            raise ValueError(f"{fmt} rows are made of columns: give them")
        return [
            {"name": c.header, "type": _ARROW_NAMES.get(str(arrow_type(c)), "string")}
            for c in columns
        ]
    model = TrajectoryRecord if fmt == "trajectory" else ROW_MODELS[fmt]
    return _model_features(model)


def hf_features(schema: pa.Schema) -> list[dict[str, Any]]:
    """Hugging Face's YAML form of an Arrow schema (``dataset_info.features``)."""
    return [_hf_field(f.name, f.type) for f in schema]


def _hf_field(name: str, kind: pa.DataType) -> dict[str, Any]:
    import pyarrow as pa

    if pa.types.is_struct(kind):
        return {"name": name, "struct": [_hf_field(f.name, f.type) for f in kind]}
    if pa.types.is_list(kind):
        inner = kind.value_type
        if pa.types.is_struct(inner):
            return {"name": name, "list": [_hf_field(f.name, f.type) for f in inner]}
        return {"name": name, "list": {"dtype": _hf_dtype(inner)}}
    return {"name": name, "dtype": _hf_dtype(kind)}


def _hf_dtype(kind: pa.DataType) -> str:
    names = {"double": "float64", "float": "float32", "int64": "int64", "int32": "int32",
             "bool": "bool", "string": "string", "large_string": "large_string"}  # fmt: skip
    text = str(kind)
    if text not in names:
        raise ValueError(f"no Hugging Face dtype for Arrow type {text}")
    return names[text]


def card_header(facts: CardFacts) -> dict[str, Any]:
    """The card's YAML header, as a dict (see the module)."""
    fmt = facts.format
    row_format = fmt if fmt not in TABULAR_FORMATS else None
    # An export of one --split is that split for Hugging Face too (else all of it: train).
    split = facts.extra.get("split")
    name = split["name"] if isinstance(split, dict) else "train"
    info: dict[str, Any] = {"splits": [{"name": name, "num_examples": facts.records}]}
    if facts.arrow_schema is not None:
        info = {"features": hf_features(facts.arrow_schema), **info}
    mask = None
    if facts.mask is not None:
        types = sorted(facts.mask.types) if facts.mask.types is not None else None
        mask = {"mask_failed_turns": True, "mask_types": types,
                "turns_outside": facts.turns_outside}  # fmt: skip
    chat = None
    if facts.chat is not None:
        chat = {"style": facts.chat.style, "system": facts.chat.system}
    template = None
    if facts.template is not None:
        template = {**facts.template, "adaptations": list(facts.adaptations),
                    "left_out": dict(facts.unrenderable)}  # fmt: skip
    features = [f for f in features_of(fmt, facts.columns)
                if f["name"] != "tools" or facts.template is not None]  # fmt: skip
    return {
        "pretty_name": f"{facts.ref.org}/{facts.ref.project} {facts.ref.corpus} corpus, {fmt}",
        "tags": ["rl-export"],
        "configs": [
            {
                "config_name": "default",
                "data_files": [{"split": name, "path": facts.file_name}],
            }
        ],
        "dataset_info": info,
        "rl_export": {
            "format": fmt,
            "file": facts.file,
            "records": facts.records,
            "counts": {
                "scanned": facts.scanned,
                "matched": facts.matched,
                "skipped": facts.skipped,
            },
            "corpus": facts.ref.root,
            "source": facts.ref.corpus,
            "reward_source": REWARD_SOURCES.get(facts.ref.corpus),
            "filters": facts.filters.to_params(sep="-"),
            "masks": mask,
            "chat_style": chat,
            "chat_template": template,
            "features": features,
            "rules_versions": sorted(facts.rules_versions),
            "schema_version": SCHEMA_VERSION,
            "row_schema": f"format.{row_format}.schema.json" if row_format else None,
            "redaction": {
                "kinds": list(facts.redaction),
                "replaced": {k: facts.redactions.get(k, 0) for k in facts.redaction},
            },
            **facts.extra,
        },
    }


def _yaml(header: dict[str, Any]) -> str:
    """Top-level keys in block style, each value one JSON text (valid YAML flow style)."""
    return "".join(f"{key}: {dumps(value).decode()}\n" for key, value in header.items())


def card_describes(text: str) -> str | None:
    """The data file a card written by :func:`dataset_card` describes (its ``configs``'
    path); None when ``text`` is not such a card (no header, no ``rl_export`` in it)."""
    lines = text.split("\n")
    if not lines or lines[0] != "---" or "---" not in lines[1:]:
        return None
    header: dict[str, Any] = {}
    for line in lines[1 : lines.index("---", 1)]:
        key, sep, value = line.partition(": ")
        try:
            header[key] = orjson.loads(value) if sep else None
        except orjson.JSONDecodeError:
            return None
    try:
        path = header["configs"][0]["data_files"][0]["path"]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(header.get("rl_export"), dict) or not isinstance(path, str):
        return None
    return path


def _redaction_line(facts: CardFacts) -> str:
    """What the card says of redaction: the kinds and how many substrings each replaced."""
    if not facts.redaction:
        return ("- Redaction: none (`--redact none`). Traces are untrusted and may hold "
                "secrets and personal data.")  # fmt: skip
    counts = ", ".join(f"{k} {facts.redactions.get(k, 0)}" for k in facts.redaction)
    return (f"- Redaction: {', '.join(facts.redaction)} replaced with `[REDACTED:KIND]` "
            f"(substrings replaced: {counts}). Other personal data may remain: traces are "
            f"untrusted.")  # fmt: skip


def _template_line(facts: CardFacts) -> str:
    """What the card says of the chat template the rows were made for."""
    template = facts.template or {}
    reader = "as verl reads this Parquet file" if template.get("reading") == "verl_parquet" \
        else "as TRL renders it"  # fmt: skip
    adapted = "; ".join(facts.adaptations) or "none: the rows keep the hf chat style's shape"
    left = sum(facts.unrenderable.values())
    why = ", ".join(f"{reason} ({n})" for reason, n in facts.unrenderable.items())
    return (
        f"- Chat template: `{template.get('given')}` ({template.get('origin')}, sha256 "
        f"`{template.get('sha256')}`): every row renders with it {reader}, with every "
        f"message's text in the output. Adaptations: {adapted}. "
        + (f"{left} rows left out: {why}." if left else "No row left out.")
    )


def dataset_card(facts: CardFacts) -> str:
    """The whole ``README.md``: the YAML header, then a few lines for people."""
    header = card_header(facts)
    meta = header["rl_export"]
    filters = ", ".join(f"{k}={v}" for k, v in meta["filters"].items()) or "none"
    lines = [
        "---",
        _yaml(header).rstrip("\n"),
        "---",
        "",
        f"# {header['pretty_name']}",
        "",
        f"{facts.records} rows in `{facts.file_name}` ({facts.file}), format `{facts.format}`, "
        f"exported by rl-export from the `{facts.ref.corpus}` corpus of "
        f"`{facts.ref.org}/{facts.ref.project}` (the latest revision of each trace; deleted "
        f"traces left out).",
        "",
        f"- Filters: {filters}.",
        f"- Rows: {facts.matched} of the {facts.scanned} latest records matched the filters"
        + (f"; {facts.skipped} of them have no `{facts.format}` row" if facts.skipped else "")
        + ".",
        f"- Reward source: {meta['reward_source'] or 'none (the traces corpus: unscored)'}.",
    ]
    if facts.chat is not None:
        merged = "; system messages folded into the first user message" if (
            facts.chat.system == "merge") else ""  # fmt: skip
        lines.append(f"- Chat style: `{facts.chat.style}`{merged}.")
    if facts.template is not None:
        lines.append(_template_line(facts))
    if facts.mask is not None:
        types = ", ".join(sorted(facts.mask.types)) if facts.mask.types else "any type"
        lines.append(
            f"- Turn masks: every assistant message has a `weight`, 0 when its turn has an "
            f"outcome with `decision: false` ({types}), else 1; {facts.turns_outside} failing "
            f"outcomes named a turn outside their conversation and masked nothing."
        )
    split = meta.get("split")
    if isinstance(split, dict):
        shares = ", ".join(f"{k}={v}" for k, v in split["splits"].items())
        lines.append(
            f"- Split: `{split['name']}` of {shares}, by a stable hash of (salt, "
            f"`{split['by']}`): a trace never changes split as the corpus grows; "
            f"{split['left_out']} matching rows of other splits left out."
        )
    dedup = meta.get("dedup")
    if isinstance(dedup, dict):
        how = "identical normalised text"
        if dedup["mode"] == "near":
            how = f"MinHash-estimated Jaccard of word 5-shingles >= {dedup['threshold']}"
        lines.append(
            f"- Deduplication: `{dedup['mode']}` on the {dedup['on']} ({how}), the best reward "
            f"kept per group; {dedup['removed']} rows removed."
        )
    if meta["row_schema"]:
        lines.append(f"- Row schema: `schemas/{meta['row_schema']}` in rl-export.")
    lines += [
        f"- Join rules version(s): {', '.join(map(str, meta['rules_versions'])) or 'none'}; "
        f"corpus layout version {SCHEMA_VERSION}.",
        _redaction_line(facts),
        "",
        "| column | type |",
        "| --- | --- |",
        *(f"| `{f['name']}` | {f['type']} |" for f in meta["features"]),
        "",
    ]
    return "\n".join(lines)


def card_facts(
    ref: CorpusRef,
    fmt: str,
    name: str,
    file: str,
    *,
    filters: Filters,
    summary: ExportSummary,
    mask: TurnMask | None = None,
    columns: Sequence[Column] | None = None,
    redaction: Sequence[str] = (),
    chat: Chat | None = None,
    split: Split | None = None,
    dedup: Dedup | None = None,
) -> CardFacts:
    """What the dataset card of an export says (:mod:`rl_export.export.card`): ``redaction``
    the kinds redacted (the summary counts what was replaced), ``chat`` a chat format's
    style."""
    extra: dict[str, Any] = {}
    if split is not None:
        extra["split"] = {**split.as_dict(), "left_out": summary.split_left_out}
    if dedup is not None:
        extra["dedup"] = {**dedup.as_dict(), "removed": summary.duplicates_removed}
    schema = None
    if file == "parquet":
        schema = rl_prompts_schema() if fmt == "rl_prompts" else parquet_schema(columns or [])
    return CardFacts(
        ref=ref, format=fmt, file_name=name, file=file, records=summary.records,
        filters=filters, mask=mask,
        rules_versions=sorted(summary.rules_versions), columns=columns, arrow_schema=schema,
        redaction=tuple(redaction), redactions=dict(summary.redactions), chat=chat,
        scanned=summary.scanned, matched=summary.matched, skipped=summary.skipped,
        turns_outside=summary.turns_outside, template=summary.template,
        adaptations=tuple(summary.adaptations), unrenderable=dict(summary.unrenderable),
        extra=extra,
    )  # fmt: skip
