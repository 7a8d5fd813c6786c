"""verl's RL dataset (``verl.utils.dataset.rl_dataset.RLHFDataset``, what ``main_ppo`` reads
``data.train_files`` with) on an ``rl_prompts`` Parquet export, then its collate function into
a batch, as verl's trainer does before a rollout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from tests.trainers.conftest import Exports


def test_rl_dataset_reads_rl_prompts_parquet(
    exports: Exports, tokenizer: Any, tmp_path: Path
) -> None:
    from omegaconf import OmegaConf
    from torch.utils.data import DataLoader
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    path = exports.files["rl_prompts"]
    table = pq.read_table(path).to_pylist()
    config = OmegaConf.create({
        "prompt_key": "prompt", "max_prompt_length": 512, "filter_overlong_prompts": True,
        "filter_overlong_prompts_workers": 1, "truncation": "error",
        "cache_dir": str(tmp_path / "verl-cache"),
    })  # fmt: skip
    dataset = RLHFDataset(str(path), tokenizer, config)
    assert len(dataset) == len(table) > 0  # no prompt filtered out as too long or malformed
    for n, source in enumerate(table):
        row = dataset[n]
        assert row["raw_prompt"] == source["prompt"]
        assert row["data_source"] == source["data_source"]
        assert row["extra_info"]["trace_id"] == source["extra_info"]["trace_id"]
        assert row["index"] == source["extra_info"]["index"]
        # What the rollout renders: the prompt through the model's chat template.
        text = tokenizer.apply_chat_template(row["raw_prompt"], tokenize=False,
                                             add_generation_prompt=True)  # fmt: skip
        assert source["prompt"][-1]["content"] in text
    batch = next(iter(DataLoader(dataset, batch_size=2, collate_fn=collate_fn)))
    assert len(batch["raw_prompt"]) == 2
    assert batch["dummy_tensor"].shape[0] == 2
