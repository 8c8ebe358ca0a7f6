"""A source narrowed to the files some globs select (`audit --include 'UD-Q2_K_XL/*'`: one GGUF set of a repo that
holds several), and the glob that selects the split set a GGUF file belongs to."""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from pathlib import Path

from kimi_audit.errors import FileMissingError, KimiAuditError
from kimi_audit.sources.base import Holes, RangeRead, Source

SPLIT_NAME = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
"""llama.cpp's split part names (`llama_split_path`: `%s-%05d-of-%05d.gguf`)."""
MAX_GLOB = 1024
"""The longest `--include` glob: fnmatch's translation of a glob is quadratic in its `[`s (20,000 of them take
30 s), and a path is shorter."""
MAX_GLOBS = 256
"""The most `--include` globs (each file listed is matched against every one)."""


def set_globs(name: str) -> tuple[str, ...]:
    """The globs that select the GGUF set the file `name` belongs to: its split parts, or the file alone."""
    m = SPLIT_NAME.match(name)
    if m is None:
        return (glob_escape(name),)
    return (glob_escape(m.group("stem")) + "-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9].gguf",)


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


class Selected:
    """`source` with only the files an `include` glob matches listed, and only those readable."""

    def __init__(self, source: Source, include: tuple[str, ...], label: str | None = None) -> None:
        for glob in include:
            if len(glob) > MAX_GLOB:
                raise KimiAuditError(f"--include: a glob of {len(glob):,} characters (at most {MAX_GLOB:,}: a "
                                     "file path's)")
        if len(include) > MAX_GLOBS:
            raise KimiAuditError(f"--include given {len(include):,} times (at most {MAX_GLOBS})")
        self.source, self.include = source, include
        self.label = label or f"{source.label} ({' '.join(include)})"
        self.revision = source.revision
        self.parallel_reads = source.parallel_reads

    def _check(self, name: str) -> str:
        if not any(fnmatchcase(name, g) for g in self.include):
            raise FileMissingError(f"{name} is not among the files --include selects")
        return name

    @property
    def remote(self) -> bool:
        return self.source.remote

    @property
    def root(self) -> Path | None:
        return self.source.root

    def list_files(self) -> tuple[str, ...]:
        return tuple(f for f in self.source.list_files() if any(fnmatchcase(f, g) for g in self.include))

    def exists(self, name: str) -> bool:
        return any(fnmatchcase(name, g) for g in self.include) and self.source.exists(name)

    def read_file(self, name: str, max_bytes: int) -> bytes:
        return self.source.read_file(self._check(name), max_bytes)

    def read_range(self, name: str, start: int, length: int) -> RangeRead:
        return self.source.read_range(self._check(name), start, length)

    def file_size(self, name: str) -> int | None:
        return self.source.file_size(name)

    def holes(self, name: str, start: int = 0, length: int | None = None) -> Holes:
        return self.source.holes(self._check(name), start, length)

    def lfs_sha256(self, name: str) -> str | None:
        return self.source.lfs_sha256(name)

    def outside_links(self) -> tuple[str, ...]:
        return self.source.outside_links()

    def reported_parameters(self) -> int | None:
        return None
