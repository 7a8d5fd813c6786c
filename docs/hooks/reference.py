"""A MkDocs hook: the reference pages, generated from the code at every build.

Where the code is the truth, the docs are made from it, never copied by hand:

1. ``reference/cli.md`` from the argument parser (:func:`rl_export.cli.build_parser`): every
   command, its subcommands (subparsers, or an ``action`` positional's choices) and flags;
2. ``reference/settings.md`` from the settings class (:class:`rl_export.runtime.settings.Settings`):
   every ``RL_EXPORT_*`` variable with its default, its type or choices, and its help;
3. ``reference/api.md`` from the web service's OpenAPI document (``create_app(...).openapi()``,
   what ``GET /api/v1/openapi.json`` serves): every route, its parameters, body and answers;
4. ``reference/schemas.md`` from ``schemas/*.schema.json`` (generated from the pydantic models
   by ``make schemas``, checked by a test), each file also published beside the page.

``tests/packaging/test_docs.py`` builds the site with ``--strict`` and checks that every
setting, command and route is on these pages.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from prometheus_client import CollectorRegistry
from pydantic import TypeAdapter
from pydantic.fields import FieldInfo

from rl_export.cli import build_parser
from rl_export.runtime.settings import Settings, env_name
from rl_export.web.app import create_app
from rl_export.web.services import build_services

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
MIB = 1024 * 1024
DAY_S = 24 * 3600


def cell(text: object) -> str:
    """Text for a Markdown table cell: pipes escaped, lines joined."""
    return " ".join(str(text).split()).replace("|", "\\|")


def code(text: object) -> str:
    """Inline code that survives backticks in the text."""
    value = str(text)
    fence = "``" if "`" in value else "`"
    pad = " " if value.startswith("`") or value.endswith("`") or not value else ""
    return f"{fence}{pad}{value}{pad}{fence}"


# 1. The command line ------------------------------------------------------------------------


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse._SubParsersAction[Any]]:
    # argparse keeps its subcommands in a private action class: there is no public accessor.
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def commands(
    parser: argparse.ArgumentParser, prefix: str = "rl-export"
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(full command, help, parser) of every command and nested subcommand, in order."""
    for action in _subparsers(parser):
        helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
        for name, sub in action.choices.items():
            full = f"{prefix} {name}"
            yield full, helps.get(name, ""), sub
            yield from commands(sub, full)


def actions_of(parser: argparse.ArgumentParser) -> list[str]:
    """The choices of a command's ``action`` positional (``tokens create``, ``shards ls``)."""
    for action in parser._actions:
        if action.dest == "action" and action.choices and not action.option_strings:
            return [str(c) for c in action.choices]
    return []


def _argument_row(action: argparse.Action) -> str | None:
    if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
        return None
    if action.option_strings:
        name = ", ".join(action.option_strings)
        if action.nargs != 0:
            name += f" {action.metavar or action.dest.upper()}"
    else:
        name = str(action.metavar or action.dest)
        if action.choices:  # as argparse writes them: a pipe would end the table's cell
            name = "{" + ",".join(str(c) for c in action.choices) + "}"
    notes = []
    if action.required and action.option_strings:
        notes.append("required")
    if action.nargs in ("+", "*"):
        notes.append("one or more" if action.nargs == "+" else "any number")
    if isinstance(action, argparse._AppendAction):
        notes.append("repeatable")
    default = action.default
    if default not in (None, False, argparse.SUPPRESS) and action.nargs != 0:
        notes.append(f"default {code(default)}")
    help_text = action.help or ""
    if notes:
        help_text = f"{help_text} ({', '.join(notes)})" if help_text else ", ".join(notes)
    return f"| {code(name)} | {cell(help_text)} |"


def cli_page(parser: argparse.ArgumentParser) -> str:
    """The command-line reference."""
    lines = [
        "# Command line",
        "",
        "Generated from `rl-export`'s argument parser (`rl_export.cli.build_parser`) when the "
        "site is built. Every command also answers `--help`. Settings come from the "
        "environment ([settings](settings.md)); flags override them. Bad input is one line "
        "on stderr naming the flag or setting, with exit code 2.",
        "",
        "```text",
        parser.format_usage().strip(),
        "```",
        "",
    ]
    for full, help_text, sub in commands(parser):
        depth = full.count(" ")
        lines += [f"{'#' * (depth + 1)} `{full}`", "", help_text[:1].upper() + help_text[1:], ""]
        lines += ["```text", sub.format_usage().strip(), "```", ""]
        choices = actions_of(sub)
        if choices:
            listed = ", ".join(f"`{full} {c}`" for c in choices)
            lines += [f"Subcommands: {listed}.", ""]
        rows = [r for group in sub._action_groups for r in _group_rows(group)]
        if rows:
            lines += ["| argument | meaning |", "| --- | --- |", *rows, ""]
    return "\n".join(lines)


def _group_rows(group: argparse._ArgumentGroup) -> list[str]:
    rows = [r for a in group._group_actions if (r := _argument_row(a)) is not None]
    if rows and group.title not in ("positional arguments", "options", "optional arguments"):
        rows.insert(0, f"| *{cell(group.title)}* | |")
    return rows


# 2. The settings ----------------------------------------------------------------------------


def annotation(info: FieldInfo) -> Any:
    """A field's type (every setting has one: pydantic leaves it None only for untyped ones)."""
    if info.annotation is None:
        raise TypeError("a setting without a type annotation")
    return info.annotation


def written_default(name: str, info: FieldInfo) -> str:
    """A default as the settings table shows it, with bytes and seconds made readable."""
    default = info.default
    if default is None:
        return "unset"
    value = TypeAdapter(annotation(info)).dump_python(default, mode="json")
    text = code(json.dumps(value, separators=(",", ":")) if not isinstance(value, str) else value)
    if isinstance(value, bool):
        return text
    if isinstance(value, int | float) and value and name.endswith("_bytes") and value % MIB == 0:
        text += f" ({int(value // MIB)} MiB)"
    elif isinstance(value, int | float) and name.endswith("_s") and value >= 3600:
        days = value / DAY_S
        text += f" ({days:g} day{'s' if days != 1 else ''})" if value % 3600 == 0 and (
            value % DAY_S == 0) else f" ({value / 3600:g} h)"  # fmt: skip
    return text


def allowed(info: FieldInfo) -> str:
    """The type, its choices or its bounds."""
    schema = TypeAdapter(annotation(info)).json_schema()
    choices = schema.get("enum")
    if choices:
        return ", ".join(code(c) if c else "empty" for c in choices)
    kind = schema.get("type") or "/".join(
        str(s.get("type")) for s in schema.get("anyOf", []) if s.get("type") != "null"
    )
    bounds = []
    for meta in info.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(meta, attr, None) is not None:
                bounds.append(f"{sign} {getattr(meta, attr)}")
    return cell(" ".join([str(kind or "JSON"), ", ".join(bounds)]).strip())


def settings_page() -> str:
    """The settings reference."""
    lines = [
        "# Settings",
        "",
        "Generated from the settings class (`rl_export.runtime.settings.Settings`) when the "
        "site is built. Every setting is an environment variable `RL_EXPORT_<NAME>`; the "
        "command line's flags override them (`--store` over `RL_EXPORT_STORE_URL`, ...). "
        "An invalid value stops a command with one line naming the variable. Settings are "
        "read once, at start, and frozen.",
        "",
        "| variable | default | type | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for name, info in Settings.model_fields.items():
        lines.append(
            f"| {code(env_name(name))} | {written_default(name, info)} | {allowed(info)} | "
            f"{cell(info.description or '')} |"
        )
    return "\n".join([*lines, ""])


# 3. The HTTP API ----------------------------------------------------------------------------


def openapi_document() -> dict[str, Any]:
    """The web service's OpenAPI document, from the app itself (in a throwaway data dir)."""
    with tempfile.TemporaryDirectory() as folder:
        settings = Settings(store_url=f"{folder}/store", data_dir=Path(folder))
        doc: dict[str, Any] = create_app(build_services(settings, CollectorRegistry())).openapi()
    return doc


def schema_text(schema: dict[str, Any], link: bool = True) -> str:
    """A parameter's or field's type in a few words; models link to their section (on the
    API page, where each has one) or are named."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})" if link else f"*{name}*"
    if "anyOf" in schema:
        kinds = [schema_text(s, link) for s in schema["anyOf"] if s.get("type") != "null"]
        nullable = any(s.get("type") == "null" for s in schema["anyOf"])
        return " or ".join(kinds) + (" or null" if nullable else "")
    if "enum" in schema:
        return " \\| ".join(code(v) for v in schema["enum"])
    if schema.get("type") == "array":
        return f"list of {schema_text(schema.get('items', {}), link)}"
    if schema.get("type") == "object" and "additionalProperties" in schema:
        extra = schema["additionalProperties"]
        inner = schema_text(extra, link) if isinstance(extra, dict) and extra else "any"
        return f"object of {inner}"
    return str(schema.get("type", "any"))


def api_page(doc: dict[str, Any]) -> str:
    """The HTTP API reference."""
    lines = [
        "# HTTP API",
        "",
        "Generated from the web service's OpenAPI document when the site is built: the same "
        "document `rl-export web` serves at `GET /api/v1/openapi.json` (no token needed). "
        "Every route needs a bearer token (`Authorization: Bearer rlx_...`, made with "
        "`rl-export tokens create`) for its org/project and scope; every error is JSON "
        "`{error, detail}`.",
        "",
        f"Version {doc['info']['version']}. {doc['info'].get('summary', '')}",
        "",
    ]
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            lines += [f"## `{method.upper()} {path}`", "", op.get("summary", ""), ""]
            if op.get("description"):
                lines += [op["description"].strip(), ""]
            params = op.get("parameters", [])
            if params:
                lines += ["| parameter | in | type | meaning |", "| --- | --- | --- | --- |"]
                for p in params:
                    required = " (required)" if p.get("required") else ""
                    lines.append(
                        f"| `{p['name']}` | {p['in']} | {schema_text(p.get('schema', {}))} | "
                        f"{cell(p.get('description', ''))}{required} |"
                    )
                lines.append("")
            body = op.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                lines += [f"Body ({code(media)}): {schema_text(content.get('schema', {}))}", ""]
            answers = []
            for status, answer in op.get("responses", {}).items():
                schemas = [c.get("schema", {}) for c in answer.get("content", {}).values()]
                shape = f": {schema_text(schemas[0])}" if schemas and schemas[0] else ""
                answers.append(f"`{status}` {cell(answer.get('description', ''))}{shape}")
            lines += ["Answers: " + "; ".join(answers) + ".", ""]
    lines += ["## Bodies", ""]
    for name, model in doc.get("components", {}).get("schemas", {}).items():
        lines += [f"### {name}", "", cell(model.get("description", "")), ""]
        lines += _property_table(model)
    return "\n".join(lines)


def _property_table(model: dict[str, Any], link: bool = True) -> list[str]:
    props = model.get("properties", {})
    if not props:
        return []
    required = set(model.get("required", []))
    rows = ["| field | type | required | meaning |", "| --- | --- | --- | --- |"]
    for field, schema in props.items():
        rows.append(
            f"| `{field}` | {schema_text(schema, link)} | {'yes' if field in required else ''} | "
            f"{cell(schema.get('description', ''))} |"
        )
    return [*rows, ""]


# 4. The schemas -----------------------------------------------------------------------------


def schemas_page(schemas: dict[str, dict[str, Any]]) -> str:
    """The schemas reference: one section per file of ``schemas/``."""
    lines = [
        "# Schemas",
        "",
        "The JSON Schemas (draft 2020-12) of the input events, the corpus records and every "
        "export format, as published in the repository's `schemas/` folder. They are "
        "generated from the pydantic models (`make schemas`; a test fails when they differ) "
        "and this page from them when the site is built. Each file is published beside this "
        "page.",
        "",
    ]
    for name, schema in schemas.items():
        lines += [f"## {name}", "", f"[{name}.schema.json](schemas/{name}.schema.json)", ""]
        if schema.get("description"):
            lines += [cell(schema["description"]), ""]
        if "oneOf" in schema:
            kinds = ", ".join(schema_text(s, link=False) for s in schema["oneOf"])
            lines += [f"One of: {kinds}.", ""]
        lines += _property_table(schema, link=False)
        for def_name, definition in schema.get("$defs", {}).items():
            if definition.get("properties"):
                lines += [f"### {name}: *{def_name}*", "", *_property_table(definition, False)]
    return "\n".join(lines)


def load_schemas() -> dict[str, dict[str, Any]]:
    return {
        p.name.removesuffix(".schema.json"): json.loads(p.read_text(encoding="utf-8"))
        for p in sorted(SCHEMAS.glob("*.schema.json"))
    }


# The hook -----------------------------------------------------------------------------------


def pages() -> dict[str, str]:
    """Every generated file of the site, by its path under the docs folder."""
    schemas = load_schemas()
    out = {
        "reference/cli.md": cli_page(build_parser()),
        "reference/settings.md": settings_page(),
        "reference/api.md": api_page(openapi_document()),
        "reference/schemas.md": schemas_page(schemas),
    }
    for name in schemas:
        out[f"reference/schemas/{name}.schema.json"] = (SCHEMAS / f"{name}.schema.json").read_text(
            encoding="utf-8"
        )
    return out


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """MkDocs event: add the generated pages before the navigation is built."""
    for path, content in pages().items():
        files.append(File.generated(config, path, content=content))
    return files
