"""TRL's ``SFTTrainer`` on a masked ``messages`` corpus, read through ``rl_export.hf``.

The corpus (an ``RL_EXPORT_CORPORA`` spec such as ``{"name": "sft-masked", "source":
"evaluator", "format": "messages", "mask_failed_turns": true}``) puts a ``weight`` on every
assistant message: 0 in a turn an evaluator failed, else 1 (OpenAI's convention). TRL does
not read ``weight``; its ``SFTTrainer`` takes pre-tokenised rows and builds its labels from
their ``assistant_masks`` (-100 where the mask is 0). :func:`rl_export.hf.tokenize_for_sft`
turns one into the other: it renders each conversation with the chat template, finds each
assistant message in the render (from the template's ``{% generation %}`` blocks, as TRL's
``trl/chat_templates/qwen3_training.jinja`` has them, or from prefixes of the conversation
for a template without them) and sets the mask to 1 on exactly the tokens of assistant
messages with weight 1. ``tests/unit/test_example_trl.py`` runs
:func:`sft_rows` on a real corpus; ``tests/trainers/test_masks.py`` trains on such rows.

Run it (a CPU is enough for a tiny model; ``trl`` brings ``torch`` and ``transformers``)::

    pip install 'rl-export[hf]' trl
    python examples/trl_sft_masked_messages.py --store s3://bucket/rl-export \\
        --org acme --project support-bot --corpus sft-masked --model <a small chat model> \\
        --chat-template qwen3_training

``--follow`` keeps training on new commits as the corpora grow (``--max-steps`` ends it).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl_export.hf import tokenize_for_sft


def sft_rows(dataset: Any, tokenizer: Any, chat_template: str) -> Any:
    """The dataset's ``messages`` rows as TRL's pre-tokenised rows (a lazy ``map``):
    ``input_ids``, ``attention_mask`` and ``assistant_masks``."""
    return tokenize_for_sft(dataset, tokenizer, chat_template=chat_template)


def read_template(name: str) -> str:
    """A template file, or the name of one that the ``trl`` wheel ships."""
    if Path(name).is_file():
        return Path(name).read_text()
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text()


def main(argv: Sequence[str] | None = None) -> None:  # pragma: no cover - needs trl and torch
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--org", required=True)
    parser.add_argument("--project", required=True)
    parser.add_argument("--corpus", required=True, help="a messages corpus with masks")
    parser.add_argument("--model", required=True, help="a causal LM with a chat template")
    parser.add_argument(
        "--chat-template",
        required=True,
        help="a chat template (with {% generation %} blocks or not): a file, or the name of one in "
        "trl/chat_templates/ (qwen3_training, llama3_training, ...)",
    )
    parser.add_argument("--max-steps", type=int, default=100)
    parser.add_argument("--follow", action="store_true", help="train on new commits too")
    parser.add_argument("--output-dir", default="sft-out")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from rl_export.hf import corpus_dataset

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    dataset = corpus_dataset(args.store, args.org, args.project, args.corpus, follow=args.follow)
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(args.model),
        args=SFTConfig(
            output_dir=args.output_dir,
            max_steps=args.max_steps,  # an IterableDataset has no length
            per_device_train_batch_size=2,
            use_cpu=True,
        ),
        train_dataset=sft_rows(dataset, tokenizer, read_template(args.chat_template)),
        processing_class=tokenizer,
    )
    trainer.train()


if __name__ == "__main__":  # pragma: no cover
    main()
