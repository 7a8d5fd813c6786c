"""What a pool process is sent and does for rows made for a chat template (issue 55): whole
lines cut into chunks at line ends, and a chunk's rows made from its lines, a line that is
not a record named with its corpus."""

from __future__ import annotations

import itertools
from typing import Any

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
    records: list[dict[str, Any]] = [
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
            slot = slots.put([line])
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


async def test_chunks_hold_short_blocks_together_and_cut_long_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The view's blocks go to the pool in chunks of about CHUNK_BYTES: short blocks (and
    the empty view after an object) together, a long block cut at line ends; every byte
    once, in order, each piece whole lines."""
    monkeypatch.setattr(templated, "CHUNK_BYTES", 40)
    lines = [b'{"n":%d}\n' % n for n in range(60)]  # 9 or 10 bytes
    sizes = [1, 0, 2, 1, 12, 0, 3, 1, 1, 30, 2, 1, 6]  # lines per block
    blocks, at = [], 0
    for size in sizes:
        blocks.append(memoryview(b"".join(lines[at : at + size])))
        at += size

    class View:  # the part of a Scan line_chunks reads
        filters, select, collect_rules = Filters(), None, False

        async def raw(self) -> Any:
            for block in blocks:
                yield block, 0

    chunks = [chunk async for chunk in templated.line_chunks(View())]  # type: ignore[arg-type]
    assert b"".join(b"".join(chunk) for chunk in chunks) == b"".join(lines[:at])
    assert all(bytes(piece).endswith(b"\n") for chunk in chunks for piece in chunk)
    # a chunk holds at most CHUNK_BYTES, or one piece cut at the first line end past it
    assert all(sum(map(len, chunk)) <= 40 or len(chunk) == 1 for chunk in chunks)
    assert all(len(piece) < 40 + 10 for chunk in chunks for piece in chunk)
    # short blocks together: a chunk ends only where the next piece would not fit
    for chunk, after in itertools.pairwise(chunks):
        assert sum(map(len, chunk)) + len(after[0]) > 40
    assert max(len(chunk) for chunk in chunks) > 1
