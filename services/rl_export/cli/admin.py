"""The commands that look after a store, and the cluster's ACLs: ``shards``, ``tokens``,
``audit``, ``acls``."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import TYPE_CHECKING

from rl_export.model.errors import ConfigError

if TYPE_CHECKING:
    pass

from rl_export.cli.flags import _open, _pinned, _ref, _settings


def cmd_shards(args: argparse.Namespace) -> int:
    from rl_export.corpora import shards, verify

    settings = _settings(args, store_url="store")
    version = None
    if args.action == "cat" and (args.version is not None or args.as_of is not None):
        version = _pinned(args, settings, _ref(args))
    elif args.version is not None or args.as_of is not None:
        raise ConfigError("--version", f"shards {args.action} reads no version (only cat does)")

    async def run() -> int:
        store = _open(args.store, settings)
        out = sys.stdout.buffer
        try:
            if args.action == "ls":
                for entry in await shards.ls(store, args.prefix):
                    print(entry)
            elif args.action == "verify":
                report = await verify.verify(store, args.prefix)
                for problem in report.problems:
                    print(problem, file=sys.stderr)
                print(report.summary())
                return 0 if report.ok else 1
            elif args.action == "compact":
                from rl_export.corpora.chain import writer_id
                from rl_export.corpora.compaction import compact_all
                from rl_export.corpora.table import TableSync

                # The open tables too, those that are behind included (nothing new).
                table = TableSync(
                    formats={spec.name: spec.format for spec in settings.corpora},
                    retention_s=settings.shard_retention_s, catch_up=True,
                ) if settings.tables else None  # fmt: skip
                written = await compact_all(
                    store, args.prefix, writer=writer_id(),
                    partitioning=(settings.partitioner, settings.partitions),
                    tombstone_retention_s=settings.tombstone_retention_s, table=table,
                )  # fmt: skip
                for compaction in written:
                    print(f"generation {compaction.generation}: {compaction.records} records")
            elif args.action == "cat":
                async for line in shards.cat(
                    store, _ref(args), latest_only=args.latest,
                    version=None if version is None else version.version,
                ):  # fmt: skip
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


def cmd_audit(args: argparse.Namespace) -> int:
    from datetime import datetime

    from rl_export.formats.specs import check_name
    from rl_export.model.codec import dumps
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


def cmd_acls(args: argparse.Namespace) -> int:
    from rl_export.kafka import acls
    from rl_export.kafka.access import Role

    settings = _settings(args)
    role = Role(args.role)
    if args.principal.strip() in ("", "User:"):
        raise ConfigError("--principal", "name the user, for example rl-export-worker")
    authentication = args.authentication or (
        "tls" if settings.kafka_security_protocol == "SSL" and settings.kafka_ssl_cert_file
        else "scram-sha-512")  # fmt: skip
    parts = []
    if args.format in ("all", "kafka-acls"):
        parts.append(acls.kafka_acls(settings, role, args.principal))
    if args.format in ("all", "strimzi"):
        user = acls.strimzi_user(settings, role, args.principal, cluster=args.cluster,
                                 authentication=authentication)  # fmt: skip
        parts.append("---\n" + user)
    print("\n".join(parts), end="")
    return 0
