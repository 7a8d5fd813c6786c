"""A chat template rendered by minijinja where it provably renders as jinja2 does (pure).

:class:`~rl_export.formats.templating.ChatTemplate` renders in transformers' jinja2
environment: what trainers render with, and what the test matrix proves. minijinja (Jinja in
Rust) renders most templates about twice as fast, but it is another implementation: some
templates render differently with it, or raise where jinja2 does not. :class:`Rendering`
uses it only for a template for which it gives the same result:

1. never for a template with ``{% generation %}`` blocks (jinja2's extension), one minijinja
   cannot parse, or when minijinja is not installed;
2. when made, it renders the given conversations (the probes', adapted as the rows are)
   with and without tools and a generation prompt, in both; any difference (a text, or an
   error on one side only) and jinja2 renders everything;
3. a render minijinja refuses is rendered by jinja2 (its text, or its own error: the reason
   a row is left out is jinja2's words);
4. one render in :data:`SAMPLE_EVERY` is rendered by jinja2 too and compared: at the first
   difference, jinja2's result is given and jinja2 renders everything after.

minijinja is given transformers' additions: ``tojson`` as ``json.dumps`` with its options
(``ensure_ascii`` off), ``raise_exception`` and ``strftime_now``; ``trim_blocks`` and
``lstrip_blocks``. Its own ``namespace`` and ``dict`` are as transformers'; its sandbox is
its own (a template cannot reach Python's internals there either).

Public interface::

    SAMPLE_EVERY
    class Rendering(template, conversations)     # conversations: [(messages, tools), ...]
        .render(messages, tools=None, add_generation_prompt=False) -> str
        .engine                                  # "minijinja" or "jinja2", now
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rl_export.formats.templating import ChatTemplate, aliased

SAMPLE_EVERY = 64
"""One render in this many is also rendered by jinja2 and compared."""
_NAME = "chat_template"


class _Refused(Exception):
    """``raise_exception`` in minijinja (any error there: jinja2 renders instead)."""


def _raise_exception(message: Any) -> None:
    raise _Refused(str(message))


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _compiled(text: str) -> Any:
    """A minijinja environment holding the template, or None (not installed, no parse)."""
    try:
        import minijinja  # optional at run time: jinja2 renders without it
    except ImportError:
        return None
    env = minijinja.Environment()
    env.trim_blocks = True
    env.lstrip_blocks = True
    env.add_filter("tojson", _tojson)
    env.add_global("raise_exception", _raise_exception)
    env.add_global("strftime_now", _strftime_now)
    try:
        env.add_template(_NAME, text)
    except Exception:  # any refusal of the template: jinja2 renders it
        return None
    return env


_ERROR = object()
"""An outcome that is an error (any: both engines raising is the same outcome)."""


class Rendering:
    """A template's renders, by minijinja where it renders the same (the module)."""

    def __init__(
        self, template: ChatTemplate, conversations: Sequence[tuple[Sequence[Any], Any]]
    ) -> None:
        self.template = template
        self._env: Any = None if template.has_generation else _compiled(template.text)
        self._count = 0
        if self._env is not None and not all(
            self._outcome(self._fast, m, t, p) == self._outcome(template.render, m, t, p)
            for m, t in conversations
            for p in (False, True)
        ):
            self._env = None

    @property
    def engine(self) -> str:
        return "jinja2" if self._env is None else "minijinja"

    @staticmethod
    def _outcome(render: Any, messages: Sequence[Any], tools: Any, prompt: bool) -> Any:
        try:
            return render(messages, tools, prompt)
        except Exception:  # compared as an outcome
            return _ERROR

    def _fast(self, messages: Sequence[Any], tools: Any, prompt: bool) -> str:
        text: str = self._env.render_template(
            _NAME, messages=aliased(messages), tools=tools, documents=None,
            add_generation_prompt=prompt, **self.template.tokens,
        )  # fmt: skip
        return text

    def render(
        self,
        messages: Sequence[Any],
        tools: Sequence[Any] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """What :meth:`ChatTemplate.render` gives (its text, or its error)."""
        if self._env is None:
            return self.template.render(messages, tools, add_generation_prompt)
        try:
            text = self._fast(messages, tools, add_generation_prompt)
        except Exception:  # jinja2's text, or its own error
            return self.template.render(messages, tools, add_generation_prompt)
        self._count += 1
        if self._count % SAMPLE_EVERY == 0:
            try:
                expected = self.template.render(messages, tools, add_generation_prompt)
            except Exception:
                self._env = None
                raise
            if expected != text:
                self._env = None
                return expected
        return text
