"""The data path of ``examples/trl_sft_masked_messages.py`` up to TRL's collator: a masked
``messages`` corpus (written by replay through the join and the sink) read through
``rl_export.hf`` and turned into TRL's pre-tokenised rows, ``input_ids``, ``attention_mask``
and ``assistant_masks``. Torch and TRL are not needed here (``tests/trainers/`` trains): the
chat template is a ChatML template with ``{% generation %}`` blocks, the tokenizer a
byte-level one built here (a token per UTF-8 byte), which lets every learned span be read
back as text."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rl_export.corpora.replay import replay
from rl_export.corpora.store import LocalStore
from rl_export.formats.specs import CorpusSpec
from rl_export.hf import corpus_dataset
from rl_export.model.codec import dumps
from rl_export.runtime.settings import load_settings
from tests.records import trace_events

EXAMPLE = Path(__file__).parents[2] / "examples" / "trl_sft_masked_messages.py"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
    "{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}<|im_end|>{% endgeneration %}"
    "{% else %}{{ m.content }}<|im_end|>{% endif %}\n{% endfor %}"
)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """A byte-level tokenizer: one token per byte, so decoding any span gives its text."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: n for n, c in enumerate(sorted(alphabet))}
    vocab |= {"<|im_start|>": len(vocab), "<|im_end|>": len(vocab) + 1}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    wrapped = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>",
                                      additional_special_tokens=["<|im_start|>"])  # fmt: skip
    wrapped.chat_template = CHATML
    return wrapped


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trl_sft_masked_messages", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def learned(tokenizer: Any, row: dict[str, list[int]]) -> str:
    """The text of the tokens the loss counts."""
    kept = [t for t, m in zip(row["input_ids"], row["assistant_masks"], strict=True) if m]
    return str(tokenizer.decode(kept))


async def test_masked_corpus_rows_become_trls_assistant_masks(
    example: ModuleType, tokenizer: Any, tmp_path: Path
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
        return list(dataset), list(example.sft_rows(dataset, tokenizer, CHATML))

    corpus, rows = await asyncio.to_thread(run)
    assert len(rows) == len(corpus) == 2
    for source, row in zip(corpus, rows, strict=True):
        assert set(row) == {"input_ids", "attention_mask", "assistant_masks"}
        assert len(row["input_ids"]) == len(row["assistant_masks"])
        rendered = tokenizer.apply_chat_template(source["messages"], tokenize=False)
        assert tokenizer.decode(row["input_ids"]) == rendered
        # The learned text is exactly the weight-1 assistant messages, as rendered in place.
        for message in source["messages"]:
            if message["role"] == "assistant" and message["content"]:
                assert (message["content"] in learned(tokenizer, row)) == (message["weight"] == 1)
    failed = next(r for s, r in zip(corpus, rows, strict=True) if s["trace_id"] == "tr-001")
    passed = next(r for s, r in zip(corpus, rows, strict=True) if s["trace_id"] == "tr-002")
    assert "No, all set" not in learned(tokenizer, failed)  # the failed second turn's reply
    assert "re-shipped it" in learned(tokenizer, failed)  # the first turn's reply still counts
    assert "lookup_order" in learned(tokenizer, failed)  # a tool call is the model's output
    assert "No, all set" in learned(tokenizer, passed)
    assert "My order" not in learned(tokenizer, passed)  # user turns never count
    assert '"status"' not in learned(tokenizer, passed)  # nor tool results


def test_a_template_without_generation_blocks_is_masked_from_its_prefixes(
    example: ModuleType, tokenizer: Any
) -> None:
    """The same ChatML without its blocks (and with a generation prompt, which says where a
    reply starts): each reply's span found from prefixes of the render, the same tokens
    learned (issue 55)."""
    plain = CHATML.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    plain += "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    messages = [
        {"role": "user", "content": "Refund order 7?"},
        {"role": "assistant", "content": "Done.", "weight": 1},
        {"role": "user", "content": "Thanks"},
        {"role": "assistant", "content": "Anything else?", "weight": 0},
    ]
    from datasets import Dataset

    dataset = Dataset.from_list([{"messages": messages}])
    (marked,) = example.sft_rows(dataset, tokenizer, CHATML)
    (found,) = example.sft_rows(dataset, tokenizer, plain)
    assert found == marked
    assert learned(tokenizer, found) == "Done.<|im_end|>"
