"""What the trainer tests share: a corpus made by ``rl-export replay``, its exports made by
``rl-export export``, and a tiny chat model built here (no model can be downloaded).

- The corpus: comparisons between some of them (the ``comparisons`` source's preference
  export), conversations of ``tests/records.py`` (a system prompt, two user turns, a tool
  call with its result, text parts, null content, unicode) and a slice of the embedded stack's
  synthetic traffic, through the real join and sink (``replay``), then exported by the CLI as
  a user would.
- The tokenizer: a byte-level BPE trained on the corpus's own text (every byte has a token, so
  nothing is unknown), with the special tokens of Qwen's chat templates, wrapped in
  ``PreTrainedTokenizerFast``, its chat template taken from the ``trl`` wheel
  (``trl/chat_templates/``, the templates TRL ships for real models).
- The model: a Qwen2 causal LM with hidden size 16 and 2 layers, random weights, on CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rl_export.model.codec import dumps
from tests.factories import event
from tests.records import trace_events

# transformers uses the `kernels` package's hub kernels when it is installed (dev's newer
# transformers brings it): they are downloaded from the hub, which is out of reach here.
os.environ.setdefault("USE_HUB_KERNELS", "NO")

ORG, PROJECT = "acme", "bot"
QWEN_SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
]  # fmt: skip


def rl_export(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI, as a user runs it; fails the test with its stderr on a non-zero exit."""
    result = subprocess.run(
        [sys.executable, "-m", "rl_export.cli", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result


def corpus_events() -> list[dict[str, Any]]:
    """Traces of every kind the exports meet: passed and failed, a failed second turn (masks),
    scores far enough apart to pair, two scenarios."""
    from rl_export.local.synthetic import generate

    failed_second_turn = [{"type": "goal_met", "turn": 2, "decision": False}]
    events: list[dict[str, Any]] = []
    for n in range(1, 9):
        passed = n % 2 == 0
        events += trace_events(
            n, score=0.1 * n, passed=passed, minute=n,
            outcomes=None if passed else failed_second_turn,
            scenario="refund" if n <= 6 else "shipping",
        )  # fmt: skip
    # Comparisons (DESIGN.md section 12) of neighbours: the later trace preferred.
    events += [
        event("label.compared", f"cmp-{n}", f"2026-01-01T01:{n:02d}:00Z",
              trace_id=f"tr-{n:03d}", trace_a=f"tr-{n:03d}", trace_b=f"tr-{n + 1:03d}",
              labeler="ana", choice="b", strength=1 + n % 3)
        for n in range(1, 8)
    ]  # fmt: skip
    return events + list(generate(24, seed=7))


@dataclass(frozen=True)
class Exports:
    """The corpus's store and its export files (one per format)."""

    store: Path
    files: dict[str, Path]

    def rows(self, fmt: str) -> list[dict[str, Any]]:
        lines = self.files[fmt].read_text().splitlines()
        return [json.loads(line) for line in lines]


EXPORTS = {
    "messages": ["--format", "messages", "--mask-failed-turns"],
    "prompt_completion": ["--format", "prompt_completion"],
    "preference": ["--format", "preference"],
    "kto": ["--format", "kto"],
    "rl_prompts": ["--format", "rl_prompts"],
}


@pytest.fixture(scope="session")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Exports:
    root = tmp_path_factory.mktemp("corpus")
    events = root / "events.jsonl"
    events.write_bytes(b"".join(dumps(e) + b"\n" for e in corpus_events()))
    store = root / "store"
    rl_export("replay", str(events), "--store", str(store))
    files: dict[str, Path] = {}
    for fmt, flags in EXPORTS.items():
        files[fmt] = root / (f"{fmt}.parquet" if fmt == "rl_prompts" else f"{fmt}.jsonl")
        rl_export("export", "--store", str(store), "--org", ORG, "--project", PROJECT,
                  "--source", "evaluator", *flags, "-o", str(files[fmt]))  # fmt: skip
    files["comparisons"] = root / "comparisons.jsonl"
    rl_export("export", "--store", str(store), "--org", ORG, "--project", PROJECT,
              "--source", "comparisons", "--format", "preference", "-o",
              str(files["comparisons"]))  # fmt: skip
    files["events"] = events
    return Exports(store, files)


def chat_template(name: str) -> str:
    """A chat template as the ``trl`` wheel ships it."""
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text()


def _corpus_text(exports: Exports) -> Iterator[str]:
    yield exports.files["events"].read_text()
    yield exports.files["messages"].read_text()


@pytest.fixture(scope="session")
def tokenizer(exports: Exports) -> Any:
    """A byte-level BPE trained on the corpus's text, with Qwen 2.5's chat template (it refuses
    content that is not a string: the default chat style must give it strings)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=QWEN_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )  # fmt: skip
    bpe.train_from_iterator(_corpus_text(exports), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=QWEN_SPECIAL[3:],
    )  # fmt: skip
    wrapped.chat_template = chat_template("qwen2_5")
    return wrapped


@pytest.fixture(scope="session")
def model(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Qwen2 (hidden size 16, 2 layers, seeded random weights) saved with the tokenizer,
    as a model folder: trainers load it by path as they would a hub name (DPO and KTO load
    their reference model from it too)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None, tie_word_embeddings=True,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("tiny-qwen2")
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
