"""Writing an export's files: under a temporary name beside the target, renamed when
complete (never a partial file under the name), the chunks written in a thread while the
next one is made."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path
from typing import IO, Any, BinaryIO

Chunk = bytes | memoryview


async def write_atomically(target: Path, write: Callable[[BinaryIO], Awaitable[None]]) -> None:
    """Write a file under a temporary name beside ``target``, fsync it, rename it: never a
    partial file under the name (the temporary one is removed on any error)."""
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                                     dir=target.parent)  # fmt: skip
    try:
        with os.fdopen(fd, "wb") as fh:
            await write(fh)
            fh.flush()
            os.fchmod(fh.fileno(), 0o666 & ~umask())  # mkstemp makes it 0600
            os.fsync(fh.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


async def write_chunks(
    chunks: AsyncGenerator[Chunk, None], out: IO[bytes] | BinaryIO, digest: Any = None
) -> None:
    """Write every chunk, each in a thread while the next one is made (one at a time, in
    order): on two cores reading and writing overlap. ``run_in_executor`` hands the write
    to the thread at once (a ``to_thread`` task would start only at the next await)."""
    loop = asyncio.get_running_loop()
    writing: asyncio.Future[int] | None = None
    try:
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                if writing is not None:
                    await writing
                if digest is not None:
                    digest.update(chunk)  # the output's sha256 (lineage)
                writing = loop.run_in_executor(None, out.write, chunk)
    finally:
        if writing is not None:
            await writing


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
