"""The ``rl-export`` command line (docs/guides/commands.md).

Every command turns an :class:`RlExportError` into one line on stderr and a non-zero exit;
argparse already answers bad flags with a usage line and exit code 2.

The top floor: imports any room (a command's modules lazily, so ``rl-export --help`` starts
fast); nothing imports it.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from rl_export import __version__
from rl_export.cli.admin import cmd_acls, cmd_audit, cmd_shards, cmd_tokens
from rl_export.cli.exports import (
    _add_filters,
    _add_training_set,
    _add_version,
    cmd_agreement,
    cmd_export,
    cmd_stats,
    cmd_versions,
)
from rl_export.cli.flags import EXIT_CONFIG, EXIT_ERROR, _add_source
from rl_export.cli.processes import (
    cmd_broker,
    cmd_dev,
    cmd_produce,
    cmd_replay,
    cmd_web,
    cmd_worker,
)
from rl_export.cli.ratings import cmd_ratings
from rl_export.cli.rubric import cmd_rubric
from rl_export.cli.templates import cmd_template
from rl_export.cli.watching import add_watch
from rl_export.model.errors import ConfigError, RlExportError

__all__ = ["build_parser", "main"]


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
    p.add_argument(
        "--data-dir", type=Path,
        help="where the stack keeps its data, the store and its token included (default var)",
    )  # fmt: skip
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
        metavar="label,export[,admin][,raw][,review]",
        help="create: what it may do (raw: read with less redaction than the default; "
        "review: decide disputed traces; admin implies neither)",
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

    p = sub.add_parser(
        "acls", help="the least Kafka ACLs a process needs: kafka-acls commands, a KafkaUser",
        description="The ACLs of the worker, the web service or produce, derived from the "
        "settings (topic names, RL_EXPORT_APP_ID, RL_EXPORT_SINK_GROUP, "
        "RL_EXPORT_PROCESSING_GUARANTEE, RL_EXPORT_CREATE_TOPICS) as the process's own clients "
        "use them: kafka-acls commands and a Strimzi KafkaUser.",
    )  # fmt: skip
    p.add_argument("--principal", required=True, help="the user: NAME or User:NAME")
    p.add_argument("--role", required=True, choices=["worker", "web", "produce"])
    p.add_argument(
        "--format", default="all", choices=["all", "kafka-acls", "strimzi"],
        help="kafka-acls commands, a Strimzi KafkaUser, or both (default)",
    )  # fmt: skip
    p.add_argument(
        "--cluster", default="my-cluster",
        help="strimzi: the Kafka cluster's name (its strimzi.io/cluster label)",
    )  # fmt: skip
    p.add_argument(
        "--authentication", choices=["scram-sha-512", "tls", "tls-external"],
        help="strimzi: how the user logs in (default: tls with RL_EXPORT_KAFKA_SSL_CERT_FILE "
        "over SSL, else scram-sha-512)",
    )  # fmt: skip
    p.set_defaults(func=cmd_acls)

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
    _add_version(p)  # cat: the version's records (with --latest, one per trace)
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
        "--chat-template", metavar="FILE|NAME",
        help="with a chat format: make every row for this chat template (a .jinja file, a "
        "tokenizer_config.json, or a name: RL_EXPORT_CHAT_TEMPLATES' or a built-in) and "
        "write only rows that render with every message's text",
    )  # fmt: skip
    p.add_argument(
        "--on-unrenderable", metavar="skip|fail",
        help="with --chat-template: leave out a row the template cannot render, counted by "
        "reason (skip, the default), or stop with exit 2 (fail)",
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

    p = sub.add_parser(
        "template", help="chat templates: add {% generation %} markers for assistant-only loss",
        description="mark FILE -o OUT writes a copy of a chat template whose {% generation %} "
        "blocks hold each assistant message (TRL's assistant_only_loss), checked by rendering "
        "conversations with both (probes, and the rows of --rows FILE.jsonl).",
    )  # fmt: skip
    p.add_argument("action", choices=["mark"])
    p.add_argument("template", metavar="FILE|NAME", help="the chat template")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="the marked copy")
    p.add_argument(
        "--rows", metavar="FILE.jsonl", action="append",
        help="an export (messages, prompt_completion, preference, kto) whose every row is "
        "rendered both ways too (repeatable)",
    )  # fmt: skip
    p.set_defaults(func=cmd_template)

    p = sub.add_parser("stats", help="print {records, avg_reward, pass_rate, human_labeled}")
    _add_source(p)
    _add_filters(p)
    _add_version(p)
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser(
        "agreement",
        help="print the agreement report (Krippendorff's alpha, labelers, evaluators) as JSON",
        description="The agreement report (docs/guides/labeling.md) over the latest records of "
        "the traces corpus that match the filters, as one JSON object on stdout.",
    )
    p.add_argument("--store", metavar="URL", help="object store URL (default RL_EXPORT_STORE_URL)")
    p.add_argument("--org", required=True)
    p.add_argument("--project", required=True)
    p.add_argument(
        "--rubric-version", type=int, metavar="N",
        help="by_question compares the labels of this rubric version (default: the newest "
        "version two labels of a trace share)",
    )  # fmt: skip
    _add_filters(p)
    _add_version(p)  # a version of the project's traces corpus
    p.set_defaults(func=cmd_agreement)

    p = sub.add_parser(
        "ratings",
        help="print Bradley-Terry ratings per agent version and agreement of comparisons as JSON",
        description="Ratings of agent versions from the comparisons of the latest records of "
        "the traces corpus that match the filters (docs/guides/comparisons.md): Elo scale, "
        "95 %% bootstrap intervals over pairs; agreement over pairs compared by two or more "
        "labelers. One JSON object on stdout.",
    )
    p.add_argument("--store", metavar="URL", help="object store URL (default RL_EXPORT_STORE_URL)")
    p.add_argument("--org", required=True)
    p.add_argument("--project", required=True)
    _add_filters(p)
    _add_version(p)  # a version of the project's traces corpus
    p.set_defaults(func=cmd_ratings)

    p = sub.add_parser(
        "rubric", help="a project's rubric as JSON: get the newest (or --version N), or set FILE",
        description="The project's rubric (docs/guides/rubrics.md): get prints a version as "
        "JSON; set FILE makes the next version from the file's guidelines and questions.",
    )  # fmt: skip
    p.add_argument("action", choices=["get", "set"])
    p.add_argument("file", nargs="?", metavar="FILE", help="set: the rubric's JSON ('-': stdin)")
    p.add_argument("--org", required=True)
    p.add_argument("--project", required=True)
    p.add_argument("--version", type=int, metavar="N", help="get: this version, not the newest")
    p.add_argument("--by", default="rl-export cli", help="set: who made the version (recorded)")
    p.add_argument("--store", metavar="URL", help="object store URL (default RL_EXPORT_STORE_URL)")
    p.set_defaults(func=cmd_rubric)

    p = sub.add_parser("produce", help="publish event JSONL files to the input topics")
    p.add_argument("files", nargs="+", type=Path, metavar="FILE")
    p.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers")
    p.set_defaults(func=cmd_produce)

    add_watch(sub)
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
