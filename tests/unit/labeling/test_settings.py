"""A project's labeling settings: validation naming the field, the store, the cache."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from rl_export.corpora.store import MemoryStore
from rl_export.labeling.settings import (
    LabelingSettings,
    SettingsBook,
    SettingsInvalid,
    merged,
    settings_key,
)
from rl_export.model.codec import loads
from rl_export.model.errors import StoreError

NOW = datetime(2026, 12, 1, tzinfo=UTC)
DEFAULTS = LabelingSettings(labels_per_trace=2, lease_s=300)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"labels_per_trace": 0}, "labels_per_trace"),
        ({"labels_per_trace": 11}, "labels_per_trace"),
        ({"labels_per_trace": "two"}, "labels_per_trace"),
        ({"lease_s": 29}, "lease_s"),
        ({"lease_s": 86_401}, "lease_s"),
        ({"order": "alphabetical"}, "order"),
        ({"adjudicate_spread": 0.9}, "adjudicate_spread"),
        ({"adjudicate_spread": -0.1}, "adjudicate_spread"),
        ({"labeler": "ana"}, "labeler"),
    ],
)
def test_an_invalid_change_names_its_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(SettingsInvalid) as caught:
        merged(DEFAULTS, change)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")


def test_a_change_keeps_the_fields_it_leaves_out() -> None:
    updated = merged(DEFAULTS, {"order": "uncertain", "adjudicate_spread": 0.4})
    assert updated == LabelingSettings(
        labels_per_trace=2, lease_s=300, order="uncertain", adjudicate_spread=0.4
    )
    assert merged(updated, {"adjudicate_spread": None}).adjudicate_spread is None


async def test_a_project_without_settings_has_the_defaults() -> None:
    book = SettingsBook(MemoryStore(), DEFAULTS, cache_s=5)
    assert await book.get("acme", "bot") == DEFAULTS


async def test_settings_put_on_one_instance_apply_on_another_after_its_cache() -> None:
    store, clock = MemoryStore(), Clock()
    one = SettingsBook(store, DEFAULTS, cache_s=5, clock=clock)
    other = SettingsBook(store, DEFAULTS, cache_s=5, clock=clock)
    assert (await other.get("acme", "bot")).labels_per_trace == 2
    stored = await one.put("acme", "bot", {"labels_per_trace": 3}, by="lead", now=NOW)
    assert (await one.get("acme", "bot")).labels_per_trace == 3  # at once where it was set
    assert (await other.get("acme", "bot")).labels_per_trace == 2  # cached
    clock.now += 5
    assert await other.get("acme", "bot") == stored
    kept = loads(store.objects[settings_key("acme", "bot")])
    assert kept["updated_by"] == "lead"
    assert kept["labels_per_trace"] == 3
    assert kept["lease_s"] == 300
    # Another project is untouched.
    assert await other.get("acme", "other") == DEFAULTS


async def test_an_invalid_put_stores_nothing() -> None:
    store = MemoryStore()
    book = SettingsBook(store, DEFAULTS, cache_s=5)
    with pytest.raises(SettingsInvalid):
        await book.put("acme", "bot", {"lease_s": 5}, by="lead", now=NOW)
    assert store.objects == {}


class FailingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.failing = False

    async def get(self, key: str) -> bytes:
        if self.failing:
            raise StoreError("down")
        return await super().get(key)


async def test_a_store_outage_keeps_the_last_known_settings() -> None:
    store, clock = FailingStore(), Clock()
    book = SettingsBook(store, DEFAULTS, cache_s=1, clock=clock)
    await book.put("acme", "bot", {"order": "newest"}, by="lead", now=NOW)
    store.failing = True
    clock.now += 10
    assert (await book.get("acme", "bot")).order == "newest"
    with pytest.raises(StoreError):
        await book.get("acme", "never-read")
