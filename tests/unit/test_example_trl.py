"""The data path of ``examples/trl_sft_masked_messages.py`` up to TRL's collator: a masked
``messages`` corpus (written by replay through the join and the sink) read through
``rl_export.hf`` and turned into TRL's pre-tokenized rows, ``input_ids`` and
``completion_mask``. TRL and torch are not installed here (see the example's docstring): the
chat template is a real ChatML template rendered by Jinja2, the tokenizer a byte-level one
(a token per UTF-8 byte, as ByT5's), which lets every masked span be read back as text."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import jinja2
import pytest

from rl_export.common.codec import dumps
from rl_export.common.settings import load_settings
from rl_export.common.specs import CorpusSpec
from rl_export.corpora.replay import replay
from rl_export.corpora.store import LocalStore
from rl_export.hf import corpus_dataset
from tests.records import trace_events

EXAMPLE = Path(__file__).parents[2] / "examples" / "trl_sft_masked_messages.py"
# A chat template renders text for a tokenizer, not HTML: nothing to escape.
CHATML = jinja2.Environment(autoescape=False).from_string(
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.content is string %}{{ m.content }}"
    "{% elif m.content %}{% for part in m.content %}{{ part.text }}{% endfor %}{% endif %}"
    "{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}<|im_end|>\n{% endfor %}"
)


def render(messages: list[dict[str, Any]]) -> str:
    return CHATML.render(messages=messages)


def encode(text: str) -> list[int]:
    return list(text.encode())


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trl_sft_masked_messages", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def learned(row: dict[str, list[int]]) -> str:
    """The text of the tokens the loss counts."""
    kept = [t for t, m in zip(row["input_ids"], row["completion_mask"], strict=True) if m]
    return bytes(kept).decode()


async def test_masked_corpus_rows_become_trls_completion_masks(
    example: ModuleType, tmp_path: Path
) -> None:
    spec = CorpusSpec(name="sft-masked", source="evaluator", format="messages",
                      mask_failed_turns=True)  # fmt: skip
    settings = load_settings(partitions=4, shard_max_records=3, corpora=[spec])
    failed_second_turn = [{"type": "goal_met", "turn": 2, "decision": False}]
    events = trace_events(1, score=0.2, passed=False, outcomes=failed_second_turn)
    events += trace_events(2, score=0.9, passed=True, minute=1)
    await replay(settings, LocalStore(tmp_path),
                 [(f"e:{n}", dumps(e)) for n, e in enumerate(events)])  # fmt: skip

    def run() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        dataset = corpus_dataset(str(tmp_path), "acme", "bot", "sft-masked")
        return list(dataset), list(example.sft_rows(dataset, render, encode))

    corpus, rows = await asyncio.to_thread(run)
    assert len(rows) == len(corpus) == 2
    for source, row in zip(corpus, rows, strict=True):
        assert set(row) == {"input_ids", "completion_mask"}  # what TRL's collator reads
        assert len(row["input_ids"]) == len(row["completion_mask"])
        assert bytes(row["input_ids"]).decode() == render(source["messages"])
        messages = source["messages"]
        # The learned text is exactly the weight-1 assistant messages, rendered in place.
        expected = "".join(
            render(messages[: n + 1])[len(render(messages[:n])) :]
            for n, m in enumerate(messages) if m["role"] == "assistant" and m["weight"] == 1
        )  # fmt: skip
        assert learned(row) == expected
    failed = next(r for s, r in zip(corpus, rows, strict=True) if s["trace_id"] == "tr-001")
    passed = next(r for s, r in zip(corpus, rows, strict=True) if s["trace_id"] == "tr-002")
    assert "No, all set" not in learned(failed)  # the failed second turn's reply
    assert "re-shipped it" in learned(failed)  # the first turn's reply still counts
    assert "No, all set" in learned(passed)
    assert "My order" not in learned(passed)  # user turns never count


def test_a_template_that_rewrites_the_past_is_refused(example: ModuleType) -> None:
    def numbered(messages: list[dict[str, Any]]) -> str:  # the count changes every prefix
        return f"{len(messages)} messages: " + "|".join(str(m["content"]) for m in messages)

    with pytest.raises(ValueError, match="changes what came before it"):
        example.weighted_tokens(
            [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
            numbered, encode,
        )  # fmt: skip
