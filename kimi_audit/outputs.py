"""The files a run writes (a report's --output, a manifest, download's files): never one the run reads, never
through a link.

- `refuse_input(output, inputs, what)`: before any work, an error (exit 2) when `output` is a file the run
  reads: the same resolved path, or the same file (st_dev, st_ino: a hard link counts).
- `write_atomic(path, data, size)`: the bytes go to a temporary file created exclusively in the target's own
  directory (tempfile.mkstemp: O_CREAT | O_EXCL, a fresh random name, so no planted name or link redirects
  them), then are renamed over `path`: a symlink at `path` is replaced, its target never written. A `path`
  that is a stream (a terminal, /dev/null, a pipe) is written to as it is: there is nothing to replace.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from kimi_audit.errors import KimiAuditError

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read once: a temporary file gets the mode a plain open() would give it


class OutputIsInputError(KimiAuditError):
    """An output named a file the run reads (it would be replaced): refused before anything is read."""


def refuse_input(output: Path, inputs: Iterable[str | os.PathLike[str]], what: str) -> None:
    """Raise OutputIsInputError when `output` is one of `inputs` (by resolved path, or by device and inode)."""
    try:
        out = os.stat(output)
    except OSError:
        return  # nothing there (or nothing reachable): it is no file the run reads
    real = os.path.realpath(output)
    for path in inputs:
        try:
            same = os.path.realpath(path) == real or _same(os.stat(path), out)
        except OSError:
            continue
        if same:
            raise OutputIsInputError(f"{what} {output} is {path}, a file this run reads: it would be replaced; "
                                     "name another file")


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def write_atomic(path: Path, data: bytes, size: int | None = None) -> None:
    """Write `data` (then extend the file to `size`, sparse) under an exclusive temporary name in `path`'s
    directory, and rename it over `path`. OSError as it comes (the caller says what was being written)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        with open(path, "wb") as stream:  # a terminal, /dev/null, a pipe: written to, nothing replaced
            stream.write(data)
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".kimi-audit.partial")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_UMASK)
            f.write(data)
            if size is not None and size > len(data):
                f.truncate(size)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
