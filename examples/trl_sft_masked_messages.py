"""TRL's ``SFTTrainer`` on a masked ``messages`` corpus, read through ``rl_export.hf``.

The corpus (an ``RL_EXPORT_CORPORA`` spec such as ``{"name": "sft-masked", "source":
"evaluator", "format": "messages", "mask_failed_turns": true}``) puts a ``weight`` on every
assistant message: 0 in a turn an evaluator failed, else 1 (OpenAI's convention). TRL does
not read ``weight``; it reads a pre-tokenized row's ``completion_mask`` (the tokens the loss
counts). :func:`weighted_tokens` turns one into the other: it renders the conversation with
the model's chat template one message at a time, and counts the tokens of an assistant
message with weight 1 and nothing else. Everything up to TRL's collator is that function
and :func:`sft_rows`; ``tests/unit/test_example_trl.py`` runs them on a real corpus.

Run it (a CPU is enough for a tiny model; ``trl`` brings ``torch`` and ``transformers``)::

    pip install 'rl-export[hf]' trl
    python examples/trl_sft_masked_messages.py --store s3://bucket/rl-export \\
        --org acme --project support-bot --corpus sft-masked --model <a small chat model>

``--follow`` keeps training on new commits as the corpora grow (``--max-steps`` ends it).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

Render = Callable[[list[dict[str, Any]]], str]
"""The chat template: messages -> text (``tokenizer.apply_chat_template(m, tokenize=False)``)."""
Encode = Callable[[str], list[int]]
"""Text -> token ids, without special tokens (``tokenizer(t, add_special_tokens=False)``)."""


def weighted_tokens(
    messages: list[dict[str, Any]], render: Render, encode: Encode
) -> dict[str, list[int]]:
    """``{input_ids, completion_mask}`` of a conversation: the mask is 1 on the tokens of
    assistant messages whose ``weight`` is 1 (no weight counts as 1), 0 elsewhere.

    Each message's tokens are those its text adds to the rendering of the messages before
    it; a chat template that renders a prefix differently raises ValueError (the mask would
    not line up with the text)."""
    input_ids: list[int] = []
    mask: list[int] = []
    before = ""
    for n, message in enumerate(messages):
        text = render(messages[: n + 1])
        if not text.startswith(before):
            raise ValueError(f"the chat template renders message {n} in a way that changes "
                             f"what came before it")  # fmt: skip
        ids = encode(text[len(before) :])
        learn = message.get("role") == "assistant" and message.get("weight", 1) == 1
        input_ids += ids
        mask += [1 if learn else 0] * len(ids)
        before = text
    return {"input_ids": input_ids, "completion_mask": mask}


def sft_rows(dataset: Any, render: Render, encode: Encode) -> Any:
    """The dataset's ``messages`` rows as TRL's pre-tokenized rows (a lazy ``map``)."""
    return dataset.map(
        lambda row: weighted_tokens(row["messages"], render, encode),
        remove_columns=["trace_id", "revision", "messages"],
    )


def main(argv: Sequence[str] | None = None) -> None:  # pragma: no cover - needs trl and torch
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--org", required=True)
    parser.add_argument("--project", required=True)
    parser.add_argument("--corpus", required=True, help="a messages corpus with masks")
    parser.add_argument("--model", required=True, help="a causal LM with a chat template")
    parser.add_argument("--max-steps", type=int, default=100)
    parser.add_argument("--follow", action="store_true", help="train on new commits too")
    parser.add_argument("--output-dir", default="sft-out")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from rl_export.hf import corpus_dataset

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    dataset = corpus_dataset(args.store, args.org, args.project, args.corpus, follow=args.follow)
    rows = sft_rows(
        dataset,
        lambda m: tokenizer.apply_chat_template(m, tokenize=False),
        lambda t: tokenizer(t, add_special_tokens=False)["input_ids"],
    )
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(args.model),
        args=SFTConfig(
            output_dir=args.output_dir,
            max_steps=args.max_steps,  # an IterableDataset has no length
            per_device_train_batch_size=2,
            completion_only_loss=True,  # the loss counts completion_mask's tokens only
            use_cpu=True,
        ),
        train_dataset=rows,
        processing_class=tokenizer,
    )
    trainer.train()


if __name__ == "__main__":  # pragma: no cover
    main()
