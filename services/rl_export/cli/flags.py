"""What the command line's commands share: settings from flags, the store, a corpus named by
flags, exit codes."""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING, Any

from rl_export.model.errors import ConfigError
from rl_export.runtime.settings import Settings, env_name, load_settings

if TYPE_CHECKING:
    from rl_export.corpora.layout import CorpusRef
    from rl_export.corpora.store import ObjectStore


EXIT_ERROR = 1
EXIT_CONFIG = 2


def _settings(args: argparse.Namespace, **mapping: str) -> Settings:
    """Load settings with flag overrides; ``mapping`` maps setting names to flag attributes."""
    overrides = {name: getattr(args, attr, None) for name, attr in mapping.items()}
    try:
        return load_settings(**overrides)
    except ConfigError as exc:
        for name, attr in mapping.items():  # name the flag when the value came from one
            if overrides[name] is not None and exc.setting == env_name(name):
                raise ConfigError(f"--{attr.replace('_', '-')}", exc.detail) from None
        raise


def _open(url: str | None, settings: Settings) -> ObjectStore:
    from rl_export.corpora.store import open_store
    from rl_export.runtime.storeurl import parse_store_url

    try:
        location = parse_store_url(url or settings.store_url)
    except ValueError as exc:
        raise ConfigError("--store", str(exc)) from None
    return open_store(location)


def _ref(args: argparse.Namespace) -> CorpusRef:
    from rl_export.corpora.layout import CorpusRef
    from rl_export.formats.specs import check_name

    for flag in ("org", "project", "corpus"):
        if not getattr(args, flag):
            raise ConfigError(f"--{flag}", f"is required for shards {args.action}")
    try:
        return CorpusRef(
            check_name("org", args.org),
            check_name("project", args.project),
            check_name("corpus", args.corpus),
        )
    except ValueError as exc:
        raise ConfigError("--org/--project/--corpus", str(exc)) from None


def _add_source(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--store", metavar="URL", help="object store URL (default RL_EXPORT_STORE_URL)")
    p.add_argument("--org", required=required)
    p.add_argument("--project", required=required)
    p.add_argument("--source", required=required, metavar="human|evaluator|traces|comparisons")


def _pinned(args: argparse.Namespace, settings: Settings, ref: CorpusRef) -> Any:
    """The version ``--version NAME`` or ``--as-of RFC3339`` names (a
    :class:`~rl_export.export.versions.Pinned`), or None; ConfigError for both, a bad time or
    an unknown version."""
    from rl_export.export.versions import parse_as_of, pinned

    if args.version is not None and args.as_of is not None:
        raise ConfigError("--version", "give --version NAME or --as-of RFC3339, not both")
    if args.version is None and args.as_of is None:
        return None
    as_of = None if args.as_of is None else parse_as_of(args.as_of)

    async def run() -> Any:
        store = _open(args.store, settings)
        try:
            return await pinned(store, ref, args.version, as_of)
        finally:
            await store.close()

    return asyncio.run(run())
