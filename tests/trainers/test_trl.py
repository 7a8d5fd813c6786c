"""TRL's trainers on the exports as a user loads them (``load_dataset("json", ...)``), a few
steps each on the tiny model of the conftest: each must train (finite losses, the weights
move) with no fix-up code between the export file and the trainer."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from tests.trainers.conftest import Exports

STEPS = 3


def load(path: Path) -> Any:
    from datasets import load_dataset

    return load_dataset("json", data_files=str(path), split="train")


def train(trainer: Any) -> None:
    """Train, then check the trainer took its steps, every logged loss is a number, and the
    weights moved."""
    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    assert trainer.state.global_step == STEPS
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert losses, trainer.state.log_history
    assert all(math.isfinite(v) for v in losses), losses
    after = trainer.model.state_dict()
    assert any(not after[k].equal(v) for k, v in before.items())


def common(tmp_path: Path) -> dict[str, Any]:
    return {
        "output_dir": str(tmp_path / "out"),
        "max_steps": STEPS,
        "per_device_train_batch_size": 2,
        "learning_rate": 1e-2,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "dataloader_num_workers": 0,
    }


@pytest.mark.parametrize("fmt", ["messages", "prompt_completion"])
def test_sft_on_chat_exports(
    fmt: str, exports: Exports, tokenizer: Any, model: str, tmp_path: Path
) -> None:
    from trl import SFTConfig, SFTTrainer

    dataset = load(exports.files[fmt])
    assert len(dataset) > 0
    trainer = SFTTrainer(
        model=model, args=SFTConfig(**common(tmp_path), max_length=1024),
        train_dataset=dataset, processing_class=tokenizer,
    )  # fmt: skip
    train(trainer)


def test_dpo_on_preference(exports: Exports, tokenizer: Any, model: str, tmp_path: Path) -> None:
    from trl import DPOConfig, DPOTrainer

    dataset = load(exports.files["preference"])
    assert len(dataset) >= 2
    trainer = DPOTrainer(
        model=model, args=DPOConfig(**common(tmp_path), max_length=1024),
        train_dataset=dataset, processing_class=tokenizer,
    )  # fmt: skip
    train(trainer)


def test_dpo_on_the_preference_export_of_comparisons(
    exports: Exports, tokenizer: Any, model: str, tmp_path: Path
) -> None:
    from trl import DPOConfig, DPOTrainer

    dataset = load(exports.files["comparisons"])
    assert len(dataset) == 7  # every comparison of the conftest's corpus has a winner
    assert set(dataset["trace_chosen"]) == {f"tr-{n:03d}" for n in range(2, 9)}
    trainer = DPOTrainer(
        model=model, args=DPOConfig(**common(tmp_path), max_length=1024),
        train_dataset=dataset, processing_class=tokenizer,
    )  # fmt: skip
    train(trainer)


def test_kto_on_kto(exports: Exports, tokenizer: Any, model: str, tmp_path: Path) -> None:
    from trl import KTOConfig, KTOTrainer

    dataset = load(exports.files["kto"])
    assert set(dataset["label"]) == {True, False}
    trainer = KTOTrainer(
        model=model, args=KTOConfig(**common(tmp_path), max_length=1024),
        train_dataset=dataset, processing_class=tokenizer,
    )  # fmt: skip
    train(trainer)
