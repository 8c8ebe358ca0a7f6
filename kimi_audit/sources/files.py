"""Opening a local file of untrusted type: only regular files are ever read.

A FIFO blocks `open()` until a writer comes (forever, for an audit), a character device can be
endless (/dev/zero) or have effects on open, a directory fails late: every local file the tool reads
(a shard, config.json, index.json, an HF cache ref) is opened here first.
"""

from __future__ import annotations

import os
import stat

from kimi_audit.errors import FileTooLargeError, NotRegularFileError, SourceError

_FILE_TYPES = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
               stat.S_IFBLK: "a block device", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symlink"}


def open_regular(path: str | os.PathLike[str], name: str, *, follow: bool = True) -> int:
    """A read-only descriptor of `path`, which must be a regular file; anything else is refused.

    Opened with O_NONBLOCK, so that a FIFO (or a device) cannot block the open itself, then checked
    with fstat on the descriptor (no race with a swap after a stat): a non-regular file raises
    NotRegularFileError, naming its type. O_NONBLOCK has no effect on a regular file's reads.
    `follow=False`: a symlink (as the last component) is refused too (O_NOFOLLOW: the open fails, ELOOP).
    OS errors are raised as they are.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = _FILE_TYPES.get(stat.S_IFMT(mode), "not a regular file")
        raise NotRegularFileError(f"{name} is {kind}, not a regular file: not read")
    return fd


def read_bounded(path: str | os.PathLike[str], name: str, max_bytes: int) -> bytes:
    """The whole of a small regular file (a config.json, an index.json), `name` in messages: refused past
    `max_bytes` (FileTooLargeError), never read past it. OS errors are raised as they are."""
    with os.fdopen(open_regular(path, name), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise FileTooLargeError(f"{name} is {size:,} bytes, over the {max_bytes:,}-byte limit")
        return f.read(max_bytes + 1)[:max_bytes]


def read_small_file(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """read_bounded for a file given by path (a config.json named on the command line): an OS error is a
    SourceError naming the file."""
    name = os.fspath(path)
    try:
        return read_bounded(path, name, max_bytes)
    except OSError as e:
        raise SourceError(f"{name}: cannot be read ({e.strerror or e})") from None


def file_identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """Which file, in which state: (device, inode, size, mtime ns, ctime ns). A file replaced by another, or
    rewritten in place (its ctime moves even where its mtime is set back), has another."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns
