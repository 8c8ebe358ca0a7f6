"""A release read under other names (spec.ReleaseReader through a renaming): the GGUF dialects whose converter reads a
release by names it does not store under. A wrapper whose text model sits under `language_model.` (Kimi-K2.5, Kimi
K3) is read by the text model's names; a release in Mistral's own spelling (Mistral Small 4) by transformers'."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from kimi_audit.model.arch.spec import ReleaseReader


class RenamedReader:
    """`read` asked for each name as `stored(name)` calls it in the release (a prefix added, a spelling swapped)."""

    def __init__(self, read: ReleaseReader, stored: Callable[[str], str]) -> None:
        self.read, self.stored = read, stored

    def shape(self, name: str) -> tuple[int, ...]:
        return self.read.shape(self.stored(name))

    def rows(self, name: str, start: int, stop: int) -> Any:
        return self.read.rows(self.stored(name), start, stop)

    def bands(self, name: str) -> Iterator[Any]:
        return self.read.bands(self.stored(name))
