"""Issue 40: published totals as a proof. Each release's layout, derived from its config, reproduces the figures
its publisher printed (tests/data/published_totals.json): the index's total_size to the byte, the tensor count,
the Hub's parameter count, or the row says why not. A dtype or a shape the tool invented changes a byte total."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.kinds import BUFFER
from kimi_audit.model.layout import expected_layout

ROWS: list[dict[str, Any]] = json.loads((Path(__file__).parent / "data" / "published_totals.json").read_text())["rows"]


def layout_of(row: dict[str, Any]):  # type: ignore[no-untyped-def]
    raw = json.loads(resources.files("kimi_audit").joinpath("data", row["config"]).read_text())
    raw.update(row["with"])
    layout = expected_layout(model_config_from_dict(raw))
    if "buffers_absent" in row:  # buffers loaders recompute, which this release does not store
        return [t for t in layout.values() if t.kind != BUFFER]
    return list(layout.values())


@pytest.mark.parametrize("row", ROWS, ids=[r["release"] for r in ROWS])
def test_the_layout_reproduces_the_published_totals(row: dict[str, Any]) -> None:
    tensors = layout_of(row)
    why_not = row.get("why_not", {})
    assert row.get("read") and {"total_size", "tensors", "parameters", "payload_gib"} & set(row)
    if "tensors" in row:
        assert len(tensors) == row["tensors"]
    if "total_size" in row:
        assert sum(t.nbytes for t in tensors) == row["total_size"]
    if "stored_elements" in row:
        assert sum(t.numel for t in tensors) == row["stored_elements"]
    if "payload_gib" in row:
        assert round(sum(t.nbytes for t in tensors) / 2**30, 2) == row["payload_gib"]
    if "parameters" in row:
        logical = sum(t.logical for t in tensors)  # packed weights count their logical elements, scales none
        if "parameters" in why_not:
            assert 0 < row["parameters"] - logical < 10**9, why_not["parameters"]
        else:
            assert logical == row["parameters"]


def test_float32_norms_would_not_survive() -> None:
    """The proof bites: V4-Flash's gains in F32 (as the tool had them) miss the published total_size by
    2 bytes × 468,096 gain elements."""
    row = ROWS[0]
    tensors = layout_of(row)
    gains = sum(t.logical for t in tensors if t.name.endswith("norm.weight"))
    assert gains == 468_096 and all(t.dtype == "BF16" for t in tensors if t.name.endswith("norm.weight"))
    assert sum(t.nbytes for t in tensors) + 2 * gains != row["total_size"]



def test_every_shipped_config_says_where_it_comes_from() -> None:
    """Issue 40: a shipped config is the release's verbatim or says which fields were filled from where: each is
    named in kimi_audit/data/SOURCES.md or has its own NAME.sources.* file."""
    data = resources.files("kimi_audit").joinpath("data")
    headings = [line for line in data.joinpath("SOURCES.md").read_text().splitlines() if line.startswith("## ")]
    own = {p.name.split(".sources.")[0] for p in data.iterdir() if ".sources." in p.name}
    configs = [p.name for p in data.iterdir() if p.name.endswith(".config.json")]
    assert len(configs) >= 12
    for name in configs:
        assert name.removesuffix(".config.json") in own or any(name in h for h in headings), name


def test_the_pinned_config_is_the_releases_verbatim() -> None:
    reference = Path(__file__).resolve().parents[2] / "shared" / "reference" / "kimi-k2-instruct.config.json"
    if not reference.exists():
        pytest.skip("../shared is not beside this checkout")
    assert resources.files("kimi_audit").joinpath("data/kimi-k2-instruct.config.json").read_bytes() == \
        reference.read_bytes()


def test_int64_weight_shapes_would_not_survive() -> None:
    """The Kimi-K2.5 dump's payload holds only with the `weight_shape` width it lists (I32): the I64 compressed-tensors
    writes would add 8 bytes to each of its 69,120 and round to another figure."""
    (row,) = [r for r in ROWS if r["release"].startswith("moonshotai/Kimi-K2.5")]
    tensors = layout_of(row)
    shapes = [t for t in tensors if t.name.endswith(".weight_shape")]
    assert len(shapes) == 69_120 and {t.dtype for t in shapes} == {"I32"}
    assert round((sum(t.nbytes for t in tensors) + 8 * len(shapes)) / 2**30, 2) != row["payload_gib"]
