"""Property-based fuzzing of the header reader: hostile bytes in, findings or a parsed header out.

For arbitrary bytes, for arbitrary JSON documents and for every mutation class of
tests/header_mutations.py, the reader
- returns a ShardHeader (never raises),
- says the truth when it accepts: the tensors it returns tile the data buffer exactly,
- uses every finding code it emits from docs/reference.md's table,
- allocates a bounded amount (tracemalloc peak <= 64 x the input + 1 MiB),
- reads nothing past the header: at most 2 range reads, both within [0, max(first_read, 8 + N)).
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import tempfile
import tracemalloc
from functools import partial
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fake_sources import NoCapabilities
from header_mutations import CLASSES, corpus, generate, valid_spec
from kimi_audit.constants import DTYPE_BITS, HEADER_LENGTH_BYTES, MAX_HEADER_BYTES
from kimi_audit.findings import Finding, Severity
from kimi_audit.format.header import ShardHeader, parse_header_json, parse_shard_prefix, read_shard_header
from kimi_audit.sources.base import RangeRead
from kimi_audit.sources.local import LocalSource

README = Path(__file__).resolve().parent.parent / "docs" / "reference.md"
DOCUMENTED_CODES: set[str] = set()
for a, b in re.findall(r"^\| ([A-Z][A-Z0-9_]+)(?: / ([A-Z][A-Z0-9_]+))? \|", README.read_text(), re.M):
    DOCUMENTED_CODES.update(x for x in (a, b) if x)

# FUZZ_EXAMPLES=5000 for a longer run; 300 keeps the suite fast.
FUZZ = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "300")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def check_header(h: ShardHeader, data: bytes) -> None:
    """What every parse result must satisfy."""
    assert isinstance(h, ShardHeader)
    assert isinstance(h.findings, tuple) and all(isinstance(f, Finding) for f in h.findings)
    for f in h.findings:
        assert f.code in DOCUMENTED_CODES, f"finding code {f.code} is not in docs/reference.md's table"
        assert isinstance(f.message, str) and "\n" not in f.message and len(f.message) < 2000
    if not h.ok:
        return
    # Accepted: the claims must hold exactly.
    n = struct.unpack("<Q", data[:8])[0]
    assert h.header_len == n and h.data_start == 8 + n
    pos = 0
    for t in sorted(h.tensors.values(), key=lambda t: (t.begin, t.end)):
        assert t.dtype in DTYPE_BITS and isinstance(t.name, str)
        t.name.encode("utf-8")  # a real Unicode string (no lone surrogate)
        assert all(type(d) is int and 0 <= d < 2**64 for d in t.shape)
        assert t.begin == pos and t.nbytes * 8 == math.prod(t.shape) * DTYPE_BITS[t.dtype]
        pos = t.end
    assert h.data_start + pos == len(data)
    assert len(h.tensors) == h.tensor_count


def parse_bytes(data: bytes) -> ShardHeader:
    h = parse_shard_prefix(data, shard="f.safetensors", file_size=len(data))
    check_header(h, data)
    return h


# --- arbitrary input ------------------------------------------------------------------------------

@FUZZ
@given(st.binary(max_size=512))
def test_arbitrary_bytes(data: bytes) -> None:
    parse_bytes(data)


@FUZZ
@given(st.binary(max_size=512), st.integers(0, 64))
def test_arbitrary_bytes_behind_a_consistent_length(payload: bytes, data_len: int) -> None:
    parse_bytes(struct.pack("<Q", len(payload)) + payload + b"\0" * data_len)


JSON_SCALARS = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4), max_leaves=20
)
FIELDS = st.sampled_from(["dtype", "shape", "data_offsets", "extra"])
ENTRY = st.dictionaries(FIELDS, st.one_of(
    st.sampled_from([*sorted(DTYPE_BITS), "X"]),
    st.lists(st.integers(-2, 2**65), max_size=4),
    JSON_VALUES,
), max_size=4)


@FUZZ
@given(st.dictionaries(st.text(max_size=10), ENTRY | JSON_VALUES, max_size=6), st.integers(0, 128))
def test_arbitrary_json_objects(obj: dict, data_len: int) -> None:
    raw = json.dumps(obj).encode()
    parse_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * data_len)


@FUZZ
@given(JSON_VALUES)
def test_arbitrary_json_documents(value: object) -> None:
    raw = json.dumps(value).encode()
    h = parse_header_json(raw, shard="f", file_size=8 + len(raw))
    assert isinstance(h, ShardHeader)


# --- mutations of valid headers -------------------------------------------------------------------

@FUZZ
@given(st.sampled_from(sorted(CLASSES)), st.integers(0, 2**32))
def test_mutations_never_raise_and_tell_the_truth(cls: str, seed: int) -> None:
    parse_bytes(generate(cls, seed))


@pytest.mark.parametrize("seed", range(12))
def test_truncation_at_every_position(seed: int) -> None:
    data = valid_spec(__import__("random").Random(seed)).to_bytes()
    assert parse_bytes(data).ok
    for i in range(len(data)):
        assert not parse_bytes(data[:i]).ok, i


def test_valid_files_are_accepted() -> None:
    for seed in range(10_000, 10_300):
        assert parse_bytes(generate("valid", seed)).ok, seed


def test_each_mutation_class_yields_rejections() -> None:
    """The generators are not toothless: every hostile class produces inputs the reader refuses."""
    for cls in CLASSES:
        if cls in ("valid",):
            continue
        rejected = sum(not parse_bytes(generate(cls, s)).ok for s in range(60))
        assert rejected > 0, cls


# --- allocation bound -----------------------------------------------------------------------------

def peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(sorted(CLASSES)), st.integers(0, 2**32))
def test_allocation_is_bounded_by_the_input(cls: str, seed: int) -> None:
    data = generate(cls, seed)
    peak = peak_bytes(lambda: parse_shard_prefix(data, shard="f", file_size=len(data)))
    assert peak <= 64 * len(data) + (1 << 20), (cls, seed, len(data), peak)


def test_claimed_sizes_allocate_nothing() -> None:
    """A length prefix, a shape or offsets that claim terabytes cost nothing: only what is there is read."""
    claims = [
        struct.pack("<Q", 2**64 - 1),
        struct.pack("<Q", MAX_HEADER_BYTES) + b"{}",
        generate("shape_overflow", 3),
    ]
    raw = json.dumps({"t": {"dtype": "F64", "shape": [2**40, 2**20], "data_offsets": [0, 2**63]}}).encode()
    claims.append(struct.pack("<Q", len(raw)) + raw)
    for data in claims:
        assert peak_bytes(partial(parse_shard_prefix, data, shard="f", file_size=2**50)) < (1 << 20)


@pytest.mark.timeout(60)
def test_a_huge_rank_is_refused_from_its_length() -> None:
    """A shape of more than 64 dims (numpy's limit) is SHAPE_INVALID whatever its dims: no product of
    200,000 of them is computed, and the shape is not kept for anything downstream to compute with."""
    for dims in ([2**63 - 1] * 200_000, [1] * 200_000):
        raw = json.dumps({"t": {"dtype": "U8", "shape": dims, "data_offsets": [0, 1]}}).encode()
        h = parse_shard_prefix(struct.pack("<Q", len(raw)) + raw + b"\0", shard="f", file_size=9 + len(raw))
        assert [f.code for f in h.findings] == ["SHAPE_INVALID"] and "200,000 dims" in h.findings[0].message
        assert h.tensors["t"].shape == ()
        assert all(len(f.message) < 2000 for f in h.findings)


# --- reads stay within the header -----------------------------------------------------------------

class CountingSource(NoCapabilities):
    """Wraps a Source and records every range read; whole-file reads are a failure here."""

    def __init__(self, inner: LocalSource) -> None:
        self.inner = inner
        self.label, self.revision, self.parallel_reads = inner.label, inner.revision, inner.parallel_reads
        self.reads: list[tuple[str, int, int, int]] = []  # name, start, asked, got

    def list_files(self):
        return self.inner.list_files()

    def exists(self, name):
        return self.inner.exists(name)

    def read_file(self, name, max_bytes):
        raise AssertionError(f"the header reader read {name} whole")

    def read_range(self, name: str, start: int, length: int) -> RangeRead:
        r = self.inner.read_range(name, start, length)
        self.reads.append((name, start, length, len(r.data)))
        return r


@pytest.fixture(scope="module")
def fuzz_dir():
    with tempfile.TemporaryDirectory(prefix="kimi-fuzz-") as d:
        yield Path(d)


def assert_reads_within_header(src: CountingSource, data: bytes, first_read: int) -> None:
    assert 1 <= len(src.reads) <= 2, src.reads
    _name, start, asked, got = src.reads[0]
    assert start == 0 and asked == max(first_read, HEADER_LENGTH_BYTES)
    n = struct.unpack("<Q", data[:8])[0] if len(data) >= 8 else None
    if len(src.reads) == 2:
        assert n is not None and n <= MAX_HEADER_BYTES and 8 + n <= len(data)
        _, start2, asked2, _ = src.reads[1]
        assert start2 == got and start2 + asked2 == 8 + n  # exactly the rest of the header, nothing after
    limit = max(first_read, 8 + (n if n is not None and n <= MAX_HEADER_BYTES else 0))
    assert all(s + a <= limit for _, s, a, _ in src.reads)


@FUZZ
@given(st.sampled_from(sorted(CLASSES)), st.integers(0, 2**32), st.sampled_from([8, 9, 16, 64, 1 << 16]))
def test_read_shard_header_reads_only_the_header(fuzz_dir: Path, cls: str, seed: int, first_read: int) -> None:
    data = generate(cls, seed)
    (fuzz_dir / "f.safetensors").write_bytes(data)
    src = CountingSource(LocalSource(fuzz_dir))
    h = read_shard_header(src, "f.safetensors", first_read)
    check_header(h, data)
    assert h.findings == parse_shard_prefix(data, shard="f.safetensors", file_size=len(data)).findings
    assert_reads_within_header(src, data, first_read)


def test_oversized_length_is_refused_after_8_bytes(fuzz_dir: Path) -> None:
    path = fuzz_dir / "big.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", MAX_HEADER_BYTES + 1))
        f.truncate(8 + MAX_HEADER_BYTES + 1 + 4096)  # sparse: the file really is that long
    src = CountingSource(LocalSource(fuzz_dir))
    h = read_shard_header(src, "big.safetensors", first_read=8)
    assert [f.code for f in h.findings] == ["HEADER_TOO_LARGE"]
    assert [(s, a, g) for _, s, a, g in src.reads] == [(0, 8, 8)]


def test_every_finding_is_an_error_or_warning() -> None:
    for _cls, _seed, data in corpus(20):
        for f in parse_bytes(data).findings:
            assert f.severity in (Severity.ERROR, Severity.WARNING)
