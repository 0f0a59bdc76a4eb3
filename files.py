"""Writing a user's file whole or not at all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, text: str, error: type[Exception]) -> None:
    """Write `text` to a temporary file beside `path` and rename it over `path` when whole,
    so a reader never sees half a file; raises `error` naming the path when it cannot.
    The file gets the permissions the umask gives a new file (mkstemp's 0600 is for the
    temporary only)."""
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as e:
        raise error(f"{path}: cannot write: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise error(f"{path}: cannot write: {e.strerror or e}") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
