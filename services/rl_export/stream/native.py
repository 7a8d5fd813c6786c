"""The join's native core: the join rules in Rust (the ``rl_export_native`` extension, built
from ``native/`` by ``make install``), with the Python rules as the reference and the fallback.

The core decodes, checks and merges the events it fully knows, keeps their states in the
table's bytes (:mod:`rl_export.stream.state`'s version 3) and encodes their snapshots
(:func:`rl_export.model.snapshots.encode_snapshot`), byte for byte as the Python rules do
(``tests/unit/stream/test_native.py`` runs both on generated event sequences and compares
every state, snapshot, header, dead letter and expiry mark). What it does not fully know it
does not take: it says "not mine" and the event goes through the Python path unchanged.
The rule is structural, so nothing needs to be listed when the Python rules grow:

* an event is the core's only when every key it has, at the top level and in the rubric, is
  one the core reads (a field a later model adds, such as a rubric version, is the Python
  path's), and it passes every check; a rejection is always the Python path's, which says
  why (the dead letter's reason and detail);
* a state is the core's only when its bytes are exactly of the shape the core writes (the
  version byte, the fourteen items of the head, the lengths of each nested item); a state
  that keeps anything more is the Python path's, for as long as it does;
* a merge the rules would reject (an event of another org, a waiting event that no longer
  decodes or belongs elsewhere) leaves the state as it was and goes to the Python path.

``RL_EXPORT_JOIN_NATIVE`` chooses: ``auto`` uses the core when the extension imports,
``on`` refuses to start without it, ``off`` runs the Python rules only.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from rl_export.model.errors import ConfigError
from rl_export.model.events import EventFamily
from rl_export.model.records import RULES_VERSION
from rl_export.runtime.settings import Settings


def _import() -> tuple[Any, str]:
    """The extension, or None and why it does not import."""
    try:
        import rl_export_native
    except ImportError as exc:  # not built here (no cargo at make install), another platform
        return None, str(exc)
    return rl_export_native, ""


_extension, _MISSING = _import()

log = logging.getLogger(__name__)

if _extension is not None:
    NativeCore: Any = _extension.Core
    NativeEvent: Any = _extension.Event
    NativeState: Any = _extension.State
else:  # types nothing is ever an instance of, so the processor's type checks stay simple

    class NativeCore:  # type: ignore[no-redef]
        pass

    class NativeEvent:  # type: ignore[no-redef]
        pass

    class NativeState:  # type: ignore[no-redef]
        pass


FAMILY_CODES: Final = {EventFamily.TRACES: 1, EventFamily.EVALUATIONS: 2, EventFamily.LABELS: 3}
"""The core's code of each topic family (0: an unknown topic, no family check)."""

OUTCOMES: Final = ("accepted", "duplicate", "pending", "ignored")
"""The outcome of a native merge's code (``code & 3``; ``code & 4``: a snapshot is due)."""

EMITS: Final = 4


def available() -> bool:
    """True when the extension imports here."""
    return _extension is not None


def join_core(settings: Settings) -> Any:
    """The native core the settings ask for, or None for the Python rules only.

    Raises :class:`ConfigError` when ``RL_EXPORT_JOIN_NATIVE=on`` and the extension is not
    there.
    """
    if settings.join_native == "off":
        return None
    if _extension is None:
        if settings.join_native == "on":
            raise ConfigError(
                "RL_EXPORT_JOIN_NATIVE",
                f"is on, but the join's native core does not import ({_MISSING}): build it "
                "with make install (it needs cargo), or set auto or off",
            )
        return None
    return _extension.Core(
        settings.max_event_bytes,
        settings.future_tolerance_s,
        settings.human_pass_threshold,
        RULES_VERSION,
    )


def describe(settings: Settings) -> str:
    """The worker's line at start that says which join rules it runs (raises as
    :func:`join_core` does)."""
    core = join_core(settings)
    if core is not None:
        return (
            f"join: native core (rl_export_native {_extension.__version__}), the Python "
            "rules for what it does not take"
        )
    if settings.join_native == "off":
        return "join: Python rules (RL_EXPORT_JOIN_NATIVE=off)"
    return f"join: Python rules; the native core does not import here ({_MISSING})"
