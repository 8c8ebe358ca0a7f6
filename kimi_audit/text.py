"""Untrusted text made safe to show: tensor names, config keys, messages quoting them.

Everything a checkpoint, its config, its index or a Hub listing holds is attacker-controlled. Shown
on a terminal, a name such as `evil.\x1b[2J.weight` would clear the screen and U+202E would reverse
what follows it; kept whole, a 1 MB dtype string is 1 MB of every message that quotes it. Each
renderer (the audit table, diff, tensor, the CLI's error line, markdown) goes through `printable`;
each finding's message is clipped once, where it is made (findings.py), by `clip`.
"""

from __future__ import annotations

import json
import re
from typing import Any

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


_NOT_ASCII_PRINTABLE = re.compile(r"[^\x00-\x7e]")
"""What json.dumps(ensure_ascii=False) leaves unescaped that may not be printable: DEL and every non-ASCII
character (it escapes the C0 controls itself)."""


def _json_escape(m: re.Match[str]) -> str:
    c = m.group()
    if c.isprintable():
        return c
    code = ord(c)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 | code >> 10:04x}\\u{0xDC00 | code & 0x3FF:04x}"


def json_dumps(obj: Any, **kwargs: Any) -> str:
    """JSON text of `obj` as json.dumps writes it with `ensure_ascii=False` (names in their own script stay
    readable), but with every non-printable character (bidi overrides such as U+202E and U+2066, zero-width and
    other format characters, DEL, line separators) written as its \\u escape: the same value to every JSON
    reader, and nothing that reorders or hides text where the file is shown."""
    return _NOT_ASCII_PRINTABLE.sub(_json_escape, json.dumps(obj, ensure_ascii=False, **kwargs))
