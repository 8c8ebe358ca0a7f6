"""`verify`'s outcome: every file with its sha256 and status, the findings (the header audit's first), the
totals, the exit code. Plain frozen data; report/verify_data.py and report/verify_table.py render it."""

from __future__ import annotations

from dataclasses import dataclass

from kimi_audit.findings import EXIT_INCONCLUSIVE, Finding, Severity, exit_code_of
from kimi_audit.verify.read import CellHealth

OK = "ok"
MISMATCH = "mismatch"
UNREFERENCED = "unreferenced"
"""Hashed; no reference digest to compare with."""
ABSENT = "absent"
"""Listed by the reference, not in the checkpoint."""
NOT_PRESENT = "data-not-present"
"""Sparse holes: not read whole, no sha256."""
UNREADABLE = "unreadable"
NOT_CHECKED = "not-checked"
"""Interrupted before it was read."""


@dataclass(frozen=True)
class FileRow:
    name: str
    size: int | None
    sha256: str | None
    expected: str | None
    reference: str | None
    """Where `expected` came from (Reference.kind)."""
    status: str
    unlisted: bool = False
    """Present, but the reference's listing does not name it."""
    bytes_read: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class VerifyReport:
    source: str
    revision: str | None
    references: tuple[str, ...]
    """Where each reference came from (Reference.where)."""
    files: tuple[FileRow, ...]
    findings: tuple[Finding, ...]
    seconds: float
    workers: str
    """`4 processes` or `Ray at ADDRESS`."""
    tensors_scanned: int = 0
    interrupted: bool = False
    manifest_written: str | None = None
    layers: tuple[CellHealth, ...] = ()
    """Weight health per layer row (expert -1): FP8 values, ±448 values, the float scales' range."""
    experts: tuple[CellHealth, ...] = ()
    """The same per routed-expert index (row ''), summed over the layers."""

    @property
    def bytes_total(self) -> int:
        return sum(f.size or 0 for f in self.files if f.status != ABSENT)

    @property
    def bytes_read(self) -> int:
        return sum(f.bytes_read for f in self.files)

    def count(self, severity: Severity) -> int:
        return sum(1 for f in self.findings if f.severity is severity)

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return exit_code_of(self.findings)

    @property
    def verdict(self) -> str:
        if self.interrupted:
            done = sum(1 for f in self.files if f.status not in (NOT_CHECKED, ABSENT))
            return f"INTERRUPTED: {done:,} of {len(self.files):,} files checked"
        return {1: "FAIL", EXIT_INCONCLUSIVE: "INCONCLUSIVE"}.get(self.exit_code, "PASS")

    @property
    def headline(self) -> str:
        """The verdict as a page or a terminal shows it: what it does not cover beside it (no reference: the
        hashes were computed, not compared, so a PASS vouches for the values only)."""
        verdict = self.verdict
        if verdict == "PASS" and not self.references:
            return "PASS (values; hashes computed, not compared: no reference)"
        return verdict
