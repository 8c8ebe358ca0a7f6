"""Writing a replica's files: each a new file renamed over its name, never written through a link; a build that
does not finish takes back what it wrote (`undone_unless_finished`)."""

from __future__ import annotations

import os
import secrets
import stat
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


def _tree(directory: Path) -> tuple[set[Path], set[tuple[Path, int, int]]]:
    """The folders under `directory` (itself included, if it exists) and its regular files by identity."""
    folders: set[Path] = set()
    files: set[tuple[Path, int, int]] = set()
    if not directory.is_dir():
        return folders, files
    for root, dirs, names in os.walk(directory):
        folders.add(Path(root))
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
        for name in names:
            path = Path(root, name)
            with suppress(OSError):
                st = path.lstat()
                if stat.S_ISREG(st.st_mode):
                    files.add((path, st.st_dev, st.st_ino))
    return folders, files


@contextmanager
def undone_unless_finished(directory: Path) -> Iterator[None]:
    """Within the block, a build into `directory`; if it ends by an exception (Ctrl-C, SIGTERM's SystemExit, a
    full disk), every regular file under `directory` that was not there before the block (by its identity: a
    file the build wrote over an old name is new) is removed, and the folders the block made, if empty after.
    A partial replica left by an interrupted `demo DIR` made the next run refuse DIR (not empty) without
    --force. Nothing that was there before is touched: an old file the build had already replaced was the
    replica's own name, replaced as --force allows."""
    folders, files = _tree(directory)
    try:
        yield
    except BaseException:
        now_folders, now_files = _tree(directory)
        for path, _, _ in now_files - files:
            with suppress(OSError):
                os.unlink(path)
        for folder in sorted(now_folders - folders, key=lambda p: len(p.parts), reverse=True):
            with suppress(OSError):
                folder.rmdir()  # only if empty: what someone else put there stays
        raise
