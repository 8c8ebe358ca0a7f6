"""Untrusted text made safe to show: tensor names, config keys, messages quoting them.

Everything a checkpoint, its config, its index or a Hub listing holds is attacker-controlled. Shown
on a terminal, a name such as `evil.\x1b[2J.weight` would clear the screen and U+202E would reverse
what follows it; kept whole, a 1 MB dtype string is 1 MB of every message that quotes it. Each
renderer (the audit table, diff, tensor, the CLI's error line, markdown) goes through `printable`;
each finding's message is clipped once, where it is made (findings.py), by `clip`.
"""

from __future__ import annotations

MAX_TEXT = 2000
"""The longest message a finding keeps (a real one is under 300 characters)."""


def printable(text: str) -> str:
    """`text` with every non-printable character (C0/C1 controls, DEL, bidi overrides, zero-width and
    other format characters, line separators) written as its Python escape (`\\x1b`, `\\u202e`)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def clip(text: str, limit: int = MAX_TEXT) -> str:
    """`text` cut to `limit` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters)"
