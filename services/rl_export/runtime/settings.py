"""The one settings class: every environment variable rl-export reads is named here.

Each field ``name`` is read from ``RL_EXPORT_<NAME>`` (for example ``RL_EXPORT_KAFKA_BOOTSTRAP``);
command-line flags override the environment. Settings are frozen once loaded.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rl_export.formats.specs import DEFAULT_CORPORA, CorpusSpec, check_name
from rl_export.model.errors import ConfigError
from rl_export.model.partitioning import Partitioner
from rl_export.privacy.attachment_sources import AttachmentSource, parse_sources
from rl_export.privacy.kinds import RedactError, parse_kinds
from rl_export.runtime.environment import ENV_PREFIX, env_name, load_settings
from rl_export.runtime.kafkasettings import check_kafka_security
from rl_export.runtime.net import checked_networks
from rl_export.runtime.storeurl import parse_store_url

__all__ = ["ENV_PREFIX", "MIB", "Settings", "env_name", "load_settings"]

MIB = 1024 * 1024
DAY_S = 24 * 3600

_NATIVE = "The join's native core (Rust): auto if it is installed, on: required, off: not used."
_BOOTSTRAP = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+:\d{1,5}$")


class Settings(BaseSettings):
    """Every setting of the service, with its default."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    # Kafka
    kafka_bootstrap: str = Field(
        "127.0.0.1:9092", description="Comma-separated host:port list of Kafka brokers."
    )
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT",
        description="How every Kafka client connects: PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or "
        "SASL_SSL (SASL authentication over TLS). TLS always verifies the broker's hostname.",
    )
    kafka_sasl_mechanism: (
        Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "AWS_MSK_IAM"] | None
    ) = Field(
        None,
        description="The SASL mechanism (needed with SASL_PLAINTEXT and SASL_SSL): PLAIN, "
        "SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER (the token is the password, or the "
        "content of the password file, read again for every connection), or AWS_MSK_IAM "
        "(OAUTHBEARER with a token signed from the process's AWS credentials; SASL_SSL and "
        "the msk extra).",
    )
    kafka_msk_region: str | None = Field(
        None,
        pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]+$",
        description="The AWS region of the MSK cluster (needed with AWS_MSK_IAM), for example "
        "eu-west-1.",
    )
    kafka_sasl_username: str | None = Field(None, description="The SASL user (PLAIN and SCRAM).")
    kafka_sasl_password: str | None = Field(
        None,
        repr=False,
        description="The SASL password (or OAUTHBEARER token); prefer the password file.",
    )
    kafka_sasl_password_file: Path | None = Field(
        None,
        description="A file holding the SASL password or OAUTHBEARER token (a mounted secret), "
        "read again whenever a client is built or, for OAUTHBEARER, connects.",
    )
    kafka_ssl_ca_file: Path | None = Field(
        None,
        description="PEM file of the certificate authorities that sign the brokers' "
        "certificates (default: the system's trusted authorities).",
    )
    kafka_ssl_cert_file: Path | None = Field(
        None, description="PEM client certificate for mutual TLS (with the key file)."
    )
    kafka_ssl_key_file: Path | None = Field(
        None, description="PEM private key of the client certificate (mutual TLS)."
    )
    kafka_ssl_key_password: str | None = Field(
        None, repr=False, description="The password of an encrypted key file; prefer its file."
    )
    kafka_ssl_key_password_file: Path | None = Field(
        None, description="A file holding the key file's password (a mounted secret)."
    )
    create_topics: bool = Field(
        True,
        description="Whether the service creates its missing topics; false on managed "
        "clusters, where it only verifies them and refuses to start listing every mismatch.",
    )
    topic_traces: str = Field("traces.completed", description="Input topic of trace events.")
    topic_evaluations: str = Field(
        "evaluations.finished", description="Input topic of evaluation events."
    )
    topic_labels: str = Field(
        "labels.submitted", description="Input topic of label, skip and retraction events."
    )
    topic_trajectories: str = Field(
        "trajectories", description="Where the join sends a snapshot of each changed trace."
    )
    topic_dead_letter: str = Field(
        "rl-export.dead-letter",
        description="Rejected events, with their original bytes and the reason in headers.",
    )
    topic_claims: str = Field(
        "rl-export.claims",
        description="Where web instances tell each other of the labeling claims they write "
        "(the object store decides who holds a place; the topic only spreads the news).",
    )
    topic_commits: str = Field(
        "corpus.commits",
        description="The change feed (compacted): one JSON message per corpus commit, keyed "
        "by <org>/<project>/<corpus>, for orchestrators' sensors (docs/guides/tables.md).",
    )
    partitions: int = Field(8, ge=1, le=1024, description="Partitions of every topic we create.")
    partitioner: Partitioner = Field(
        "murmur2",
        description="How producers hash trace_id to a partition: murmur2 (Java-compatible "
        "clients), crc32 (librdkafka: confluent-kafka, node-rdkafka) or fnv1a (Sarama).",
    )
    replication_factor: int = Field(
        1, ge=1, le=32, description="Replication factor of every topic we create."
    )
    app_id: str = Field("rl-export", min_length=1, description="Consumer group of the join.")
    sink_group: str = Field(
        "rl-export-sink", min_length=1, description="Consumer group of the sink."
    )
    instance_id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9._-]{1,200}$",
        description="A stable name of this worker (the pod name): its join and sink join their "
        "groups as static members, so a restart within the session timeout moves no partition.",
    )
    session_timeout_s: float = Field(
        10.0, ge=1, description="How soon the group notices a dead worker and rebalances."
    )
    kafka_wait_s: float = Field(
        60.0, ge=0, description="How long a starting worker waits for its broker to answer."
    )
    stop_grace_s: float = Field(
        10.0,
        gt=0,
        description="How long a stopping worker waits for the batch in hand to commit before "
        "it cancels it (a broker that is gone never answers; exactly once makes the cut safe).",
    )

    # Events and the join
    max_event_bytes: int = Field(MIB, ge=1024, description="Larger events are dead-lettered.")
    future_tolerance_s: float = Field(
        DAY_S,
        ge=0,
        description="Events whose occurred_at is further ahead of the worker's clock are "
        "dead-lettered.",
    )
    human_pass_threshold: float = Field(
        0.7, ge=0.0, le=1.0, description="Human reward needed to pass."
    )
    orphan_retention_s: float = Field(
        7 * DAY_S,
        gt=0,
        description="How long events whose trace never came are kept before they are dropped.",
    )
    tombstone_retention_s: float = Field(
        7 * DAY_S,
        gt=0,
        description="How long a deleted trace's tombstone is kept (in the table and beside "
        "compactions).",
    )
    state_store: str = Field(
        "rocksdb://",
        pattern=r"^(rocksdb|memory)://$",
        description="The join table's store: rocksdb:// on disk, or memory:// (rebuilt from "
        "the changelog at start).",
    )
    state_cache_mib: int = Field(
        4, ge=0, description="Recently used join states kept in memory per join process."
    )
    join_batch_size: int = Field(
        5000,
        ge=1,
        description="Events the join takes per batch: per-request costs (producing, committing, "
        "fetching) are shared by a batch, at most one batch's work is redone after a crash.",
    )
    join_batch_window_s: float = Field(0.1, gt=0, description="Longest wait to fill a batch.")
    join_batch_bytes: int = Field(
        MIB // 2,
        ge=0,
        description="On a backlog, a batch is topped up from further fetch responses until it "
        "holds this many bytes of events (fewer transactions; more memory); 0: one response.",
    )
    expiry_scan_interval_s: float = Field(
        3600.0, gt=0, description="How often the join drops expired orphans and tombstones."
    )
    join_processes: int = Field(
        2,
        ge=0,
        le=64,
        description="Child processes a worker runs its join in (one core each; each is a "
        "member of the join group); 0 runs the join in the worker's own process.",
    )
    join_native: Literal["auto", "on", "off"] = Field("auto", description=_NATIVE)
    producer_compression: Literal["", "snappy", "lz4", "zstd", "gzip"] = Field(
        "snappy",
        description="Compression of the record batches the join produces (changelog, "
        "snapshots, dead letters); empty: none. On the bench's traffic snappy makes them 3.5 "
        "times smaller for a few µs per event, and the broker and the sink handle that much "
        "fewer bytes.",
    )
    processing_guarantee: Literal["exactly_once", "at_least_once"] = Field(
        "exactly_once",
        description="exactly_once: each join partition writes its changelog, snapshots and "
        "dead letters and commits its input offsets in one Kafka transaction, so a paused "
        "'zombie' join is fenced; at_least_once: plain idempotent sends, then the commit.",
    )

    # Object storage and shards
    store_url: str = Field("var/store", description="file:///abs/path, a path, or s3://bucket/p")
    shard_max_records: int = Field(
        10_000, ge=1, description="A partition's pending records are committed at this many."
    )
    shard_max_bytes: int = Field(
        64 * MIB, ge=1024, description="... or at this many bytes of records."
    )
    shard_max_age_s: float = Field(
        10.0, gt=0, description="... or when the oldest has waited this long."
    )
    sink_buffer_mib: int = Field(
        32,
        ge=1,
        description="Bytes of records the sink holds for its next shards, over all its "
        "partitions and corpora; past it, the partitions holding most commit early.",
    )
    shard_inline_max_bytes: int = Field(
        65536,
        ge=0,
        description="A commit whose shard is at most this many bytes (uncompressed, no "
        "sidecar) holds its lines itself: one object written instead of a data object and a "
        "commit, what a quiet corpus's commits cost. 0: every commit names a data object.",
    )
    shard_compression: Literal["none", "gzip"] = Field(
        "none", description="Compression of the shards' data objects: none or gzip."
    )
    shard_sidecars: bool = Field(
        True,
        description="Write an index sidecar (Parquet: the filter columns and each line's "
        "place) beside each uncompressed trajectory compaction part and seeded chain, so the "
        "web service and the exports read columns instead of parsing records.",
    )
    sink_sidecars: bool = Field(
        False,
        description="Index sidecars beside the sink's own shards too (with shard_sidecars): "
        "readers then parse nothing, but each commit builds a Parquet file per shard, about "
        "a third of the worker's speed on small events; off, the shards since the last "
        "compaction are read whole.",
    )
    corpus_max_age_s: float = Field(
        120.0,
        ge=0,
        description="Quiet chains wait up to this long (0: off). A corpus's chain on a "
        "partition holding fewer than quiet_chain_records lines when its partition commits "
        "is left pending until it has that many or its oldest line is this old: fewer, "
        "larger objects for projects with little traffic (object writes per event stop "
        "growing with tenants), at the cost of those corpora's freshness in the store (the "
        "web service shows new traces from the trajectories topic meanwhile). Deletions are "
        "never held.",
    )
    quiet_chain_records: int = Field(
        8, ge=2, description="With corpus_max_age_s: fewer pending lines than this is quiet."
    )
    compaction_interval_s: float = Field(
        300.0, gt=0, description="How often a worker compacts the corpora it writes."
    )
    compaction_min_commits: int = Field(
        64,
        ge=1,
        description="A corpus is compacted once its chains hold this many commits after its "
        "latest compaction (as the worker counts its own, scaled to every partition): a "
        "generation rewrites the corpus (about a dozen objects), which a quiet corpus's one "
        "new commit does not pay for when there are many tenants.",
    )
    compaction_max_wait_s: float = Field(
        86400.0,
        gt=0,
        description="A corpus whose tail stays under compaction_min_commits is compacted "
        "anyway (its open table written) once a worker has seen it wait this long.",
    )
    shard_retention_s: float = Field(
        7 * DAY_S, ge=0, description="How long shards covered by a compaction stay readable."
    )
    tables: bool = Field(
        True,
        description="Keep each corpus's open table: a Delta Lake table of its latest view in "
        "<org>/<project>/<corpus>/_table/, brought to each new compaction generation with a "
        "MERGE of what changed (docs/guides/tables.md). The memory store has none.",
    )
    corpora: tuple[CorpusSpec, ...] = Field(
        DEFAULT_CORPORA, description="JSON list of {name, source, format, filter}."
    )
    crash_at: Literal["", "after_data", "after_commit", "join_pause_before_send"] = Field(
        "",
        description="Fault injection for tests: SIGKILL the sink at this point, or SIGSTOP a "
        "join process once, after it wrote a batch to its table and before it sends it.",
    )

    # Local stack and servers
    data_dir: Path = Field(Path("var"), description="Where the embedded stack keeps its data.")
    broker_port: int = Field(
        9092, ge=1, le=65535, description="Port of the local broker (broker, dev) on 127.0.0.1."
    )
    worker_web_port: int = Field(
        6066, ge=1, le=65535, description="Port of a worker's /metrics, /healthz and /readyz."
    )
    web_port: int = Field(8080, ge=1, le=65535, description="Port of the web service.")
    web_metrics_port: int = Field(
        8081,
        ge=1,
        le=65535,
        description="Port of the web service's Prometheus metrics (GET /metrics), never served "
        "on the public port: open it to monitoring only.",
    )
    web_host: str = Field("127.0.0.1", description="Address the HTTP servers bind to.")
    log_level: str = Field(
        "warn",
        pattern=r"^(crit|error|warn|info|debug)$",
        description="Log level of the processes: crit, error, warn, info or debug.",
    )

    # The web service (``rl-export web``)
    web_index_dir: Path | None = Field(
        None,
        description="Where the web service keeps its query index (default "
        "<data_dir>/web-index/<web_port>: one per instance, never shared).",
    )
    web_index_poll_s: float = Field(
        1.0, gt=0, description="How often the index looks for new commits of a corpus."
    )
    web_index_wait_s: float = Field(
        10.0,
        ge=0,
        description="How long the first request for a corpus waits for the index to catch "
        "up before it answers from what is indexed so far.",
    )
    web_index_threads: int = Field(
        2, ge=1, le=64,
        description="DuckDB threads of the index, and how many corpora it ingests at once.",
    )  # fmt: skip
    web_index_memory: str = Field(
        "1GB", pattern=r"^\d+(\.\d+)?\s*[KMGT]i?B$", description="DuckDB memory limit."
    )
    web_agreement_max_age_s: float = Field(
        30.0,
        ge=0,
        description="How old an agreement report may be and still answer GET agreement "
        "after labels changed its corpus: the answer says it is updating and one new report "
        "is computed in the background. Older (or 0), the request waits for a new one.",
    )
    web_warm: str = Field(
        "",
        description="Projects (org/project, comma-separated) whose corpora (those of "
        "RL_EXPORT_CORPORA) an instance indexes as it starts, side by side; its /readyz "
        "answers 503 until their first pass is done, so a load balancer sends it no "
        "requests before then. Other corpora are indexed when first asked for.",
    )
    web_token_cache_s: float = Field(
        5.0,
        ge=0,
        description="How long a web instance trusts a token it has checked: a revocation "
        "takes effect everywhere within this time.",
    )
    web_auth_failures_per_minute: int = Field(
        30,
        ge=1,
        le=100_000,
        description="Unknown tokens one client address may send per minute; over that, they get "
        "429 with Retry-After until the minute ends (a token that verifies is always served).",
    )
    web_trusted_proxies: Annotated[str, AfterValidator(checked_networks)] = Field(
        "",
        description="Addresses and CIDRs (comma list) of the proxies in front of the web service: "
        "only from them are X-Forwarded-For and Forwarded read for the client's address. "
        "Empty (the default): the client is the connection's peer, whatever the headers say.",
    )
    web_max_body_bytes: int = Field(MIB, ge=1024, description="Larger request bodies get 413.")
    web_publish_timeout_s: float = Field(
        10.0, gt=0, description="How long a label waits for the broker's acknowledgement."
    )
    web_overlay_ttl_s: float = Field(
        900.0,
        gt=0,
        description="How long the web service hides a trace its labeler just labeled or "
        "skipped from their queue while the corpora catch up.",
    )
    web_export_processes: int = Field(
        1, ge=1, le=16, description="Processes that run background export jobs per instance."
    )
    web_export_threads: int = Field(
        4,
        ge=1,
        le=64,
        description="Threads of the pool that runs direct exports (GET export), apart from the "
        "threads that answer stats, the queue, claims and /readyz; exports beyond it wait.",
    )
    web_exports_per_subject: int = Field(
        2,
        ge=1,
        le=64,
        description="Direct exports one subject (token user, per org/project) may run at once "
        "per instance; more get 429 with Retry-After.",
    )
    web_jobs_per_subject: int = Field(
        4,
        ge=1,
        le=256,
        description="Export jobs one subject (per org/project) may have queued or running at "
        "once per instance; more get 429 with Retry-After.",
    )
    web_export_retention_s: float = Field(
        DAY_S, gt=0, description="How long finished export jobs and their files are kept."
    )
    web_export_heartbeat_s: float = Field(
        2.0, gt=0, description="How often a running export job writes its progress."
    )
    chat_templates: Path | None = Field(
        None,
        description="A folder of chat templates (NAME.jinja) that exports, the API, jobs and "
        "corpus specs name with --chat-template NAME / chat_template=NAME (before the "
        "built-in ones; the API reads no other file).",
    )
    redact: str = Field(
        "secrets",
        description="What exports redact unless asked otherwise, and corpus specs without a "
        "'redact' of their own: kinds (secrets, email, phone, credit_card, iban, ip), pii, "
        "all or none.",
    )
    labels_per_trace: int = Field(
        1,
        ge=1,
        le=10,
        description="Labels per trace a project's team aims for, until an admin sets "
        "labels_per_trace with PUT labeling.",
    )
    lease_s: int = Field(
        600,
        ge=30,
        le=DAY_S,
        description="How long a claim holds a trace for its labeler, until an admin sets "
        "lease_s with PUT labeling.",
    )
    compare_partners: int = Field(
        8,
        ge=1,
        le=64,
        description="Comparisons: how many traces of its group (same prompt or scenario) each "
        "trace is paired with at most, the next ones in a fixed shuffle of the group (a group "
        "of n traces gives at most n times this many pairs).",
    )
    labeling_cache_s: float = Field(
        5.0,
        ge=0,
        description="How long a web instance uses a project's labeling settings (and which "
        "version of its rubric is the newest) before it reads them again: a change applies "
        "everywhere within this time.",
    )
    web_sync_export_max_records: int = Field(
        10_000,
        ge=0,
        description="The page downloads exports of up to this many records directly and runs "
        "larger ones as background jobs.",
    )

    # Attachments of zip exports (docs/guides/security.md)
    attachment_sources: str = Field(
        "",
        description="Comma list of the URI prefixes a zip export may fetch attachments from: "
        "s3://bucket/prefix/ and https://host[:port]/prefix/, each ending with '/'. Empty (the "
        "default): no attachment is fetched. file: and http: URIs, the store's own bucket and "
        "prefix, and https hosts that resolve to a non-public address are never fetched.",
    )
    attachment_max_bytes: int = Field(
        16 * MIB, ge=1, description="Largest attachment a zip export fetches (larger: too_large)."
    )
    attachment_max_total_bytes: int = Field(
        256 * MIB,
        ge=1,
        description="Bytes of attachments one zip export fetches at most; the attachments "
        "past it are listed as too_large.",
    )

    @field_validator("attachment_sources")
    @classmethod
    def _check_attachment_sources(cls, value: str) -> str:
        return ",".join(str(s) for s in parse_sources(value))

    @field_validator("kafka_bootstrap")
    @classmethod
    def _check_bootstrap(cls, value: str) -> str:
        servers = [s.strip() for s in value.split(",") if s.strip()]
        if not servers or not all(_BOOTSTRAP.match(s) for s in servers):
            raise ValueError(f"expected host:port[,host:port...], got {value!r}")
        return ",".join(servers)

    @model_validator(mode="after")
    def _check_kafka_security(self) -> Settings:
        """Refuse combinations that cannot connect (:func:`~rl_export.runtime.
        kafkasettings.check_kafka_security`)."""
        check_kafka_security(self)
        return self

    @field_validator("web_warm")
    @classmethod
    def _check_warm(cls, value: str) -> str:
        projects = [p.strip() for p in value.split(",") if p.strip()]
        for project in projects:
            parts = project.split("/")
            if len(parts) != 2:
                raise ValueError(f"expected org/project[,org/project...], got {project!r}")
            check_name("org", parts[0])
            check_name("project", parts[1])
        return ",".join(projects)

    @property
    def warm_projects(self) -> tuple[tuple[str, str], ...]:
        """``web_warm`` as (org, project) pairs."""
        return tuple((org, project) for org, _, project in
                     (p.partition("/") for p in self.web_warm.split(",") if p))  # fmt: skip

    @field_validator("redact")
    @classmethod
    def _check_redact(cls, value: str) -> str:
        try:
            kinds = parse_kinds(value)
        except RedactError as exc:
            raise ValueError(exc.detail) from None
        return ",".join(kinds) or "none"

    @model_validator(mode="after")
    def _default_redaction(self) -> Settings:
        """Corpus specs without a ``redact`` of their own take this setting's; a spec's
        ``chat_template`` is loaded (from ``chat_templates`` or the built-ins) and probed."""
        kinds = parse_kinds(self.redact)
        corpora = []
        for spec in self.corpora:
            try:
                corpora.append(spec.with_redact_default(kinds).with_template(self.chat_templates))
            except ConfigError as exc:
                raise ValueError(f"{env_name('corpora')}: corpus {spec.name}: {exc}") from None
        object.__setattr__(self, "corpora", tuple(corpora))
        return self

    @field_validator("store_url")
    @classmethod
    def _check_store_url(cls, value: str) -> str:
        parse_store_url(value)  # raises ValueError with the reason
        return value

    @property
    def attachment_prefixes(self) -> tuple[AttachmentSource, ...]:
        """``attachment_sources`` parsed."""
        return parse_sources(self.attachment_sources)

    @property
    def index_dir(self) -> Path:
        """The web service's index folder (one per instance: see ``web_index_dir``)."""
        if self.web_index_dir is not None:
            return self.web_index_dir
        return self.data_dir / "web-index" / str(self.web_port)

    @property
    def input_topics(self) -> tuple[str, str, str]:
        """The three input topics, in the order traces, evaluations, labels."""
        return (self.topic_traces, self.topic_evaluations, self.topic_labels)

    @property
    def all_topics(self) -> tuple[str, ...]:
        """Every topic the service creates and checks at start."""
        return (
            *self.input_topics,
            self.topic_trajectories,
            self.topic_dead_letter,
            self.topic_changelog,
            self.topic_claims,
            self.topic_commits,
        )

    @property
    def topic_changelog(self) -> str:
        """The join table's changelog (compacted; one per ``app_id``)."""
        return f"{self.app_id}-trace-state-changelog"
