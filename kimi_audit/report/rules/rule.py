"""A finding code as a rule: severity, a one-line meaning, a fuller description and what to do about it."""

from __future__ import annotations

from typing import NamedTuple


class Rule(NamedTuple):
    severity: str
    short: str
    """docs/reference.md's meaning, one line."""
    full: str
    help: str
