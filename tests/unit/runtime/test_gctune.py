"""A reading process's allocators: pyarrow on the system allocator unless the environment
says otherwise (each case in a child process: the setting is process-wide)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHILD = (
    "from rl_export.runtime.gctune import lean_allocators\n"
    "lean_allocators()\n"
    "import pyarrow\n"
    "print(pyarrow.default_memory_pool().backend_name)\n"
)


@pytest.mark.parametrize(("given", "expected"), [(None, "system"), ("mimalloc", "mimalloc")])
def test_pyarrow_takes_the_system_allocator_unless_told_otherwise(
    given: str | None, expected: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if given is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = given
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == expected
