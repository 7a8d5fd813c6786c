"""Lineage: the ``<file>.manifest.json`` beside an export (docs/guides/exports.md; pure).

Every export to a file, and every export job, says exactly what it is: the file it describes
(``output``, its name), the position
of the corpus it read (the compaction generation and every chain's end:
:class:`~rl_export.export.latest.ViewPosition`), every option that shaped its rows (format,
filters, split, dedup, masks, columns, pairing, chat style, chat template with the
adaptations it needed and the rows it left out, redaction and what it replaced), how many
rows it holds, the sha256 of its bytes and the rl-export version.
``rl-export export --from-manifest FILE -o OUT`` reads the same position with the same
options, so it writes the same bytes again for as long as the objects of that position
exist (compaction and shard retention may remove them; a pinned version keeps them).

The manifest holds no clock time and no store URL (the position is relative to the store
the export is read from).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from rl_export import __version__
from rl_export.export.dedup import Dedup, parse_dedup
from rl_export.export.latest import ViewPosition
from rl_export.export.splits import Split, parse_split
from rl_export.formats.filters import FilterError, parse_filters
from rl_export.formats.render import CHAT_FORMATS
from rl_export.model.errors import ExportError

MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_VERSION = 1


class Manifest(BaseModel):
    """What ``<file>.manifest.json`` holds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    manifest_version: int = MANIFEST_VERSION
    rl_export_version: str = __version__
    org: str
    project: str
    source: str
    format: str
    file: str = "jsonl"  # jsonl | parquet (rl_prompts)
    position: dict[str, Any]  # ViewPosition.to_json()
    filters: dict[str, str | list[str]] = {}
    columns: str | None = None
    pair_by: list[str] = []
    margin: float = 0.0
    max_pairs: int = 1
    zip_data: str = "csv"
    mask_failed_turns: bool = False
    mask_types: list[str] | None = None
    split: dict[str, Any] | None = None  # {name, splits: {name: share}, by, salt}
    dedup: dict[str, Any] | None = None  # {mode, on[, threshold]}
    chat_style: str | None = None  # the chat formats' style and system mode; else None
    system: str | None = None
    # --chat-template: {given, origin, name, sha256, on_unrenderable, reading}; what every
    # row got for it; the rows it left out, by reason.
    chat_template: dict[str, Any] | None = None
    adaptations: list[str] = []
    unrenderable: dict[str, int] = {}
    completion: str | None = None  # preference only
    redact: list[str] = []  # the kinds redacted ([]: none)
    redactions: dict[str, int] = {}
    duplicates_removed: int | None = None
    split_left_out: int | None = None
    rows: int
    bytes: int
    sha256: str
    # The name of the file it describes (None: a manifest written before it was kept).
    output: str | None = None

    def view_position(self) -> ViewPosition:
        return ViewPosition.from_json(self.position)

    def split_of(self) -> Split | None:
        if self.split is None:
            return None
        shares = ",".join(f"{k}={v!r}" for k, v in self.split["splits"].items())
        return parse_split(self.split["name"], shares, self.split["by"], self.split["salt"])

    def dedup_of(self) -> Dedup | None:
        if self.dedup is None:
            return None
        threshold = self.dedup.get("threshold")
        return parse_dedup(self.dedup["mode"], None if threshold is None else repr(threshold),
                           self.dedup["on"])  # fmt: skip


def manifest_path(output: Path) -> Path:
    """Where the manifest of ``output`` goes: beside it, ``<file>.manifest.json``."""
    return output.with_name(output.name + MANIFEST_SUFFIX)


def encode_manifest(manifest: Manifest) -> bytes:
    """The manifest's bytes: one JSON object, keys in a fixed order, a final newline."""
    return orjson.dumps(manifest.model_dump(mode="json"), option=orjson.OPT_INDENT_2) + b"\n"


def read_manifest(path: Path) -> Manifest:
    """A manifest file, checked; ExportError naming ``from-manifest`` for anything wrong."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ExportError("from-manifest", f"cannot read {path}: {exc.strerror}") from None
    try:
        manifest = Manifest.model_validate_json(data)
        manifest.view_position()
        manifest.split_of()
        manifest.dedup_of()
        parse_filters(manifest.filters)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the file"
        raise ExportError(
            "from-manifest", f"{path} is not an export manifest ({where}: {first['msg']})"
        ) from None
    except (ValueError, FilterError, KeyError, TypeError) as exc:
        raise ExportError("from-manifest", f"{path} is not an export manifest ({exc})") from None
    if manifest.rl_export_version != __version__:
        raise ExportError(
            "from-manifest", f"{path} was made by rl-export {manifest.rl_export_version}, this "
            f"is {__version__}: the bytes may differ",
        )  # fmt: skip
    if manifest.manifest_version != MANIFEST_VERSION:
        raise ExportError(
            "from-manifest", f"{path}: manifest version {manifest.manifest_version} is not "
            f"{MANIFEST_VERSION}",
        )  # fmt: skip
    return manifest


def manifest_options(manifest: Manifest) -> dict[str, Any]:
    """The export's options a manifest holds, by the names of ``rl-export export``'s flags
    (``f_<filter>`` for the filters), as the command line gives them."""
    split, dedup = manifest.split_of(), manifest.dedup_of()
    options: dict[str, Any] = {
        "org": manifest.org, "project": manifest.project, "source": manifest.source,
        "format": manifest.format, "columns": manifest.columns, "margin": manifest.margin,
        "pair_by": ",".join(manifest.pair_by) or None, "max_pairs": manifest.max_pairs,
        "zip_data": manifest.zip_data, "mask_failed_turns": manifest.mask_failed_turns,
        "mask_types": None if manifest.mask_types is None else ",".join(manifest.mask_types),
        "redact": ",".join(manifest.redact) or "none",
    }  # fmt: skip
    for name in ("chat_style", "system", "completion"):
        if getattr(manifest, name) is not None:
            options[name] = getattr(manifest, name)
    if manifest.chat_template is not None:
        options["chat_template"] = manifest.chat_template["given"]
        options["on_unrenderable"] = manifest.chat_template["on_unrenderable"]
        options["template_sha256"] = manifest.chat_template["sha256"]
    for name, value in manifest.filters.items():
        options["f_" + name.replace("-", "_")] = value
    if split is not None:
        options |= {"split": split.name, "split_by": split.by, "split_salt": split.salt,
                    "splits": ",".join(f"{n}={v!r}" for n, v in split.splits)}  # fmt: skip
    if dedup is not None:
        threshold = repr(dedup.threshold) if dedup.mode == "near" else None
        options |= {"dedup": dedup.mode, "dedup_on": dedup.on, "dedup_threshold": threshold}
    return options


def export_manifest(summary: Any, ref: Any, fmt: str, **options: Any) -> Manifest:
    """The manifest of an export just written: its :class:`~rl_export.export.scan.
    ExportSummary` (position, counts, sha256), its corpus and format, and the options it was
    made with (the keyword arguments of :func:`~rl_export.export.write_export`)."""
    columns, mask, split, dedup = (options["columns"], options["mask"], options["split"],
                                   options["dedup"])  # fmt: skip
    chat = options["chat"] if fmt in CHAT_FORMATS else None
    return Manifest(
        org=ref.org, project=ref.project, source=ref.corpus, format=fmt, file=options["file"],
        position=summary.position or {}, filters=options["filters"].to_params(sep="-"),
        columns=columns if columns is None or isinstance(columns, str) else ",".join(columns),
        pair_by=list(options["pair_by"]), margin=options["margin"],
        max_pairs=options["max_pairs"], zip_data=options["zip_data"],
        mask_failed_turns=mask is not None,
        mask_types=None if mask is None or mask.types is None else sorted(mask.types),
        split=None if split is None else split.as_dict(),
        dedup=None if dedup is None else dedup.as_dict(),
        chat_style=None if chat is None else chat.style,
        system=None if chat is None else chat.system,
        completion=options["completion"] if fmt == "preference" else None,
        chat_template=summary.template, adaptations=list(summary.adaptations),
        unrenderable=dict(summary.unrenderable),
        redact=list(options["kinds"]), redactions=summary.redactions,
        duplicates_removed=None if dedup is None else summary.duplicates_removed,
        split_left_out=None if split is None else summary.split_left_out,
        rows=summary.records, bytes=summary.bytes, sha256=summary.sha256,
        output=options.get("output"),
    )  # fmt: skip
