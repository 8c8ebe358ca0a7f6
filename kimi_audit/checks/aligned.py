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
from kimi_audit.format import ShardHeader
from kimi_audit.layout import BUFFER, ExpectedTensor
from kimi_audit.stats import Stats, stats_from_classes


def aligned_checks(
    headers: dict[str, ShardHeader], alignments: dict[str, ShardAlignment], expected: dict[str, ExpectedTensor]
) -> tuple[list[Finding], Stats] | None:
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
    out.extend(_scale_pairs(shards, aligns, positions, expected))  # type: ignore[arg-type]
    return out, stats_from_classes(chain.from_iterable(a.classes for a in aligns), headers)  # type: ignore[union-attr]


def _scale_pairs(
    shards: list[str], aligns: list[ShardAlignment], positions: list[np.ndarray], expected: dict[str, ExpectedTensor]
) -> list[Finding]:
    """Each present scale against its weight, listed just before it in the layout: present, same shard."""
    shard_of = np.full(len(expected), -1, dtype=np.int64)
    for i, pos in enumerate(positions):
        shard_of[pos] = i
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
