"""Tokenising conversational rows for SFT, with masks that trainers honour
(docs/guides/exports.md, turns and per-turn masks; served as ``rl_export.hf.tokenize_for_sft``).

A masked ``messages`` row gives each assistant message a ``weight`` (0: a failed turn). TRL's
``SFTTrainer`` takes pre-tokenised rows and builds its labels from ``assistant_masks``;
:func:`tokenize_for_sft` makes those rows. The conversation is rendered with the chat
template as transformers renders it (:mod:`rl_export.formats.templating`: the same sandbox
and variables, the tokenizer's special tokens, the row's ``tools``), and each assistant
message's characters are found in the render:

- a template with ``{% generation %}`` blocks (TRL ships one per model family in
  ``trl/chat_templates/``, ``rl-export template mark`` makes one from any other) marks them:
  the *n*-th block is the *n*-th assistant message. The whole conversation is rendered once,
  so a template that renders earlier messages differently as the conversation grows (Qwen 3
  drops earlier reasoning) is masked as it renders the whole conversation;
- a template without blocks is rendered for each assistant message's prefixes
  (:func:`~rl_export.formats.masks.prefix_spans`), each checked to be preserved as the
  beginning of the whole render; a row for which one is not is a ValueError that says so.

The mask is 1 on the tokens that overlap the spans of weight-1 messages (transformers' rule).
``transformers`` is an optional dependency, needed only for the tokenizer.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import orjson

from rl_export.formats.masks import prefix_spans
from rl_export.formats.templating import ChatTemplate, without_nulls

SFT_COLUMNS = ("input_ids", "attention_mask", "assistant_masks")
"""What :func:`tokenize_for_sft` yields: TRL's ``SFTTrainer`` takes a dataset with
``input_ids`` as pre-tokenised, and always builds its labels from ``assistant_masks`` (-100
where the mask is 0), with or without ``assistant_only_loss``."""


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


def _tools(row: Mapping[str, Any]) -> Any:
    """A row's ``tools``: a list, or JSON text (an export made for a chat template)."""
    tools = row.get("tools")
    return orjson.loads(tools) if isinstance(tools, str) else tools


def assistant_spans(
    template: ChatTemplate, messages: list[Any], tools: Any = None
) -> tuple[str, list[tuple[int, int]]]:
    """The conversation rendered, and the character span of each assistant message in it,
    in order (the module: from the ``{% generation %}`` blocks, else from prefixes)."""
    if template.has_generation:
        return template.render_blocks(messages, tools)
    return prefix_spans(template, messages, tools)


def learned_spans(
    messages: list[dict[str, Any]],
    blocks: list[tuple[int, int]],
    *,
    mask_failed_turns: bool,
) -> list[tuple[int, int]]:
    """The character spans of the rendered conversation the loss counts: the assistant
    messages' spans, in order, less those of weight 0 (with ``mask_failed_turns``).
    ValueError when the spans are not one per assistant message."""
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
    """1 for each token (its character offsets) that overlaps one of ``spans`` (transformers'
    rule for ``return_assistant_tokens_mask``: a token cut by a span's edge is learned)."""
    mask = []
    for start, end in offsets:
        inside = end > start and any(start < hi and end > lo for lo, hi in spans)
        mask.append(1 if inside else 0)
    return mask


def _template(chat_template: str | ChatTemplate, tokenizer: Any) -> ChatTemplate:
    if isinstance(chat_template, ChatTemplate):
        return chat_template
    return ChatTemplate(chat_template, "chat_template", tokenizer.special_tokens_map)


def tokenize_row(
    row: Mapping[str, Any],
    tokenizer: Any,
    *,
    chat_template: str | ChatTemplate,
    mask_failed_turns: bool = True,
) -> dict[str, list[int]]:
    """One conversational row as ``input_ids``, ``attention_mask`` and ``assistant_masks``
    (see :func:`tokenize_for_sft`)."""
    template = _template(chat_template, tokenizer)
    # What transformers >= 5.25 does (a dataset's Arrow rows have a null for each key a
    # message lacks).
    messages = without_nulls(_conversation(row))
    text, found = assistant_spans(template, messages, _tools(row))
    spans = learned_spans(messages, found, mask_failed_turns=mask_failed_turns)
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

    How the characters of each assistant message are found (the module): from the
    template's ``{% generation %}`` blocks, else from prefixes of the conversation, each
    checked to render as the beginning of the whole (a row for which one does not is a
    ValueError when it is tokenised). ``chat_template`` defaults to the tokenizer's.
    """
    given = chat_template if chat_template is not None else tokenizer.chat_template
    if not isinstance(given, str):
        raise ValueError("tokenize_for_sft needs a chat template: pass chat_template= (or "
                         "give the tokenizer one)")  # fmt: skip
    template = _template(given, tokenizer)
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("tokenize_for_sft needs a fast tokenizer (character offsets)")
    tokenized = dataset.map(
        partial(tokenize_row, tokenizer=tokenizer, chat_template=template,
                mask_failed_turns=mask_failed_turns),
    )  # fmt: skip
    return tokenized.select_columns(list(SFT_COLUMNS))
