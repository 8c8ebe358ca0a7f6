"""Where a tensor sits in the model drawn as a grid: its layer row, its part of the block (column) and its
index in a repeated group (the routed experts), read from the names the expected layout uses. The HTML report
draws that grid (report.grid); verify sums its weight-health figures per layer and per expert by it."""

from __future__ import annotations

from collections.abc import Iterable

from kimi_audit.model.layout import ExpectedLayout

OUTSIDE = "outside the layers"
"""The row of the tensors outside the decoder layers that carry no index (embedding, final norm, head)."""

Cell = tuple[str, str, int]
"""(row key, column key, index in a strip or -1)."""


class Locator:
    """Where a tensor name falls in the grid: the layer prefixes the layout uses (`model.layers.`)."""

    def __init__(self, prefixes: Iterable[str]) -> None:
        self.prefixes = tuple(sorted(set(prefixes), key=len, reverse=True))

    def cell(self, name: str) -> Cell:
        for pre in self.prefixes:
            if name.startswith(pre):
                head, _, tail = name[len(pre):].partition(".")
                if head.isascii() and head.isdigit():
                    return _within(str(int(head)), tail.split(".") if tail else [])
        return _outside(name.split("."))


def _digit(segs: list[str]) -> int:
    return next((k for k, s in enumerate(segs) if s.isdigit()), -1)


def _within(row: str, rest: list[str]) -> Cell:
    if not rest:
        return row, "", -1  # the layer itself (MTP_ABSENT names `model.layers.61`)
    k = _digit(rest)
    if k > 0:
        return row, ".".join(rest[:k]), int(rest[k])
    return row, ".".join(rest[:-1]) or rest[0], -1


def _outside(segs: list[str]) -> Cell:
    k = _digit(segs)
    if k > 0:
        return ".".join(segs[:k]), segs[k - 1], int(segs[k])
    return OUTSIDE, ".".join(segs[:-1]) or segs[0], -1


def _layer_prefix(name: str, layer: int) -> str | None:
    """`model.layers.` of `model.layers.3.mlp.gate.weight`; None where the layer's index is no segment."""
    segs = name.split(".")
    if str(layer) not in segs:
        return None
    return ".".join(segs[:segs.index(str(layer))]) + "."


def first_of_spec(layout: ExpectedLayout) -> dict[int, int]:
    """Spec index -> the first position holding it."""
    n = len(layout.spec_of)
    return dict(zip(reversed(layout.spec_of), range(n - 1, -1, -1)))  # the last written, the first position


def locator(layout: ExpectedLayout, first: dict[int, int] | None = None) -> Locator:
    """The names' places in `layout`'s grid (its layer prefixes, `model.layers.`)."""
    first = first_of_spec(layout) if first is None else first
    prefixes = {_layer_prefix(layout.names[p], layer) for p in first.values()
                if (layer := layout.layer_of[p]) is not None}
    return Locator([p for p in prefixes if p] or ["model.layers."])
