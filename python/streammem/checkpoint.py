"""Writing checkpoint files so that a crash never leaves a half-written one."""
from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import BinaryIO, Callable

__all__ = ["atomic_write"]


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Replace ``path`` atomically by what ``write(fh)`` writes to a binary file handle.

    The bytes go to a hidden file beside ``path``, are flushed to disk, and the
    file is renamed over ``path``: a reader sees the old file or the new one,
    never a part.  The hidden file is removed if ``write`` raises.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
