"""Process memory tuning: glibc's mmap threshold stays fixed after ``tune_malloc``."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

# Frees a 4 MiB block (which raises glibc's dynamic mmap threshold to 4 MiB), then reports
# whether a new 1 MiB block got a mapping of its own (a new line in /proc/self/maps, other
# than the heap's).
_PROBE = """
import sys
from rl_export.common.gctune import tune_malloc
if sys.argv[1] == "tuned":
    assert tune_malloc()
big = bytearray(4 * 1024 * 1024)
del big
def mappings():  # the heap's own line changes as it grows: not a mapping of its own
    return {m for m in open("/proc/self/maps").read().splitlines() if "[heap]" not in m}
before = mappings()
block = bytearray(1024 * 1024)
print("mapped" if mappings() - before else "heap")
"""


def probe(mode: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")
def test_freed_large_blocks_do_not_move_large_buffers_into_the_heap() -> None:
    assert probe("default") == "heap"  # glibc raised its threshold past 1 MiB
    assert probe("tuned") == "mapped"  # returned to the system when freed
