"""The commands that read corpora for people and trainers: ``export``, ``stats``,
``agreement``, ``versions``, with their filter and training-set flags."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl_export.model.errors import ConfigError

if TYPE_CHECKING:
    from rl_export.corpora.layout import CorpusRef

from rl_export.cli.flags import _open, _pinned, _settings


def _filter_values(args: argparse.Namespace) -> dict[str, str | list[str]]:
    """The filter flags given on the command line, as ``parse_filters`` reads them."""
    from rl_export.formats.filters import FILTER_NAMES

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
    "dedup_on", "chat_style", "system", "completion", "chat_template", "on_unrenderable",
)  # fmt: skip
"""What ``--from-manifest`` takes from the manifest: not to be given with it."""


def _from_manifest(args: argparse.Namespace) -> Any:
    """Fill the export's options in ``args`` from ``--from-manifest FILE``; return the view
    position it read. ConfigError for an option given beside it, or a file that is not a
    manifest of this rl-export version."""
    from rl_export.export.lineage import manifest_options, read_manifest
    from rl_export.formats.filters import FILTER_NAMES

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


def _template(args: argparse.Namespace, settings: Any, fmt: str, chat: Any) -> Any:
    """``--chat-template`` and ``--on-unrenderable`` as a TemplateChoice (None without a
    template); from a manifest, the template must still be the one it was made with."""
    from rl_export.export.requests import check_template, parse_on_unrenderable
    from rl_export.export.templated import TemplateChoice
    from rl_export.formats.templates import load_template

    on_unrenderable = parse_on_unrenderable(args.on_unrenderable, args.chat_template is not None)
    if args.chat_template is None:
        return None
    check_template(fmt, chat)
    loaded = load_template(args.chat_template, folder=settings.chat_templates)
    expected = getattr(args, "template_sha256", None)
    if expected is not None and loaded.template.sha256 != expected:
        raise ConfigError("--from-manifest", f"the chat template {args.chat_template} is not the "
                          f"one the export was made with (sha256 {loaded.template.sha256[:12]}, "
                          f"not {expected[:12]}): its rows may differ")  # fmt: skip
    return TemplateChoice(loaded, on_unrenderable)


def cmd_export(args: argparse.Namespace) -> int:
    from rl_export.corpora.rubrics import RubricVersions
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
    from rl_export.export.columns import question_columns
    from rl_export.formats.filters import parse_filters
    from rl_export.formats.render import TABULAR_FORMATS
    from rl_export.runtime.gctune import lean_allocators, tune_gc
    from rl_export.runtime.progressbar import bar, position_callback

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
    template = _template(args, settings, args.format, chat)
    to_stdout = args.output == "-"
    file = file_for(args.format, None if to_stdout else args.output)
    check_export(
        args.format, columns=args.columns, pair_by=pair_by, margin=margin,
        max_pairs=args.max_pairs, zip_data=args.zip_data, mask=mask, file=file, card=args.card,
        redact=redact, chat=chat, completion=completion, template=template is not None,
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
            columns = args.columns
            if columns is None and args.format in TABULAR_FORMATS:  # one per question
                latest = await RubricVersions(store).latest(ref.org, ref.project)
                if latest.version:
                    columns = question_columns([q.name for q in latest.spec.questions])
            with bar(f"exporting {ref.root} as {args.format}", unit="records") as progress:
                return await write_export(
                    store, ref, format=args.format, filters=filters, columns=columns,
                    pair_by=pair_by, margin=margin, max_pairs=args.max_pairs,
                    zip_data=args.zip_data, mask=mask, file=file, card=args.card,
                    redact=redact, chat=chat, completion=completion, split=split, dedup=dedup,
                    at=at, attachments=AttachmentPolicy.from_settings(settings),
                    out=sys.stdout.buffer if to_stdout else Path(args.output),
                    progress=position_callback(progress), template=template,
                )  # fmt: skip
        finally:
            await store.close()

    summary = asyncio.run(run())
    if split is not None:  # an empty split, or too few split-by values, said on stderr
        said = _split_warnings(args, settings, ref, split, filters=filters, at=at)
        for warning in asyncio.run(said):
            print(f"rl-export: warning: {warning}", file=sys.stderr)
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
    if not to_stdout:
        note += f"; lineage {args.output}.manifest.json"
    if template is not None:
        note += f"; {template_note(template, summary)}"
    if args.card:
        note += f", dataset card {Path(args.output).parent / 'README.md'}"
    if version is not None:
        note += f"; read at version {version.name}"
    elif at is not None:
        note += f"; read at the position of {args.from_manifest}"
    if summary.erased:
        note += (f"; {summary.erased} records of deleted traces left out (deletion "
                 "wins)")  # fmt: skip
    if summary.redactions:
        note += "; redacted: " + ", ".join(f"{k} {n}" for k, n in summary.redactions.items())
    else:
        note += "; nothing redacted (--redact none)"
    print(note, file=sys.stderr)
    if (why := summary.why_empty()) is not None:
        print(f"no {args.format} row: {why}", file=sys.stderr)
    return 0


def template_note(template: Any, summary: Any) -> str:
    """What the summary says of a chat template: which, what every row got, what it left
    out and why."""
    adapted = "; ".join(summary.adaptations) or "none"
    left = sum(summary.unrenderable.values())
    why = ", ".join(f"{reason} ({n})" for reason, n in summary.unrenderable.items())
    note = f"chat template {template.loaded.describe()}: adaptations: {adapted}; "
    return note + (f"{left} rows left out: {why}" if left else "no row left out")


def _add_version(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("pinned versions (docs/concepts/corpora.md)")
    group.add_argument("--version", metavar="NAME", help="read the corpus at this version")
    group.add_argument(
        "--as-of", metavar="RFC3339",
        help="read the corpus at the newest version created at or before this time",
    )  # fmt: skip


def cmd_versions(args: argparse.Namespace) -> int:
    from rl_export.corpora.layout import CorpusRef
    from rl_export.corpora.versions import delete_version, get_version, list_versions
    from rl_export.export.versions import pin, table_format
    from rl_export.formats.specs import check_name
    from rl_export.model.codec import dumps

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
                version = await pin(store, ref, args.name, args.note or "",
                                    fmt=table_format(settings, ref.corpus))  # fmt: skip
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
    from rl_export.export import stats
    from rl_export.formats.filters import parse_filters
    from rl_export.model.codec import dumps
    from rl_export.runtime.gctune import lean_allocators, tune_gc

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


class TracesRecords:
    """What a report over a project's ``traces`` corpus reads (``agreement``, ``ratings``):
    the flags' settings, filters and pinned version, made once from the command line."""

    def __init__(self, args: argparse.Namespace) -> None:
        from rl_export.export import source_ref
        from rl_export.formats.filters import parse_filters
        from rl_export.runtime.gctune import tune_gc

        self.args = args
        self.settings = _settings(args, store_url="store")
        self.filters = parse_filters(_filter_values(args))
        self.ref = source_ref(args.org, args.project, "traces")
        self.version = _pinned(args, self.settings, self.ref)
        tune_gc()

    async def each(
        self, store: Any, fields: frozenset[str], add: Callable[[dict[str, Any]], None]
    ) -> None:
        """``add(record)`` for each latest record that matches the filters (``fields`` of it).
        A store without the corpus is a ConfigError naming --org and --project, not --source,
        which these commands have not."""
        from rl_export.export import latest_records
        from rl_export.model.errors import NoDataError

        version, ref = self.version, self.ref
        try:
            async for batch in latest_records(
                store, ref, filters=self.filters, fields=fields,
                at=None if version is None else version.at,
            ):  # fmt: skip
                for record in batch:
                    add(record)
        except NoDataError:
            raise ConfigError(
                "--org/--project", f"no traces corpus for {ref.org}/{ref.project} in "
                f"{store.url} (check --org and --project)",
            ) from None  # fmt: skip


def cmd_agreement(args: argparse.Namespace) -> int:
    from rl_export.corpora.rubrics import RubricVersions
    from rl_export.labeling.agreement import AgreementBuilder, AgreementInput, agreement_report
    from rl_export.labeling.questions import QuestionsBuilder, with_questions
    from rl_export.model.codec import dumps
    from rl_export.model.rubrics import RubricSpec

    traces = TracesRecords(args)
    questions = QuestionsBuilder()
    specs: dict[int, RubricSpec] = {}

    async def run() -> AgreementInput:
        store = _open(args.store, traces.settings)
        builder = AgreementBuilder()

        def add(record: dict[str, Any]) -> None:
            builder.add(record)
            questions.add(record)

        try:
            versions = RubricVersions(store)
            for n in range(await versions.latest_version(args.org, args.project) + 1):
                found = await versions.get(args.org, args.project, n)
                if found is not None:
                    specs[n] = found.spec
            if args.rubric_version is not None and args.rubric_version not in specs:
                raise ConfigError("--rubric-version", f"{args.org}/{args.project} has no rubric "
                                  f"version {args.rubric_version}")  # fmt: skip
            await traces.each(store, AgreementBuilder.FIELDS | QuestionsBuilder.FIELDS, add)
        finally:
            await store.close()
        return builder.build()

    report = agreement_report(asyncio.run(run())).model_dump(mode="json")
    print(dumps(with_questions(report, questions, specs, args.rubric_version)).decode())
    return 0


async def _split_warnings(args: argparse.Namespace, settings: Any, ref: Any, split: Any, *,
                          filters: Any, at: Any) -> list[str]:  # fmt: skip
    """What ``--split`` should say about the splits (:mod:`rl_export.export.splitcounts`)."""
    from rl_export.export.splitcounts import split_counts

    store = _open(args.store, settings)
    try:
        return (await split_counts(store, ref, split, filters=filters, at=at)).warnings
    finally:
        await store.close()


def _add_filters(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("filters (docs/guides/exports.md)")
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
    group = p.add_argument_group("training sets (docs/guides/exports.md)")
    for flag, metavar, text in _TRAINING_FLAGS:
        group.add_argument(flag, metavar=metavar, help=text)


def _training_set(args: argparse.Namespace) -> tuple[Any, Any]:
    """The ``--split`` and ``--dedup`` flags, checked: (Split | None, Dedup | None)."""
    from rl_export.export import parse_dedup, parse_split

    split = parse_split(args.split, args.splits, args.split_by, args.split_salt)
    dedup = parse_dedup(args.dedup, args.dedup_threshold, args.dedup_on)
    return split, dedup
