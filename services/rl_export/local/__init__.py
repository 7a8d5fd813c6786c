"""The local stack: the Kafka broker, SeaweedFS, process handling, ``dev`` and its synthetic
traffic. For development and tests; production runs none of it. The benchmarks and the soak
that drive it live outside the package, in ``tests/perf/`` and ``tests/soak/``.

A process room: imports the stages and the ground floor, never ``worker``, ``web`` or ``cli``."""
