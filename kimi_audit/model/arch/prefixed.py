"""A release read under its text model's names (spec.ReleaseReader with a prefix): the GGUF dialects of a wrapper
whose text model sits under `language_model.` (Kimi-K2.5, Kimi K3) read its tensors by the text model's names."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kimi_audit.model.arch.spec import ReleaseReader


class PrefixedReader:
    """A release read under its text model's names: each name with `prefix` before it (a wrapper's
    `language_model.`), for a dialect that names the text model's tensors alone."""

    def __init__(self, read: ReleaseReader, prefix: str) -> None:
        self.read, self.prefix = read, prefix

    def shape(self, name: str) -> tuple[int, ...]:
        return self.read.shape(self.prefix + name)

    def rows(self, name: str, start: int, stop: int) -> Any:
        return self.read.rows(self.prefix + name, start, stop)

    def bands(self, name: str) -> Iterator[Any]:
        return self.read.bands(self.prefix + name)
