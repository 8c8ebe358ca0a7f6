"""First-read sizing for shard headers (kimi_audit/header_estimate.py)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from kimi_audit.format.estimate import (
    _json_len,
    _names_len,
    _shape_len,
    estimate_first_read,
    header_upper_bound,
    names_lower_bound,
    shard_first_reads,
)
from kimi_audit.format.fetch import fetch_shard_prefix
from kimi_audit.format.header import read_shard_header
from kimi_audit.model.config import parse_config_bytes
from kimi_audit.model.layout import ExpectedTensor, expected_layout, payload_bytes
from kimi_audit.sources.local import LocalSource


def _facts(d: Path) -> tuple[dict[str, str], dict[str, ExpectedTensor], dict[str, int], dict[str, int]]:
    _, cfg = parse_config_bytes((d / "config.json").read_bytes())
    wm = json.loads((d / "model.safetensors.index.json").read_bytes())["weight_map"]
    shards = set(wm.values())
    sizes = {s: (d / s).stat().st_size for s in shards}
    actual = {}
    for s in shards:
        with open(d / s, "rb") as f:
            actual[s] = 8 + struct.unpack("<Q", f.read(8))[0]
    return wm, expected_layout(cfg), sizes, actual


def test_json_length_helpers() -> None:
    names = ["model.a.weight", 'quo"te', "back\\slash", "é", "tab\t", ""]
    assert _names_len(names) == sum(_json_len(n) for n in names)
    for shape in [(), (7,), (7168, 2048), (1, 2, 3)]:
        assert _shape_len(shape) == _json_len(list(shape))


def test_replica_first_reads_are_exact_and_never_short(replica_dir: Path) -> None:
    wm, expected, sizes, actual = _facts(replica_dir)
    exact = shard_first_reads(wm, expected, sizes)
    assert all(exact[s] >= actual[s] for s in actual), "no shard needs a second read"
    assert sum(exact.values()) <= 1.001 * sum(actual.values())
    # without the file size or the layout the estimate is looser, but still never short
    for loose, bound in ((shard_first_reads(wm, expected), 1.07), (shard_first_reads(wm), 1.15)):
        assert all(loose[s] >= actual[s] for s in actual)
        assert sum(loose.values()) <= bound * sum(actual.values())


def test_tiny_first_reads_never_short(tiny_dir: Path) -> None:
    wm, expected, sizes, actual = _facts(tiny_dir)
    for reads in (shard_first_reads(wm, expected, sizes), shard_first_reads(wm, expected), shard_first_reads(wm)):
        assert all(reads[s] >= actual[s] for s in actual)


def _reshaped(t: ExpectedTensor, shape: tuple[int, ...]) -> ExpectedTensor:
    return t._replace(shape=shape, nbytes=payload_bytes(t.dtype, shape))


def test_config_that_does_not_match_falls_back_to_the_bound(replica_dir: Path) -> None:
    wm, expected, sizes, _actual = _facts(replica_dir)
    shard = "model-5-of-61.safetensors"
    names = [n for n, s in wm.items() if s == shard]
    upper = header_upper_bound(names, expected, file_size=sizes[shard])
    # a layout that expects smaller tensors than stored would put the "exact" header gigabytes long
    shrunk = {n: _reshaped(expected[n], (1,) * len(expected[n].shape)) for n in names}
    got = estimate_first_read(names, shrunk, file_size=sizes[shard])
    assert got <= header_upper_bound(names, shrunk, file_size=sizes[shard]) < 2 * upper
    # one that expects bigger tensors would make it negative: the bound again, never below 8
    grown = {n: _reshaped(expected[n], tuple(d * 4 for d in expected[n].shape)) for n in names}
    assert estimate_first_read(names, grown, file_size=sizes[shard]) >= names_lower_bound(names)
    assert estimate_first_read([], expected, file_size=sizes[shard]) > 8
    assert estimate_first_read(names, expected, file_size=100) <= 100  # never past the end of the file


def test_fetch_shard_prefix_matches_read_shard_header(replica_dir: Path) -> None:
    src = LocalSource(replica_dir)
    shard = "model-2-of-61.safetensors"
    with open(replica_dir / shard, "rb") as f:
        head = f.read(8)
        head += f.read(struct.unpack("<Q", head)[0])
    for first in (8, 1000, len(head), 10**6):  # short first reads take a second read for the rest
        data, size = fetch_shard_prefix(src, shard, first)
        h = read_shard_header(src, shard, first)
        assert size == h.file_size == (replica_dir / shard).stat().st_size
        assert data[: len(head)] == head and len(data) == max(len(head), first)
        assert h.ok and h.data_start == len(head)


def test_exact_figure_past_the_quick_bound_is_checked_against_the_entries_text() -> None:
    """Twenty-dimensional shapes make each entry longer than the quick bound allows: the exact figure
    must still be taken, once the bound from the entries' own text admits it."""
    from kimi_audit.model.kinds import PARAMETER
    from kimi_audit.model.layout import _tensor

    names = [f"t.{i}.weight" for i in range(50)]
    shape = (1,) * 20
    expected = {n: _tensor(n, "U8", shape, PARAMETER, n, None, None) for n in names}
    header = {n: {"dtype": "U8", "shape": list(shape), "data_offsets": [i, i + 1]} for i, n in enumerate(names)}
    text = json.dumps(header, separators=(",", ":")).encode()
    exact = 8 + len(text)
    file_size = exact + len(names)
    digits = len(str(file_size))
    from kimi_audit.format.estimate import ENTRY_PUNCTUATION, MAX_DTYPE_TEXT, METADATA_ALLOWANCE, PADDING

    per_entry = ENTRY_PUNCTUATION + 2 * digits + MAX_DTYPE_TEXT + len("[,]") + 2 * (digits + 1)
    quick = 8 + 2 + METADATA_ALLOWANCE + PADDING + _names_len(names) + len(names) * per_entry
    assert exact > quick, "the case must lie past the quick bound"
    assert estimate_first_read(names, expected, file_size=file_size) == exact
