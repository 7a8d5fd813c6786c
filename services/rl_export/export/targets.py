"""Which files an export to a path may write over (docs/guides/exports.md; DESIGN section 10).

An export to ``out`` writes ``out``, its lineage manifest ``out.manifest.json`` and, with
``--card``, the dataset card ``README.md`` beside it. It writes over none of them that it
did not make: each is checked, by its content, never by its name, before a byte is written
(:func:`check_targets`; :class:`~rl_export.model.errors.ExportError` naming the first file
that is not the export's own, which the command line prints in one line, exit 2):

- the manifest is the export's own when it is an rl-export manifest
  (:class:`~rl_export.export.lineage.Manifest`) of an export to a file of this name
  (``output``; manifests written before it was kept name none);
- the output is the export's own when that manifest describes it: the same size and the same
  sha256 (the bytes it wrote, not whatever a user put there since);
- the card is the export's own when it is a card of ours (:func:`~rl_export.export.card.
  card_describes`) describing a file of this name.

So running the same export again over its own previous output works, with or without
``--card``, while a user's ``README.md``, ``notes.jsonl`` or another export's card is left as
it was. A target that does not exist is free. (What a write between the check and the rename
puts there is not looked at: the check is for people, not for racing processes.)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import ValidationError

from rl_export.export.card import CARD_NAME, card_describes
from rl_export.export.lineage import Manifest, manifest_path
from rl_export.model.errors import ExportError

_CHUNK = 1 << 20


def check_targets(target: Path, *, card: bool) -> None:
    """Refuse (ExportError) when a file an export to ``target`` writes exists and is not
    the export's own (see the module)."""
    name = target.name
    lineage = manifest_path(target)
    manifest = None
    if lineage.exists():
        manifest = _manifest(lineage)
        if manifest is None or manifest.output not in (None, name):
            _refuse(lineage, f"is not the manifest of an export to {name}")
    if target.exists() and (manifest is None or not _describes(manifest, target)):
        why = "no export manifest beside it" if manifest is None else "its manifest says otherwise"
        _refuse(target, f"was not written by an export to it ({why})")
    readme = target.parent / CARD_NAME
    if card and readme.exists() and _card_of(readme) != name:
        _refuse(readme, f"is not the dataset card of an export to {name}")


def _refuse(path: Path, why: str) -> None:
    raise ExportError("output", f"{path} exists and {why}: not written over (move it away or "
                      "export to another file)")  # fmt: skip


def _manifest(path: Path) -> Manifest | None:
    try:
        return Manifest.model_validate_json(path.read_bytes())
    except (OSError, ValidationError, ValueError):
        return None


def _describes(manifest: Manifest, target: Path) -> bool:
    """Whether the manifest's size and sha256 are those of the file's bytes now."""
    try:
        if not target.is_file() or target.stat().st_size != manifest.bytes:
            return False
        digest = hashlib.sha256()
        with target.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
    except OSError:
        return False
    return digest.hexdigest() == manifest.sha256


def _card_of(path: Path) -> str | None:
    try:
        return card_describes(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None


__all__ = ["check_targets"]
