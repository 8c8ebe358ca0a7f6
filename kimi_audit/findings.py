"""Findings: what an audit reports. Codes are stable; docs/reference.md lists them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from kimi_audit.text import MAX_TEXT, clip, printable


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"error": 2, "warning": 1, "info": 0}[self.value]


EXIT_INCONCLUSIVE = 3
"""The exit code of a run that found nothing wrong but could not check what it exists to check: the config names
no architecture this tool describes (LAYOUT_UNSUPPORTED), so no tensor was compared with a layout. A release gate
must not read that as a pass; `--ignore LAYOUT_UNSUPPORTED` accepts it."""
INCONCLUSIVE_CODES = frozenset({"LAYOUT_UNSUPPORTED"})


def exit_code_of(findings: Any, fail_on: Severity | str = Severity.ERROR) -> int:
    """1 when any finding is at `fail_on` or worse; else EXIT_INCONCLUSIVE when one says the main checks could not
    run; else 0."""
    rank = Severity(fail_on).rank
    if any(f.severity.rank >= rank for f in findings):
        return 1
    return EXIT_INCONCLUSIVE if any(f.code in INCONCLUSIVE_CODES for f in findings) else 0


@dataclass(frozen=True, slots=True)  # slots: a hostile header can make a million of them
class Finding:
    code: str
    severity: Severity
    message: str
    tensor: str | None = None
    shard: str | None = None
    expected: Any = None
    actual: Any = None
    covers: int = 0
    """How many findings this root cause stands for, not reported one by one (checks.root_causes)."""

    def __post_init__(self) -> None:
        # Messages quote untrusted values: made one printable line and clipped here, once, whatever made them.
        if len(self.message) > MAX_TEXT or not self.message.isprintable():
            object.__setattr__(self, "message", clip(printable(clip(self.message))))  # escapes lengthen it
        for key in ("tensor", "shard"):  # a file name that is not UTF-8 (lone surrogates): escaped, so that
            value = getattr(self, key)  # every report can be written; other names stay as they are
            if isinstance(value, str) and not value.isprintable():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    object.__setattr__(self, key, value.encode("utf-8", "backslashreplace").decode("utf-8"))

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity.value,
            "message": self.message,
            "tensor": self.tensor,
            "shard": self.shard,
            "expected": _jsonable(self.expected),
            "actual": _jsonable(self.actual),
            "covers": self.covers,
        }


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    return v


def error(code: str, message: str, **kw: Any) -> Finding:
    return Finding(code, Severity.ERROR, message, **kw)


def warning(code: str, message: str, **kw: Any) -> Finding:
    return Finding(code, Severity.WARNING, message, **kw)


def info(code: str, message: str, **kw: Any) -> Finding:
    return Finding(code, Severity.INFO, message, **kw)
