"""The ``rl-export`` command line (DESIGN.md section 6).

Every command turns an :class:`RlExportError` into one line on stderr and a non-zero exit;
argparse already answers bad flags with a usage line and exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import select
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from rl_export import __version__
from rl_export.common.errors import ConfigError, RlExportError
from rl_export.common.settings import Settings, env_name, load_settings

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


def _wait_for_signal() -> int:
    """Block until SIGINT, SIGTERM or SIGHUP (the terminal closed); return the signal number."""
    received: list[int] = []
    stop = threading.Event()

    def handler(signum: int, _frame: Any) -> None:
        received.append(signum)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)
    stop.wait()
    return received[0]


def cmd_broker(args: argparse.Namespace) -> int:
    from rl_export.local.broker import LocalKafka

    settings = _settings(args, broker_port="port", data_dir="data_dir")
    data_dir = settings.data_dir / "kafka" if args.data_dir is None else settings.data_dir
    broker = LocalKafka(data_dir, settings.broker_port)
    print(f"starting Apache Kafka (KRaft) on 127.0.0.1:{settings.broker_port} ...", flush=True)
    broker.start()
    try:
        print(f"Kafka ready: bootstrap {broker.bootstrap}", flush=True)
        print(f"  data {broker.data_dir}  log {broker.log_path}", flush=True)
        print("Press Ctrl-C to stop.", flush=True)
        _wait_for_signal()
        print("stopping Kafka ...", flush=True)
    finally:
        broker.stop()
    print("Kafka stopped.", flush=True)
    return 0


def cmd_produce(args: argparse.Namespace) -> int:
    from rl_export.common.progressbar import bar
    from rl_export.stream.produce import produce_lines, read_lines

    settings = _settings(args, kafka_bootstrap="bootstrap")
    missing = [p for p in args.files if not p.is_file()]
    if missing:
        raise ConfigError("FILE", f"no such file: {missing[0]}")
    with bar("producing", unit="events") as progress:
        report = asyncio.run(produce_lines(settings, read_lines(args.files), progress.update))
    for line in report.skipped[:20]:
        print(f"skipped {line}", file=sys.stderr)
    if len(report.skipped) > 20:
        print(f"... and {len(report.skipped) - 20} more skipped lines", file=sys.stderr)
    print(f"published {report.published} events, skipped {len(report.skipped)} lines")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from rl_export.worker.main import run_worker

    settings = _settings(
        args, kafka_bootstrap="bootstrap", store_url="store", worker_web_port="web_port"
    )
    return run_worker(settings)


def _open(url: str | None, settings: Settings) -> ObjectStore:
    from rl_export.common.storeurl import parse_store_url
    from rl_export.corpora.store import open_store

    try:
        location = parse_store_url(url or settings.store_url)
    except ValueError as exc:
        raise ConfigError("--store", str(exc)) from None
    return open_store(location)


def cmd_replay(args: argparse.Namespace) -> int:
    from rl_export.common.progressbar import bar
    from rl_export.corpora.replay import replay, summary
    from rl_export.stream.produce import read_lines

    settings = _settings(args, store_url="store")
    missing = [p for p in args.files if not p.is_file()]
    if missing:
        raise ConfigError("FILE", f"no such file: {missing[0]}")

    async def run() -> list[str]:
        store = _open(args.store, settings)
        try:
            await store.check()
            with bar("replaying", unit="events") as progress:
                report = await replay(
                    settings, store, read_lines(args.files), run_id=args.run_id,
                    progress=progress.update,
                )  # fmt: skip
        finally:
            await store.close()
        return summary(report)

    for line in asyncio.run(run()):
        print(line)
    return 0


def _ref(args: argparse.Namespace) -> CorpusRef:
    from rl_export.common.specs import check_name
    from rl_export.corpora.layout import CorpusRef

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


def cmd_shards(args: argparse.Namespace) -> int:
    from rl_export.corpora import shards

    settings = _settings(args, store_url="store")

    async def run() -> int:
        store = _open(args.store, settings)
        out = sys.stdout.buffer
        try:
            if args.action == "ls":
                for entry in await shards.ls(store, args.prefix):
                    print(entry)
            elif args.action == "verify":
                report = await shards.verify(store, args.prefix)
                for problem in report.problems:
                    print(problem, file=sys.stderr)
                print(report.summary())
                return 0 if report.ok else 1
            elif args.action == "compact":
                from rl_export.corpora.chain import writer_id
                from rl_export.corpora.compaction import compact_all

                written = await compact_all(
                    store, args.prefix, writer=writer_id(),
                    partitioning=(settings.partitioner, settings.partitions),
                    tombstone_retention_s=settings.tombstone_retention_s,
                )  # fmt: skip
                for compaction in written:
                    print(f"generation {compaction.generation}: {compaction.records} records")
            elif args.action == "cat":
                async for line in shards.cat(store, _ref(args), latest_only=args.latest):
                    out.write(line)
            elif args.action == "tail":
                stop = asyncio.Event()
                asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
                async for line in shards.tail(store, _ref(args), stop=stop):
                    out.write(line)
                    out.flush()
        finally:
            await store.close()
        return 0

    return asyncio.run(run())


def _filter_values(args: argparse.Namespace) -> dict[str, str | list[str]]:
    """The filter flags given on the command line, as ``parse_filters`` reads them."""
    from rl_export.common.filters import FILTER_NAMES

    values: dict[str, str | list[str]] = {}
    for name in FILTER_NAMES:
        value = getattr(args, "f_" + name.replace("-", "_"), None)
        if value is not None:
            values[name] = value
    return values


def _export_ref(args: argparse.Namespace) -> CorpusRef:
    from rl_export.export import source_ref

    return source_ref(args.org, args.project, args.source)


_MANIFEST_FLAGS = (
    "org", "project", "source", "format", "columns", "pair_by", "margin", "mask_types",
    "redact", "split", "splits", "split_by", "split_salt", "dedup", "dedup_threshold",
    "dedup_on", "chat_style", "system", "completion",
)  # fmt: skip
"""What ``--from-manifest`` takes from the manifest: not to be given with it."""


def _from_manifest(args: argparse.Namespace) -> Any:
    """Fill the export's options in ``args`` from ``--from-manifest FILE``; return the view
    position it read. ConfigError for an option given beside it, or a file that is not a
    manifest of this rl-export version."""
    from rl_export.common.filters import FILTER_NAMES
    from rl_export.export.lineage import manifest_options, read_manifest

    defaults = {"max_pairs": 1, "zip_data": "csv", "mask_failed_turns": False}
    given = [n for n in _MANIFEST_FLAGS if getattr(args, n) is not None]
    given += [n for n, default in defaults.items() if getattr(args, n) != default]
    given += ["f_" + n for n in FILTER_NAMES if getattr(args, "f_" + n.replace("-", "_"))
              is not None]  # fmt: skip
    if given:
        flags = ", ".join("--" + n.removeprefix("f_").replace("_", "-") for n in given)
        raise ConfigError("--from-manifest", "takes the export's options from the manifest: "
                          f"give only --store, -o and --card, not {flags}")  # fmt: skip
    manifest = read_manifest(Path(args.from_manifest))
    for name, value in manifest_options(manifest).items():
        setattr(args, name, value)
    return manifest.view_position()


def cmd_export(args: argparse.Namespace) -> int:
    from rl_export.common.filters import parse_filters
    from rl_export.common.gctune import lean_allocators, tune_gc
    from rl_export.common.progressbar import bar, position_callback
    from rl_export.export import (
        check_export,
        file_for,
        parse_chat_style,
        parse_completion,
        parse_margin,
        parse_mask,
        parse_pair_by,
        write_export,
    )
    from rl_export.export.attachments import AttachmentPolicy

    settings = _settings(args, store_url="store")
    at = _from_manifest(args) if args.from_manifest is not None else None
    if at is not None and (args.version is not None or args.as_of is not None):
        raise ConfigError("--from-manifest", "reads the manifest's position: give no --version "
                          "or --as-of with it")  # fmt: skip
    for flag in ("org", "project", "source", "format"):
        if getattr(args, flag) is None:
            raise ConfigError(f"--{flag}", "is required (or --from-manifest FILE)")
    filters = parse_filters(_filter_values(args))
    ref = _export_ref(args)
    version = _pinned(args, settings, ref)
    if version is not None:
        at = version.at
    pair_by = parse_pair_by(args.pair_by)
    margin = parse_margin(args.margin)
    redact = args.redact if args.redact is not None else settings.redact
    mask = parse_mask(args.format, args.mask_failed_turns, args.mask_types)
    chat = parse_chat_style(args.format, args.chat_style, args.system)
    completion = parse_completion(args.format, args.completion)
    to_stdout = args.output == "-"
    file = file_for(args.format, None if to_stdout else args.output)
    check_export(
        args.format, columns=args.columns, pair_by=pair_by, margin=margin,
        max_pairs=args.max_pairs, zip_data=args.zip_data, mask=mask, file=file, card=args.card,
        redact=redact, chat=chat, completion=completion,
    )  # fmt: skip
    split, dedup = _training_set(args)
    if to_stdout and args.card:
        raise ConfigError("--card", "writes README.md beside the output file: give -o FILE")
    if not to_stdout and Path(args.output).is_dir():
        raise ConfigError("--output", f"{args.output} is a directory")

    tune_gc()  # records are trees: the cycle collector would walk each batch for nothing
    lean_allocators()  # the reading threads' arenas would hold on to what they freed

    async def run() -> Any:
        store = _open(args.store, settings)
        try:
            with bar(f"exporting {ref.root} as {args.format}", unit="records") as progress:
                return await write_export(
                    store, ref, format=args.format, filters=filters, columns=args.columns,
                    pair_by=pair_by, margin=margin, max_pairs=args.max_pairs,
                    zip_data=args.zip_data, mask=mask, file=file, card=args.card,
                    redact=redact, chat=chat, completion=completion, split=split, dedup=dedup,
                    at=at, manifest=args.card, attachments=AttachmentPolicy.from_settings(settings),
                    out=sys.stdout.buffer if to_stdout else Path(args.output),
                    progress=position_callback(progress),
                )  # fmt: skip
        finally:
            await store.close()

    summary = asyncio.run(run())
    where = "stdout" if to_stdout else args.output
    note = f"exported {summary.records} {'pairs' if args.format == 'preference' else 'rows'} "
    note += f"({summary.format}, {summary.bytes} bytes) to {where}"
    note += f" from {summary.scanned} latest records, {summary.matched} matching the filters"
    if summary.skipped:
        note += f", {summary.skipped} without a {args.format} row"
    if split is not None:
        note += f"; --split {split.name}: {summary.split_left_out} of other splits left out"
    if dedup is not None:
        note += f"; --dedup {dedup.mode}: {summary.duplicates_removed} duplicates removed"
    if args.format == "zip":
        note += f"; {summary.attachments} attachments, {summary.attachment_errors} failed"
    if mask is not None:
        note += (f"; {summary.turns_outside} failing outcomes named a turn outside their "
                 f"conversation (they mask nothing)")  # fmt: skip
    if args.card:
        note += f"; dataset card {Path(args.output).parent / 'README.md'}, lineage "
        note += f"{args.output}.manifest.json"
    if version is not None:
        note += f"; read at version {version.name}"
    elif at is not None:
        note += f"; read at the position of {args.from_manifest}"
    if summary.redactions:
        note += "; redacted: " + ", ".join(f"{k} {n}" for k, n in summary.redactions.items())
    else:
        note += "; nothing redacted (--redact none)"
    print(note, file=sys.stderr)
    if (why := summary.why_empty()) is not None:
        print(f"no {args.format} row: {why}", file=sys.stderr)
    return 0


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


def _add_version(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("pinned versions (DESIGN.md section 5)")
    group.add_argument("--version", metavar="NAME", help="read the corpus at this version")
    group.add_argument(
        "--as-of", metavar="RFC3339",
        help="read the corpus at the newest version created at or before this time",
    )  # fmt: skip


def cmd_versions(args: argparse.Namespace) -> int:
    from rl_export.common.codec import dumps
    from rl_export.common.specs import check_name
    from rl_export.corpora.layout import CorpusRef
    from rl_export.corpora.versions import delete_version, get_version, list_versions
    from rl_export.export.versions import pin

    settings = _settings(args, store_url="store")
    for flag in ("org", "project", "corpus"):
        try:
            check_name(flag, getattr(args, flag))
        except ValueError as exc:
            raise ConfigError(f"--{flag}", str(exc)) from None
    ref = CorpusRef(args.org, args.project, args.corpus)

    async def run() -> list[bytes]:
        store = _open(args.store, settings)
        try:
            if args.action == "create":
                version = await pin(store, ref, args.name, args.note or "")
            elif args.action == "show":
                version = await get_version(store, ref, args.name)
            elif args.action == "delete":
                version = await delete_version(store, ref, args.name)
            else:
                return [dumps(v.model_dump(mode="json")) for v in await list_versions(store, ref)]
        finally:
            await store.close()
        return [dumps(version.model_dump(mode="json"))]

    for line in asyncio.run(run()):
        sys.stdout.buffer.write(line + b"\n")
    sys.stdout.flush()
    if args.action == "delete":
        print(f"deleted version {args.name} of {ref.root}: the objects only it kept go at the "
              "next expiry", file=sys.stderr)  # fmt: skip
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from rl_export.common.codec import dumps
    from rl_export.common.filters import parse_filters
    from rl_export.common.gctune import lean_allocators, tune_gc
    from rl_export.export import stats

    settings = _settings(args, store_url="store")
    filters = parse_filters(_filter_values(args))
    ref = _export_ref(args)
    version = _pinned(args, settings, ref)
    tune_gc()
    lean_allocators()  # the same reading as an export's

    async def run() -> dict[str, Any]:
        store = _open(args.store, settings)
        try:
            return await stats(
                store, ref, filters=filters, at=None if version is None else version.at
            )
        finally:
            await store.close()

    print(dumps(asyncio.run(run())).decode())
    return 0


def cmd_agreement(args: argparse.Namespace) -> int:
    from rl_export.common.codec import dumps
    from rl_export.common.errors import NoDataError
    from rl_export.common.filters import parse_filters
    from rl_export.common.gctune import tune_gc
    from rl_export.export import latest_records, source_ref
    from rl_export.labeling.agreement import AgreementBuilder, AgreementInput, agreement_report

    settings = _settings(args, store_url="store")
    filters = parse_filters(_filter_values(args))
    ref = source_ref(args.org, args.project, "traces")
    tune_gc()

    async def run() -> AgreementInput:
        store = _open(args.store, settings)
        builder = AgreementBuilder()
        try:
            async for batch in latest_records(
                store, ref, filters=filters, fields=AgreementBuilder.FIELDS
            ):
                for record in batch:
                    builder.add(record)
        except NoDataError:  # its message names --source, which this command has not
            raise ConfigError(
                "--org/--project",
                f"no traces corpus for {ref.org}/{ref.project} in {store.url} (check --org "
                "and --project)",
            ) from None
        finally:
            await store.close()
        return builder.build()

    report = agreement_report(asyncio.run(run()))
    print(dumps(report.model_dump(mode="json")).decode())
    return 0


def _add_filters(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("filters (DESIGN.md section 4)")
    group.add_argument("--passed", dest="f_passed", metavar="true|false")
    group.add_argument("--min-reward", dest="f_min_reward", metavar="R")
    group.add_argument("--max-reward", dest="f_max_reward", metavar="R")
    group.add_argument(
        "--pass-dimension", dest="f_pass_dimension", metavar="TYPE", action="append",
        help="repeatable: every decided outcome of TYPE is true, at least one decided",
    )  # fmt: skip
    group.add_argument("--max-severity", dest="f_max_severity", metavar="N")
    group.add_argument("--agent-version", dest="f_agent_version", metavar="V")
    group.add_argument("--scenario", dest="f_scenario", metavar="S")
    group.add_argument("--since", dest="f_since", metavar="RFC3339", help="updated_at >= since")
    group.add_argument("--until", dest="f_until", metavar="RFC3339", help="updated_at < until")
    group.add_argument("--labeled", dest="f_labeled", metavar="true|false")
    group.add_argument(
        "--min-labels", dest="f_min_labels", metavar="N", help="at least N current human labels"
    )
    group.add_argument(
        "--max-spread", dest="f_max_spread", metavar="X",
        help="the largest difference between two labelers' rewards is at most X (0..1)",
    )  # fmt: skip
    group.add_argument(
        "--metadata", dest="f_metadata", metavar="KEY=VALUE", action="append",
        help="repeatable: the trace's top-level metadata KEY equals VALUE (as text)",
    )  # fmt: skip
    group.add_argument("--limit", dest="f_limit", metavar="N")


_TRAINING_FLAGS = (
    ("--split", "NAME", "keep the rows of this split only"),
    ("--splits", "NAME=FRACTION,...", "the splits' shares, summing to 1 (train=0.9,eval=0.1)"),
    ("--split-by", "FIELD", "what decides a row's split: trace_id, a field, metadata.KEY"),
    ("--split-salt", "S", "a salt for the split's hash"),
    ("--dedup", "exact|near", "one row per group of duplicates: the best reward, the latest"),
    ("--dedup-threshold", "J", "near: least estimated Jaccard of word 5-shingles (0.85)"),
    ("--dedup-on", "conversation|prompt", "the text compared (default: every message)"),
)


def _add_training_set(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("training sets (DESIGN.md section 4)")
    for flag, metavar, text in _TRAINING_FLAGS:
        group.add_argument(flag, metavar=metavar, help=text)


def _training_set(args: argparse.Namespace) -> tuple[Any, Any]:
    """The ``--split`` and ``--dedup`` flags, checked: (Split | None, Dedup | None)."""
    from rl_export.export import parse_dedup, parse_split

    split = parse_split(args.split, args.splits, args.split_by, args.split_salt)
    dedup = parse_dedup(args.dedup, args.dedup_threshold, args.dedup_on)
    return split, dedup


def _add_source(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--store", metavar="URL", help="object store URL (default RL_EXPORT_STORE_URL)")
    p.add_argument("--org", required=required)
    p.add_argument("--project", required=required)
    p.add_argument("--source", required=required, metavar="human|evaluator|traces")


def cmd_web(args: argparse.Namespace) -> int:
    from rl_export.web.main import run_web

    settings = _settings(args, web_port="port", web_metrics_port="metrics_port",
                         kafka_bootstrap="bootstrap", store_url="store")  # fmt: skip
    return run_web(settings)


def cmd_audit(args: argparse.Namespace) -> int:
    from datetime import datetime

    from rl_export.common.codec import dumps
    from rl_export.common.specs import check_name
    from rl_export.web import audit

    settings = _settings(args, store_url="store")
    for flag, value in (("org", args.org), ("project", args.project)):
        try:
            check_name(flag, value)
        except ValueError as exc:
            raise ConfigError(f"--{flag}", str(exc)) from None
    since = None
    if args.since is not None:
        try:
            since = datetime.fromisoformat(args.since.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError("--since", f"{args.since!r} is not an RFC 3339 time") from None
        if since.tzinfo is None:
            raise ConfigError("--since", f"{args.since!r} needs an offset or Z")

    async def run() -> list[bytes]:
        store = _open(args.store, settings)
        try:
            entries = await audit.read(store, args.org, args.project, since)
        finally:
            await store.close()
        return [dumps(e.model_dump(mode="json")) for e in entries]

    for line in asyncio.run(run()):
        sys.stdout.buffer.write(line + b"\n")
    sys.stdout.flush()
    return 0


def cmd_tokens(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from rl_export.web.tokens import TokenError, TokenStore, parse_expiry, parse_scopes

    settings = _settings(args, store_url="store")

    async def run() -> int:
        store = _open(args.store, settings)
        tokens = TokenStore(store)
        now = datetime.now(UTC)
        try:
            if args.action == "create":
                for flag in ("org", "project", "subject", "scopes"):
                    if not getattr(args, flag):
                        raise ConfigError(f"--{flag}", "is required for tokens create")
                scopes, expires_in = parse_scopes(args.scopes), parse_expiry(args.expires_in)
                record, token = await tokens.create(
                    args.org, args.project, args.subject, scopes, now, expires_in=expires_in
                )
                until = record.expires_at.isoformat() if record.expires_at else "never"
                print(f"token {record.id} for {record.subject} on {record.org}/{record.project}, "
                      f"scopes {','.join(record.scopes)}, expires {until}; only its hash is "
                      f"stored, in {store.url}; this is the only time it is shown:")  # fmt: skip
                print(token)
            elif args.action == "list":
                for record in await tokens.list():
                    expiry = record.expires_at
                    if record.revoked_at:
                        state = "revoked " + record.revoked_at.isoformat()
                    elif expiry is not None and expiry <= now:
                        state = "expired"
                    else:
                        state = "active"
                    until = expiry.isoformat() if expiry else "never"
                    print(f"{record.id}  {record.org}/{record.project}  {record.subject}  "
                          f"{','.join(record.scopes)}  created {record.created_at.isoformat()}  "
                          f"expires {until}  {state}")  # fmt: skip
            else:
                if not args.id:
                    raise ConfigError("ID", "tokens revoke needs the token's id (tokens list)")
                record = await tokens.revoke(args.id, now)
                print(
                    f"token {record.id} of {record.subject} on {record.org}/{record.project} "
                    "is revoked (web instances refuse it within RL_EXPORT_WEB_TOKEN_CACHE_S)"
                )
        except TokenError as exc:
            raise ConfigError(f"tokens {args.action}", str(exc)) from None
        finally:
            await store.close()
        return 0

    return asyncio.run(run())


def cmd_dev(args: argparse.Namespace) -> int:
    from rl_export.local.dev import run_dev

    settings = _settings(args, broker_port="port", data_dir="data_dir")
    return run_dev(settings, traffic_rate=args.rate)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2), like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_CONFIG, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="rl-export",
        description="Turn scored agent runs into continuously refreshed JSONL training corpora.",
    )
    parser.add_argument("--version", action="version", version=f"rl-export {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("broker", help="run the local single-node Apache Kafka (KRaft)")
    p.add_argument("--port", type=int, help="listener port on 127.0.0.1 (default 9092)")
    p.add_argument("--data-dir", type=Path, help="log directory (default var/kafka)")
    p.set_defaults(func=cmd_broker)

    p = sub.add_parser("dev", help="the embedded stack: Kafka, every stage, synthetic traffic")
    p.add_argument("--port", type=int, help="Kafka port on 127.0.0.1 (default 9092)")
    p.add_argument("--data-dir", type=Path, help="where the stack keeps data (default var)")
    p.add_argument(
        "--rate", type=float, default=5.0, help="synthetic traces per second (0 for none)"
    )
    p.set_defaults(func=cmd_dev)

    p = sub.add_parser("web", help="the web service: the API, the RL Export page, export jobs")
    p.add_argument("--port", type=int, help="HTTP port (default 8080)")
    p.add_argument(
        "--metrics-port", type=int, help="port of GET /metrics, apart from the public port "
        "(default RL_EXPORT_WEB_METRICS_PORT, 8081)",
    )  # fmt: skip
    p.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers")
    p.add_argument("--store", metavar="URL", help="object store URL")
    p.set_defaults(func=cmd_web)

    p = sub.add_parser(
        "tokens", help="create, list or revoke API tokens (kept hashed in the store)"
    )
    p.add_argument("action", choices=["create", "list", "revoke"])
    p.add_argument("id", nargs="?", help="revoke: the token's id")
    p.add_argument("--org", help="create: the org the token is for")
    p.add_argument("--project", help="create: the project the token is for")
    p.add_argument("--subject", help="create: who the token speaks for (the labeler)")
    p.add_argument(
        "--scopes",
        metavar="label,export[,admin][,raw]",
        help="create: what it may do (raw: read with less redaction than the default; "
        "admin does not imply it)",
    )
    p.add_argument(
        "--expires-in", metavar="DURATION", default="90d",
        help="create: how long the token works: 90d, 12h, 30m, 45s or never (default 90d)",
    )  # fmt: skip
    p.add_argument("--store", metavar="URL", help="object store URL (default RL_EXPORT_STORE_URL)")
    p.set_defaults(func=cmd_tokens)

    p = sub.add_parser(
        "audit", help="the raw-access audit log of a project, one JSON object per line"
    )
    p.add_argument("--org", required=True, help="the organisation")
    p.add_argument("--project", required=True, help="the project")
    p.add_argument("--since", metavar="RFC3339", help="only entries at or after this time")
    p.add_argument("--store", metavar="URL", help="object store URL (default RL_EXPORT_STORE_URL)")
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser("worker", help="a stream-processing worker (the join)")
    p.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers")
    p.add_argument("--store", metavar="URL", help="object store URL")
    p.add_argument("--web-port", type=int, help="port of /metrics, /healthz, /readyz")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("replay", help="run the join and sink over event files, no broker")
    p.add_argument("files", nargs="+", type=Path, metavar="FILE")
    p.add_argument("--store", metavar="URL", required=True, help="object store URL")
    p.add_argument("--run-id", help="names the replay's chains (default: time and random)")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("shards", help="list, read, tail, verify or compact corpora")
    p.add_argument("action", choices=["ls", "cat", "tail", "verify", "compact"])
    p.add_argument("--store", metavar="URL", required=True, help="object store URL")
    p.add_argument("--prefix", default="", help="only corpora under this key prefix")
    p.add_argument("--org", help="cat/tail: the corpus's org")
    p.add_argument("--project", help="cat/tail: the corpus's project")
    p.add_argument("--corpus", help="cat/tail: the corpus name (human, evaluator, traces, ...)")
    p.add_argument("--latest", action="store_true", help="cat: latest revision per trace only")
    p.set_defaults(func=cmd_shards)

    p = sub.add_parser(
        "export", help="write an export of a corpus's latest view (any format, filtered)"
    )
    _add_source(p, required=False)  # required unless --from-manifest: checked by cmd_export
    p.add_argument("--from-manifest", metavar="FILE", help="a .manifest.json's export again")
    p.add_argument(
        "--format", metavar="F",
        help="trajectory, prompt_completion, messages, kto, preference, executions, rl_prompts "
        "(Parquet when FILE ends in .parquet), csv, json, parquet or zip",
    )  # fmt: skip
    p.add_argument("--columns", metavar="PATH[:HEADER],...", help="tabular formats' columns")
    p.add_argument("--pair-by", metavar="FIELD,...", help="preference: pair within these fields")
    p.add_argument("--margin", metavar="M", help="preference: least reward gap (default 0)")
    p.add_argument(
        "--max-pairs", type=int, default=1, metavar="N",
        help="preference: pairs per trajectory at most (default 1)",
    )  # fmt: skip
    p.add_argument(
        "--completion", metavar="turn|rest",
        help="preference: chosen/rejected are the agent's reply to the prompt (turn, the "
        "default: up to the next user message) or everything after it (rest)",
    )  # fmt: skip
    p.add_argument("--zip-data", default="csv", metavar="csv|json", help="zip: the data file")
    p.add_argument(
        "--chat-style", metavar="hf|openai|raw",
        help="messages, prompt_completion, preference, kto: hf (default: string content, "
        "tool-call arguments as objects), openai (arguments as JSON strings) or raw (as "
        "received)",
    )  # fmt: skip
    p.add_argument(
        "--system", metavar="keep|merge",
        help="with a chat format: merge folds system messages into the first user message "
        "(templates without a system role); default keep",
    )  # fmt: skip
    p.add_argument(
        "--mask-failed-turns", action="store_true",
        help="messages, prompt_completion: weight 0 on the assistant messages of turns with a "
        "failing outcome, 1 on the others",
    )  # fmt: skip
    p.add_argument(
        "--mask-types", metavar="TYPE,...",
        help="with --mask-failed-turns: only outcomes of these report types mask",
    )  # fmt: skip
    p.add_argument(
        "--card", action="store_true",
        help="write a Hugging Face dataset card (README.md) and the lineage manifest "
        "(FILE.manifest.json) beside the output file",
    )  # fmt: skip
    p.add_argument(
        "--redact", metavar="KIND,...",
        help="replace sensitive text with [REDACTED:KIND]: secrets, email, phone, credit_card, "
        "iban, ip, pii (all but secrets), all, or none (default RL_EXPORT_REDACT: secrets)",
    )  # fmt: skip
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="'-' for stdout")
    _add_filters(p)
    _add_training_set(p)
    _add_version(p)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser(
        "versions", help="create, list, show or delete pinned versions of a corpus",
        description="A version pins a corpus's current position (compaction generation and "
        "every chain's end) so that export --version NAME reads the same records later.",
    )  # fmt: skip
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in (("create", "pin the corpus's current position as NAME"),
                         ("list", "every version of the corpus, oldest first"),
                         ("show", "one version"),
                         ("delete", "delete a version (what only it kept goes at the next "
                                    "expiry)")):  # fmt: skip
        a = actions.add_parser(action, help=text)
        if action != "list":
            a.add_argument("name", metavar="NAME", help="the version's name")
        a.add_argument(
            "--store", metavar="URL", help="object store URL (default RL_EXPORT_STORE_URL)"
        )
        a.add_argument("--org", required=True)
        a.add_argument("--project", required=True)
        a.add_argument("--corpus", required=True, help="human, evaluator, traces, ...")
        if action == "create":
            a.add_argument("--note", metavar="TEXT", help="what the version is for")
        a.set_defaults(func=cmd_versions, name=None, note=None)

    p = sub.add_parser("stats", help="print {records, avg_reward, pass_rate, human_labeled}")
    _add_source(p)
    _add_filters(p)
    _add_version(p)
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser(
        "agreement",
        help="print the agreement report (Krippendorff's alpha, labelers, evaluators) as JSON",
        description="The agreement report (DESIGN.md section 8) over the latest records of "
        "the traces corpus that match the filters, as one JSON object on stdout.",
    )
    p.add_argument("--store", metavar="URL", help="object store URL (default RL_EXPORT_STORE_URL)")
    p.add_argument("--org", required=True)
    p.add_argument("--project", required=True)
    _add_filters(p)
    p.set_defaults(func=cmd_agreement)

    p = sub.add_parser("produce", help="publish event JSONL files to the input topics")
    p.add_argument("files", nargs="+", type=Path, metavar="FILE")
    p.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers")
    p.set_defaults(func=cmd_produce)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # aiokafka warns about every retry while topic leaders settle; errors still show.
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        print(f"rl-export: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except RlExportError as exc:
        print(f"rl-export: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        if not _stdout_closed():
            raise
        # The reader of our output went away (`rl-export shards tail ... | head`): a normal
        # end for a command line. Point stdout at /dev/null so that the interpreter's final
        # flush does not fail a second time.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    return code


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reading end is closed (poll reports an error on it)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError):
        return False


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
