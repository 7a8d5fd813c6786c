"""Tokenising conversational rows for SFT, with masks that trainers honour
(docs/guides/exports.md, turns and per-turn masks; served as ``rl_export.hf.tokenize_for_sft``).

A masked ``messages`` row gives each assistant message a ``weight`` (0: a failed turn). TRL's
``SFTTrainer`` takes pre-tokenised rows and builds its labels from ``assistant_masks``;
:func:`tokenize_for_sft` makes those rows: it renders each conversation once, whole, with a
chat template whose ``{% generation %}`` blocks mark assistant output (TRL ships one per
model family in ``trl/chat_templates/``), takes the n-th block as the n-th assistant message,
and sets the mask to 1 on the tokens of the blocks of weight-1 messages. No prefix is
rendered on its own, so templates that render history differently as a conversation grows
(Qwen 3 drops earlier reasoning) are masked as they render the whole conversation.
``transformers`` is an optional dependency, imported only when a row is tokenised.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import partial
from typing import Any

SFT_COLUMNS = ("input_ids", "attention_mask", "assistant_masks")
"""What :func:`tokenize_for_sft` yields: TRL's ``SFTTrainer`` takes a dataset with
``input_ids`` as pre-tokenised, and always builds its labels from ``assistant_masks`` (-100
where the mask is 0), with or without ``assistant_only_loss``."""
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


def _conversation(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A row's conversation: ``messages``, or a ``prompt`` followed by its ``completion``."""
    if isinstance(row.get("messages"), list):
        return list(row["messages"])
    if isinstance(row.get("prompt"), list) and isinstance(row.get("completion"), list):
        return [*row["prompt"], *row["completion"]]
    raise ValueError(
        "tokenize_for_sft needs conversational rows: a 'messages' list, or 'prompt' and "
        f"'completion' lists; this row has {sorted(row)}"
    )


def learned_spans(
    messages: list[dict[str, Any]],
    blocks: list[tuple[int, int]],
    *,
    mask_failed_turns: bool,
) -> list[tuple[int, int]]:
    """The character spans of the rendered conversation the loss counts: the ``{% generation
    %}`` blocks of the assistant messages, in order, less those of weight 0 (with
    ``mask_failed_turns``). ValueError when the blocks are not one per assistant message."""
    assistants = [m for m in messages if m.get("role") == "assistant"]
    if len(blocks) != len(assistants):
        raise ValueError(
            f"the chat template rendered {len(blocks)} generation blocks for "
            f"{len(assistants)} assistant messages: each assistant message must be in one "
            "{% generation %} block"
        )
    return [
        block
        for block, message in zip(blocks, assistants, strict=True)
        if not (mask_failed_turns and message.get("weight", 1) == 0)
    ]


def span_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """1 for each token (its character offsets) that starts inside one of ``spans``."""
    mask = []
    for start, end in offsets:
        inside = end > start and any(lo <= start < hi for lo, hi in spans)
        mask.append(1 if inside else 0)
    return mask


def tokenize_row(
    row: Mapping[str, Any],
    tokenizer: Any,
    *,
    chat_template: str,
    mask_failed_turns: bool = True,
) -> dict[str, list[int]]:
    """One conversational row as ``input_ids``, ``attention_mask`` and ``assistant_masks``
    (see :func:`tokenize_for_sft`)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = _conversation(row)
    # Annotated as returning the text, it returns (texts, generation blocks per text) here.
    result: Any = render_jinja_template(
        conversations=[messages], chat_template=chat_template,
        return_assistant_tokens_mask=True, **tokenizer.special_tokens_map,
    )  # fmt: skip
    rendered, indices = result
    text = rendered[0]
    spans = learned_spans(messages, indices[0], mask_failed_turns=mask_failed_turns)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(encoded["input_ids"])
    return {
        "input_ids": ids,
        "attention_mask": [1] * len(ids),
        "assistant_masks": span_mask([tuple(o) for o in encoded["offset_mapping"]], spans),
    }


def tokenize_for_sft(
    dataset: Any,
    tokenizer: Any,
    *,
    mask_failed_turns: bool = True,
    chat_template: str | None = None,
) -> Any:
    """A conversational dataset (``messages`` rows, or ``prompt_completion`` rows) tokenised
    for TRL's ``SFTTrainer``: ``input_ids``, ``attention_mask`` and ``assistant_masks``, in
    which only the tokens of assistant messages count (1), less those of assistant messages
    with ``weight`` 0 when ``mask_failed_turns`` (``--mask-failed-turns`` exports and
    corpora); every other column is dropped. A lazy ``map`` for an ``IterableDataset``.

    How the tokens of each assistant message are found: the whole conversation is rendered
    once, with a chat template that marks assistant output with ``{% generation %}`` blocks
    (TRL ships one per model family, e.g. ``trl/chat_templates/qwen3_training.jinja``), and
    the n-th block is the n-th assistant message. Nothing is rendered twice, so a template
    that renders earlier messages differently as the conversation grows (Qwen 3 drops earlier
    reasoning) is tokenised exactly as it renders the whole conversation. ``chat_template``
    defaults to the tokenizer's; a template without ``{% generation %}`` is a ValueError.
    """
    template = chat_template if chat_template is not None else tokenizer.chat_template
    if not isinstance(template, str) or not _GENERATION.search(template):
        raise ValueError(
            "tokenize_for_sft needs a chat template that marks assistant output with "
            "{% generation %} blocks: pass chat_template= (TRL ships one for each model family "
            "in trl/chat_templates/, e.g. qwen3_training.jinja, llama3_training.jinja)"
        )
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("tokenize_for_sft needs a fast tokenizer (character offsets)")
    tokenized = dataset.map(
        partial(tokenize_row, tokenizer=tokenizer, chat_template=template,
                mask_failed_turns=mask_failed_turns),
    )  # fmt: skip
    return tokenized.select_columns(list(SFT_COLUMNS))
