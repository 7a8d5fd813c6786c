"""A project's labeling settings (docs/guides/labeling.md), kept in the object store.

``_labeling/<org>/<project>/settings.json`` holds what an admin set with ``PUT labeling``; a
project that never set them uses the defaults from the service's settings
(``RL_EXPORT_LABELS_PER_TRACE``, ``RL_EXPORT_LEASE_S``, order ``oldest``, no adjudication, blind;
comparisons of pairs sharing a prompt, of different agent versions, one per pair).
Every web instance reads the object at most once per ``cache_s`` (seconds), so a change
applies everywhere within that time; the instance that wrote it applies it at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rl_export.corpora.store import ObjectStore
from rl_export.model.codec import dumps, loads
from rl_export.model.errors import ObjectNotFoundError, StoreError
from rl_export.model.events import UtcDatetime

Order = Literal["oldest", "newest", "uncertain", "random"]
ORDERS: tuple[Order, ...] = ("oldest", "newest", "uncertain", "random")
ShowEvaluations = Literal["after_label", "always", "never"]
PairOn = Literal["prompt", "scenario"]
PairVersions = Literal["different", "any"]
PREFIX = "_labeling/"


class LabelingSettings(BaseModel):
    """How a project's team labels: k labels per trace, lease, queue order, adjudication,
    whether labelers see each other's labels."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    labels_per_trace: int = Field(
        1, ge=1, le=10, description="The target of current human labels per trace (k)."
    )
    lease_s: int = Field(
        600, ge=30, le=86_400, description="How long a claim holds a trace for its labeler."
    )
    order: Order = Field("oldest", description="The order of every labeler's queue.")
    adjudicate_spread: float | None = Field(
        None,
        ge=0,
        le=0.8,
        description="A trace whose labelers' rewards differ by at least this much asks for one "
        "more label, once; null: never.",
    )
    blind: bool = Field(
        True,
        description="Queue and claim items carry no other labeler's ratings, comments, names "
        "or human rewards (docs/guides/security.md); false shows them.",
    )
    show_evaluations: ShowEvaluations = Field(
        "after_label",
        description="When a labeler sees the evaluators' verdict, scores and reasoning: "
        "after_label (once they saved a label on the trace: no anchoring), always, or never.",
    )
    pair_on: PairOn = Field(
        "prompt",
        description="What two traces of a pair to compare share: the prompt (the messages up "
        "to and including the first user message, exactly) or the scenario.",
    )
    pair_versions: PairVersions = Field(
        "different",
        description="Whether a pair's traces must differ in agent_version (different) or may "
        "share one (any).",
    )
    comparisons_per_pair: int = Field(
        1, ge=1, le=10, description="The target of current comparisons per pair (k)."
    )


class StoredSettings(LabelingSettings):
    """The settings as the store keeps them: who set them, and when."""

    updated_by: str
    updated_at: UtcDatetime


class SettingsInvalid(ValueError):
    """A settings change that cannot be accepted; ``field`` names the first bad one."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def settings_key(org: str, project: str) -> str:
    return f"{PREFIX}{org}/{project}/settings.json"


def merged(current: LabelingSettings, change: dict[str, Any]) -> LabelingSettings:
    """``current`` with the fields of ``change`` replaced, validated as a whole.

    A field left out keeps its current value; an unknown field or a value out of range is a
    :class:`SettingsInvalid` naming it.
    """
    values = current.model_dump(include=set(LabelingSettings.model_fields)) | change
    try:
        return LabelingSettings.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "body"
        message = str(first["msg"]).removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = (
                "is not a labeling setting (labels_per_trace, lease_s, order, "
                "adjudicate_spread, blind, show_evaluations, pair_on, pair_versions, "
                "comparisons_per_pair)"
            )
        raise SettingsInvalid(field, message) from None


class SettingsBook:
    """Every project's labeling settings, read through from the store with a short cache."""

    def __init__(
        self, store: ObjectStore, defaults: LabelingSettings, *, cache_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.store = store
        self.defaults = defaults
        self.cache_s = cache_s
        self.clock = clock
        self._cache: dict[tuple[str, str], tuple[float, LabelingSettings]] = {}

    async def get(self, org: str, project: str) -> LabelingSettings:
        """The project's settings (the defaults when none were set). Raises StoreError when
        the store does not answer and nothing is cached."""
        key = (org, project)
        cached = self._cache.get(key)
        now = self.clock()
        if cached is not None and now - cached[0] < self.cache_s:
            return cached[1]
        try:
            found = await self._read(org, project)
        except StoreError:
            if cached is not None:  # keep applying what was known rather than fail the queue
                return cached[1]
            raise
        self._cache[key] = (now, found)
        return found

    async def _read(self, org: str, project: str) -> LabelingSettings:
        try:
            data = await self.store.get(settings_key(org, project))
        except ObjectNotFoundError:
            return self.defaults
        return StoredSettings.model_validate(loads(data))

    async def put(
        self, org: str, project: str, change: dict[str, Any], *, by: str, now: datetime
    ) -> LabelingSettings:
        """Apply ``change`` to the current settings, store them, and return them."""
        current = await self._read(org, project)
        updated = merged(current, change)
        stored = StoredSettings(**updated.model_dump(), updated_by=by, updated_at=now)
        await self.store.put(settings_key(org, project), dumps(stored.model_dump(mode="json")))
        self._cache[(org, project)] = (self.clock(), stored)
        return stored
