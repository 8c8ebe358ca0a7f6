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


# --- the bands equal the whole -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fp8_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The tiny FP8 Kimi-K2 checkpoint (128x128 scale blocks, edge blocks partial) and the values a converter
    writes from it, computed whole: every module dequantized at once, the experts stacked, kv_b split."""
    import numpy as np

    from kimi_audit.checks.rmsnorm import linear_weight
    from kimi_audit.model.checkpoint import load_checkpoint
    from kimi_audit.numerics.tensor_io import TensorFetcher
    from kimi_audit.replica.tiny import build_tiny
    from kimi_audit.sources import LocalSource

    src = build_tiny(tmp_path_factory.mktemp("fp8") / "src")
    cfg = load_checkpoint(LocalSource(src)).config
    fetch = TensorFetcher(LocalSource(src))
    hidden, moe, heads = cfg.hidden_size, cfg.moe_intermediate_size or 0, cfg.num_attention_heads
    nope, v, kvl = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank or 0

    def weight(module: str, out: int, inp: int) -> np.ndarray:
        return np.asarray(linear_weight(fetch, cfg, module, out, inp), dtype=np.float32)

    kv_b = weight("model.layers.1.self_attn.kv_b_proj", heads * (nope + v), kvl).reshape(heads, nope + v, kvl)
    values = {
        "blk.1.ffn_gate_exps.weight": np.stack([weight(f"model.layers.1.mlp.experts.{i}.gate_proj", moe, hidden)
                                                for i in range(cfg.n_routed_experts or 0)]),
        "blk.1.attn_k_b.weight": np.ascontiguousarray(kv_b[:, :nope].transpose(0, 2, 1)),
        "blk.1.attn_v_b.weight": np.ascontiguousarray(kv_b[:, nope:]),
        "blk.0.ffn_down.weight": weight("model.layers.0.mlp.down_proj", hidden, cfg.intermediate_size),
        "token_embd.weight": np.asarray(fetch.read("model.embed_tokens.weight")[0], dtype=np.float32),
    }
    return src, values


def write_converted(path: Path, src: Path, values: dict) -> Path:
    from kimi_audit.model.arch.deepseek_v3.gguf import gguf_metadata
    from kimi_audit.numerics.ggml import encode

    kv = {"general.architecture": "deepseek2", **gguf_metadata(json.loads((src / "config.json").read_text()))}
    typed = [(name, "F32" if name == "token_embd.weight" else "Q8_0", x) for name, x in values.items()]
    sparse_pair.write_gguf(path, kv, [(name, list(reversed(x.shape)), 0 if t == "F32" else 8, encode(x, t))
                                      for name, t, x in typed])
    return path


@pytest.mark.parametrize("band", [4096, None])
def test_bands_equal_the_whole(tmp_path: Path, fp8_pair: tuple[Path, dict], band: int | None,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Bands of 128 rows (the experts' 160 rows: a band, then one of a partial scale block; kv_b's heads from
    two bands) find the bytes of the whole-tensor encoding equal, and one value changed in the last band of the
    last expert, different."""
    from typer.testing import CliRunner

    from kimi_audit.checks import against
    from kimi_audit.cli import app

    if band is not None:
        monkeypatch.setattr(against, "BAND_BYTES", band)
    src, values = fp8_pair

    def run(path: Path) -> dict[str, list[dict]]:
        result = CliRunner().invoke(app, ["audit", str(path), "--against", str(src), "--values", "--no-progress",
                                          "--json"])
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
        assert result.exit_code in (0, 1), result.output[-2000:]
        return compared(json.loads(result.stdout))

    found = run(write_converted(tmp_path / "same.gguf", src, values))
    assert "AGAINST_VALUES" not in found and "AGAINST_UNREAD" not in found, found
    assert found["AGAINST_CHECKED"][0]["actual"] == len(values)
    other = dict(values)
    other["blk.1.ffn_gate_exps.weight"] = values["blk.1.ffn_gate_exps.weight"].copy()
    other["blk.1.ffn_gate_exps.weight"][-1, -1, -1] += 1
    found = run(write_converted(tmp_path / "other.gguf", src, other))
    assert [f["covers"] for f in found["AGAINST_VALUES"]] == [1]
    assert found["AGAINST_VALUES"][0]["tensor"] == "blk.1.ffn_gate_exps.weight"
