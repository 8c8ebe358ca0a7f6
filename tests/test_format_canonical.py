"""The canonical-form fast path of the header reader against the JSON path it stands in for.

`format._canonical_header` reads headers in the form safetensors writes with one regex pass; every
other header goes through json.loads and the per-entry rules. On any input both must give the same
ShardHeader (tensors, metadata, findings), and the fast path must really carry the canonical ones.
"""

from __future__ import annotations

import collections
import json
import struct
from pathlib import Path

import pytest

from header_mutations import corpus
from kimi_audit.format import header as fmt
from kimi_audit.format.header import parse_shard_prefix


def both_paths(data: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[fmt.ShardHeader, fmt.ShardHeader]:
    fast = parse_shard_prefix(data, shard="s.safetensors", file_size=len(data))
    with monkeypatch.context() as m:
        m.setattr(fmt, "_canonical_header", lambda body: None)
        slow = parse_shard_prefix(data, shard="s.safetensors", file_size=len(data))
    return fast, slow


def canonical(data: bytes) -> bool:
    n = struct.unpack("<Q", data[:8])[0] if len(data) >= 8 else 0
    try:
        return fmt._canonical_header(data[8:8 + n].decode("utf-8").rstrip(" ")) is not None
    except UnicodeDecodeError:
        return False


def test_the_fast_path_agrees_with_the_json_path_on_the_mutation_corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    taken: collections.Counter[str] = collections.Counter()
    for cls, seed, data in corpus(per_class=120):
        fast, slow = both_paths(data, monkeypatch)
        assert fast == slow, (cls, seed)
        taken[cls] += canonical(data)
    # The generator writes canonical text: the fast path carried valid files (the others use zero-element
    # tensors or slow-path features) and mutants of several classes, accepted and refused.
    assert taken["valid"] > 40 and len(+taken) >= 5, taken


def test_real_safetensors_files_take_the_fast_path(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shards = sorted(tiny_dir.glob("*.safetensors"))
    assert shards
    for path in shards:
        data = path.read_bytes()
        assert canonical(data), path.name
        fast, slow = both_paths(data, monkeypatch)
        assert fast == slow and fast.ok and fast.tensor_count > 0


def _file(header: str, payload: int) -> bytes:
    raw = header.encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * payload


ENTRY = '"{name}":{{"dtype":"F32","shape":[2],"data_offsets":[{b},{e}]}}'


@pytest.mark.parametrize(
    "header, payload, code",
    [
        # one entry out of canonical form among canonical ones: the regex skips it, the length check sees it
        ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"shape":[2],"dtype":"F32","data_offsets":[8,16]}}',
         16, None),
        ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}',
         16, "HEADER_DUPLICATE_KEY"),
        ('{"__metadata__":{"k":"v","k":"w"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 8,
         "HEADER_DUPLICATE_KEY"),
        ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"x":1}', 8, "TENSOR_ENTRY_INVALID"),
        ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"x":[1],"b":{"dtype":"F32","shape":[2],'
         '"data_offsets":[8,16]}}', 16, "TENSOR_ENTRY_INVALID"),
        ('{"a":{"dtype":"F32","shape":[1,,2],"data_offsets":[0,8]}}', 8, "HEADER_INVALID_JSON"),
        ('{"a":{"dtype":"F32","shape":[2,],"data_offsets":[0,8]}}', 8, "HEADER_INVALID_JSON"),
        ('{"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1,2],"data_offsets":[0,8]}}', 8, None),
        ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,' + "9" * 5000 + ']}}', 8, "HEADER_INVALID_JSON"),
        ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}x', 8, "HEADER_INVALID_JSON"),
        ('{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', 8, "SIZE_MISMATCH"),
        ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
         8, "OFFSETS_OVERLAP"),
        ('{"a":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}}', 8, "DTYPE_UNKNOWN"),
        ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,08]}}', 8, "HEADER_INVALID_JSON"),
        ('{"a":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,8]}}', 8, "SHAPE_INVALID"),
        ('{"__metadata__":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 8, "METADATA_INVALID"),
        ('{"a\\u0062":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 8, None),
    ],
)
def test_near_canonical_headers_are_judged_like_the_json_path_judges_them(
    header: str, payload: int, code: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _file(header, payload)
    fast, slow = both_paths(data, monkeypatch)
    assert fast == slow
    codes = {f.code for f in fast.findings}
    assert (code in codes) if code else fast.ok, codes


def test_a_canonical_header_of_many_entries_is_read_by_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    entries = [ENTRY.format(name=f"t.{i}", b=8 * i, e=8 * i + 8) for i in range(5000)]
    meta = json.dumps({"format": "pt"}, separators=(",", ":"))
    data = _file('{"__metadata__":' + meta + "," + ",".join(entries) + "}", 8 * 5000)
    assert canonical(data)
    fast, slow = both_paths(data, monkeypatch)
    assert fast == slow and fast.ok and fast.tensor_count == 5000 and fast.metadata == {"format": "pt"}
    assert fast.tensors["t.4999"].begin == 39992
