"""What a pool process is sent and does for rows made for a chat template (issue 55): whole
lines cut into chunks at line ends, and a chunk's rows made from its lines, a line that is
not a record named with its corpus."""

from __future__ import annotations

import orjson
import pytest

from rl_export.corpora.commits import ChainError
from rl_export.export import templated
from rl_export.export.lazy import export_fields
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
    assert all(piece.endswith(b"\n") and piece.count(b"\n") <= 2 for piece in pieces)
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
