"""The parameter accounting's summary rows: by dtype, listed-apart metadata and buffers, activated
parameters, the MTP layers against the main model, and the published figures compared against.

Kept apart from the tree's nodes (tree.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class PublishedFigure:
    source: str
    total: float
    activated: float
    significant: int
    """Significant figures the source states (for the 'consistent when rounded' verdict)."""


PUBLISHED: tuple[PublishedFigure, ...] = (
    PublishedFigure("Kimi K2 tech report (arXiv:2507.20534)", 1.04e12, 32.6e9, 3),
    PublishedFigure("Kimi-K2-Instruct model card", 1e12, 32e9, 2),
)


@dataclass(frozen=True)
class DtypeRow:
    dtype: str
    derived: int
    found: int


def sum_rows(rows: Iterable[DtypeRow]) -> tuple[DtypeRow, ...]:
    """Rows of one dtype added up, largest first."""
    derived: dict[str, int] = {}
    found: dict[str, int] = {}
    for r in rows:
        derived[r.dtype] = derived.get(r.dtype, 0) + r.derived
        found[r.dtype] = found.get(r.dtype, 0) + r.found
    keys = sorted(derived, key=lambda d: (-max(derived[d], found[d]), d))
    return tuple(DtypeRow(d, derived[d], found[d]) for d in keys)


@dataclass(frozen=True)
class ExcludedRow:
    """Quantization metadata (kind SCALE: FP8 block scales, INT4 group scales, weight_shape...) or stored
    buffers of one component (indices collapsed): listed, never counted."""

    kind: str
    pattern: str
    dtype: str
    derived_tensors: int
    found_tensors: int
    derived_elements: int
    found_elements: int


@dataclass(frozen=True)
class Comparison:
    source: str
    published_total: float
    published_activated: float
    total_ratio: float
    activated_ratio: float
    total_consistent: bool
    """The computed total, rounded to the published significant figures, equals the published one."""
    activated_consistent: bool


@dataclass(frozen=True)
class Activation:
    per_token: int
    always_active: int
    """Parameters outside the routed experts of the main stack, MTP layers excluded."""
    routed_total: int
    routed_active: int
    top_k: int
    experts: int
    moe_blocks: int
    per_expert: int
    mtp_excluded: int
    embedding: int

    @property
    def without_embedding(self) -> int:
        return self.per_token - self.embedding


@dataclass(frozen=True)
class MtpSummary:
    """The multi-token-prediction layers beside the main model ("671B main + 14B MTP = 685B")."""

    layers: tuple[int, ...]
    total: int
    """Derived parameters of the whole checkpoint, MTP layers included."""
    parameters: int
    """Derived parameters of the MTP layers."""
    duplicates: int
    """Of which: the MTP layers' embed_tokens and shared_head.head, copies of the main embedding and lm_head."""

    @property
    def main(self) -> int:
        return self.total - self.parameters

    @property
    def counted_once(self) -> int:
        """The total with the duplicated embedding and head tables counted once."""
        return self.total - self.duplicates
