"""``rl_export.hf.tokenize_for_sft``: per-turn masks that TRL's ``SFTTrainer`` honours.

The masked ``messages`` export (``--mask-failed-turns``) puts ``weight: 0`` on the reply of a
failed second turn. Tokenised with TRL's Qwen 3 training template, only the tokens of
weight-1 assistant messages are in ``assistant_masks``; SFTTrainer turns every other token's
label into -100, and the loss does not move when a masked token is changed."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from rl_export.hf import SFT_COLUMNS, tokenize_for_sft, tokenize_row
from tests.trainers.conftest import Exports, chat_template
from tests.trainers.test_trl import common, load, train


@pytest.fixture(scope="module")
def template() -> str:
    return chat_template("qwen3_training")


def learned(tokenizer: Any, row: dict[str, list[int]]) -> str:
    ids = [t for t, m in zip(row["input_ids"], row["assistant_masks"], strict=True) if m]
    return str(tokenizer.decode(ids))


def test_only_weight_one_assistant_messages_are_learned(
    exports: Exports, tokenizer: Any, template: str
) -> None:
    rows = exports.rows("messages")
    tokenized = list(tokenize_for_sft(load(exports.files["messages"]), tokenizer,
                                      chat_template=template))  # fmt: skip
    assert len(tokenized) == len(rows)
    weights_seen = set()
    for source, row in zip(rows, tokenized, strict=True):
        assert set(row) == set(SFT_COLUMNS)
        assert len(row["input_ids"]) == len(row["attention_mask"]) == len(row["assistant_masks"])
        text = learned(tokenizer, row)
        for message in source["messages"]:
            content = message["content"]
            if message["role"] == "assistant" and content:
                weights_seen.add(message["weight"])
                assert (content in text) == (message["weight"] == 1), (content, text)
            elif content:  # system, user and tool messages are never learned
                assert content not in text
    assert weights_seen == {0, 1}
    unmasked = list(tokenize_for_sft(load(exports.files["messages"]), tokenizer,
                                     chat_template=template, mask_failed_turns=False))  # fmt: skip
    for source, row in zip(rows, unmasked, strict=True):
        text = learned(tokenizer, row)
        assert all(m["content"] in text for m in source["messages"] if m["role"] == "assistant")


def test_a_template_that_rewrites_history_is_masked_as_it_renders(tokenizer: Any) -> None:
    """Like Qwen 3, this template drops the reasoning of every assistant message but the last:
    rendering prefixes and diffing would misplace the spans; one render of the whole
    conversation does not."""
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'assistant' %}{% generation %}"
        "{% if loop.last %}<think>{{ m.reasoning_content }}</think>{% endif %}"
        "{{ m.content }}<|im_end|>{% endgeneration %}\n"
        "{% else %}{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    )
    messages = [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer", "reasoning_content": "early thought",
         "weight": 0},
        {"role": "user", "content": "second question"},
        {"role": "assistant", "content": "second answer", "reasoning_content": "late thought",
         "weight": 1},
    ]  # fmt: skip
    row = tokenize_row({"messages": messages}, tokenizer, chat_template=template)
    assert "early thought" not in tokenizer.decode(row["input_ids"])
    text = learned(tokenizer, row)
    assert "second answer" in text
    assert "late thought" in text
    assert "first answer" not in text
    assert "question" not in text


def test_a_template_without_generation_blocks_is_masked_from_its_prefixes(
    exports: Exports, tokenizer: Any
) -> None:
    """Qwen 2.5's template (the tokenizer's: no blocks) gives, from prefixes of each
    conversation, the tokens TRL's training copy of it gives from its blocks, but for the
    newlines around them (TRL's blocks also hold the header's newline and the one after
    <|im_end|>, which the model never writes)."""
    dataset = load(exports.files["messages"])
    plain = list(tokenize_for_sft(dataset, tokenizer))
    blocks = list(tokenize_for_sft(dataset, tokenizer,
                                   chat_template=chat_template("qwen2_5_training")))  # fmt: skip
    assert len(plain) == len(blocks) == len(dataset)
    for ours, theirs in zip(plain, blocks, strict=True):
        assert ours["input_ids"] == theirs["input_ids"]
        assert "".join(learned(tokenizer, ours).split()) == "".join(
            learned(tokenizer, theirs).split()
        )
    assert any(0 in row["assistant_masks"] and 1 in row["assistant_masks"] for row in plain)


def test_a_template_that_appends_a_turn_cannot_be_masked_from_prefixes(
    tokenizer: Any,
) -> None:
    appends = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}<|im_start|>assistant\n"
    )
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    with pytest.raises(ValueError, match="cannot be found from prefixes"):
        tokenize_row({"messages": messages}, tokenizer, chat_template=appends)


def test_sft_trainer_honours_the_masks(
    exports: Exports, tokenizer: Any, model: str, template: str, tmp_path: Path
) -> None:
    import torch
    from trl import SFTConfig, SFTTrainer

    rows = tokenize_for_sft(load(exports.files["messages"]), tokenizer, chat_template=template)
    trainer = SFTTrainer(
        model=model, args=SFTConfig(**common(tmp_path), max_length=4096),
        train_dataset=rows, processing_class=tokenizer,
    )  # fmt: skip
    # TRL's labels: the token where assistant_masks is 1, -100 everywhere else.
    prepared = list(trainer.train_dataset)
    for source, example in zip(rows, prepared, strict=True):
        pairs = zip(source["input_ids"], source["assistant_masks"], strict=True)
        expected = [t if m else -100 for t, m in pairs]
        assert example["labels"] == expected

    def loss(example: dict[str, Any]) -> float:
        batch = trainer.data_collator([example])
        with torch.no_grad():
            return float(trainer.model(**batch).loss)

    # A row whose last message is a masked reply: changing its tokens cannot change the loss
    # (nothing learned comes after them), changing a learned token does.
    n, example = next((n, e) for n, e in enumerate(prepared) if e["labels"][-1] == -100
                      and 0 in rows[n]["assistant_masks"][-8:])  # fmt: skip
    masks = rows[n]["assistant_masks"]
    tail = max(i for i, m in enumerate(masks) if m) + 1
    other = tokenizer.convert_tokens_to_ids("<tool_call>")

    def changed(positions: list[int]) -> dict[str, Any]:
        ids = list(example["input_ids"])
        for i in positions:
            ids[i] = other
        return {**example, "input_ids": ids}

    base = loss(example)
    assert math.isfinite(base)
    assert loss(changed(list(range(tail, len(masks))))) == base
    first_learned = masks.index(1)
    assert loss(changed([first_learned])) != base
    train(trainer)
