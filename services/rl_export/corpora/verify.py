"""``rl-export shards verify``: check the corpora in a store.

:func:`verify` checks, for every corpus under a prefix (docs/concepts/corpora.md):

1. every object under ``_manifest/`` is a commit name and a readable commit that agrees with
   its name (stream, ``from_offset``, ``last_offset >= from_offset``) and names its shard
   where the layout puts it;
2. every commit's shard exists and matches the commit: byte size, sha256, record count,
   one JSON object with ``trace_id`` and ``revision`` per line;
3. every chain, sorted by ``from_offset``, has no overlap and no gap, and starts at 0 unless
   a compaction's positions reach its first commit;
4. no ``(trace_id, revision)`` appears twice in the corpus's chains (compaction parts aside);
5. every ``_compaction.json`` is readable and matches its folder; its parts exist (only the
   latest generation must be complete: expiry deletes an old generation parts first) and
   match size, sha256 and record counts; it holds one record per trace; the latest
   generation's positions fall on commit boundaries, so a reader can continue from them;
   the latest generation's tombstones are tombstones of traces its parts do not hold, and
   its holdings index names exactly the parts' traces and revisions, each in its partition;
6. every pinned version (:mod:`rl_export.corpora.versions`) under the prefix resolves: it is
   readable, its compaction and that compaction's parts exist, and every chain it names runs
   without a gap from that compaction's position to the version's end, each commit's shard
   present.

Data objects no commit names, and parts no compaction names, are counted as ``orphans``: a
crash between a data upload and its commit, or a lost commit race, leaves them; they are
harmless and are not problems.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from rl_export.corpora.commits import (
    ChainError,
    Commit,
    SidecarRef,
    chain_keys,
    decode_shard,
    read_commit,
)
from rl_export.corpora.compacted import Compaction, read_compaction, read_holdings, read_tombstones
from rl_export.corpora.layout import Compression, CorpusRef
from rl_export.corpora.reader import stream_order
from rl_export.corpora.shards import (
    DEFAULT_CONCURRENCY,
    bounded,
    group_by_corpus,
    parse_commit_key,
)
from rl_export.corpora.sidecar import SidecarError, read_sidecar
from rl_export.corpora.store import ObjectStore
from rl_export.corpora.versions import VERSIONS_ROOT, Version, all_versions
from rl_export.model.codec import loads
from rl_export.model.errors import ObjectNotFoundError, StoreError
from rl_export.model.partitioning import partition_for


@dataclass
class VerifyReport:
    """What :func:`verify` found. ``problems`` fail it; ``notes`` and ``orphans`` do not."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    corpora: int = 0
    commits: int = 0
    records: int = 0
    compactions: int = 0
    compacted_records: int = 0
    orphans: int = 0
    versions: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        verdict = "ok" if self.ok else f"{len(self.problems)} problems"
        return (
            f"{verdict}: {self.corpora} corpora, {self.commits} commits, {self.records} records, "
            f"{self.compactions} compactions ({self.compacted_records} records), "
            f"{self.orphans} orphans" + (f", {self.versions} versions" if self.versions else "")
        )


@dataclass
class _CommitCheck:
    """One commit and its shard, checked; ``ids`` only when the shard's checksum matched."""

    key: str
    stream: str | None
    offset: int | None
    commit: Commit | None = None
    problems: list[str] = field(default_factory=list)
    records: int = 0
    ids: list[tuple[str, int]] | None = None
    missing: bool = False  # the commit or its shard went while we read (expiry, if covered)


@dataclass
class _Link:
    from_offset: int
    last_offset: int | None  # None: the commit is unreadable, only its name is known
    key: str


async def _get(store: ObjectStore, key: str) -> bytes | str:
    """The object's bytes, or a problem saying why not."""
    try:
        return await store.get(key)
    except ObjectNotFoundError:
        return f"{key}: missing"
    except ValueError as exc:
        return f"{key}: not a valid object key ({exc})"


def _rows(
    key: str, data: bytes, compression: Compression
) -> tuple[list[dict[str, Any]] | None, str | None]:
    """Decode a shard into records, or say why it cannot be."""
    try:
        rows: list[Any] = decode_shard(data, compression)
    except (ValueError, OSError, EOFError) as exc:
        return None, f"{key}: unreadable shard ({exc})"
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            return None, f"{key}: line {number} is not a JSON object"
        trace_id, revision = row.get("trace_id"), row.get("revision")
        if (
            not isinstance(trace_id, str)
            or isinstance(revision, bool)
            or not isinstance(revision, int)
        ):
            return None, f"{key}: line {number} has no string trace_id and integer revision"
    return rows, None


async def _check_commit(store: ObjectStore, ref: CorpusRef, key: str) -> _CommitCheck:
    parsed = parse_commit_key(ref, key)
    if parsed is None:
        return _CommitCheck(key, None, None, problems=[
            f"{key}: not a commit name (expected _manifest/<topic>-<partition>/<from_offset>.json)"
        ])  # fmt: skip
    stream, offset = parsed
    check = _CommitCheck(key, stream, offset)
    try:
        commit = await read_commit(store, key)
    except ChainError as exc:
        check.problems.append(str(exc))
        return check
    except ObjectNotFoundError:
        check.problems.append(f"{key}: listed but gone while verifying")
        check.missing = True
        return check
    check.commit = commit
    if commit.stream != stream:
        check.problems.append(f"{key}: commit is for {commit.stream}, its folder is {stream}")
    if commit.from_offset != offset:
        check.problems.append(f"{key}: from_offset {commit.from_offset} differs from its name")
    if commit.last_offset < commit.from_offset:
        check.problems.append(
            f"{key}: last_offset {commit.last_offset} < from_offset {commit.from_offset}"
        )
    shard_key = ref.key(commit.shard)
    # A commit holding its lines names itself; the others their data object.
    expected = key if commit.inline is not None else (
        ref.data_key(stream, offset, commit.sha256, commit.compression))  # fmt: skip
    if shard_key != expected:
        check.problems.append(
            f"{key}: shard {commit.shard} is not where the layout puts it "
            f"({ref.relative(expected)})"
        )
    if commit.inline is not None and commit.compression != "none":
        check.problems.append(f"{key}: holds its lines but says they are {commit.compression}")
    data = commit.inline.encode() if commit.inline is not None else await _get(store, shard_key)
    if isinstance(data, str):
        check.problems.append(f"{data} (the shard of {key})")
        check.missing = True
        return check
    if len(data) != commit.bytes:
        check.problems.append(f"{shard_key}: {len(data)} bytes, {key} says {commit.bytes}")
    digest = hashlib.sha256(data).hexdigest()
    if digest != commit.sha256:
        check.problems.append(
            f"{shard_key}: sha256 {digest[:16]}… does not match {key} ({commit.sha256[:16]}…)"
        )
    rows, problem = _rows(shard_key, data, commit.compression)
    if rows is None:
        check.problems.append(f"{problem}")
        return check
    check.records = len(rows)
    if len(rows) != commit.records:
        check.problems.append(f"{shard_key}: {len(rows)} records, {key} says {commit.records}")
    if digest == commit.sha256:
        check.ids = [(row["trace_id"], row["revision"]) for row in rows]
    if commit.index is not None:
        check.problems += await _sidecar_problems(
            store,
            ref,
            commit.index,
            commit.sha256,
            rows=rows,
            size=len(data),
            compression=commit.compression,
        )
    return check


async def _sidecar_problems(store: ObjectStore, ref: CorpusRef, index: Any, sha256: str, *,
                            rows: list[dict[str, Any]], size: int,
                            compression: Compression) -> list[str]:  # fmt: skip
    """What is wrong with an object's index sidecar: readers would refuse it, or its rows do
    not name the object's records."""
    try:
        sidecar = SidecarRef.model_validate(index)
    except ValueError as exc:
        return [f"{ref.key(sha256[:16])}: malformed index reference ({exc})"]
    key = ref.key(sidecar.key)
    data = await _get(store, key)
    if isinstance(data, str):
        return [f"{data} (an index sidecar)"]
    try:
        table = read_sidecar(data, sidecar, shard_sha256=sha256, records=len(rows),
                             shard_bytes=size if compression == "none" else None)  # fmt: skip
    except SidecarError as exc:
        return [str(exc)]
    ids = list(zip(table.column("trace_id").to_pylist(), table.column("revision").to_pylist(),
                   strict=True))  # fmt: skip
    if ids != [(row["trace_id"], row["revision"]) for row in rows]:
        return [f"{key}: its trace ids and revisions are not its object's"]
    return []


def _check_chain(
    ref: CorpusRef, stream: str, links: list[_Link], covered_by_compaction: int
) -> list[str]:
    """Gaps and overlaps of one chain (``links`` sorted by ``from_offset``)."""
    problems = []
    first = links[0]
    if first.from_offset > covered_by_compaction:
        problems.append(
            f"{first.key}: chain {stream} starts at offset {first.from_offset}; offsets "
            f"{covered_by_compaction}..{first.from_offset - 1} are in no commit or compaction"
        )
    # ``end``: the highest offset known to be covered so far, and the commit covering it;
    # after an unreadable commit only its first offset is known, so gaps cannot be told.
    end, end_key, exact = -1, first.key, True
    for n, link in enumerate(links):
        if n and link.from_offset <= end:
            problems.append(f"{link.key}: overlaps {end_key} (which reaches offset {end})")
        elif n and exact and link.from_offset > max(end + 1, covered_by_compaction):
            # (A gap a compaction covers is history that expired: readers start there.)
            problems.append(
                f"{link.key}: gap in chain {stream}, offsets {end + 1}..{link.from_offset - 1} "
                f"are in no commit (previous: {end_key})"
            )
        if link.last_offset is None:
            end, end_key, exact = max(end, link.from_offset), link.key, False
        elif link.last_offset > end or not exact:
            end, end_key, exact = max(end, link.last_offset), link.key, True
    return problems


async def _check_compactions(
    store: ObjectStore, ref: CorpusRef, keys: list[str], report: VerifyReport
) -> tuple[list[Compaction], set[str]]:
    """Check every generation; return the readable compactions and the keys they name."""
    prefix = ref.compacted_prefix()
    folders: dict[str, list[str]] = {}
    for key in keys:
        if key.startswith(prefix):
            folders.setdefault(key[len(prefix) :].split("/", 1)[0], []).append(key)
    readable: list[tuple[str, Compaction]] = []
    for folder, members in sorted(folders.items()):
        manifest = f"{prefix}{folder}/_compaction.json"
        if manifest not in members:
            continue  # a compactor that crashed or lost: its parts are orphans
        try:
            compaction = Compaction.model_validate(loads(await store.get(manifest)))
        except (ValueError, ObjectNotFoundError) as exc:
            report.problems.append(f"{manifest}: unreadable compaction ({exc})")
            continue
        if not folder.isdigit() or compaction.generation != int(folder):
            report.problems.append(
                f"{manifest}: generation {compaction.generation} in folder {folder}"
            )
        readable.append((manifest, compaction))
    named: set[str] = {manifest for manifest, _ in readable}
    newest = max((c.generation for _, c in readable), default=None)
    for manifest, compaction in readable:
        report.compactions += 1
        traces: set[str] = set()
        total = 0
        for number, part in enumerate(compaction.parts):
            shard, sha256 = part.get("shard"), part.get("sha256")
            records, size = part.get("records"), part.get("bytes")
            compression = part.get("compression")
            if not (
                isinstance(shard, str)
                and isinstance(sha256, str)
                and isinstance(records, int)
                and isinstance(size, int)
                and compression in ("none", "gzip")
            ):
                report.problems.append(f"{manifest}: part {number} is malformed ({part})")
                continue
            key = ref.key(shard)
            named.add(key)
            data = await _get(store, key)
            if isinstance(data, str):
                if compaction.generation == newest:
                    report.problems.append(f"{data} (part {number} of {manifest})")
                else:
                    report.notes.append(f"{data} (part {number} of older {manifest}, expiring?)")
                continue
            if len(data) != size:
                report.problems.append(f"{key}: {len(data)} bytes, {manifest} says {size}")
            if hashlib.sha256(data).hexdigest() != sha256:
                report.problems.append(f"{key}: sha256 does not match {manifest}")
            rows, problem = _rows(key, data, compression)
            if rows is None:
                report.problems.append(f"{problem}")
                continue
            if part.get("index") is not None:
                named.add(ref.key(str(part["index"].get("key"))))
                report.problems += await _sidecar_problems(
                    store,
                    ref,
                    part["index"],
                    sha256,
                    rows=rows,
                    size=len(data),
                    compression=compression,
                )
            total += len(rows)
            if len(rows) != records:
                report.problems.append(f"{key}: {len(rows)} records, {manifest} says {records}")
            for row in rows:
                if row["trace_id"] in traces:
                    report.problems.append(f"{key}: trace {row['trace_id']!r} twice in {manifest}")
                traces.add(row["trace_id"])
        report.compacted_records += total
        if total != compaction.records:
            report.problems.append(
                f"{manifest}: parts hold {total} records, it says {compaction.records}"
            )
        extras = [compaction.tombstones or {}, *((compaction.holdings or {}).get("parts", []))]
        named.update(ref.key(x["shard"]) for x in extras if isinstance(x.get("shard"), str))
        if compaction.generation == newest:
            await _check_compaction_extras(store, ref, manifest, compaction, report)
    return [c for _, c in readable], named


async def _check_compaction_extras(
    store: ObjectStore, ref: CorpusRef, manifest: str, compaction: Compaction, report: VerifyReport
) -> None:
    """The latest generation's tombstones and holdings index against its parts."""
    try:
        parts = {
            (r["trace_id"], r["revision"]) for r in await read_compaction(store, ref, compaction)
        }
        tombstones = await read_tombstones(store, ref, compaction)
    except (ChainError, ObjectNotFoundError, ValueError, KeyError, TypeError):
        return  # the parts' own problems are reported above
    except StoreError as exc:
        report.problems.append(f"{manifest}: tombstones unreadable ({exc})")
        return
    live = {trace for trace, _ in parts}
    for row in tombstones:
        if not row.get("deleted") or row.get("trace_id") in live:
            report.problems.append(
                f"{manifest}: tombstone of {row.get('trace_id')!r} is no tombstone of a trace "
                "the parts leave out"
            )
    holdings = compaction.holdings
    if holdings is None:
        return
    indexed: set[tuple[str, int]] = set()
    for part in holdings.get("parts", []):
        try:
            traces, revisions = await read_holdings(store, ref, part)
        except (StoreError, ValueError) as exc:
            report.problems.append(f"{manifest}: holdings of partition {part.get('partition')}: "
                                   f"{exc}")  # fmt: skip
            continue
        for trace in traces:
            home = partition_for(trace.encode(), holdings["partitions"], holdings["partitioner"])
            if home != part.get("partition"):
                report.problems.append(
                    f"{manifest}: {trace!r} is indexed in partition {part.get('partition')}, "
                    f"its partition is {home}"
                )
        indexed.update(zip(traces, revisions, strict=True))
    if indexed != parts:
        report.problems.append(
            f"{manifest}: its holdings index names {len(indexed - parts)} (trace, revision) "
            f"the parts do not hold and misses {len(parts - indexed)}"
        )


async def _verify_corpus(
    store: ObjectStore, ref: CorpusRef, keys: list[str], report: VerifyReport, concurrency: int
) -> None:
    report.corpora += 1
    # 5. Compactions first: their positions excuse chains that start after 0.
    compactions, named = await _check_compactions(store, ref, keys, report)
    reach: dict[str, int] = {}
    for compaction in compactions:
        for stream, position in compaction.positions.items():
            reach[stream] = max(reach.get(stream, 0), position)

    # 1, 2. Every commit and its shard.
    manifest = sorted(k for k in keys if k.startswith(f"{ref.root}/_manifest/"))
    checks = await bounded(manifest, lambda key: _check_commit(store, ref, key), concurrency)
    chains: dict[str, list[_Link]] = {}
    seen: dict[tuple[str, int], str] = {}
    for check in checks:
        if check.stream is None or check.offset is None:
            report.problems.extend(check.problems)
            continue
        if check.missing and check.offset < reach.get(check.stream, 0):
            # A compaction covers it: expiry deleted it while we read (a live store).
            report.notes += [f"{p} (covered by a compaction: expired)" for p in check.problems]
            continue
        report.problems.extend(check.problems)
        report.commits += 1
        report.records += check.records
        commit = check.commit
        if commit is not None:
            named.add(ref.key(commit.shard))
            if commit.index is not None:
                named.add(ref.key(commit.index.key))
        last = None  # unknown when the commit is unreadable or contradicts its name
        if commit and commit.from_offset == check.offset <= commit.last_offset:
            last = commit.last_offset
        chains.setdefault(check.stream, []).append(_Link(check.offset, last, check.key))
        # 4. Repeated (trace_id, revision), across every chain of the corpus.
        for ident in check.ids or ():
            first = seen.get(ident)
            if first is None:
                seen[ident] = check.key
                continue
            where = f"{first} and {check.key}" if first != check.key else f"twice in {first}"
            report.problems.append(
                f"{ref.root}: (trace_id {ident[0]!r}, revision {ident[1]}) is in {where}"
            )

    # 3. Gaps and overlaps.
    for stream in sorted(chains, key=stream_order):
        links = sorted(chains[stream], key=lambda link: link.from_offset)
        report.problems.extend(_check_chain(ref, stream, links, reach.get(stream, 0)))

    # 5. A reader starting from the latest compaction continues each chain at its position.
    if compactions:
        latest = max(compactions, key=lambda c: c.generation)
        for stream, position in sorted(latest.positions.items()):
            links = chains.get(stream, [])
            if not links or any(link.last_offset is None for link in links):
                continue
            heads = {link.from_offset for link in links}
            heads.add(max(link.last_offset or 0 for link in links) + 1)
            if position not in heads:
                report.problems.append(
                    f"{ref.compaction_key(latest.generation)}: position {position} of {stream} "
                    f"is not a commit boundary of {ref.manifest_prefix(stream)}"
                )

    # Orphans: data and parts nothing names.
    report.orphans += sum(
        1
        for key in keys
        if key.startswith((f"{ref.root}/data/", ref.compacted_prefix())) and key not in named
    )


async def verify(
    store: ObjectStore, prefix: str = "", *, concurrency: int = DEFAULT_CONCURRENCY
) -> VerifyReport:
    """Check every corpus under ``prefix`` (see the module docstring for what is checked)."""
    report = VerifyReport()
    for ref, keys in group_by_corpus(await store.list(prefix)).items():
        await _verify_corpus(store, ref, keys, report, concurrency)
    for key, version in await all_versions(store):
        if not key.removeprefix(f"{VERSIONS_ROOT}/").startswith(prefix):
            continue
        report.versions += 1
        if isinstance(version, Version):
            report.problems.extend(await _version_problems(store, key, version))
        else:
            report.problems.append(str(version))
    return report


async def _version_problems(store: ObjectStore, key: str, version: Version) -> list[str]:
    """Why ``version`` does not resolve (nothing when it does)."""
    ref = CorpusRef(version.org, version.project, version.corpus)
    if key != f"{VERSIONS_ROOT}/{ref.root}/{version.name}.json":
        return [f"{key}: names another version ({ref.root} {version.name})"]
    positions: dict[str, int] = {}
    if version.generation is not None:
        compaction_key = ref.compaction_key(version.generation)
        try:
            compaction = Compaction.model_validate(loads(await store.get(compaction_key)))
        except ObjectNotFoundError:
            return [f"{key}: its compaction {compaction_key} is gone"]
        except ValueError as exc:
            return [f"{key}: its compaction {compaction_key} is unreadable ({exc})"]
        positions = dict(compaction.positions)
        present = set(await store.list(ref.compacted_prefix()))
        for part in compaction.parts:
            if ref.key(part["shard"]) not in present:
                return [f"{key}: part {part['shard']} of its compaction is gone"]
    problems = []
    for stream, end in sorted(version.ends.items()):
        position = positions.get(stream, 0)
        commits = dict(await chain_keys(store, ref, stream, position))
        data = set(await store.list(f"{ref.root}/data/{stream}/")) if position < end else set()
        while position < end and position in commits:
            try:
                commit = await read_commit(store, commits[position])
            except (ObjectNotFoundError, ChainError) as exc:
                problems.append(f"{key}: commit {commits[position]} unreadable ({exc})")
                break
            if commit.inline is None and ref.key(commit.shard) not in data:
                problems.append(f"{key}: shard {commit.shard} is gone")
                break
            position = commit.last_offset + 1
        else:
            if position != end:
                problems.append(
                    f"{key}: chain {stream} reaches offset {position} from "
                    f"{positions.get(stream, 0)}, the version ends at {end}"
                )
    return problems
