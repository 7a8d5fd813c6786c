"""The renderer is transformers' (rl_export.formats.templating): every template of the tests,
every conversation, with and without tools and the generation prompt, renders to the same
text as transformers' own ``render_jinja_template`` (installed without torch), or raises
where it raises; ``{% generation %}`` blocks are the same spans; the sandbox still refuses
what it refused."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.exceptions import SecurityError, TemplateError
from transformers.utils.chat_template_utils import render_jinja_template

from rl_export.formats.chat import Chat
from rl_export.formats.templating import SPECIAL_TOKENS, ChatTemplate, without_nulls
from tests.chattemplates import CONVERSATIONS, TEMPLATES, TOOLS, template

HF = Chat("hf", split=False)


def theirs(text: str, messages: list[Any], tools: Any = None, prompt: bool = False) -> str:
    rendered, _ = render_jinja_template(  # type: ignore[misc]  # returns (texts, blocks)
        conversations=[copy.deepcopy(messages)], tools=tools, chat_template=text,
        add_generation_prompt=prompt, **SPECIAL_TOKENS,
    )  # fmt: skip
    out: str = rendered[0]
    return out


def outcome(render: Any) -> str:
    try:
        return "ok: " + render()
    except Exception as exc:  # the same error, or the same text
        return f"raises {type(exc).__name__}: {exc}"


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_template_renders_as_transformers_does(name: str) -> None:
    ours = template(name)
    cases = 0
    for messages in CONVERSATIONS.values():
        for shaped in (messages, HF.apply(messages)):
            for tools in (None, TOOLS):
                for prompt in (False, True):
                    mine = outcome(lambda: ours.render(shaped, tools, prompt))  # noqa: B023
                    real = outcome(lambda: theirs(ours.text, shaped, tools, prompt))  # noqa: B023
                    assert mine == real, (name, shaped, tools, prompt)
                    cases += 1
    assert cases == len(CONVERSATIONS) * 8


def test_generation_blocks_are_the_spans_transformers_finds() -> None:
    text = (
        "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}"
        "{{ m.content }}</s>{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}"
    )
    messages = HF.apply(CONVERSATIONS["plain"])
    rendered, spans = ChatTemplate(text).render_blocks(messages)
    real, blocks = render_jinja_template(  # type: ignore[misc]  # returns (texts, blocks)
        conversations=[messages], chat_template=text, return_assistant_tokens_mask=True,
    )  # fmt: skip
    assert (rendered, spans) == (real[0], blocks[0])
    assert [rendered[a:b] for a, b in spans] == ["It shipped yesterday.</s>",
                                                 "You are welcome.</s>"]  # fmt: skip
    assert ChatTemplate(text).has_generation
    assert not template("chatml").has_generation


@settings(max_examples=60, deadline=None)
@given(st.lists(st.fixed_dictionaries({
    "role": st.sampled_from(["system", "user", "assistant", "tool"]),
    "content": st.one_of(st.none(), st.text(max_size=30)),
}, optional={"reasoning": st.text(max_size=10), "thinking": st.text(max_size=10),
             "name": st.text(max_size=5)}), min_size=1, max_size=6))  # fmt: skip
def test_generated_conversations_render_the_same(messages: list[dict[str, Any]]) -> None:
    """Messages nobody listed (null content, reasoning under every name, odd roles) render
    as transformers renders them with four templates of different styles."""
    for name in ("qwq_32b", "mistral_nemo_2407", "chatml", "deepseek_v3_1"):
        ours = template(name)
        shaped = without_nulls(messages)
        assert outcome(lambda: ours.render(shaped)) == outcome(  # noqa: B023
            lambda: theirs(ours.text, shaped)  # noqa: B023
        ), name


def test_the_sandbox_still_refuses() -> None:
    """What transformers' sandbox refuses, ours does: internals, changing what it is given,
    underscore names on a namespace; raise_exception raises."""
    messages = [{"role": "user", "content": "x"}]
    for text, error in (
        ("{{ messages.__class__ }}", None),
        ("{{ messages.append(1) }}", SecurityError),
        ("{{ messages[0].update({'a': 1}) }}", SecurityError),
        ("{% set ns = namespace(_x=1) %}", SecurityError),
        ("{{ raise_exception('no') }}", TemplateError),
        ("{{ ''.__class__.__mro__ }}", SecurityError),
    ):
        if error is None:  # an internal attribute is undefined: renders nothing
            assert ChatTemplate(text).render(messages) == theirs(text, messages) == ""
        else:
            with pytest.raises(error):
                ChatTemplate(text).render(messages)
            with pytest.raises(error):
                theirs(text, messages)


def test_a_template_pickles_as_its_text() -> None:
    again = pickle.loads(pickle.dumps(template("qwq_32b")))
    messages = HF.apply(CONVERSATIONS["openai_call"])
    assert again.render(messages) == template("qwq_32b").render(messages)
    assert again.sha256 == template("qwq_32b").sha256


def test_strftime_now_is_now_and_a_date_only_format_is_kept_for_the_day(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import datetime as dt

    from rl_export.formats import templating

    days = iter([dt.datetime(2026, 1, 2, 23, 59), dt.datetime(2026, 1, 2, 23, 59, 59),
                 dt.datetime(2026, 1, 3, 0, 0), dt.datetime(2026, 1, 3, 0, 1)])  # fmt: skip

    class Clock(dt.datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return next(days)

    monkeypatch.setattr(templating, "datetime", Clock)
    monkeypatch.setattr(templating, "_TODAY", {})
    rendered = ChatTemplate("{{ strftime_now('%d %b %Y') }} {{ strftime_now('%H:%M') }}")
    assert rendered.render([]) == "02 Jan 2026 23:59"  # the two calls: the first two times
    assert rendered.render([]) == "03 Jan 2026 00:01"  # the next day: not the cached text
    assert set(templating._TODAY) == {"%d %b %Y"}  # a time of day is never kept


_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=8),
    st.floats(allow_nan=True, allow_infinity=True),
)  # fmt: skip
_keys = st.one_of(st.text(max_size=4), st.integers(-3, 3), st.booleans(), st.none(),
                  st.floats(allow_nan=False, width=16))  # fmt: skip
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=12,
)
_options = st.fixed_dictionaries(
    {},
    optional={"ensure_ascii": st.booleans(), "sort_keys": st.booleans(),
              "separators": st.sampled_from([(",", ":"), (", ", ": ")]),
              "indent": st.sampled_from([None, 2, 4])},
)  # fmt: skip


def _json(encode: Any, x: Any, options: dict[str, Any]) -> str:
    try:
        text: str = encode(x, **options)
        return "ok: " + text
    except Exception as exc:  # the same error, or the same text
        return f"raises {type(exc).__name__}: {exc}"


@given(_values, _options)
@settings(max_examples=400, deadline=None)
def test_tojson_writes_what_json_dumps_writes(value: Any, options: dict[str, Any]) -> None:
    """``tojson`` keeps json's encoder and its C encoder for each set of options: the text
    (or the error) is transformers' (json.dumps, ASCII kept) for any value, NaN, keys of
    any type and mixed keys sorted included, and a value it cannot write leaves the next
    one written right."""
    import json

    from rl_export.formats import templating

    for x in (value, [value, object()], value):
        expected = _json(json.dumps, x, {"ensure_ascii": False, **options})  # tojson's default
        assert _json(templating._tojson, x, options) == expected


def test_tojson_after_a_cycle_writes_the_next_value() -> None:
    """A cycle stops json's C encoder in the middle of its containers: it is made again."""
    import json

    from rl_export.formats import templating

    cycle: list[Any] = [1]
    cycle.append({"a": cycle})
    for _ in range(2):
        with pytest.raises(ValueError, match="Circular reference detected"):
            templating._tojson(cycle)
        assert templating._tojson([{"a": [1]}, {"a": [1]}]) == json.dumps([{"a": [1]}, {"a": [1]}])
