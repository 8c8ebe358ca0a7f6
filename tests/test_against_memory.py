"""`audit GGUF --against SRC --values` in bounded memory whatever the tensor's size: the GGUF's bytes and the
source's values are compared in bands, never whole (checks.against). Each test runs the command line as its own
process under an address-space cap (RLIMIT_AS) that reading the tensor whole would exceed, on a sparse pair
(tests/sparse_pair.py): no traceback, the comparison's own result. Not a timed test: the cap is the assertion;
bench/against_memory.py measures the peak RSS and the wall."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

import sparse_pair

GIB = 1 << 30


def run_capped(gguf: Path, src: Path, cap: int) -> tuple[int, dict, str]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}
    done = subprocess.run([sys.executable, "-m", "kimi_audit", "audit", str(gguf), "--against", str(src),
                           "--values", "--no-progress", "--json"], capture_output=True, text=True,
                          preexec_fn=limit, env=env, timeout=600, check=False)
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    return done.returncode, json.loads(done.stdout), done.stderr


def compared(doc: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for f in doc["findings"]:
        if f["code"].startswith("AGAINST"):
            out.setdefault(f["code"], []).append(f)
    return out


def check(tmp_path: Path, experts: int, cap: int) -> None:
    gguf, src = sparse_pair.build(tmp_path, experts)
    assert os.path.getsize(gguf) > cap  # read whole, the tensor alone would not fit under the cap
    code, doc, _ = run_capped(gguf, src, cap)
    assert code in (0, 1)
    found = compared(doc)
    assert "AGAINST_VALUES" not in found and "AGAINST_UNREAD" not in found, found
    assert found["AGAINST_CHECKED"][0]["actual"] == 1


def test_a_2_gib_tensor_under_a_1_gib_cap(tmp_path: Path) -> None:
    """16 experts of 4096 x 8192: 2 GiB of float32 in the GGUF, 512 MiB of FP8 in the source (before the bands,
    the stacked float32 source alone was 2 GiB: a MemoryError traceback under this cap)."""
    check(tmp_path, 16, GIB)


@pytest.mark.slow
def test_a_4_gib_tensor_under_a_1_5_gib_cap(tmp_path: Path) -> None:
    check(tmp_path, 32, GIB + GIB // 2)


def test_a_source_that_cannot_be_read_is_one_finding(tmp_path: Path) -> None:
    """The source's data a sparse hole (a header-only copy): one AGAINST_UNREAD naming the tensor, exit 1, no
    traceback; the header checks still run."""
    gguf, src = sparse_pair.build(tmp_path, 4, 1024, 512)
    shard = src / "model.safetensors"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size - (1024 * 512 * 4 + 4 * 4 * 8))  # keep the header, then leave the data a hole
        f.truncate(size)
    code, doc, _ = run_capped(gguf, src, GIB)
    found = compared(doc)
    assert code == 1 and len(found["AGAINST_UNREAD"]) == 1 and "AGAINST_VALUES" not in found
    unread = found["AGAINST_UNREAD"][0]
    assert unread["tensor"] == sparse_pair.GGUF_TENSOR and "not present" in unread["message"]
    assert found["AGAINST_CHECKED"][0]["actual"] == 0
