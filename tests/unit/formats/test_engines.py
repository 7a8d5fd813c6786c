"""Chat templates rendered by minijinja only where they render as jinja2 does (issue 55,
formats/engines.py): for every template of the tests, read as JSON Lines and as verl's
Parquet, each row of the agent conversations gets the same outcome (kept as the same row,
or left out for the same reason) as with jinja2 alone; a template minijinja renders
differently or with {% generation %} blocks is rendered by jinja2; a
difference found in a sampled render hands over to jinja2."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from rl_export.formats import engines
from rl_export.formats.adapt import Reading
from rl_export.formats.chat import Chat
from rl_export.formats.engines import Rendering
from rl_export.formats.fit import TemplateFit
from rl_export.formats.masks import mark
from rl_export.formats.render import render_row
from rl_export.formats.templating import ChatTemplate
from tests.chattemplates import CONVERSATIONS, TEMPLATES, TOOLS, template

pytest.importorskip("minijinja")
HF = Chat("hf", "keep", split=False)


def rows() -> list[dict[str, Any]]:
    out = []
    for messages in CONVERSATIONS.values():
        for tools in (None, TOOLS):
            record = {"trace_id": "t", "messages": messages,
                      "metadata": {"tools": tools} if tools else {}}  # fmt: skip
            row = render_row("messages", record, chat=HF, tools=True)
            if row is not None:
                out.append(row)
    return out


def _jinja2_only(fit: TemplateFit) -> TemplateFit:
    fit._rendering = Rendering(fit.template, [])
    fit._rendering._env = None
    return fit


@pytest.mark.parametrize("reading", ["jsonl", "verl_parquet"])
@pytest.mark.parametrize("name", TEMPLATES)
def test_every_row_gets_the_same_outcome_as_with_jinja2(name: str, reading: str) -> None:
    chosen = template(name)
    fast = TemplateFit.probed(chosen, Reading(reading))
    slow = _jinja2_only(TemplateFit.probed(chosen, Reading(reading)))
    for row in rows():
        assert fast.row("messages", row) == slow.row("messages", row), (name, reading, row)


def test_the_engines_chosen() -> None:
    """The templates minijinja renders differently (or refuses where jinja2 does not) are
    found by the probes' conversations: jinja2 renders them."""
    engine = {}
    for name in TEMPLATES:
        fit = TemplateFit.probed(template(name), Reading())
        with contextlib.suppress(Exception):  # a template that wants more raises
            fit._render([{"role": "user", "content": "hi"}], TOOLS)
        assert fit._rendering is not None
        engine[name] = fit._rendering.engine
    assert engine["llama3_1_json_tools"] == "minijinja"  # the benchmark's
    assert engine["hermes_3_tool_use"] == engine["command_r_plus_tool_use"] == "jinja2"


def test_generation_blocks_are_jinja2s() -> None:
    marked = mark(template("chatml"))
    assert marked.has_generation
    assert Rendering(marked, [([{"role": "user", "content": "hi"}], None)]).engine == "jinja2"


def test_a_difference_in_a_sampled_render_hands_over_to_jinja2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chosen = template("chatml")
    rendering = Rendering(chosen, [([{"role": "user", "content": "hi"}], None)])
    assert rendering.engine == "minijinja"
    monkeypatch.setattr(engines, "SAMPLE_EVERY", 1)
    monkeypatch.setattr(rendering, "_fast", lambda *a: "not what jinja2 renders")
    messages = [{"role": "user", "content": "hello"}]
    assert rendering.render(messages) == chosen.render(messages)
    assert rendering.engine == "jinja2"


def test_a_refusal_is_rendered_by_jinja2_with_its_words() -> None:
    chosen = ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('user "
                          "first') }}{% endif %}{{ messages[0].content }}")  # fmt: skip
    rendering = Rendering(chosen, [([{"role": "user", "content": "hi"}], None)])
    assert rendering.engine == "minijinja"
    with pytest.raises(Exception, match=r"^user first$"):
        rendering.render([{"role": "system", "content": "s"}])
