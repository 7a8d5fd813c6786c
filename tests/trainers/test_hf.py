"""``rl_export.hf.corpus_dataset`` straight into TRL's trainers: the default corpora (trajectory
records) rendered in a training format by the dataset itself, no ``select_columns``, no
``map``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rl_export.formats.filters import Filters
from rl_export.hf import corpus_dataset
from tests.trainers.conftest import ORG, PROJECT, Exports
from tests.trainers.test_trl import common, train


@pytest.mark.parametrize(
    "source", ["evaluator:messages", "traces:messages", "evaluator:prompt_completion"]
)
def test_default_corpus_into_sft_trainer(
    source: str, exports: Exports, tokenizer: Any, model: str, tmp_path: Path
) -> None:
    from trl import SFTConfig, SFTTrainer

    corpus, fmt = source.split(":")
    dataset = corpus_dataset(str(exports.store), ORG, PROJECT, corpus, format=fmt)
    trainer = SFTTrainer(
        model=model, args=SFTConfig(**common(tmp_path), max_length=1024),
        train_dataset=dataset, processing_class=tokenizer,
    )  # fmt: skip
    train(trainer)


def test_rows_are_the_exports_rows(exports: Exports) -> None:
    """The dataset renders with the export's code: the same rows as the export file."""
    store = str(exports.store)
    masked = corpus_dataset(store, ORG, PROJECT, "evaluator", format="messages",
                            mask_failed_turns=True)  # fmt: skip
    assert sorted(map(str, masked)) == sorted(map(str, exports.rows("messages")))
    kto = corpus_dataset(store, ORG, PROJECT, "evaluator", format="kto")
    assert sorted(map(str, kto)) == sorted(map(str, exports.rows("kto")))
    passed = list(corpus_dataset(store, ORG, PROJECT, "evaluator", format="kto",
                                 filters=Filters(passed=True)))  # fmt: skip
    assert passed
    assert all(row["label"] is True for row in passed)
    for row in corpus_dataset(store, ORG, PROJECT, "evaluator"):  # trajectory, schema 3
        assert "labels" not in row
        assert "human_labels" in row


def test_kto_trainer_on_the_dataset(
    exports: Exports, tokenizer: Any, model: str, tmp_path: Path
) -> None:
    from trl import KTOConfig, KTOTrainer

    dataset = corpus_dataset(str(exports.store), ORG, PROJECT, "evaluator", format="kto")
    trainer = KTOTrainer(
        model=model, args=KTOConfig(**common(tmp_path), max_length=1024),
        train_dataset=dataset, processing_class=tokenizer,
    )  # fmt: skip
    train(trainer)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"format": "preference"}, "unknown format 'preference'"),
        ({"format": "kto", "mask_failed_turns": True}, "mask_failed_turns applies to"),
        ({"format": "messages", "chat_style": "markdown"}, "unknown chat style"),
        ({"format": "messages", "redact": "secrets,nonsense"}, "nonsense"),
        ({"filters": Filters(limit=3)}, "limit"),
    ],
)
def test_bad_options_are_refused(exports: Exports, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        corpus_dataset(str(exports.store), ORG, PROJECT, "evaluator", **options)


def test_sft_trainer_on_a_split_materialised_with_its_features(
    exports: Exports, tokenizer: Any, model: str, tmp_path: Path
) -> None:
    """The declared features carry the messages to Parquet and back as the dicts TRL reads."""
    import datasets
    from trl import SFTConfig, SFTTrainer

    dataset = corpus_dataset(str(exports.store), ORG, PROJECT, "evaluator", format="messages",
                             split="train", splits="train=0.8,eval=0.2")  # fmt: skip
    rows = list(dataset)
    assert rows
    path = tmp_path / "train.parquet"
    datasets.Dataset.from_generator(lambda: iter(dataset), features=dataset.features,
                                    cache_dir=str(tmp_path / "hf")).to_parquet(path)  # fmt: skip
    loaded = datasets.load_dataset("parquet", data_files=str(path), split="train",
                                   cache_dir=str(tmp_path / "hf"))  # fmt: skip
    assert loaded.features == dataset.features
    assert sorted(map(str, loaded)) == sorted(map(str, rows))
    trainer = SFTTrainer(
        model=model, args=SFTConfig(**common(tmp_path), max_length=1024),
        train_dataset=loaded, processing_class=tokenizer,
    )  # fmt: skip
    train(trainer)
