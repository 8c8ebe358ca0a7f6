"""Class/dtype statistics against a plain per-tensor recount."""

from __future__ import annotations

from collections import defaultdict
from math import prod
from pathlib import Path

from kimi_audit.checks.stats import compute_stats
from kimi_audit.format.header import TensorInfo
from kimi_audit.format.table import TensorTable, tensor_table
from kimi_audit.model.checkpoint import load_checkpoint
from kimi_audit.model.kinds import PARAMETER
from kimi_audit.model.layout import ExpectedLayout
from kimi_audit.model.roles import kind_of
from kimi_audit.sources import LocalSource


def recount(actual: TensorTable, expected) -> dict[tuple[str, str], list[int]]:
    rows: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for row, name in enumerate(actual.names):
        t = actual.info(row)
        e = expected.get(name)
        row = rows[(e.kind if e is not None else kind_of(name), t.dtype)]
        row[0] += 1
        row[1] += prod(t.shape)
        row[2] += t.end - t.begin
    return dict(rows)


def test_stats_match_a_per_tensor_recount_of_the_tiny_checkpoint(tiny_dir: Path) -> None:
    ckpt = load_checkpoint(LocalSource(tiny_dir))
    actual, _ = tensor_table(ckpt.headers)
    stats = compute_stats(actual, ckpt.expected, ckpt.headers)
    want = recount(actual, ckpt.expected)
    assert {(r.kind, r.dtype): [r.tensors, r.elements, r.bytes] for r in stats.rows} == want
    assert len(want) >= 3 and stats.tensors == len(actual)


def test_totals_past_float_precision_are_exact() -> None:
    big = 2**60 + 1  # far past 2**53: a float64 sum would round it
    infos = [TensorInfo(f"t.{i}.weight", "U8", (big,), i * big, (i + 1) * big) for i in range(3)]
    infos.append(TensorInfo("x.inv_freq", "F32", (3,), 3 * big, 3 * big + 12))
    names, dtypes, shapes, begins, ends = (list(col) for col in zip(*infos))
    actual = TensorTable(names, ["s"] * 4, dtypes, shapes, begins, ends)
    stats = compute_stats(actual, ExpectedLayout([], [], [], []), {})
    rows = {(r.kind, r.dtype): r for r in stats.rows}
    assert rows[(PARAMETER, "U8")].elements == 3 * big and rows[(PARAMETER, "U8")].bytes == 3 * big
    assert stats.parameters == 3 * big and stats.elements == 3 * big + 3
