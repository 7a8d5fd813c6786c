"""Unit tests of the benchmark harnesses in tests/perf/."""
