"""What the benchmarks, the soak and the integration tests share: worker processes, a proxy
that cuts a connection, topic reads, the expected corpora and process CPU and memory."""
