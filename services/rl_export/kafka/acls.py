"""The ACLs a process needs, written out: kafka-acls commands and a Strimzi ``KafkaUser``.

``rl-export acls --principal P --role worker|web|produce`` prints what
:func:`rl_export.kafka.access.grants` derives from the settings (topic names, app id, sink
group, exactly once or not, whether topics are created): one kafka-acls command per
resource, and one ``KafkaUser`` whose ACLs say which of the process's clients needs each
operation. The Strimzi component of ``deploy/kubernetes`` is this output (a test holds them
equal), and so is the configuration guide's table.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence

from rl_export.kafka import access
from rl_export.kafka.access import Grant, Kind, Op, Resource, Role
from rl_export.runtime.settings import Settings

STRIMZI_AUTHENTICATIONS = ("scram-sha-512", "tls", "tls-external")
# A word YAML reads as that string: a letter first (no number, no .inf), no keyword.
_PLAIN = re.compile(r"^[A-Za-z][A-Za-z0-9._\-]*$")
_KEYWORDS = {"true", "false", "yes", "no", "on", "off", "y", "n", "null"}
_KAFKA_ACLS_RESOURCE = {Kind.TOPIC: "--topic", Kind.GROUP: "--group",
                        Kind.TRANSACTIONAL_ID: "--transactional-id"}  # fmt: skip


def _yaml(text: str) -> str:
    """A plain YAML scalar when it is one, else a quoted one (JSON's quoting is YAML's)."""
    plain = _PLAIN.match(text) and text.lower() not in _KEYWORDS
    return text if plain else json.dumps(text)


def principal_of(name: str) -> str:
    """A principal as Kafka writes it: ``User:<name>`` unless it already says its type."""
    return name if ":" in name else f"User:{name}"


def user_name(principal: str) -> str:
    """The user's own name (a Strimzi ``KafkaUser`` is named after it)."""
    return principal.split(":", 1)[1] if principal.startswith("User:") else principal


def why(settings: Settings, role: Role, resource: Resource, ops: Sequence[Op]) -> str:
    """Which clients need each operation on a resource, in one line."""
    return "; ".join(
        f"{op}: {', '.join(access.needed_by(settings, role, Grant(resource, op)))}" for op in ops
    )


def kafka_acls(settings: Settings, role: Role, principal: str) -> str:
    """The kafka-acls commands that grant a role's process what it needs, one per resource."""
    principal = principal_of(principal)
    lines = [
        f"# The ACLs of the rl-export {role} (rl-export acls --role {role}), for {principal}.",
        "# Run as an admin: BOOTSTRAP is a broker's address, ADMIN_CONFIG a client properties",
        "# file that logs in as a principal allowed to change ACLs.",
    ]
    for resource, ops in access.by_resource(access.grants(settings, role)).items():
        lines.append(f"# {why(settings, role, resource, ops)}")
        words = ["kafka-acls.sh", '--bootstrap-server "$BOOTSTRAP"',
                 '--command-config "$ADMIN_CONFIG"', "--add",
                 f"--allow-principal {shlex.quote(principal)}"]  # fmt: skip
        if resource.kind is Kind.CLUSTER:
            words.append("--cluster")
        else:
            words.append(f"{_KAFKA_ACLS_RESOURCE[resource.kind]} {shlex.quote(resource.name)}")
        if resource.prefixed:
            words.append("--resource-pattern-type prefixed")
        words += [f"--operation {op}" for op in ops]
        lines.append(" ".join(words))
    return "\n".join(lines) + "\n"


def strimzi_user(
    settings: Settings, role: Role, principal: str, *, cluster: str,
    authentication: str = "scram-sha-512",
) -> str:  # fmt: skip
    """A Strimzi ``KafkaUser`` (simple authorization) with a role's ACLs, as YAML."""
    name = user_name(principal_of(principal))
    lines = [
        "apiVersion: kafka.strimzi.io/v1beta2",
        "kind: KafkaUser",
        "metadata:",
        f"  name: {_yaml(name)}",
        "  labels:",
        f"    strimzi.io/cluster: {_yaml(cluster)}",
        "spec:",
        "  authentication:",
        f"    type: {authentication}",
        "  authorization:",
        "    type: simple",
        "    acls:",
    ]
    for resource, ops in access.by_resource(access.grants(settings, role)).items():
        lines.append(f"      # {why(settings, role, resource, ops)}")
        if resource.kind is Kind.CLUSTER:
            lines.append("      - resource: {type: cluster}")
        else:
            pattern = "prefix" if resource.prefixed else "literal"
            lines.append(f"      - resource: {{type: {resource.kind}, name: "
                         f"{_yaml(resource.name)}, patternType: {pattern}}}")  # fmt: skip
        lines.append(f"        operations: [{', '.join(ops)}]")
    return "\n".join(lines) + "\n"


def _cell(resource: Resource) -> str:
    if resource.kind is Kind.CLUSTER:
        return "the cluster"
    kind = "transactional ids" if resource.kind is Kind.TRANSACTIONAL_ID else str(resource.kind)
    return f"{kind} {'starting ' if resource.prefixed else ''}`{resource.name}`"


def acls_table(settings: Settings, roles: Sequence[Role] = tuple(Role)) -> str:
    """The roles' ACLs as a Markdown table (the configuration guide's)."""
    rows = ["| process | resource | operations | needed by |", "| --- | --- | --- | --- |"]
    for role in roles:
        for resource, ops in access.by_resource(access.grants(settings, role)).items():
            needs = [access.needed_by(settings, role, Grant(resource, op)) for op in ops]
            clients = sorted({c for found in needs for c in found})
            rows.append(f"| {role} | {_cell(resource)} | {', '.join(ops)} | "
                        f"{', '.join(clients)} |")  # fmt: skip
    return "\n".join(rows) + "\n"
