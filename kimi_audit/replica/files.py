"""Writing a replica's files: each a new file renamed over its name, never written through a link."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO


@contextmanager
def new_file(path: Path) -> Iterator[BinaryIO]:
    """Write `path` as a new file: a temporary file created exclusively beside it (O_EXCL, so never through a
    link; mode 0o666 less the umask, as open() gives), then renamed over it. Whatever `path` was (a symlink
    planted there, a hard link to another file, someone else's file) is replaced, never written through nor
    truncated; on an error the temporary file is removed."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
