"""What a pool process is sent and does for rows made for a chat template (issue 55): whole
lines cut into chunks at line ends, and a chunk's rows made from its lines, a line that is
not a record named with its corpus."""

from __future__ import annotations

import orjson
import pytest

from rl_export.corpora.commits import ChainError
from rl_export.export import templated
from rl_export.export.lazy import export_fields
from rl_export.export.slots import Slots
from rl_export.export.templated import LineMaking, template_chat
from rl_export.formats.adapt import Reading
from rl_export.formats.chat import HF
from rl_export.formats.filters import Filters
from rl_export.formats.fit import TemplateFit
from rl_export.formats.templates import load_template


def test_blocks_are_cut_at_line_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(templated, "CHUNK_BYTES", 10)
    block = b"".join(b'{"n":%d}\n' % n for n in range(25))
    pieces = templated._pieces(memoryview(block))
    assert b"".join(pieces) == block
    assert len(pieces) > 5
    assert all(bytes(p).endswith(b"\n") and bytes(p).count(b"\n") <= 2 for p in pieces)
    assert templated._pieces(memoryview(b"")) == []


@pytest.fixture
def started() -> None:
    fit = TemplateFit.probed(load_template("chatml").template, Reading())
    fields = export_fields("messages", Filters(), chat=template_chat(HF), template=True)
    templated._start(fit, LineMaking(fields, None, HF, (), root="acme/bot/evaluator"))


@pytest.mark.usefixtures("started")
def test_a_chunk_s_rows_are_made_from_its_lines() -> None:
    records = [
        {"trace_id": "t1", "messages": [{"role": "user", "content": "Hi"},
                                        {"role": "assistant", "content": "Hello"}]},
        {"trace_id": "t2", "messages": [{"role": "assistant", "content": "no user"}]},
        {"trace_id": "t3", "messages": []},
    ]  # fmt: skip
    made = templated._made("messages", b"".join(orjson.dumps(r) + b"\n" for r in records))
    kept = [orjson.loads(line)["messages"] for line in made.lines]
    assert kept[0] == records[0]["messages"]
    assert made.skipped + len(made.refused) + len(made.lines) == 3


@pytest.mark.usefixtures("started")
def test_a_line_that_is_not_a_record_names_the_corpus() -> None:
    with pytest.raises(ChainError, match=r"^acme/bot/evaluator: a line is not a record"):
        templated._made("messages", b'{"trace_id": "t1"}\nnot json\n')


def test_rows_longer_than_the_slot_come_back_as_lines() -> None:
    """A chunk in a slot whose rows do not fit in its out room (the trace's tools, as JSON
    text in the row, are longer than as stored): the rows come back as lines, the same as
    from the chunk itself; rows that fit are left in the slot."""
    tools = [{"type": "function", "function": {"name": "f", "description": '"' * 400}}]
    record = {"trace_id": "t1", "metadata": {"tools": tools},
              "messages": [{"role": "user", "content": "Hi"},
                           {"role": "assistant", "content": "Hello"}]}  # fmt: skip
    line = orjson.dumps(record) + b"\n"
    fit = TemplateFit.probed(load_template("chatml").template, Reading())
    fields = export_fields("messages", Filters(), chat=template_chat(HF), template=True)
    for size, fits in ((len(line), False), (4 * len(line), True)):
        slots = Slots(1, size)
        try:
            templated._start(fit, LineMaking(fields, None, HF, ()), (slots.name, size))
            slot = slots.put(line)
            assert slot is not None
            made = templated._made_in("messages", slot, len(line))
            expected = templated._made("messages", line).lines
            assert made.kept == 1
            assert len(expected[0]) > len(line)
            if fits:
                assert made.lines == []
                assert slots.take(slot, made.given or 0) == expected[0]
            else:
                assert made.given is None
                assert made.lines == expected
        finally:
            templated._SLOTS = None
            slots.close()
