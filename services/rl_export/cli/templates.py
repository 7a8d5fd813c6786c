"""``rl-export template mark FILE -o OUT``: a chat template with ``{% generation %}`` markers.

TRL's ``assistant_only_loss`` needs a template whose ``{% generation %}`` blocks hold each
assistant message. ``mark`` writes one from any template whose conversations render their
beginnings the same as they grow (:mod:`rl_export.formats.masks`), after rendering
conversations with both: the probes' (made for the template as an export makes its rows) and
every row of the exports given with ``--rows``. The marked copy must render the same text,
with blocks that are the assistant messages, for every conversation the original renders;
otherwise nothing is written and the command says why (exit 2).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rl_export.model.errors import ConfigError


def _rows(path: Path) -> Iterator[tuple[list[Any], Any]]:
    """The conversations of an export's rows (each reply of a preference row on its own),
    with their tools."""
    import orjson

    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise ConfigError("--rows", f"cannot read {path}: {exc.strerror}") from None
    for n, line in enumerate(lines, 1):
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise ConfigError("--rows", f"{path}:{n} is not JSON") from None
        if not isinstance(row, dict):
            raise ConfigError("--rows", f"{path}:{n} is not a JSON object")
        tools = row.get("tools")
        tools = orjson.loads(tools) if isinstance(tools, str) else tools
        if isinstance(row.get("messages"), list):
            yield row["messages"], tools
        prompt = row.get("prompt")
        for reply in ("completion", "chosen", "rejected"):
            if isinstance(prompt, list) and isinstance(row.get(reply), list):
                yield [*prompt, *row[reply]], tools


def cmd_template(args: argparse.Namespace) -> int:
    from rl_export.cli.flags import _settings
    from rl_export.formats.chat import Chat
    from rl_export.formats.fit import TemplateFit
    from rl_export.formats.masks import check_marked, mark
    from rl_export.formats.probes import conversations
    from rl_export.formats.templates import load_template

    settings = _settings(args)
    loaded = load_template(args.template, folder=settings.chat_templates)
    original = loaded.template
    if original.has_generation:
        raise ConfigError("template", f"{args.template} already marks assistant output with "
                          "{% generation %} blocks: use it as it is")  # fmt: skip
    fit = TemplateFit.probed(original)
    hf = Chat("hf", split=False)
    probes = []
    for messages in conversations():
        row, _ = fit.row("messages", {"messages": hf.apply(messages)})
        if row is not None:
            probes.append((row["messages"], None))
    given = [c for path in args.rows or [] for c in _rows(Path(path))]
    marked = mark(original)
    check = check_marked(original, marked, [*probes, *given])
    if not check.ok:
        if not check.checked:
            detail = "no conversation renders with it, so none could be checked"
        else:
            detail = (f"{len(check.failures)} of the {check.checked} conversations rendered "
                      f"would be masked wrongly ({check.failures[0]})")  # fmt: skip
        raise ConfigError("template", f"cannot place {{% generation %}} markers in "
                          f"{args.template} safely: {detail}")  # fmt: skip
    out = Path(args.output)
    try:
        out.write_text(marked.text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError("--output", f"cannot write {out}: {exc.strerror}") from None
    print(f"wrote {out}: {args.template} with each assistant message in a {{% generation %}} "
          f"block; {check.checked} conversations ({len(probes)} probes, "
          f"{check.checked - len(probes)} rows) render the same text both ways, the blocks "
          "being the assistant messages", file=sys.stderr)  # fmt: skip
    return 0
