"""``make bench-peers``' pieces: the peers' merge rule and its check, the Quix Streams and Kafka
Streams peers (a Python script run in a virtualenv of its own, a Maven project), and how a
peer's process is run and measured. The rounds and the table are in
:mod:`tests.perf.bench_peers`.

The merge rule and the Quix Streams script import nothing but the standard library (and
Quix Streams): they run in the peers' virtualenv, which holds no rl-export.
"""
