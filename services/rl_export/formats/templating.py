"""Chat templates rendered as transformers' ``apply_chat_template`` renders them (pure).

A chat template is Jinja code from a model's tokenizer. Trainers render every row with it
(TRL through ``apply_chat_template``, verl through the same), so an export that promises
rows a template can render renders them the same way, without transformers installed:

- the environment is transformers' (``chat_template_utils._cached_compile_jinja_template``,
  5.x): an ``ImmutableSandboxedEnvironment`` (a template cannot reach Python internals nor
  change the lists and dicts it is given) with ``trim_blocks`` and ``lstrip_blocks``, the
  ``loopcontrols`` extension and the ``{% generation %}`` block, a ``tojson`` that does not
  escape HTML, and the globals ``raise_exception``, ``strftime_now``, ``dict`` and
  ``namespace`` (which refuses names starting with ``_``);
- the variables are ``messages``, ``tools``, ``documents``, ``add_generation_prompt`` and
  the special tokens (``bos_token``, ``eos_token``, ``unk_token``, ``pad_token``: placeholder
  strings unless given); a message's reasoning under an older name (``thinking``,
  ``reasoning``) is also given as ``reasoning_content``, as transformers does. Messages are
  passed as they are: transformers >= 5.25 drops a message's keys whose value is null before
  rendering and older versions do not, so the caller decides (:func:`without_nulls`).

One difference, for speed and with the same results: attribute access on a plain ``dict``
(``message.content``) reads the item directly when the name is not a ``dict`` attribute, and
the sandbox's check of an attribute of a ``str`` or of jinja's ``loop`` is skipped when its
name does not start with ``_`` (each is what the sandbox decides for them, without raising
and catching an ``AttributeError`` for every ``message.role``, nor walking its checks for
every ``loop.last``); ``strftime_now`` with a format of the date alone gives the text it
gave earlier the same day (``strftime`` costs more than the rest of a short render's
calls; the process's locale is never changed); ``tojson`` reuses ``json``'s encoder for
its options, and the C encoder ``json`` makes for each value when there is no indent.
``tests/unit/formats/test_templating.py`` renders every template of the test data both
ways and compares.

Public interface::

    class ChatTemplate(text, name="template", tokens=None)   # compiled once
        .render(messages, tools=None, add_generation_prompt=False) -> str
        .render_blocks(messages, tools=None) -> (str, [(start, end), ...])  # {% generation %}
        .has_generation                                        # the template marks output
        .sha256, .name, .text
    def without_nulls(messages) -> list                        # apply_chat_template's 5.25 step
    GENERATION_RE                                              # a {% generation %} tag
    SPECIAL_TOKENS                                             # the placeholder tokens
    TemplateSyntaxError                                        # jinja2's, re-exported
"""

from __future__ import annotations

import hashlib
import json
import json.encoder
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from json.encoder import encode_basestring, encode_basestring_ascii
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.runtime
import jinja2.utils
from jinja2.exceptions import TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = [
    "GENERATION_RE",
    "SPECIAL_TOKENS",
    "ChatTemplate",
    "TemplateSyntaxError",
    "without_nulls",
]

GENERATION_RE = re.compile(r"\{%-?\s*generation\s*-?%\}")
"""A ``{% generation %}`` tag: the template marks what the model writes."""
SPECIAL_TOKENS: dict[str, str] = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "pad_token": "<pad>",
}
"""The special tokens a template is given when no tokenizer is at hand (an export's check)."""
_REASONING = ("reasoning_content", "thinking", "reasoning")
_DICT_NAMES = frozenset(dir(dict))
_REASONING_KEYS = frozenset(_REASONING)
_Spans = list[tuple[int, int]]
_TRACKING: ContextVar[tuple[list[str], _Spans] | None] = ContextVar("generation", default=None)


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body, and while a render
    tracks them, notes the character span the body took (transformers' AssistantTracker)."""

    tags = {"generation"}  # noqa: RUF012 - jinja's own class attribute

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_block")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _block(self, caller: Any) -> str:
        text: str = caller()
        tracking = _TRACKING.get()
        if tracking is not None:
            rendered, spans = tracking
            start = sum(map(len, rendered))
            spans.append((start, start + len(text)))
        return text


class _Namespace(jinja2.utils.Namespace):
    """``namespace(...)`` that refuses attributes starting with ``_`` (transformers')."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, "
                f"but got {name!r}. Please rename the attribute."
            )


class _Dict:
    """``dict(...)`` in a template: a dict, and nothing else of the type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


_PLAIN: frozenset[type] = frozenset({str, jinja2.runtime.LoopContext, _Namespace})


class _Environment(ImmutableSandboxedEnvironment):
    """The sandbox, with its answer for the two commonest lookups given without an exception
    (the module docstring)."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        kind = type(obj)
        if kind is dict and attribute not in _DICT_NAMES:
            # A dict instance has no attribute of that name: the sandbox would fail getattr
            # and read the item.
            try:
                return obj[attribute]
            except (TypeError, LookupError):
                return self.undefined(obj=obj, name=attribute)
        if kind in _PLAIN and not attribute.startswith("_"):
            # Immutable, or jinja's own loop and namespace objects: none of their public
            # attributes is internal, and the sandbox allows each one (a method is still
            # checked when it is called: str.format).
            try:
                return getattr(obj, attribute)
            except AttributeError:
                return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        if __obj is _strftime_now:
            # The sandbox would find it safe, the context pass it nothing (the module).
            kwargs.pop("_block_vars", None)
            kwargs.pop("_loop_vars", None)
            return __obj(*args, **kwargs)
        return super().call(__context, __obj, *args, **kwargs)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


_ENCODERS: dict[tuple[Any, ...], json.JSONEncoder] = {}
"""``json.dumps``'s encoder for each set of ``tojson``'s options (it makes one a call)."""
c_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)  # CPython's, in C
_ABSENT = object()
_C_ENCODERS = threading.local()
"""Each thread's C encoders (see :func:`_c_encoder`), by the same options."""


def _c_encoder(encoder: json.JSONEncoder, indent: int | None) -> Any:
    """The C encoder ``encoder.encode`` makes for each value it writes in one go (no
    indent), made once: its text for a value is ``encode``'s. It keeps the containers it is
    in the middle of (to find a cycle), so each thread has its own and one that raised is
    made again. None where CPython's C encoder is not there."""
    if c_make_encoder is None or indent is not None:
        return None
    markers: dict[int, Any] | None = {} if encoder.check_circular else None
    strings = encode_basestring_ascii if encoder.ensure_ascii else encode_basestring
    try:
        return c_make_encoder(
            markers, encoder.default, strings, None, encoder.key_separator,
            encoder.item_separator, encoder.sort_keys, encoder.skipkeys, encoder.allow_nan,
        )  # fmt: skip
    except TypeError:  # another Python's signature: encode itself
        return None


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    key = (ensure_ascii, indent, type(indent), separators, sort_keys)  # indent 4, not 4.0
    try:
        encoder = _ENCODERS.get(key)
    except TypeError:  # unhashable options (a list of separators): json.dumps itself
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
            sort_keys=sort_keys,
        )  # fmt: skip
    if encoder is None:
        if len(_ENCODERS) >= 64:
            _ENCODERS.clear()
        encoder = _ENCODERS[key] = json.JSONEncoder(
            ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )
    if isinstance(x, str):
        return encoder.encode(x)
    made: dict[Any, Any] = _C_ENCODERS.__dict__
    c_encoder = made.get(key, _ABSENT)
    if c_encoder is _ABSENT:
        if len(made) >= 64:
            made.clear()
        c_encoder = made[key] = _c_encoder(encoder, indent)
    if c_encoder is None:
        return encoder.encode(x)
    try:
        return "".join(c_encoder(x, 0))
    except BaseException:
        made.pop(key, None)  # it may still hold the containers it was in
        raise


_DATE_ONLY = re.compile(r"(?:[^%]|%[aAbBdjmyY%])*")
"""A format of the date alone (no time, no zone): the same text all day."""
_TODAY: dict[str, tuple[int, str]] = {}
"""Each date-only format's text, and the day it is of (strftime is the cost of a call)."""


def _strftime_now(format: str) -> str:
    now = datetime.now()
    cached = _TODAY.get(format) if type(format) is str else None
    if cached is not None and cached[0] == now.toordinal():
        return cached[1]
    text = now.strftime(format)
    if type(format) is str and len(_TODAY) < 64 and _DATE_ONLY.fullmatch(format):
        _TODAY[format] = (now.toordinal(), text)
    return text


def _environment() -> _Environment:
    env = _Environment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _Dict()
    env.globals["namespace"] = _Namespace
    return env


def without_nulls(messages: Sequence[Any]) -> list[Any]:
    """The messages without their keys whose value is null (what transformers >= 5.25's
    ``apply_chat_template`` does before rendering)."""
    return [
        {k: v for k, v in m.items() if v is not None} if isinstance(m, dict) else m
        for m in messages
    ]


def _aliased(messages: Sequence[Any]) -> Sequence[Any]:
    """Reasoning under an older name also given as ``reasoning_content`` (and ``thinking``),
    as transformers does; the messages themselves when none has any (the usual case)."""
    out: list[Any] | None = None
    for n, message in enumerate(messages):
        if not isinstance(message, dict) or _REASONING_KEYS.isdisjoint(message):
            continue
        reasoning = next((message[k] for k in _REASONING if message.get(k) is not None), None)
        if reasoning is None:
            continue
        if out is None:
            out = list(messages)
        out[n] = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return messages if out is None else out


@contextmanager
def _tracking(rendered: list[str], spans: _Spans) -> Iterator[None]:
    token = _TRACKING.set((rendered, spans))
    try:
        yield
    finally:
        _TRACKING.reset(token)


class ChatTemplate:
    """A chat template, compiled once (the module docstring). Raises TemplateSyntaxError for
    text that is not a Jinja template."""

    def __init__(
        self, text: str, name: str = "template", tokens: Mapping[str, Any] | None = None
    ) -> None:
        self.text = text
        self.name = name
        self.sha256 = hashlib.sha256(text.encode()).hexdigest()
        self.tokens = dict(SPECIAL_TOKENS if tokens is None else tokens)
        self.has_generation = GENERATION_RE.search(text) is not None
        self._compiled = _environment().from_string(text)
        # Its globals as one dict: jinja2 copies them into every render's context, and a
        # ChainMap (the template's over the environment's) is slow to copy. Nothing changes
        # the environment's globals after this.
        self._compiled.globals = dict(self._compiled.globals)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its text (a process compiles it again)."""
        return ChatTemplate, (self.text, self.name, self.tokens)

    def _variables(
        self, messages: Sequence[Any], tools: Sequence[Any] | None, add_generation_prompt: bool
    ) -> dict[str, Any]:
        return {
            "messages": _aliased(messages),
            "tools": tools,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
            **self.tokens,
        }

    def render(
        self,
        messages: Sequence[Any],
        tools: Sequence[Any] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """The conversation as the template renders it; any error the template raises
        (``raise_exception``, a missing key, a type error) propagates."""
        variables = self._variables(messages, tools, add_generation_prompt)
        return self._compiled.render(variables)

    def render_blocks(
        self, messages: Sequence[Any], tools: Sequence[Any] | None = None
    ) -> tuple[str, _Spans]:
        """The conversation rendered (no generation prompt), and the character span of each
        ``{% generation %}`` block in it, in order."""
        rendered: list[str] = []
        spans: _Spans = []
        variables = self._variables(messages, tools, False)
        with _tracking(rendered, spans):
            for piece in self._compiled.generate(variables):
                rendered.append(piece)
        return "".join(rendered), spans
