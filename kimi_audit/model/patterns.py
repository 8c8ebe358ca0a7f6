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
        program = _program(self.encoded)
        if program is None:
            return self.regex.match(name) is not None
        b = name.encode()
        hit: bool = program.Match(_ANCHOR_START, b, 0, len(b))[0] != _NO_MATCH
        return hit

    def match_many(self, names: Sequence[str]) -> list[bool]:
        """`match` of each name, over its UTF-8 bytes (3.5 ms for the 2,688 expert modules of a Kimi K3 layer,
        against 10 ms matching them as str; a scan of the names joined by newlines pays per match the same
        conversion back from bytes), asked of RE2's compiled program itself where google-re2 exposes it (its
        `match` wraps each answer in a generator and a Match object: 3 Python calls a name, most of the 0.13 s
        that Kimi-K2-Thinking's 70,776 modules took)."""
        program = _program(self.encoded)
        if program is None:
            match = self.encoded.match
            return [match(n.encode()) is not None for n in names]
        m, anchor, none = program.Match, _ANCHOR_START, _NO_MATCH
        hits: list[bool] = [m(anchor, b, 0, len(b))[0] != none for b in map(str.encode, names)]
        return hits


_ANCHOR_START = getattr(getattr(re2, "_Anchor", None), "ANCHOR_START", None)
_NO_MATCH = getattr(re2, "_NULL_SPAN", None)
"""google-re2's own names (1.1): the anchor its `match` passes and the span of no match. Where either is missing
(another version), `_program` answers None and the wrapper's `match` is used."""


def _program(regex: Any) -> Any:
    """The RE2 program under google-re2's compiled pattern (its `_regexp`, whose `Match(anchor, text, pos, endpos)`
    returns the match's spans, `_NO_MATCH` first where there is none); None where this google-re2 has none."""
    if _ANCHOR_START is None or _NO_MATCH is None:
        return None
    program = getattr(regex, "_regexp", None)
    return program if callable(getattr(program, "Match", None)) else None


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
