"""Module-name patterns from a config (compressed-tensors' `re:` entries of `targets` and `ignore`), matched in
linear time, from the start of the name as compressed-tensors matches them (`re.match`).

config.json is untrusted: a pattern such as `(.|.)*X` makes a backtracking engine (Python's `re`) take time
exponential in the module name's length. Patterns are compiled with RE2 (google-re2), whose matching is
linear in the name and whose compiled program is bounded in memory (`max_mem`); a pattern RE2 cannot compile
(back-references, look-around, a program over the bound) is a ConfigError naming it, never a fallback to `re`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import re2

from kimi_audit.errors import ConfigError
from kimi_audit.text import clip

__all__ = ["MAX_PATTERN_MEMORY", "NamePatterns", "compile_patterns"]

MAX_PATTERN_MEMORY = 8 << 20
"""Bytes RE2 may use for one compiled pattern set (its default); a larger program is refused."""


def _options() -> Any:
    options = re2.Options()
    options.max_mem = MAX_PATTERN_MEMORY
    options.log_errors = False
    # Only whether a name matches is asked, never a group: parentheses are parsed as non-capturing, so that RE2
    # tracks no submatch (half the time of a match: `.*mlp\.(gate|up)_proj.*` over Kimi-K2-Thinking's 70,776
    # modules, 0.15 s against 0.32 s).
    options.never_capture = True
    return options


@dataclass(frozen=True)
class NamePatterns:
    """Several patterns, any of which must match at the start of a module name (compressed-tensors'
    `re.match`)."""

    sources: tuple[str, ...]
    regex: Any
    """The RE2 program of the patterns' alternation."""
    encoded: Any = None
    """The same program over UTF-8 bytes: `match_many`'s (google-re2 converts a str match's offsets back to
    characters, which costs most of a match on a module name)."""

    def match(self, name: str) -> bool:
        return self.regex.match(name) is not None

    def match_many(self, names: Sequence[str]) -> list[bool]:
        """`match` of each name, over its UTF-8 bytes (3.5 ms for the 2,688 expert modules of a Kimi K3 layer,
        against 10 ms matching them as str; a scan of the names joined by newlines pays per match the same
        conversion back from bytes)."""
        match = self.encoded.match
        return [match(n.encode()) is not None for n in names]


def compile_patterns(patterns: Iterable[str], where: str) -> NamePatterns | None:
    """The patterns as one RE2 program (None when there are none); `where` names their place in the config
    for the error a pattern RE2 cannot compile raises."""
    sources = tuple(patterns)
    if not sources:
        return None
    for source in sources:  # one at a time first, so that the error names the pattern at fault
        try:
            re2.compile(source, _options())
        except re2.error as e:
            raise ConfigError(f"{where} holds a pattern RE2 cannot compile, {clip(source, 80)!r}: "
                              f"{_reason(e)}") from None
    alternation = "|".join(f"(?:{s})" for s in sources)
    try:
        regex = re2.compile(alternation, _options())
        encoded = re2.compile(alternation.encode(), _options())
    except re2.error as e:
        raise ConfigError(f"{where}: its {len(sources)} patterns together are over RE2's bound: "
                          f"{_reason(e)}") from None
    return NamePatterns(sources, regex, encoded)


def _reason(e: Exception) -> str:
    arg = e.args[0] if e.args else e
    return clip(arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg), 200)
