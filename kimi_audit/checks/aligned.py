"""The layout findings and statistics, added up from each shard's alignment (alignment.py).

For a checkpoint whose every tensor name is in the layout, once: the same findings, in the same
order, and the same Stats as checks.layout.layout_findings and stats.compute_stats give row by row
(tests/test_checks.py compares them), from vector work over positions instead of 139,644 rows.
Anything else (a name the layout lacks, a name in two shards, an expected tensor missing) returns
None, and the audit takes the row-by-row path, which explains it.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from kimi_audit.alignment import ShardAlignment
from kimi_audit.checks.layout import mismatch_findings, scale_pair_finding
from kimi_audit.findings import Finding
from kimi_audit.format import ShardHeader, TensorInfo
from kimi_audit.layout import BUFFER, ExpectedTensor
from kimi_audit.stats import Stats, stats_from_classes


class AlignedLookup:
    """Tensor name -> (header entry, shard), through the alignments' positions: what
    checks.tensors.TensorTable.get answers, without a table of every name."""

    def __init__(self, headers: dict[str, ShardHeader], positions: list[np.ndarray], shard_of: np.ndarray,
                 expected: dict[str, ExpectedTensor]) -> None:
        self._headers, self._shards, self._positions = headers, list(headers), positions
        self._shard_of, self._expected = shard_of, expected

    def get(self, name: str) -> tuple[TensorInfo, str] | None:
        e = self._expected.get(name)
        if e is None or self._shard_of[e.position] < 0:
            return None
        i = int(self._shard_of[e.position])
        row = int(np.flatnonzero(self._positions[i] == e.position)[0])
        shard = self._shards[i]
        c = self._headers[shard].columns
        return TensorInfo(c.names[row], c.dtypes[row], c.shapes[row], c.begins[row], c.ends[row]), shard


def aligned_checks(
    headers: dict[str, ShardHeader], alignments: dict[str, ShardAlignment], expected: dict[str, ExpectedTensor]
) -> tuple[list[Finding], Stats, AlignedLookup] | None:
    shards = list(headers)
    aligns = [alignments.get(s) for s in shards]
    if not shards or any(a is None or a.positions is None or a.layout_size != len(expected) for a in aligns):
        return None
    positions = [a.position_array() for a in aligns]  # type: ignore[union-attr]
    everywhere = np.concatenate(positions)
    if len(everywhere) and (everywhere.min() < 0 or everywhere.max() >= len(expected)):
        return None
    counts = np.bincount(everywhere, minlength=len(expected))
    if len(counts) and counts.max() > 1:
        return None  # a name in two shards
    missing = np.flatnonzero(counts == 0).tolist()
    if missing:
        entries = list(expected.values())
        if any(entries[p].kind != BUFFER for p in missing):
            return None
    out: list[Finding] = []
    for shard, a in zip(shards, aligns):
        cols = headers[shard].columns
        for row in a.mismatched:  # type: ignore[union-attr]
            name = cols.names[row]
            out.extend(mismatch_findings(name, cols.dtypes[row], cols.shapes[row], shard, expected[name]))
    shard_of = np.full(len(expected), -1, dtype=np.int64)
    for i, pos in enumerate(positions):
        shard_of[pos] = i
    out.extend(_scale_pairs(shards, aligns, positions, shard_of, expected))  # type: ignore[arg-type]
    stats = stats_from_classes(chain.from_iterable(a.classes for a in aligns), headers)  # type: ignore[union-attr]
    return out, stats, AlignedLookup(headers, positions, shard_of, expected)


def _scale_pairs(
    shards: list[str], aligns: list[ShardAlignment], positions: list[np.ndarray], shard_of: np.ndarray,
    expected: dict[str, ExpectedTensor],
) -> list[Finding]:
    """Each present scale against its weight, listed just before it in the layout: present, same shard."""
    scale_pos = np.concatenate([pos[a.scale_row_array()] for pos, a in zip(positions, aligns)])
    owner = np.concatenate([np.full(len(a.scale_row_array()), i, dtype=np.int64) for i, a in enumerate(aligns)])
    weight_shard = shard_of[np.maximum(scale_pos - 1, 0)]
    bad = np.flatnonzero((scale_pos < 1) | (weight_shard != owner))
    if not len(bad):
        return []
    names = list(expected)
    order = bad[np.argsort(scale_pos[bad], kind="stable")]
    out = []
    for j, w, s in zip(scale_pos[order].tolist(), weight_shard[order].tolist(), owner[order].tolist()):
        out.append(scale_pair_finding(names[j], names[j - 1], shards[s], None if w < 0 or j < 1 else shards[w]))
    return out
