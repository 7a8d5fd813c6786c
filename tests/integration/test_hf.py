"""``rl_export.hf`` on the real S3 store (SeaweedFS): a corpus written there by ``replay`` read
as a Hugging Face dataset from its ``s3://`` URL, with its features, split across nodes and
resumed."""

from __future__ import annotations

import asyncio
import uuid
from itertools import islice

from datasets.distributed import split_dataset_by_node

from rl_export.corpora.compaction import compact
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import CorpusReader
from rl_export.corpora.store import S3Store
from rl_export.hf import corpus_dataset, row_features
from rl_export.local.seaweed import LocalS3
from tests.exportdata import ORG, PROJECT, replay_events, story_after, story_before


async def test_a_corpus_on_s3_as_a_dataset(s3: LocalS3) -> None:
    prefix = f"hf-{uuid.uuid4().hex[:8]}"
    store = S3Store(s3.bucket, prefix)
    ref = CorpusRef(ORG, PROJECT, "evaluator")
    try:
        await replay_events(store, story_before(), "before")
        await compact(store, ref, writer="test")
        await replay_events(store, story_after(), "after")
        reader = CorpusReader(store, ref)
        expected = sorted(
            [(r["trace_id"], r["revision"]) async for r in reader.records(latest_only=True)]
        )
    finally:
        await store.close()
    url = f"s3://{s3.bucket}/{prefix}"

    def read() -> None:
        dataset = corpus_dataset(url, ORG, PROJECT, "evaluator")
        rows = list(dataset)
        assert sorted((r["trace_id"], r["revision"]) for r in rows) == expected
        assert dataset.features == row_features("trajectory")  # a default corpus's records
        for row in rows:
            dataset.features.encode_example(row)
        messages = corpus_dataset(url, ORG, PROJECT, "evaluator", format="messages",
                                  split="train", splits="train=0.5,eval=0.5")  # fmt: skip
        assert messages.features == row_features("messages")
        assert 0 < len(list(messages)) <= len(rows)
        nodes = [list(split_dataset_by_node(dataset, rank, 2)) for rank in range(2)]
        assert sorted(r["trace_id"] for node in nodes for r in node) == sorted(
            r["trace_id"] for r in rows)  # fmt: skip
        stopped = corpus_dataset(url, ORG, PROJECT, "evaluator")
        head = list(islice(stopped, 2))
        resumed = corpus_dataset(url, ORG, PROJECT, "evaluator")
        resumed.load_state_dict(stopped.state_dict())
        assert head + list(resumed) == rows

    await asyncio.to_thread(read)
