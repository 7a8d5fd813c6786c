"""The benchmarks, the ceiling and the profile (``make bench``, ``bench-ab``, ``bench-ceiling``,
``bench-export``, ``bench-web``, ``bench-restart``, ``bench-peers``, ``profile``): run from the
checkout with ``python -m tests.perf.<name>``, never shipped in the wheel."""
