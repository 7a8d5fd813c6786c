"""The join's rubric versions: labels checked against theirs, versions read once.

A ``label.submitted`` of rubric version N > 0 (or an adjudication) carries answers that the
schema alone cannot judge: they must fit version N of the project's rubric
(:func:`rl_export.model.rubrics.check_answers`), or the label goes to the dead-letter topic
with reason ``invalid_rubric``. Versions live in the object store
(``_rubrics/<org>/<project>/<N>.json``, :mod:`rl_export.corpora.rubrics`), created once and
never rewritten, so the join reads each at most once and keeps it
(:class:`~rl_export.model.rubrics.KnownRubrics`); version 0 is built in, and a join that
only ever sees version-0 labels never reads the store for them.

Where the store comes in: the join process opens the store the worker is configured with
(``RL_EXPORT_STORE_URL``) and hands it over as a :class:`RubricSource`; ``replay`` hands its
own store. The batch processor asks :meth:`RubricCheck.load` for the versions a batch's
labels name before it checks them (step 2), and for the versions its touched traces' labels
name before it builds their snapshots (step 4), since a snapshot scores every current label.

When the store has no version N of a project when a label naming it arrives, the label is
dead-lettered (``invalid_rubric``, "rubric version N ... does not exist"): the web service
creates a version before it accepts labels for it, so such a label comes from elsewhere, and
its dead letter keeps its bytes for a replay once the version exists. Nothing is cached
about a missing version, so a version created a moment later is found by the next label.
When the store fails (an error, not a missing object), :class:`~rl_export.model.errors.StoreError`
propagates: the batch is retried, as when Kafka fails, and no valid label is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

from rl_export.model.events import EventRejection, RejectReason
from rl_export.model.eventview import EventView
from rl_export.model.rubrics import KnownRubrics, RubricSpec, check_answers

log = logging.getLogger(__name__)

VersionKey = tuple[str, str, int]  # (org, project, rubric version)


class RubricSource(Protocol):
    """Where rubric versions are read from (the object store)."""

    async def fetch(self, org: str, project: str, version: int) -> RubricSpec | None:
        """Version ``version`` of the project's rubric; None when there is none. Raises
        StoreError when the store does not answer."""
        ...


class RubricCheck:
    """Checks labels against their rubric versions, reading the versions it lacks."""

    def __init__(self, source: RubricSource | None, known: KnownRubrics) -> None:
        self.source = source
        self.known = known
        self._missing_logged: set[VersionKey] = set()

    async def load(self, wanted: Iterable[VersionKey]) -> set[VersionKey]:
        """Read the versions of ``wanted`` not known yet; return those the store lacks."""
        missing: set[VersionKey] = set()
        for key in set(wanted):
            if key in self.known:
                continue
            spec = None if self.source is None else await self.source.fetch(*key)
            if spec is None:
                missing.add(key)
            else:
                self.known.add(*key, spec)
        return missing

    def check(self, view: EventView) -> EventRejection | None:
        """Why a label's answers do not fit their version (None: they do). Call after
        :meth:`load` of its version."""
        if view.answers is None:
            return None
        version = view.rubric_version
        spec = self.known.spec(view.org, view.project, version)
        if spec is None:
            return EventRejection(
                RejectReason.INVALID_RUBRIC,
                f"rubric version {version} of {view.org}/{view.project} does not exist",
            )
        problem = check_answers(spec, view.answers)
        if problem is not None:
            return EventRejection(
                RejectReason.INVALID_RUBRIC, f"{problem} (rubric version {version})"
            )
        return None

    def note_missing(self, keys: Iterable[VersionKey]) -> None:
        """Log, once per version, labels already accepted whose version is gone from the store
        (deleted by hand): they stay in ``human_labels`` without a reward."""
        for key in keys:
            if key not in self._missing_logged:
                self._missing_logged.add(key)
                log.error("rubric version %d of %s/%s is not in the store: labels of it are "
                          "kept without a reward", key[2], key[0], key[1])  # fmt: skip
