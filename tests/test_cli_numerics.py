"""`rmsnorm`, `tensor` and `audit --values` on the tiny real checkpoint, the full-scale replica and the
loopback Hub. References are computed independently: tensors loaded with the safetensors library,
arithmetic in torch (DeepseekV3RMSNorm), header bytes parsed here with struct + json."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from typer.testing import CliRunner

from hub_repos import TINY_REPO
from kimi_audit.checks.values import plan_reads, value_findings
from kimi_audit.cli import app
from kimi_audit.format.header import TensorInfo
from kimi_audit.model.checkpoint import load_checkpoint
from kimi_audit.sources import LocalSource

torch = pytest.importorskip("torch")
from safetensors.torch import load_file  # noqa: E402

runner = CliRunner()
TINY_Q = 192  # q_lora_rank of the tiny config
EPS = 1e-6


def run(*args: str):
    return runner.invoke(app, list(args))


def run_json(*args: str, code: int = 0) -> dict:
    r = run(*args, "--json")
    assert r.exit_code == code, r.output
    return json.loads(r.stdout)


# ------------------------------------------------------------------ independent references


def header_of(path: Path) -> tuple[int, dict]:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return 8 + n, json.loads(f.read(n))


def tensor_file(d: Path, name: str) -> Path:
    index = json.loads((d / "model.safetensors.index.json").read_text())
    return d / index["weight_map"][name]


def load_tensor(d: Path, name: str) -> torch.Tensor:
    return load_file(str(tensor_file(d, name)))[name]


def poke(d: Path, name: str, values: np.ndarray, start_elem: int = 0) -> None:
    """Overwrite elements of a tensor in place (tests' own copy of a checkpoint)."""
    path = tensor_file(d, name)
    data_start, header = header_of(path)
    begin = header[name]["data_offsets"][0]
    raw = np.ascontiguousarray(values).tobytes()
    with open(path, "r+b") as f:
        f.seek(data_start + begin + start_elem * values.dtype.itemsize)
        f.write(raw)


def ref_rmsnorm(x: torch.Tensor, g: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return g * h.to(input_dtype)


def ref_position_rms(y: torch.Tensor) -> list[float]:
    y64 = y.double().reshape(-1, y.shape[-1])
    return y64.pow(2).mean(-1).sqrt().tolist()


def ref_dequant(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    rows, cols = w.shape
    se = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
    return (w.float() * se).to(torch.bfloat16)


def gain_name(layer: int) -> str:
    return f"model.layers.{layer}.self_attn.q_a_layernorm.weight"


# ------------------------------------------------------------------ rmsnorm


def test_rmsnorm_seeded_input_matches_torch_reference(tiny_dir: Path) -> None:
    doc = run_json("rmsnorm", str(tiny_dir), "--layer", "2", "--seed", "7", "--tokens", "5", "--batch", "3")
    (layer,) = doc["layers"]
    assert layer["layer"] == 2 and layer["block"] == "moe" and layer["ok"] is True
    assert doc["input"] == {"kind": "random", "seed": 7, "shape": [3, 5, TINY_Q], "dtype": "BF16"}
    g = load_tensor(tiny_dir, gain_name(2))
    x32 = np.random.default_rng(7).standard_normal((3, 5, TINY_Q), dtype=np.float32)
    y = ref_rmsnorm(torch.from_numpy(x32).to(torch.bfloat16), g)
    assert layer["output_rms"] == pytest.approx(ref_position_rms(y), rel=1e-12)
    assert len(layer["output_rms"]) == 15
    gd = g.double()
    assert layer["gain"]["min"] == float(gd.min()) and layer["gain"]["max"] == float(gd.max())
    assert layer["gain"]["mean"] == pytest.approx(float(gd.mean()), rel=1e-12)
    ratio = (y.double() / gd).reshape(-1, TINY_Q).pow(2).mean(-1).sqrt() - 1
    assert layer["rms_y_over_gain_minus_1"] == pytest.approx(ratio.tolist(), rel=1e-9, abs=1e-12)
    assert 0 < layer["max_abs_deviation"] < 0.01  # bf16 rounding only


def test_rmsnorm_all_layers_table(tiny_dir: Path) -> None:
    r = run("rmsnorm", str(tiny_dir), "--all")
    assert r.exit_code == 0, r.output
    assert "4 layer(s): gains finite and non-zero" in r.stdout
    assert "layer 3 output RMS per position" in r.stdout
    doc = run_json("rmsnorm", str(tiny_dir), "--all")
    assert [(x["layer"], x["block"]) for x in doc["layers"]] == [(0, "dense"), (1, "moe"), (2, "moe"), (3, "moe")]
    # only the 4 gains and the headers of the 3 shards were read
    headers = sum(header_of(p)[0] for p in tiny_dir.glob("*.safetensors"))
    assert doc["bytes_read"] == headers + 4 * TINY_Q * 2


def test_rmsnorm_input_file(tiny_dir: Path, tmp_path: Path) -> None:
    x = (np.random.default_rng(3).standard_normal((2, 4, TINY_Q)) * 5).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    doc = run_json("rmsnorm", str(tiny_dir), "--input", str(tmp_path / "x.npy"), "--layer", "0")
    y = ref_rmsnorm(torch.from_numpy(x).to(torch.bfloat16), load_tensor(tiny_dir, gain_name(0)))
    assert doc["layers"][0]["output_rms"] == pytest.approx(ref_position_rms(y), rel=1e-12)
    np.save(tmp_path / "bad.npy", np.zeros((2, 7), np.float32))
    r = run("rmsnorm", str(tiny_dir), "--input", str(tmp_path / "bad.npy"))
    assert r.exit_code == 2 and "is not [B, T, 192]" in r.output and len(r.output.strip().splitlines()) == 1


def test_rmsnorm_from_embeddings_is_the_real_query_latent(tiny_dir: Path) -> None:
    ids = [1, 5, 999]
    doc = run_json("rmsnorm", str(tiny_dir), "--from-embeddings", "1,5,999", "--layer", "0")
    emb = load_tensor(tiny_dir, "model.embed_tokens.weight")[ids]
    p = "model.layers.0."
    h = ref_rmsnorm(emb, load_tensor(tiny_dir, p + "input_layernorm.weight"))
    w = ref_dequant(load_tensor(tiny_dir, p + "self_attn.q_a_proj.weight"),
                    load_tensor(tiny_dir, p + "self_attn.q_a_proj.weight_scale_inv"))
    q = (h.float() @ w.float().T).to(torch.bfloat16)  # F.linear with float32 accumulation
    y = ref_rmsnorm(q, load_tensor(tiny_dir, gain_name(0)))
    # the projection's float32 summation order is BLAS's: equal to within bf16 rounding
    assert doc["layers"][0]["output_rms"] == pytest.approx(ref_position_rms(y), rel=2e-3)
    assert doc["input"]["token_ids"] == ids and doc["input"]["shape"] == [1, 3, TINY_Q]
    r = run("rmsnorm", str(tiny_dir), "--from-embeddings", "1,1000")
    assert r.exit_code == 2 and "row 1000 out of range" in r.output
    r = run("rmsnorm", str(tiny_dir), "--from-embeddings", "a,b")
    assert r.exit_code == 2


@pytest.mark.parametrize("fault,needle", [("zeros", "gain is all zeros"), ("nan", "1 NaN")])
def test_rmsnorm_fails_on_zero_or_nan_gain(tiny_copy: Path, fault: str, needle: str) -> None:
    if fault == "zeros":
        poke(tiny_copy, gain_name(1), np.zeros(TINY_Q, ml_dtypes.bfloat16))
    else:
        poke(tiny_copy, gain_name(1), np.array([np.nan], ml_dtypes.bfloat16), start_elem=17)
    r = run("rmsnorm", str(tiny_copy), "--all")
    assert r.exit_code == 1, r.output
    assert "1 of 4 layers failed the check" in r.stdout
    doc = run_json("rmsnorm", str(tiny_copy), "--all", code=1)
    bad = [x for x in doc["layers"] if not x["ok"]]
    assert [x["layer"] for x in bad] == [1]
    assert any(needle in p for p in bad[0]["problems"])


def test_rmsnorm_bad_layer_is_one_line_error(tiny_dir: Path) -> None:
    r = run("rmsnorm", str(tiny_dir), "--layer", "9")
    assert r.exit_code == 2 and "layers 0..3" in r.output


def test_rmsnorm_on_the_replica_reads_only_gains(replica_dir: Path) -> None:
    doc = run_json("rmsnorm", str(replica_dir), "--all", "--tokens", "8")
    assert len(doc["layers"]) == 61 and all(x["ok"] for x in doc["layers"])
    assert [x["block"] for x in doc["layers"]].count("moe") == 60
    headers = sum(header_of(p)[0] for p in replica_dir.glob("*.safetensors"))
    assert doc["bytes_read"] == headers + 61 * 1536 * 2
    # layer 0's gain, read back independently (by offset: replica shards are 2.8-17 GB apparent)
    path = tensor_file(replica_dir, gain_name(0))
    start, header = header_of(path)
    b, e = header[gain_name(0)]["data_offsets"]
    with open(path, "rb") as f:
        f.seek(start + b)
        gain = np.frombuffer(f.read(e - b), ml_dtypes.bfloat16).astype(np.float64)
    assert doc["layers"][0]["gain"]["max"] == float(gain.max())


def test_rmsnorm_from_embeddings_on_replica_reads_rows_not_the_table(replica_copy: Path, replica_dir: Path) -> None:
    from kimi_audit.model.config import parse_config_bytes
    from kimi_audit.replica.build import replica_shards, write_shard

    # the replica's embedding table and q_a_proj are holes: not present (exit 2), never zeros
    r = run("rmsnorm", str(replica_dir), "--from-embeddings", "0,163839")
    assert r.exit_code == 2 and "model.embed_tokens.weight row 0: the data is not present" in r.output
    # a copy of shard 1 (same seed, same bytes) with the two rows and q_a_proj written
    shard = "model-1-of-61.safetensors"
    tensors = replica_shards(parse_config_bytes((replica_dir / "config.json").read_bytes())[1])[shard]
    tmp = replica_copy / (shard + ".new")
    write_shard(tmp, tensors, seed=0)
    start, header = header_of(tmp)
    rng = np.random.default_rng(3)
    with open(tmp, "r+b") as f:
        b, _ = header["model.embed_tokens.weight"]["data_offsets"]
        for row in (0, 163839):
            f.seek(start + b + row * 7168 * 2)
            f.write(rng.normal(0, 0.02, 7168).astype(ml_dtypes.bfloat16).tobytes())
        b, e = header["model.layers.0.self_attn.q_a_proj.weight"]["data_offsets"]
        f.seek(start + b)
        f.write(rng.normal(0, 20, e - b).clip(-448, 448).astype(ml_dtypes.float8_e4m3fn).tobytes())
    os.replace(tmp, replica_copy / shard)  # replaces the hard link, not the shared file
    doc = run_json("rmsnorm", str(replica_copy), "--from-embeddings", "0,163839")
    # two 7168-wide bf16 rows, the input_layernorm gain, q_a_proj (FP8 1536x7168) and its scales, the gain
    payload = 2 * 7168 * 2 + 7168 * 2 + 1536 * 7168 + 12 * 56 * 4 + 1536 * 2
    assert doc["bytes_read"] == start + payload
    assert doc["layers"][0]["ok"] and doc["layers"][0]["output"]["zeros"] < 100


# ------------------------------------------------------------------ tensor


def test_tensor_fp8_weight_dequant_matches_torch(tiny_dir: Path) -> None:
    name = "model.layers.1.mlp.experts.3.down_proj.weight"
    doc = run_json("tensor", str(tiny_dir), name, "--dequant")
    w = load_tensor(tiny_dir, name)
    s = load_tensor(tiny_dir, name + "_scale_inv")
    assert doc["dtype"] == "F8_E4M3" and doc["shape"] == list(w.shape) and doc["bytes"] == w.numel()
    wf = w.float().double()
    st = doc["stats"]
    assert st["saturated"] == int((wf.abs() == 448).sum()) and st["saturated"] > 0
    assert st["zeros"] == int((wf == 0).sum()) and st["nan"] == 0
    assert st["mean"] == pytest.approx(float(wf.mean()), rel=1e-9)
    d = ref_dequant(w, s).double()
    dq = doc["dequantized"]
    assert dq["min"] == float(d.min()) and dq["max"] == float(d.max())
    assert dq["std"] == pytest.approx(float(d.std(unbiased=False)), rel=1e-9)
    assert doc["scale"]["tensor"] == name + "_scale_inv"
    assert doc["scale"]["stats"]["min"] == float(s.double().min()) and doc["ok"]
    r = run("tensor", str(tiny_dir), name, "--dequant")
    assert r.exit_code == 0 and "FP8 saturated" in r.stdout and "dequantized BF16" in r.stdout


def test_tensor_bf16_gain_and_router_bias(tiny_dir: Path) -> None:
    doc = run_json("tensor", str(tiny_dir), gain_name(0))
    g = load_tensor(tiny_dir, gain_name(0)).double()
    assert doc["stats"]["max"] == float(g.max()) and doc["stats"]["saturated"] is None
    assert doc["bytes"] == TINY_Q * 2 and doc["scale"] is None
    bias = "model.layers.2.mlp.gate.e_score_correction_bias"
    doc = run_json("tensor", str(tiny_dir), bias)
    assert doc["dtype"] == "F32" and doc["stats"]["count"] == 8


def test_tensor_reports_nan_weight_and_bad_scales(tiny_copy: Path) -> None:
    name = "model.layers.2.self_attn.q_a_proj.weight"
    poke(tiny_copy, name, np.array([0x7F, 0xFF], np.uint8), start_elem=10)  # the two FP8 NaN codes
    poke(tiny_copy, name + "_scale_inv", np.array([0.0, -1.0], np.float32), start_elem=1)
    doc = run_json("tensor", str(tiny_copy), name, "--dequant", code=1)
    assert doc["stats"]["nan"] == 2 and doc["dequantized"]["nan"] == 2
    assert doc["problems"] == [f"VALUE_NAN: {name}: 2 of {doc['stats']['count']:,} values are NaN",
                               f"SCALE_NOT_POSITIVE: {name}_scale_inv: 2 of 6 block scales are ≤ 0 (dequantized "
                               "weights would be zero or sign-flipped)"]
    r = run("tensor", str(tiny_copy), name)
    assert r.exit_code == 1 and "VALUE_NAN" in r.stdout and "2 of" in r.stdout


def test_tensor_errors_are_one_line(tiny_dir: Path) -> None:
    r = run("tensor", str(tiny_dir), "model.layers.0.nope.weight")
    assert r.exit_code == 2 and "no tensor named" in r.output and len(r.output.strip().splitlines()) == 1
    r = run("tensor", str(tiny_dir), "model.embed_tokens.weight", "--max-bytes", "1000")
    assert r.exit_code == 2 and "over the 1,000-byte limit" in r.output


def test_tensor_on_replica_expert_weight(replica_dir: Path) -> None:
    name = "model.layers.30.mlp.experts.200.down_proj.weight"
    # the replica's big weights are holes: not present (exit 2), not 14,680,064 zeros
    doc = run_json("tensor", str(replica_dir), name, "--dequant", code=2)
    assert doc["error"]["code"] == "DATA_NOT_PRESENT"
    assert doc["error"]["message"] == (f"{name}: the data is not present in model-31-of-61.safetensors "
                                       "(a sparse hole: a header-only or partial copy)")
    doc = run_json("tensor", str(replica_dir), name[: -len(".weight")] + ".weight_scale_inv")
    assert doc["shape"] == [56, 16] and doc["stats"]["min"] > 0 and doc["ok"]


# ------------------------------------------------------------------ Hub


def test_rmsnorm_and_tensor_over_the_hub(hub, tiny_dir: Path) -> None:
    doc = run_json("rmsnorm", TINY_REPO, "--layer", "3")
    local = run_json("rmsnorm", str(tiny_dir), "--layer", "3")
    assert doc["layers"][0]["output_rms"] == local["layers"][0]["output_rms"]
    assert doc["revision"] == hub.repos[TINY_REPO].commit
    shard = tensor_file(tiny_dir, gain_name(3)).name
    data_start, header = header_of(tiny_dir / shard)
    b, e = header[gain_name(3)]["data_offsets"]
    ranges = [r.range for r in hub.stats().records if r.path.endswith(shard) and r.method == "GET"]
    # the header (one read sized from the index's names), then exactly the 384-byte gain
    assert ranges[-1] == f"bytes={data_start + b}-{data_start + e - 1}"
    assert all(r.startswith("bytes=0-") for r in ranges[:-1]) and len(ranges) <= 3
    _reqs, sent = hub.stats().for_path(shard)
    assert sent <= 1.2 * data_start + (e - b)
    name = "model.layers.1.mlp.shared_experts.up_proj.weight"
    assert run_json("tensor", TINY_REPO, name, "--dequant")["dequantized"] == \
        run_json("tensor", str(tiny_dir), name, "--dequant")["dequantized"]


# ------------------------------------------------------------------ audit --values


def _small_counts(d: Path) -> tuple[int, int, int, int]:
    """Gains, router biases, FP8 scales and the other float tensors up to 256 KiB the values pass reads (the tiny
    router gates, the rotary inv_freq), from the headers."""
    entries = [(n, v) for p in d.glob("*.safetensors") for n, v in header_of(p)[1].items() if n != "__metadata__"]
    classed = ("norm.weight", ".e_score_correction_bias", ".weight_scale_inv")
    return (sum(n.endswith(classed[0]) for n, _ in entries), sum(n.endswith(classed[1]) for n, _ in entries),
            sum(n.endswith(classed[2]) for n, _ in entries),
            sum(not n.endswith(classed) and v["dtype"] in ("F32", "F16", "BF16", "F64")
                and v["data_offsets"][1] - v["data_offsets"][0] <= 1 << 18 for n, v in entries))


def test_values_pass_clean_tiny(tiny_dir: Path) -> None:
    doc = run_json("audit", str(tiny_dir), "--values", "--no-progress")
    codes = [f["code"] for f in doc["findings"]]
    assert codes == ["VALUES_CHECKED"]
    gains, biases, scales, others = _small_counts(tiny_dir)
    assert doc["findings"][0]["actual"] == gains + biases + scales + others and others
    assert (f"({gains} gains, {biases} router biases, {scales} FP8 scales, {others} other float tensors up to "
            "256 KiB)") in doc["findings"][0]["message"]


def test_values_pass_on_a_gguf_counts_no_fp8_scales_and_says_1_read() -> None:
    """A GGUF's values pass said `0 FP8 scales` (a GGUF holds none) and `fetched in 1 reads`."""
    gguf = Path(__file__).parent / "data" / "gguf" / "tiny-Q2_K.gguf"
    doc = run_json("audit", str(gguf), "--values", "--no-progress")
    checked = next(f["message"] for f in doc["findings"] if f["code"] == "VALUES_CHECKED")
    assert "FP8" not in checked and "router biases, the block scales of" in checked, checked
    assert checked.endswith(" bytes fetched in 1 read"), checked


def test_values_pass_reports_each_fault_by_name(tiny_copy: Path) -> None:
    scale = "model.layers.1.mlp.experts.5.gate_proj.weight_scale_inv"
    scale2 = "model.layers.3.self_attn.o_proj.weight_scale_inv"
    gain = "model.layers.2.self_attn.kv_a_layernorm.weight"
    bias = "model.layers.3.mlp.gate.e_score_correction_bias"
    poke(tiny_copy, scale, np.array([0.0, -3.0], np.float32), start_elem=2)
    poke(tiny_copy, scale2, np.array([np.nan], np.float32))
    poke(tiny_copy, gain, np.zeros(96, ml_dtypes.bfloat16))
    poke(tiny_copy, bias, np.array([np.inf], np.float32), start_elem=4)
    assert run("audit", str(tiny_copy), "--no-progress").exit_code == 0  # headers alone can't see values
    doc = run_json("audit", str(tiny_copy), "--values", "--no-progress", code=1)
    got = {(f["code"], f["tensor"], f["actual"]) for f in doc["findings"] if f["severity"] == "error"}
    assert got == {("SCALE_NOT_POSITIVE", scale, 2), ("VALUE_NAN", scale2, 1),
                   ("GAIN_ALL_ZERO", gain, 96), ("VALUE_INF", bias, 1)}


def test_values_pass_caps_listed_findings(tiny_copy: Path) -> None:
    names = [f"model.layers.2.mlp.experts.{e}.up_proj.weight_scale_inv" for e in range(8)]
    for n in names:
        poke(tiny_copy, n, np.zeros(6, np.float32))
    src = LocalSource(tiny_copy)
    found = value_findings(src, load_checkpoint(src).headers, max_per_code=3)
    bad = [f for f in found if f.code == "SCALE_NOT_POSITIVE"]
    assert [f.tensor for f in bad[:3]] == names[:3]
    assert bad[3].tensor is None and bad[3].actual == 8 and "5 more tensors" in bad[3].message
    assert len(bad) == 4


def test_plan_reads_coalesces_neighbours_only() -> None:
    t = [TensorInfo("a", "F32", (2,), 0, 8), TensorInfo("b", "F32", (2,), 8, 16),
         TensorInfo("c", "F32", (2,), 100, 108), TensorInfo("d", "F32", (2,), 10_000, 10_008)]
    groups = plan_reads(t, max_gap=100)
    assert [(g0, g1, [m.name for m in ms]) for g0, g1, ms in groups] == [
        (0, 108, ["a", "b", "c"]), (10_000, 10_008, ["d"])]
    assert len(plan_reads(t, max_gap=0)) == 3
    assert len(plan_reads(t, max_gap=1 << 20, max_span=50)) == 3


def test_values_pass_on_the_replica(replica_copy: Path, replica_dir: Path) -> None:
    from kimi_audit.model.config import parse_config_bytes
    from kimi_audit.replica.build import replica_shards, write_shard

    shard = "model-8-of-61.safetensors"
    tensors = replica_shards(parse_config_bytes((replica_dir / "config.json").read_bytes())[1])[shard]
    tmp = replica_copy / (shard + ".new")
    write_shard(tmp, tensors, seed=7)  # the shard's own seed: same bytes as the original
    victim = "model.layers.7.mlp.experts.311.down_proj.weight_scale_inv"
    start, header = header_of(tmp)
    b, _ = header[victim]["data_offsets"]
    with open(tmp, "r+b") as f:
        f.seek(start + b + 4 * 100)
        f.write(np.array([-1.0], np.float32).tobytes())
    os.replace(tmp, replica_copy / shard)  # replaces the hard link, not the shared file
    doc = run_json("audit", str(replica_copy), "--values", "--no-progress", code=1)
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert [(f["code"], f["tensor"], f["actual"]) for f in errors] == [("SCALE_NOT_POSITIVE", victim, 1)]
    checked = next(f for f in doc["findings"] if f["code"] == "VALUES_CHECKED")
    gains, biases, scales, others = _small_counts(replica_dir)
    assert checked["actual"] == gains + biases + scales + others == 69_913 + 61
    assert (biases, scales, others) == (60, 69_608, 61)  # others: each layer's rotary inv_freq


def test_values_pass_over_the_hub_reads_only_small_tensors(hub, tiny_dir: Path) -> None:
    import re

    local = run_json("audit", str(tiny_dir), "--values", "--no-progress")
    hub.reset_stats()
    doc = run_json("audit", TINY_REPO, "--values", "--no-progress")
    (checked,) = [f for f in doc["findings"] if f["code"] == "VALUES_CHECKED"]
    assert checked == next(f for f in local["findings"] if f["code"] == "VALUES_CHECKED")
    fetched = int(re.search(r"([\d,]+) bytes fetched", checked["message"]).group(1).replace(",", ""))
    data = [r for r in hub.stats().records
            if r.method == "GET" and r.range and not r.range.startswith("bytes=0-")]
    assert sum(r.bytes_sent for r in data) == fetched
    # every data read lies inside the small tensors' span of its shard (no big weight read)
    for r in data:
        shard = r.path.rsplit("/", 1)[-1]
        start, header = header_of(tiny_dir / shard)
        small = [v["data_offsets"] for n, v in header.items() if n != "__metadata__" and (
                 n.endswith(("norm.weight", "_scale_inv", "e_score_correction_bias")) or (
                     v["dtype"] in ("F32", "F16", "BF16") and v["data_offsets"][1] - v["data_offsets"][0] <= 1 << 18))]
        lo, hi = (int(x) for x in r.range[len("bytes="):].split("-"))
        assert start + min(b for b, _ in small) <= lo and hi < start + max(e for _, e in small)


# ------------------------------------------------------------------ issue 16: F32 gains, module names, ue8m0


def test_rmsnorm_with_f32_gains_matches_torch(tmp_path: Path) -> None:
    """DeepSeek-V3.2 stores every norm gain F32: torch's ``weight * h.to(bf16)`` is then float32."""
    from tiny_checkpoint import tiny_shards, write_tiny

    shards = tiny_shards()
    for members in shards.values():
        for k in [k for k in members if k.endswith("norm.weight")]:
            members[k] = members[k].astype(np.float32) * np.float32(1.0 + 2.0 ** -20)  # not bf16-representable
    d = write_tiny(tmp_path / "v32", shards)
    doc = run_json("rmsnorm", str(d), "--layer", "1", "--seed", "3", "--tokens", "7", "--batch", "2")
    (layer,) = doc["layers"]
    g = load_tensor(d, gain_name(1))
    assert g.dtype == torch.float32 and layer["ok"]
    x32 = np.random.default_rng(3).standard_normal((2, 7, TINY_Q), dtype=np.float32)
    y = ref_rmsnorm(torch.from_numpy(x32).to(torch.bfloat16), g)
    assert y.dtype == torch.float32 and layer["output"]["dtype"] == "F32"
    assert layer["output"]["min"] == float(y.min()) and layer["output"]["max"] == float(y.max())
    assert layer["output_rms"] == pytest.approx(ref_position_rms(y), rel=1e-12)


def test_tensor_by_module_name_is_its_weight(tiny_dir: Path) -> None:
    module = "model.layers.1.mlp.experts.3.down_proj"
    by_module = run_json("tensor", str(tiny_dir), module, "--dequant")
    by_weight = run_json("tensor", str(tiny_dir), module + ".weight", "--dequant")
    assert by_module == by_weight and by_module["tensor"] == module + ".weight"
    assert by_module["module"] == module and by_module["scheme"] == "fp8"
    w, s = load_tensor(tiny_dir, module + ".weight"), load_tensor(tiny_dir, module + ".weight_scale_inv")
    assert by_module["dequantized"]["max"] == float(ref_dequant(w, s).double().max())
    gain = "model.layers.0.self_attn.q_a_layernorm"  # a module whose tensor is `.weight`, not quantized
    doc = run_json("tensor", str(tiny_dir), gain)
    assert doc["tensor"] == gain + ".weight" and doc["module"] is None and doc["dequantized"] is None


def _ue8m0_copy(d: Path) -> list[str]:
    """Turn a tiny copy into a DeepSeek-V3.1-style checkpoint: scale_fmt ue8m0 and every FP8 scale rounded
    to a power of two. Returns the scale names."""
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["scale_fmt"] = "ue8m0"
    (d / "config.json").write_text(json.dumps(cfg))
    names = [n for n in json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
             if n.endswith(".weight_scale_inv")]
    for n in names:
        s = load_tensor(d, n).numpy()
        poke(d, n, np.exp2(np.ceil(np.log2(s))).astype(np.float32))
    return names


def test_values_ue8m0_scales_must_be_powers_of_two(tiny_copy: Path) -> None:
    names = _ue8m0_copy(tiny_copy)
    doc = run_json("audit", str(tiny_copy), "--values", "--no-progress")
    assert [f["code"] for f in doc["findings"]] == ["VALUES_CHECKED"]
    gate = "model.layers.2.mlp.experts.4.gate_proj.weight_scale_inv"
    o_proj = "model.layers.3.self_attn.o_proj.weight_scale_inv"
    assert {gate, o_proj} <= set(names)
    poke(tiny_copy, gate, np.array([0.375, 2.0 ** -130, 3.0e-5], np.float32), start_elem=1)  # 2**-130: below E8M0
    poke(tiny_copy, o_proj, np.array([0.1], np.float32))
    doc = run_json("audit", str(tiny_copy), "--values", "--no-progress", code=1)
    got = [(f["code"], f["severity"], f["tensor"], f["actual"], f["message"]) for f in doc["findings"]
           if f["code"] == "SCALE_NOT_UE8M0"]
    assert got == [
        ("SCALE_NOT_UE8M0", "error", gate, 3, f"{gate}: 3 of 6 block scales are not powers of two (scale_fmt "
         "ue8m0); the first is 0.375"),
        ("SCALE_NOT_UE8M0", "warning", o_proj, 1, f"{o_proj}: 1 of 3 block scales are not powers of two "
         "(scale_fmt ue8m0); the first is 0.100000001"),
    ]
    assert [f["code"] for f in doc["findings"] if f["severity"] == "error"] == ["SCALE_NOT_UE8M0"]
    cfg = json.loads((tiny_copy / "config.json").read_text())
    del cfg["quantization_config"]["scale_fmt"]  # without ue8m0 any positive finite scale is fine
    (tiny_copy / "config.json").write_text(json.dumps(cfg))
    assert [f["code"] for f in run_json("audit", str(tiny_copy), "--values", "--no-progress")["findings"]] == \
        ["VALUES_CHECKED"]


def test_values_pass_names_every_tensor_it_could_not_check(tmp_path: Path) -> None:
    """A small tensor the pass cannot decode (an F4 gain: a valid safetensors dtype numpy has no type for) is
    a VALUES_SKIPPED finding, never a silent pass; the one beside it is checked."""
    from kimi_audit.format.header import read_shard_header
    from shard_builder import entry, write_shard

    shard = "model.safetensors"
    write_shard(tmp_path / shard, {"model.norm.weight": entry("F4", [16], 0, 8),
                                   "model.layers.0.input_layernorm.weight": entry("BF16", [4], 8, 16)})
    src = LocalSource(tmp_path)
    found = value_findings(src, {shard: read_shard_header(src, shard)})
    skipped = [f for f in found if f.code == "VALUES_SKIPPED"]
    assert [(f.tensor, f.shard) for f in skipped] == [("model.norm.weight", shard)]
    assert "'F4'" in skipped[0].message and "not checked" in skipped[0].message
    zero = [f for f in found if f.code == "GAIN_ALL_ZERO"]  # the other gain was read: all zero bytes
    assert [f.tensor for f in zero] == ["model.layers.0.input_layernorm.weight"]
    checked = next(f for f in found if f.code == "VALUES_CHECKED")
    assert checked.actual == 1


def test_the_fetcher_sorts_the_shards_once_and_scans_the_index_once(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted, not timed: `audit A --against B --values` asks the fetcher for tensor after tensor. Each look-up
    sorted every shard name (natural_key) and each header read scanned the whole index: tensors x shards (a
    checkpoint of 2,000 one-tensor shards against its copy ran past 120 s; 2.8 s now)."""
    import kimi_audit.numerics.tensor_io as tensor_io
    from tiny_checkpoint import tiny_shards, write_tiny

    d = write_tiny(tmp_path / "ckpt", tiny_shards())
    calls = {"natural_key": 0}
    natural_key = tensor_io.natural_key

    def counted(name: str) -> object:
        calls["natural_key"] += 1
        return natural_key(name)

    monkeypatch.setattr(tensor_io, "natural_key", counted)
    fetcher = tensor_io.TensorFetcher(LocalSource(d))
    names = [n for n in json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]]
    shards = [f for f in fetcher.files if f.endswith(".safetensors")]
    assert len(names) > 100 and len(shards) >= 3
    for n in names:
        assert fetcher.locate(n)[1].name == n
    assert calls["natural_key"] <= len(shards)  # one sort, not one a tensor
    assert fetcher._listed_in is not None and sum(map(len, fetcher._listed_in.values())) == len(names)
