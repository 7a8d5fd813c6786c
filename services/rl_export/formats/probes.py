"""What a chat template requires, found by rendering probes, never by its name (pure).

:func:`probe` renders small conversations whose every text is a marker string and reads the
output (or the error) to fill in a :class:`~rl_export.formats.adapt.Requirements`. Each
question is asked with the answers found before it applied, in this order:

1. **system**: ``[system S, user U1, assistant A1, user U2, assistant A2]`` must render with
   S before U1. A template that raises on a system message, drops it, or moves it after the
   first user message (Mistral's put it in the last ``[INST]``: an SFT row that ends with an
   assistant turn loses it) gets ``merge_system``.
2. **tool call ids**: a call and its result with ids of the shapes agents write (OpenAI's
   ``call_`` + 24 characters, ``call_1``, Anthropic's ``toolu_...``, none at all) must all
   render, each id whole where it is shown. Otherwise the first shape of
   :data:`ID_SHAPES` that renders, whole, becomes ``call_ids``.
3. **tool names**: a tool message without ``name`` must render; if it raises, or if a
   ``name`` changes the output (the template shows it), ``tool_names``.
4. **arguments**: ``{"Kq1": "Vq1 v", "Kq2": 7}`` as an object and as a JSON string. A form
   is clean when it renders, shows every key and value, and is neither JSON encoded twice
   (``\\"Kq1\\"``), nor a Python dict (``'Kq1': 'Vq1 v'``), nor taken apart character by
   character (then a key or a value is missing). The object form when it is clean, else the
   string form when it is, else ``garbles_arguments``.
5. **text beside calls**: an assistant message with text and a call must show both
   (``together``); else the text in a message of its own before the call (``split``).
6. **parallel calls**: two calls in one message, two results, must show both calls
   (``many``); else one call per message (``one``).

A template that needs a ``tools`` list to render at all (the ``tool_use`` members of
Hermes' and Command R's template sets) is probed with a one-tool list. ``reading`` is how the
trainer will hand the rows to the template (:class:`~rl_export.formats.adapt.Reading`):
probes go through it as rows do, so verl's Parquet (every key present, null where absent,
arguments as JSON strings) is probed as verl renders it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import orjson

from rl_export.formats.adapt import IdShape, Reading, Requirements, adapt
from rl_export.formats.templating import ChatTemplate

S, U1, A1, U2, A2 = "Sq1 be terse", "Uq1 where is it", "Aq1 it shipped", "Uq2 thanks", "Aq2 ok"
TEXT, RESULT, RESULT2 = "Tq1 let me look", "Rq1 in transit", "Rq2 at the depot"
FN, FN2 = "lookup_parcel_q", "track_route_q"
ARGS: dict[str, Any] = {"Kq1": "Vq1 v", "Kq2": 7}
ARGS2: dict[str, Any] = {"Kq3": "Vq3 w"}
ORIGINAL_IDS: tuple[str | None, ...] = (
    "call_Xq7aB2cD4eF6gH8iJ0kL1mN3",  # OpenAI's
    "call_1",
    "toolu_01Aq2Bw3Ce4Dr5Ft6Gy7Hu8",  # Anthropic's
    None,
)
"""Tool call ids as agents write them (None: the call has none, nor its result)."""
ID_SHAPES: tuple[IdShape, ...] = tuple(
    IdShape(length, alphabet)
    for length in (9, 8, 10, 12, 16, 24, 32, 6)
    for alphabet in ("alnum", "lower_alnum", "digits")
)
"""The shapes tried, in order, when a template refuses ids as agents write them."""
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": name, "description": "Find where a parcel is.",
        "parameters": {"type": "object", "required": list(args), "properties": {
            key: {"type": "string" if isinstance(value, str) else "integer",
                  "description": f"The {key}."}
            for key, value in args.items()}},
    }} for name, args in ((FN, ARGS), (FN2, ARGS2))
]  # fmt: skip
"""A tools list (OpenAI's shape, every field filled in), for templates that cannot render
without one."""


def _call(call_id: str | None, name: str = FN, args: Any = None) -> dict[str, Any]:
    function = {"name": name, "arguments": ARGS if args is None else args}
    call: dict[str, Any] = {"type": "function", "function": function}
    if call_id is not None:
        call["id"] = call_id
    return call


def _result(call_id: str | None, content: str = RESULT, name: str | None = FN) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "tool", "content": content}
    if call_id is not None:
        message["tool_call_id"] = call_id
    if name is not None:
        message["name"] = name
    return message


def _called(call_id: str | None = "call_1", *, name: bool = True, text: str = "",
            args: Any = None) -> list[dict[str, Any]]:  # fmt: skip
    """user -> assistant (a call) -> its result -> assistant."""
    return [
        {"role": "user", "content": U1},
        {"role": "assistant", "content": text, "tool_calls": [_call(call_id, args=args)]},
        _result(call_id, name=FN if name else None),
        {"role": "assistant", "content": A1},
    ]


def _parallel() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": U1},
        {"role": "assistant", "content": "",
         "tool_calls": [_call("call_1"), _call("call_2", FN2, ARGS2)]},
        _result("call_1"),
        _result("call_2", RESULT2, FN2),
        {"role": "assistant", "content": A1},
    ]  # fmt: skip


class _Prober:
    """Renders probes adapted to the requirements found so far, through the reading."""

    def __init__(self, template: ChatTemplate, reading: Reading) -> None:
        self.template = template
        self.reading = reading
        self.tools: list[dict[str, Any]] | None = None

    def render(self, messages: list[dict[str, Any]], req: Requirements) -> str | None:
        """The probe's output, or None when the template raises on it."""
        adapted, _ = adapt(messages, req)
        shown, tools = self.reading.view(adapted, self.tools)
        try:
            return self.template.render(shown, tools)
        except Exception:  # any error of the template: the probe does not render
            return None


def _shows(out: str | None, *markers: str) -> bool:
    return out is not None and all(m in out for m in markers)


def _system(prober: _Prober, req: Requirements) -> Requirements:
    out = prober.render([
        {"role": "system", "content": S}, {"role": "user", "content": U1},
        {"role": "assistant", "content": A1}, {"role": "user", "content": U2},
        {"role": "assistant", "content": A2},
    ], req)  # fmt: skip
    if out is not None and S in out and U1 in out and out.index(S) < out.index(U1):
        return req
    return replace(req, merge_system=True)


def _ids_whole(out: str | None, ids: list[str]) -> bool:
    """The probe renders, and every id it shows is whole (a template may keep an id's tail:
    two ids alike at the end would then be one)."""
    if out is None:
        return False
    return all(i in out or i[-4:] not in out for i in ids)


def _call_ids(prober: _Prober, req: Requirements) -> Requirements:
    named = replace(req, tool_names=True)  # names given: only the ids are in question
    if all(_ids_whole(prober.render(_called(i), named), [i] if i else [])
           for i in ORIGINAL_IDS):  # fmt: skip
        return req
    for shape in ID_SHAPES:
        trial = replace(named, call_ids=shape)
        adapted, _ = adapt(_called("call_1"), trial)
        made = [c["id"] for m in adapted for c in m.get("tool_calls") or []]
        if _ids_whole(prober.render(_called("call_1"), trial), made):
            return replace(req, call_ids=shape)
    return req  # no shape renders: the rows with calls fail their check, counted


def _tool_names(prober: _Prober, req: Requirements) -> Requirements:
    without = prober.render(_called(name=False), req)
    with_name = prober.render(_called(name=False), replace(req, tool_names=True))
    if without is None and with_name is not None:
        return replace(req, tool_names=True)
    if without is not None and with_name is not None and with_name != without:
        return replace(req, tool_names=True)
    return req


def _clean(out: str | None) -> bool:
    """The arguments rendered once, whole, as the template's own syntax."""
    if not _shows(out, FN, *ARGS, "Vq1 v", "7"):
        return False
    assert out is not None
    twice = '\\"Kq1\\"' in out or '\\"Vq1 v\\"' in out
    python = "'Kq1': 'Vq1 v'" in out or "'Kq1':'Vq1 v'" in out
    return not twice and not python


def _arguments(prober: _Prober, req: Requirements, forced: str | None) -> Requirements:
    as_object = prober.render(_called(), req) if forced is None else None
    if _clean(as_object):
        return req
    as_string = replace(req, arguments="string")
    as_text = prober.render(_called(args=orjson.dumps(ARGS).decode()), as_string)
    if _clean(as_text):
        return as_string
    if not (_shows(as_object, FN) or _shows(as_text, FN)):
        return req if forced is None else as_string  # no call shown: the rows' check says so
    return replace(req if forced is None else as_string, garbles_arguments=True)


def _text_with_calls(prober: _Prober, req: Requirements) -> Requirements:
    together = replace(req, text_with_calls="together")
    if _shows(prober.render(_called(text=TEXT), together), TEXT, FN, RESULT, A1):
        return together
    return req


def _parallel_calls(prober: _Prober, req: Requirements) -> Requirements:
    many = replace(req, calls_per_message="many")
    markers = (FN, FN2, "Vq1 v", "Vq3 w", RESULT, RESULT2, A1)
    if _shows(prober.render(_parallel(), many), *markers):
        return many
    return req


def conversations() -> list[list[dict[str, Any]]]:
    """The probes' conversations (in the hf chat style, calls beside their text): what
    ``rl-export template mark`` renders when it is given no rows."""
    return [
        [{"role": "user", "content": U1}, {"role": "assistant", "content": A1}],
        [{"role": "system", "content": S}, {"role": "user", "content": U1},
         {"role": "assistant", "content": A1}, {"role": "user", "content": U2},
         {"role": "assistant", "content": A2}],
        _called(), _called(text=TEXT), _parallel(),
    ]  # fmt: skip


STEPS: tuple[Callable[[_Prober, Requirements], Requirements], ...] = (
    _system, _call_ids, _tool_names,
)  # fmt: skip


def probe(
    template: ChatTemplate, reading: Reading | None = None, *, merge_system: bool = False
) -> Requirements:
    """What ``template`` requires of the rows, read as ``reading`` gives them to it (the
    module). ``merge_system``: the caller merges system messages whatever the template."""
    reading = reading or Reading()
    prober = _Prober(template, reading)
    plain = [{"role": "user", "content": U1}, {"role": "assistant", "content": A1}]
    if prober.render(plain, Requirements()) is None:
        prober.tools = TOOLS  # a template that needs a tools list
    req = Requirements(merge_system=merge_system)
    for step in STEPS:
        if step is _system and merge_system:
            continue
        req = step(prober, req)
    req = _arguments(prober, req, "string" if reading.string_arguments else None)
    req = _text_with_calls(prober, req)
    return _parallel_calls(prober, req)
