"""How the project talks to Kafka: connections and starting clients while a broker blinks.

One place for bootstrap, TLS and SASL of every client (:mod:`.client`), and starting and
stopping clients while the broker may be away for a moment (:mod:`.retrying`).

Imports ``model`` and ``runtime``.
"""
