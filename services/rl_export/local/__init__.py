"""The local stack: the Kafka broker, SeaweedFS, process handling, ``dev``, synthetic traffic
and the benchmarks. For development and tests; production runs none of it."""
