"""Holes are not zeros: a local shard's sparse holes (a header-only or partial copy) are reported as
DATA_NOT_PRESENT by `audit --values`, and end `tensor` / `rmsnorm` with exit 2, never read as values.
Also: the numerics commands check the memory they need before allocating it.

Holes are made here by rewriting a shard with a region seeked over (whole filesystem blocks); a test
that needs one is skipped, saying so, only where the filesystem under tmp makes no holes."""

from __future__ import annotations

import errno
import json
import os
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kimi_audit.cli import app
from kimi_audit.numerics import tensor_io
from kimi_audit.numerics.tensor_io import HEADER_BLOCK_SLACK, data_holes, in_hole
from kimi_audit.sources import LocalSource

runner = CliRunner()
SMALL = ("norm.weight", ".weight_scale_inv", ".e_score_correction_bias")
FLOATS, OTHER_BYTES = ("F32", "F16", "BF16", "F64"), 1 << 18
"""The values pass also reads any other float tensor up to 256 KiB (the tiny router gates, the rotary inv_freq)."""


def is_small(name: str, entry: dict) -> bool:  # type: ignore[type-arg]
    b, e = entry["data_offsets"]
    return name.endswith(SMALL) or (entry["dtype"] in FLOATS and e - b <= OTHER_BYTES)
GAIN_2 = "model.layers.2.self_attn.q_a_layernorm.weight"


def run(*args: str):
    return runner.invoke(app, list(args))


def header_of(path: Path) -> tuple[int, dict]:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return 8 + n, json.loads(f.read(n))


def shard_of(d: Path, name: str) -> Path:
    return d / json.loads((d / "model.safetensors.index.json").read_text())["weight_map"][name]


def block_size(path: Path) -> int:
    return max(os.statvfs(path).f_bsize, os.stat(path).st_blksize, 4096)


def rewrite_sparse(path: Path, begin: int, end: int) -> None:
    """Rewrite `path` leaving [begin, end) unwritten (a hole where it spans whole blocks)."""
    data = path.read_bytes()
    tmp = path.with_name(path.name + ".sparse")
    with open(tmp, "wb") as f:
        f.write(data[:begin])
        f.seek(end)
        f.write(data[end:])
        f.truncate(len(data))
    os.replace(tmp, path)


def require_holes(path: Path) -> tuple[tuple[int, int], ...]:
    holes = LocalSource(path.parent).holes(path.name)
    if not holes:
        pytest.skip(f"the filesystem under {path.parent} makes no sparse holes (SEEK_HOLE finds none)")
    return holes


def punch_tensor(d: Path, name: str) -> tuple[int, int]:
    """Make a hole of the whole blocks around a tensor's bytes, the header's block left alone (a tensor
    that starts in it is then partly present); returns the hole (file offsets)."""
    path = shard_of(d, name)
    start, header = header_of(path)
    b, e = header[name]["data_offsets"]
    bs = block_size(path)
    hb, he = max((start + b) // bs, -(-start // bs)) * bs, -(-(start + e) // bs) * bs
    assert hb < he, f"{name} lies in the header's block"
    rewrite_sparse(path, hb, he)
    require_holes(path)
    return hb, he


def small_in(d: Path, shard: Path, lo: int, hi: int) -> list[str]:
    """The small tensors of a shard with a byte in [lo, hi) (file offsets)."""
    start, header = header_of(shard)
    return sorted(n for n, v in header.items() if n != "__metadata__" and is_small(n, v)
                  and start + v["data_offsets"][0] < hi and start + v["data_offsets"][1] > lo
                  and v["data_offsets"][1] > v["data_offsets"][0])


def all_small(d: Path) -> int:
    return sum(is_small(n, v) for p in d.glob("*.safetensors") for n, v in header_of(p)[1].items()
               if n != "__metadata__")


def header_only(d: Path) -> Path:
    """Each shard replaced by a new file of its header and a hole to its old size (as `download --headers-only`
    leaves it); only the header is read, and a hard-linked shard (replica_copy) is replaced, not written into."""
    for p in d.glob("*.safetensors"):
        start, _ = header_of(p)
        with open(p, "rb") as f:
            head = f.read(start)
        tmp = p.with_name(p.name + ".sparse")
        with open(tmp, "wb") as f:
            f.write(head)
            f.truncate(p.stat().st_size)
        os.replace(tmp, p)
    return d


# ------------------------------------------------------------------ LocalSource.holes


def test_local_holes_lists_extents(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    bs = 1 << 16  # a multiple of every usual filesystem block
    path.write_bytes(b"\x01" * (8 * bs))
    rewrite_sparse(path, 3 * bs, 6 * bs)
    with open(path, "r+b") as f:
        f.truncate(10 * bs)  # and a hole to the end
    require_holes(path)
    src = LocalSource(tmp_path)
    assert src.holes("f.bin") == ((3 * bs, 6 * bs), (8 * bs, 10 * bs))
    assert src.holes("f.bin", 4 * bs, 3 * bs) == ((4 * bs, 6 * bs),)  # clipped to the range
    assert src.holes("f.bin", 5 * bs, bs + 1) == ((5 * bs, 6 * bs),)
    assert src.holes("f.bin", 0, 3 * bs) == ()
    assert src.holes("f.bin", 6 * bs, 2 * bs) == ()
    assert src.holes("f.bin", 9 * bs) == ((9 * bs, 10 * bs),)
    assert src.holes("f.bin", 20 * bs, 5) == ()  # past the end of the file: nothing to say


def test_local_holes_where_unsupported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "f.bin").write_bytes(b"x" * 10)
    src = LocalSource(tmp_path)
    real_lseek = os.lseek

    def einval(fd: int, pos: int, how: int) -> int:
        if how in (os.SEEK_SET, os.SEEK_CUR, os.SEEK_END):
            return real_lseek(fd, pos, how)
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(os, "lseek", einval)
    assert src.holes("f.bin") == ()  # a filesystem that cannot say: every byte present
    monkeypatch.undo()
    monkeypatch.delattr(os, "SEEK_HOLE", raising=False)
    assert src.holes("f.bin") == ()  # a platform without SEEK_HOLE


class _FakeHoles:
    def __init__(self, holes: tuple[tuple[int, int], ...]) -> None:
        self._holes = holes

    def holes(self, name: str, start: int = 0, length: int | None = None) -> tuple[tuple[int, int], ...]:
        end = start + (length or 0)
        return tuple((max(a, start), min(b, end)) for a, b in self._holes if a < end and b > start)


def test_data_holes_and_in_hole() -> None:
    # a header-only copy: the bytes after the header share its last block; one hole to the end
    src = _FakeHoles(((12_288, 10_000_000),))
    assert data_holes(src, "s", 10_000, 10_000_000) == ((10_000, 10_000_000),)
    # data well past the header, then a hole to the end: only the hole
    src = _FakeHoles(((10_000 + HEADER_BLOCK_SLACK + 4096, 10_000_000),))
    assert data_holes(src, "s", 10_000, 10_000_000) == ((10_000 + HEADER_BLOCK_SLACK + 4096, 10_000_000),)
    # data after a hole: not a header-only copy
    src = _FakeHoles(((12_288, 20_480), (40_960, 10_000_000)))
    assert data_holes(src, "s", 10_000, 10_000_000) == ((12_288, 20_480), (40_960, 10_000_000))
    assert data_holes(_FakeHoles(()), "s", 10_000, 10_000_000) == ()  # none (what the Hub answers)
    holes = ((100, 200), (300, 400))
    assert not in_hole(holes, 0, 100) and not in_hole(holes, 200, 300) and not in_hole(holes, 400, 500)
    assert in_hole(holes, 199, 201) and in_hole(holes, 250, 301) and in_hole(holes, 0, 1000)
    assert in_hole(holes, 150, 160) and in_hole(holes, 100, 101) and not in_hole(holes, 150, 150)
    assert not in_hole((), 0, 10)


# ------------------------------------------------------------------ audit --values


def test_values_pass_reports_a_hole_not_zero_gains(tiny_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hb, he = punch_tensor(tiny_copy, GAIN_2)
    gone = small_in(tiny_copy, shard_of(tiny_copy, GAIN_2), hb, he)
    assert GAIN_2 in gone
    r = run("audit", str(tiny_copy), "--values", "--no-progress", "--json")
    assert r.exit_code == 0, r.output
    findings = json.loads(r.stdout)["findings"]
    assert [f for f in findings if f["severity"] == "error"] == []
    (dnp,) = [f for f in findings if f["code"] == "DATA_NOT_PRESENT"]
    assert dnp["severity"] == "info" and dnp["actual"] == dnp["covers"] == len(gone)
    assert dnp["shard"] == shard_of(tiny_copy, GAIN_2).name
    assert "the data is not present" in dnp["message"]
    (checked,) = [f for f in findings if f["code"] == "VALUES_CHECKED"]
    assert checked["actual"] == all_small(tiny_copy) - len(gone)
    assert f"{len(gone):,} not present" in checked["message"]
    # the same bytes taken at face value (no hole lookup) are zero gains: what the hole check prevents
    monkeypatch.setattr(LocalSource, "holes", lambda self, name, start=0, length=None: ())
    r = run("audit", str(tiny_copy), "--values", "--no-progress", "--json")
    assert r.exit_code == 1
    assert ("GAIN_ALL_ZERO", GAIN_2) in {(f["code"], f["tensor"]) for f in json.loads(r.stdout)["findings"]}


def test_values_pass_on_a_header_only_copy(tiny_copy: Path) -> None:
    header_only(tiny_copy)
    require_holes(next(tiny_copy.glob("*.safetensors")))
    r = run("audit", str(tiny_copy), "--values", "--no-progress", "--json")
    assert r.exit_code == 0, r.output
    findings = json.loads(r.stdout)["findings"]
    assert [f for f in findings if f["severity"] != "info"] == []
    (dnp,) = [f for f in findings if f["code"] == "DATA_NOT_PRESENT"]
    assert dnp["actual"] == dnp["covers"] == all_small(tiny_copy) and dnp["shard"] is None
    assert "in 3 shards" in dnp["message"]
    (checked,) = [f for f in findings if f["code"] == "VALUES_CHECKED"]
    assert checked["actual"] == 0


def test_header_only_replica_values_pass(replica_copy: Path) -> None:
    d = header_only(replica_copy)  # what `download --headers-only` leaves
    require_holes(d / "model-1-of-61.safetensors")
    r = run("audit", str(d), "--values", "--no-progress", "--json")
    assert r.exit_code == 0, r.output
    findings = json.loads(r.stdout)["findings"]
    assert [f for f in findings if f["severity"] == "error"] == []
    (dnp,) = [f for f in findings if f["code"] == "DATA_NOT_PRESENT"]
    assert dnp["actual"] == all_small(d) == 69_913 + 61 and "in 61 shards" in dnp["message"]  # + the inv_freqs
    r = run("rmsnorm", str(d), "--layer", "3")
    assert r.exit_code == 2 and "the data is not present in model-4-of-61.safetensors" in r.output


# ------------------------------------------------------------------ tensor, rmsnorm


def test_tensor_on_a_hole_exits_2(tiny_copy: Path) -> None:
    punch_tensor(tiny_copy, GAIN_2)
    shard = shard_of(tiny_copy, GAIN_2).name
    r = run("tensor", str(tiny_copy), GAIN_2)
    assert r.exit_code == 2
    assert f"{GAIN_2}: the data is not present in {shard} (a sparse hole" in r.output
    assert "Traceback" not in r.output
    r = run("tensor", str(tiny_copy), GAIN_2, "--json")
    assert json.loads(r.stdout)["error"]["code"] == "DATA_NOT_PRESENT"
    assert run("tensor", str(tiny_copy), "model.layers.0.self_attn.q_a_layernorm.weight").exit_code == 0


def test_rmsnorm_on_a_hole_exits_2(tiny_copy: Path) -> None:
    punch_tensor(tiny_copy, GAIN_2)
    r = run("rmsnorm", str(tiny_copy), "--layer", "2")
    assert r.exit_code == 2 and f"{GAIN_2}: the data is not present" in r.output
    assert run("rmsnorm", str(tiny_copy), "--layer", "0").exit_code == 0
    assert run("rmsnorm", str(tiny_copy), "--all").exit_code == 2


def test_rmsnorm_from_embeddings_on_a_hole_exits_2(tiny_copy: Path) -> None:
    punch_tensor(tiny_copy, "model.embed_tokens.weight")
    r = run("rmsnorm", str(tiny_copy), "--from-embeddings", "100,200")
    assert r.exit_code == 2 and "model.embed_tokens.weight row 100: the data is not present" in r.output


# ------------------------------------------------------------------ memory


def test_rmsnorm_refuses_an_input_that_cannot_fit(tiny_dir: Path) -> None:
    r = run("rmsnorm", str(tiny_dir), "--tokens", "65536", "--batch", "4096")  # within the option ranges
    assert r.exit_code == 2, r.output
    assert "rmsnorm on a [4096, 65536, 192] input (1 layer) needs 1.5 TiB of memory" in r.output
    assert " available" in r.output and "Traceback" not in r.output and "MemoryError" not in r.output


def test_memory_check_figures(tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    monkeypatch.setattr(tensor_io, "available_memory", lambda: 3 << 30)
    r = run("rmsnorm", str(tiny_dir), "--tokens", "65536", "--batch", "16", "--json")
    assert r.exit_code == 2
    err = json.loads(r.stdout)["error"]
    # 65536 * 16 positions * 192 values * 32 bytes + 65536 * 16 * 64 bytes
    assert err == {"code": "NOT_ENOUGH_MEMORY", "message": "rmsnorm on a [16, 65536, 192] input (1 layer) "
                   "needs 6.1 GiB of memory, 3.0 GiB available"}
    assert run("rmsnorm", str(tiny_dir), "--tokens", "1024", "--batch", "16").exit_code == 0  # 97 MiB: fits
    # an --input file is sized from its .npy header, before it is loaded
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((4, 8, 192), np.float32))
    monkeypatch.setattr(tensor_io, "MEMORY_CHECK_BYTES", 0)
    monkeypatch.setattr(tensor_io, "available_memory", lambda: 1000)
    r = run("rmsnorm", str(tiny_dir), "--input", str(x))
    assert r.exit_code == 2 and "needs 218.0 KiB of memory, 1.0 KiB available" in r.output
    r = run("tensor", str(tiny_dir), "model.layers.1.mlp.experts.3.down_proj.weight", "--dequant")
    assert r.exit_code == 2 and "needs" in r.output and "1.0 KiB available" in r.output
    monkeypatch.setattr(tensor_io, "available_memory", lambda: None)  # unknown: no check
    assert run("rmsnorm", str(tiny_dir), "--input", str(x)).exit_code == 0


def test_available_memory_is_a_positive_figure() -> None:
    avail = tensor_io.available_memory()
    assert avail is None or avail > 0
    assert tensor_io.format_size(3 << 30) == "3.0 GiB" and tensor_io.format_size(1536) == "1.5 KiB"


def test_verify_a_failed_hole_query_is_a_finding(tiny_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file whose holes cannot be asked about (an I/O error, not a filesystem that cannot tell) is not read
    as if it were whole: SHARD_UNREADABLE and exit 1, never "no holes" and a PASS."""
    real_lseek = os.lseek

    def eio(fd: int, pos: int, how: int) -> int:
        if how in (os.SEEK_SET, os.SEEK_CUR, os.SEEK_END):
            return real_lseek(fd, pos, how)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "lseek", eio)
    r = run("verify", str(tiny_copy), "--json", "--no-progress", "-j", "1")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    shards = [f for f in doc["files"] if f["name"].endswith(".safetensors")]
    assert shards and all(f["status"] == "unreadable" and f["sha256"] is None for f in shards)
    unreadable = [f for f in doc["findings"] if f["code"] == "SHARD_UNREADABLE"]
    assert {f["shard"] for f in unreadable} >= {f["name"] for f in shards}
    assert all("cannot tell which of its bytes are present" in f["message"] for f in unreadable)
    assert doc["result"]["verdict"] == "FAIL"
