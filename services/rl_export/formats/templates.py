"""Where a chat template comes from: a file, the operator's folder, or a built-in.

``--chat-template FILE|NAME`` (the CLI, corpus specs, ``rl_export.hf``) and the API's
``chat_template=NAME`` name a template:

- a **file** (the CLI and corpus specs only: the API never reads a path it is given): a
  ``.jinja`` file, or a tokenizer's ``tokenizer_config.json`` (its ``chat_template``: the
  text, or the one named ``default`` of a list);
- a **name**: ``NAME.jinja`` in the operator's folder (``RL_EXPORT_CHAT_TEMPLATES``), else a
  built-in (``rl_export/formats/chat_templates/``, listed with their sources in its
  ``SOURCES.md``).

What is found is compiled (:class:`~rl_export.formats.templating.ChatTemplate`); anything
wrong is an :class:`~rl_export.model.errors.ExportError` naming ``chat-template``: no such
file or name (the names there are, listed), not UTF-8, not a template.

Public interface::

    BUILTIN_DIR
    def builtin_names() -> list[str]
    def registered_names(folder) -> list[str]
    def load_template(given, *, folder=None, files=True) -> LoadedTemplate
    LoadedTemplate(template, given, origin)     # origin: file, registered or built-in
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import orjson

from rl_export.formats.templating import ChatTemplate, TemplateSyntaxError
from rl_export.model.errors import ExportError

BUILTIN_DIR = Path(__file__).parent / "chat_templates"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_FLAG = "chat-template"


@dataclass(frozen=True)
class LoadedTemplate:
    """A template, as it was named, and where it was found."""

    template: ChatTemplate
    given: str
    origin: Literal["file", "registered", "built-in"]

    def describe(self) -> str:
        """``qwen (registered, sha256 1a2b3c4d5e6f)``: how a summary names it."""
        return f"{self.given} ({self.origin}, sha256 {self.template.sha256[:12]})"


def builtin_names() -> list[str]:
    """The built-in templates' names."""
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.jinja"))


def registered_names(folder: Path | None) -> list[str]:
    """The names of the templates in the operator's folder (none without one)."""
    if folder is None or not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.jinja") if NAME.match(p.stem))


def _text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ExportError(_FLAG, f"cannot read {path}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ExportError(_FLAG, f"{path} is not UTF-8 text") from None
    if path.suffix != ".json":
        return text
    try:
        config = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise ExportError(_FLAG, f"{path} is not JSON (a tokenizer_config.json)") from None
    found = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(found, list):  # named templates: the default one
        found = next((t.get("template") for t in found
                      if isinstance(t, dict) and t.get("name") == "default"), None)  # fmt: skip
    if not isinstance(found, str):
        raise ExportError(_FLAG, f"{path} has no chat_template (or no 'default' one)")
    return found


def _compiled(text: str, name: str) -> ChatTemplate:
    try:
        return ChatTemplate(text, name)
    except TemplateSyntaxError as exc:
        raise ExportError(_FLAG, f"{name} is not a chat template: line {exc.lineno}: "
                          f"{exc.message}") from None  # fmt: skip


def load_template(given: str, *, folder: Path | None = None, files: bool = True) -> LoadedTemplate:
    """The template ``given`` names (the module); ``files=False`` takes names only (the
    API's rule)."""
    given = given.strip()
    path = Path(given)
    looks_like_file = "/" in given or path.suffix in (".jinja", ".json")
    if files and (looks_like_file or path.is_file()):
        if not path.is_file():
            raise ExportError(_FLAG, f"no such file: {given}")
        return LoadedTemplate(_compiled(_text(path), path.stem), given, "file")
    if not NAME.match(given):
        raise ExportError(_FLAG, f"{given!r} is not a template name (letters, digits, . _ -)")
    if folder is not None and (folder / f"{given}.jinja").is_file():
        text = _text(folder / f"{given}.jinja")
        return LoadedTemplate(_compiled(text, given), given, "registered")
    if (BUILTIN_DIR / f"{given}.jinja").is_file():
        text = _text(BUILTIN_DIR / f"{given}.jinja")
        return LoadedTemplate(_compiled(text, given), given, "built-in")
    names = registered_names(folder) + builtin_names()
    where = "a file, " if files else ""
    raise ExportError(_FLAG, f"no chat template {given!r}: give {where}a registered name "
                      f"or a built-in one ({', '.join(names)})")  # fmt: skip
