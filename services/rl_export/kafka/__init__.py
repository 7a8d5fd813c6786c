"""How the project talks to Kafka: connections, what each process does there, and starting
clients while a broker blinks.

One place for bootstrap, TLS and SASL of every client (:mod:`.client`, its token sources in
:mod:`.tokens`); one list of what each process's clients read, write, join and name
(:mod:`.access`), from which its ACLs come, written out (:mod:`.acls`) and asked of the broker
(:mod:`.authorized`); and starting and stopping clients while the broker may be away for a
moment (:mod:`.retrying`).

Imports ``model`` and ``runtime``.
"""
