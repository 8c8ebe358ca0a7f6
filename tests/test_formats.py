"""Every quantization format the family ships in, proven against its writer: tiny DeepseekV3 checkpoints
quantized by compressed-tensors' own compressors (tests/ct_checkpoint.py) audit clean, count exactly the
unquantized model's parameters, dequantize bit for bit as compressed-tensors decompresses them, and each fault
is named once. The FP4 / E8M0 kernels against compressed-tensors' and torch's own decoding; DeepSeek-V4's FP8
and FP4 experts against transformers 5.25's dequantization and DeepSeek's formula."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from kimi_audit.model.arch import deepseek_v4
from kimi_audit.model.arch.spec import MTP
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.quant.deepseek import Fp4Experts, Fp8Block
from kimi_audit.model.quant.dispatch import quant_plan
from kimi_audit.model.quant.scheme import Stored
from kimi_audit.numerics.fp4 import dequantize_fp4_e8m0, e8m0_to_float32, float4_e2m1fn, fp4_lut, unpack_fp4

torch = pytest.importorskip("torch")
pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors.mx_utils import decompress_mx_scale  # noqa: E402
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from ct_checkpoint import PRESETS, build, decompress_module, preset_scheme  # noqa: E402
from tiny_checkpoint import TINY_CONFIG  # noqa: E402

EXPERT = "model.layers.2.mlp.experts.3.down_proj"
MODULES = [EXPERT, "model.layers.1.self_attn.q_a_proj", "model.layers.3.self_attn.kv_b_proj",
           "model.layers.0.mlp.gate_proj", "model.layers.2.mlp.shared_experts.up_proj"]
"""Modules of every shape kind: an expert [320, 160], q_a_proj [192, 320], kv_b_proj [256, 96] (a partial
FP8 block), the dense MLP, a shared expert."""
ST = {"I32": torch.int32, "I64": torch.int64, "I8": torch.int8, "U8": torch.uint8, "BF16": torch.bfloat16,
      "F32": torch.float32, "F8_E4M3": torch.float8_e4m3fn}


def to_np(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    if t.dtype == torch.float8_e8m0fnu:
        return t.view(torch.uint8).numpy().view(ml_dtypes.float8_e8m0fnu)
    return t.numpy()


def bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def run_json(*args: str, code: int = 0) -> dict[str, Any]:
    from typer.testing import CliRunner

    from kimi_audit.cli import app

    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == code, r.output
    return json.loads(r.stdout)


def weight_map(d: Path) -> dict[str, str]:
    return json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]


def module_tensors(d: Path, module: str) -> dict[str, torch.Tensor]:
    """The module's stored tensors, read with safetensors, keyed by their names relative to it."""
    out = {}
    for name, shard in weight_map(d).items():
        if name.startswith(module + ".") and "." not in name[len(module) + 1:]:
            out[name[len(module) + 1:]] = load_file(str(d / shard))[name]
    return out


def edit(d: Path, name: str, value: torch.Tensor | None) -> None:
    """Replace (or, value None, remove) one tensor in its shard and the index."""
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shard = index["weight_map"][name]
    tensors = load_file(str(d / shard))
    if value is None:
        del tensors[name], index["weight_map"][name]
    else:
        tensors[name] = value.contiguous()
    save_file(tensors, str(d / shard), metadata={"format": "pt"})
    (d / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("formats")
    return {name: build(root / name, name) for name in PRESETS}


def unquantized_total() -> int:
    from kimi_audit.model.layout import expected_layout

    base = {k: v for k, v in TINY_CONFIG.items() if k != "quantization_config"}
    return sum(e.logical for e in expected_layout(model_config_from_dict(base)).values())


# ------------------------------------------------------------------ clean checkpoints, each format


@pytest.mark.parametrize("name", list(PRESETS))
def test_the_writers_checkpoint_audits_clean_and_counts_the_unquantized_parameters(
        checkpoints: dict[str, Path], name: str) -> None:
    d = checkpoints[name]
    doc = run_json("audit", str(d), "--values", "--no-progress")
    fmt, scheme = preset_scheme(name)
    own_width = ["WRITER_DTYPE"] if fmt == "pack-quantized" else []  # its weight_shape I64: one info, for all
    assert [f["code"] for f in doc["findings"]] == ["VALUES_CHECKED", *own_width], doc["findings"]
    q = doc["model"]["quantization"]
    strategy = str(scheme.weights.strategy.value if hasattr(scheme.weights.strategy, "value")
                   else scheme.weights.strategy)
    assert (q["method"], q["format"], q["bits"], q["strategy"]) == (
        "compressed-tensors", fmt, scheme.weights.num_bits, strategy)
    assert ("block" in q) == (strategy == "block")  # never a phantom block
    total = run_json("params", str(d))["total"]
    assert total == {"derived": unquantized_total(), "found": unquantized_total(), "mismatch": False,
                     "complete": True, "incomplete": None}


@pytest.mark.parametrize("name", list(PRESETS))
def test_stored_tensors_are_the_writers_and_dequantize_bit_for_bit(checkpoints: dict[str, Path], name: str) -> None:
    """The scheme's stored tensors are the names, dtypes and shapes compressed-tensors wrote; its dequantize()
    of them == the compressor's decompress, bit for bit, on modules of every shape."""
    d = checkpoints[name]
    cfg = model_config_from_dict(json.loads((d / "config.json").read_text()))
    assert cfg.quant is not None and cfg.quant_unsupported is None
    fmt, ct_scheme = preset_scheme(name)
    for module in MODULES:
        scheme = cfg.quant.scheme_for(module)
        stored = module_tensors(d, module)
        ref = decompress_module({k: v for k, v in stored.items() if not k.startswith("input_")}, fmt, ct_scheme)
        out, inp = ref.shape
        writer = {suffix: dtype for suffix, dtype, _ in type(scheme).writer_dtypes}  # compressed-tensors' widths
        assert {k: (v.dtype, tuple(v.shape)) for k, v in stored.items()} == {
            s.suffix[1:]: (ST[writer.get(s.suffix, s.dtype)], s.shape) for s in scheme.stored(out, inp)}, module
        got = scheme.dequantize({"." + k: to_np(v) for k, v in stored.items()}, out, inp)
        assert got.dtype == to_np(ref).dtype and got.shape == (out, inp)
        assert np.array_equal(bits(got), bits(to_np(ref))), (name, module)


@pytest.mark.parametrize("name", ["fp8_block", "w8a16_channel", "nvfp4a16", "mxfp4a16"])
def test_tensor_dequant_gives_the_decompressed_weights_statistics(checkpoints: dict[str, Path], name: str) -> None:
    d = checkpoints[name]
    fmt, ct_scheme = preset_scheme(name)
    doc = run_json("tensor", str(d), EXPERT, "--dequant")
    ref = decompress_module(module_tensors(d, EXPERT), fmt, ct_scheme).double()
    assert doc["ok"] and doc["module"] == EXPERT and doc["scheme"] == f"compressed-tensors/{fmt}"
    assert doc["scale"]["tensor"] == EXPERT + ".weight_scale"
    dq = doc["dequantized"]
    assert dq["shape"] == [320, 160] and dq["min"] == float(ref.min()) and dq["max"] == float(ref.max())
    assert dq["mean"] == pytest.approx(float(ref.mean()), rel=1e-9, abs=1e-15)


def test_params_explain_and_audit_name_the_same_scheme(checkpoints: dict[str, Path]) -> None:
    from typer.testing import CliRunner

    from kimi_audit.cli import app

    d = checkpoints["nvfp4a16"]
    text = CliRunner().invoke(app, ["explain", str(d), "experts.down_proj", "--no-progress"]).stdout
    assert "FP4 e2m1, two per U8 byte, one F8_E4M3 scale per 16 inputs" in text
    assert "dtype differs" not in CliRunner().invoke(app, ["params", str(d)]).stdout


# ------------------------------------------------------------------ faults, each named once


def _errors(d: Path, *extra: str) -> list[tuple[str, str | None]]:
    doc = run_json("audit", str(d), "--no-progress", *extra, code=1)
    return [(f["code"], f["tensor"]) for f in doc["findings"] if f["severity"] == "error"]


@pytest.mark.parametrize("name,suffix", [("fp8_block", "weight_scale"), ("fp8_dynamic", "weight_scale"),
                                         ("nvfp4a16", "weight_global_scale"), ("mxfp4a16", "weight_scale"),
                                         ("w8a16_channel", "weight_scale"), ("fp8_static", "input_scale")])
def test_a_missing_scale_is_named_once(checkpoints: dict[str, Path], tmp_path: Path, name: str, suffix: str) -> None:
    d = Path(shutil.copytree(checkpoints[name], tmp_path / name))
    edit(d, f"{EXPERT}.{suffix}", None)
    assert _errors(d) == [("SCALE_MISSING", f"{EXPERT}.{suffix}")]


@pytest.mark.parametrize("name", ["nvfp4a16", "mxfp4a16", "w4a16"])
def test_a_packed_weight_one_column_off_is_named_once(checkpoints: dict[str, Path], tmp_path: Path,
                                                       name: str) -> None:
    d = Path(shutil.copytree(checkpoints[name], tmp_path / name))
    packed = module_tensors(d, EXPERT)["weight_packed"]
    edit(d, f"{EXPERT}.weight_packed", torch.cat([packed, packed[:, :1]], 1))
    assert _errors(d) == [("SHAPE_MISMATCH", f"{EXPERT}.weight_packed")]


def test_bad_fp4_scales_are_named_by_the_values_pass(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """MXFP4: an E8M0 0xFF is NaN; NVFP4: an F8_E4M3 0x7F is NaN, a zero global scale is not positive."""
    d = Path(shutil.copytree(checkpoints["mxfp4a16"], tmp_path / "mx"))
    scale = module_tensors(d, EXPERT)["weight_scale"].clone()
    scale[0, :2] = 255
    edit(d, f"{EXPERT}.weight_scale", scale)
    assert _errors(d, "--values") == [("VALUE_NAN", f"{EXPERT}.weight_scale")]
    doc = run_json("tensor", str(d), EXPERT, code=1)
    assert doc["problems"] == [f"VALUE_NAN: {EXPERT}.weight_scale: 2 of 1,600 values are NaN"]

    d = Path(shutil.copytree(checkpoints["nvfp4a16"], tmp_path / "nv"))
    tensors = module_tensors(d, EXPERT)
    scale = tensors["weight_scale"].view(torch.uint8).clone()
    scale[1, 1] = 0x7F
    edit(d, f"{EXPERT}.weight_scale", scale.view(torch.float8_e4m3fn))
    edit(d, f"{EXPERT}.weight_global_scale", torch.zeros(1, dtype=torch.float32))
    assert sorted(_errors(d, "--values")) == [("SCALE_NOT_POSITIVE", f"{EXPERT}.weight_global_scale"),
                                              ("VALUE_NAN", f"{EXPERT}.weight_scale")]


def test_an_unknown_format_is_unsupported_and_the_total_incomplete(checkpoints: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    d = Path(shutil.copytree(checkpoints["mxfp4a16"], tmp_path / "unknown"))
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["format"] = "mxfp6-pack-quantized"
    (d / "config.json").write_text(json.dumps(cfg))
    doc = run_json("audit", str(d), "--no-progress", code=1)
    assert [f["code"] for f in doc["findings"] if f["severity"] == "error"] == ["QUANT_UNSUPPORTED"]
    total = run_json("params", str(d), code=1)["total"]
    assert total["complete"] is False and "mxfp6-pack-quantized" in total["incomplete"]


# ------------------------------------------------------------------ several config groups


def test_several_config_groups_each_with_its_targets() -> None:
    """Experts NVFP4 (a `re:` target), attention FP8 per channel (names), the rest INT4 (`Linear`); exact
    names before patterns before the class target, as compressed-tensors' match_targets; `ignore` first."""
    from compressed_tensors.quantization import QuantizationConfig

    _, nv = preset_scheme("nvfp4a16", ["re:.*mlp\\.experts\\.\\d+\\..*"])
    _, int4 = preset_scheme("w4a16", ["Linear"])
    _, fp8 = preset_scheme("fp8_dynamic", ["model.layers.1.self_attn.q_a_proj"])
    qc = QuantizationConfig(config_groups={"group_0": int4, "group_1": nv, "group_2": fp8},
                            format="mixed-precision", ignore=["lm_head", "re:.*kv_a_proj.*"])
    q = qc.model_dump()
    q["config_groups"]["group_0"]["format"] = "pack-quantized"
    q["config_groups"]["group_1"]["format"] = "nvfp4-pack-quantized"
    q["config_groups"]["group_2"]["format"] = "float-quantized"
    q["quant_method"] = "compressed-tensors"
    plan = quant_plan(q, "BF16")
    assert plan is not None
    got = {m: plan.scheme_for(m).key for m in (
        "model.layers.1.self_attn.q_a_proj", "model.layers.2.self_attn.q_a_proj",
        "model.layers.2.mlp.experts.7.up_proj", "model.layers.2.mlp.shared_experts.up_proj",
        "model.layers.2.self_attn.kv_a_proj_with_mqa", "lm_head")}
    assert got == {"model.layers.1.self_attn.q_a_proj": "compressed-tensors/float-quantized",
                   "model.layers.2.self_attn.q_a_proj": "compressed-tensors/pack-quantized",
                   "model.layers.2.mlp.experts.7.up_proj": "compressed-tensors/nvfp4-pack-quantized",
                   "model.layers.2.mlp.shared_experts.up_proj": "compressed-tensors/pack-quantized",
                   "model.layers.2.self_attn.kv_a_proj_with_mqa": "none", "lm_head": "none"}
    summary = plan.summary()
    assert [g["format"] for g in summary["groups"]] == ["pack-quantized", "float-quantized", "nvfp4-pack-quantized"]
    raw = dict({k: v for k, v in TINY_CONFIG.items()}, quantization_config=q)
    from kimi_audit.model.layout import expected_layout

    layout = expected_layout(model_config_from_dict(raw))
    assert layout["model.layers.1.self_attn.q_a_proj.weight"].dtype == "F8_E4M3"
    assert layout["model.layers.2.self_attn.q_a_proj.weight_packed"].dtype == "I32"
    assert layout["model.layers.2.mlp.experts.7.up_proj.weight_packed"].dtype == "U8"
    assert sum(e.logical for e in layout.values()) == unquantized_total()


# ------------------------------------------------------------------ FP4 and E8M0 decoding


def test_fp4_unpacking_equals_compressed_tensors_for_every_byte() -> None:
    every = torch.arange(256, dtype=torch.uint8).reshape(8, 32)
    ref = unpack_fp4_from_uint8(every, 8, 64, dtype=torch.float32)
    assert np.array_equal(bits(unpack_fp4(every.numpy(), 64)), bits(ref.numpy()))  # -0.0 included
    assert np.array_equal(unpack_fp4(every.numpy(), 63), ref.numpy()[:, :63])
    e2m1 = np.arange(16, dtype=np.uint8).view(float4_e2m1fn).astype(np.float32)  # ml_dtypes' own decoding
    assert np.array_equal(bits(fp4_lut()), bits(e2m1))


def test_e8m0_decoding_equals_torch_and_compressed_tensors() -> None:
    every = torch.arange(256, dtype=torch.uint8)
    ours = e8m0_to_float32(every.numpy())
    ref = every.view(torch.float8_e8m0fnu).float().numpy()
    assert np.array_equal(bits(ours[:255]), bits(ref[:255])) and np.isnan(ref[255])
    assert np.isnan(ours[255]) and ours[127] == 1.0 and ours[0] == 2.0 ** -127
    ct = decompress_mx_scale(every[:255]).float().numpy()  # compressed-tensors' bf16 2**(e - 127)
    assert np.array_equal(ours[:255], ct)


# ------------------------------------------------------------------ DeepSeek-V4


V4_RELEASE = deepseek_v4.ARCHITECTURE.quant
"""How DeepSeek-V4's release writes FP8 (its architecture's record)."""
V4_QUANT = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "weight_block_size": [128, 128],
            "activation_scheme": "dynamic"}


@pytest.mark.parametrize("where", ["top", "inside"], ids=["v4", "v4.1"])
def test_v4_selects_fp8_with_scale_names_and_fp4_experts(where: str) -> None:
    q = dict(V4_QUANT, weight_block_size=[32, 32] if where == "inside" else [128, 128])
    config: dict[str, Any] = {"model_type": "deepseek_v4"}
    if where == "top":
        config["expert_dtype"] = "fp4"
    else:
        q["expert_dtype"] = "fp4"
    plan = quant_plan(q, "BF16", config, V4_RELEASE)
    assert plan is not None
    fp8 = plan.scheme_for("layers.3.attn.wq_a")
    fp4 = plan.scheme_for("layers.3.ffn.experts.17.w1")
    assert isinstance(fp8, Fp8Block) and isinstance(fp4, Fp4Experts)
    assert plan.scheme_for("layers.3.ffn.shared_experts.w1") is fp8 and plan.scheme_for("head").key == "none"
    assert plan.scheme_for("model.layers.3.mlp.experts.0.gate_proj") is fp4  # transformers' saved names
    b = 32 if where == "inside" else 128
    assert fp8.stored(4096, 1024) == (Stored(".weight", "F8_E4M3", (4096, 1024), "parameter", 4096 * 1024),
                                      Stored(".scale", "F8_E8M0", (4096 // b, 1024 // b), "scale"))
    assert fp4.stored(2048, 4096) == (Stored(".weight", "I8", (2048, 2048), "packed", 2048 * 4096),
                                      Stored(".scale", "F8_E8M0", (2048, 128), "scale"))
    assert [g["targets"] for g in plan.summary()["groups"]] == [["Linear"], ["re:(?:.*\\.)?experts\\.\\d+\\."]]
    flash_base = quant_plan({k: v for k, v in V4_QUANT.items() if k != "scale_fmt"}, "BF16",
                            {"model_type": "deepseek_v4"}, V4_RELEASE)
    assert flash_base is not None and flash_base.schemes == (Fp8Block(scale_suffix=".scale", scale_fmt=None),)


def test_v4_fp8_dequantizes_as_transformers() -> None:
    """transformers 5.25's FP8 dequantization (integrations/finegrained_fp8._dequantize_fp8_weight) of F8_E8M0
    block scales, 32 x 32 (V4.1) and 128 x 128 with partial blocks."""
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

    gen = torch.Generator().manual_seed(4)
    for (out, inp), block in (((96, 200), (32, 32)), ((300, 260), (128, 128))):
        w = (torch.randn(out, inp, generator=gen) * 40).to(torch.float8_e4m3fn)
        grid = (-(-out // block[0]), -(-inp // block[1]))
        scale = torch.randint(100, 140, grid, generator=gen, dtype=torch.uint8).view(torch.float8_e8m0fnu)
        ref = _dequantize_fp8_weight(w.clone(), scale, list(block), torch.bfloat16)
        scheme = Fp8Block(block=block, scale_fmt="ue8m0", scale_suffix=".scale", scale_dtype="F8_E8M0")
        got = scheme.dequantize({".weight": to_np(w), ".scale": to_np(scale)}, out, inp)
        assert np.array_equal(bits(got), bits(to_np(ref)))


def test_v4_fp4_experts_dequantize_as_transformers() -> None:
    """transformers 5.25's load-time dequantization of `expert_dtype: fp4` weights (finegrained_fp8.Fp8Dequantize:
    I8 nibble pairs, F8_E8M0 scales per 32 inputs, float32 product to bf16), bit for bit; and DeepSeek's formula
    ``fp4 * 2**(e - 127)`` with compressed-tensors' E2M1 decoding (the same nibble order)."""
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    gen = torch.Generator().manual_seed(5)
    out, inp = 64, 256
    packed = torch.randint(-128, 128, (out, inp // 2), generator=gen, dtype=torch.int8)
    scale = torch.randint(110, 135, (out, inp // 32), generator=gen, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    ref = Fp8Dequantize(None)._dequantize_one(packed, scale, torch.bfloat16)
    got = Fp4Experts().dequantize({".weight": packed.numpy(), ".scale": to_np(scale)}, out, inp)
    assert np.array_equal(bits(got), bits(to_np(ref)))
    values = unpack_fp4_from_uint8(packed.view(torch.uint8), out, inp, dtype=torch.float32)
    formula = (values * scale.float().repeat_interleave(32, 1)).to(torch.bfloat16)
    assert np.array_equal(bits(got), bits(to_np(formula)))
    assert np.array_equal(bits(dequantize_fp4_e8m0(packed.numpy(), to_np(scale), inp)), bits(got))


def test_verify_scans_each_formats_scales(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """verify's value scan reads the codes: an E8M0 0xFF (MXFP4's U8 exponents) and an F8_E4M3 0x7F (NVFP4's
    scales) are NaN, a negative F8_E4M3 scale and a zero global scale are not positive; FP4 bytes hold no NaN."""
    for name in ("mxfp4a16", "nvfp4a16"):
        assert run_json("verify", str(checkpoints[name]), "--no-progress")["result"]["verdict"] == "PASS"
    d = Path(shutil.copytree(checkpoints["mxfp4a16"], tmp_path / "mx"))
    scale = module_tensors(d, EXPERT)["weight_scale"].clone()
    scale[0, :3] = 255
    edit(d, f"{EXPERT}.weight_scale", scale)
    doc = run_json("verify", str(d), "--no-progress", code=1)
    assert [(f["code"], f["tensor"], f["actual"]) for f in doc["findings"] if f["severity"] == "error"] == [
        ("VALUE_NAN", f"{EXPERT}.weight_scale", 3)]
    d = Path(shutil.copytree(checkpoints["nvfp4a16"], tmp_path / "nv"))
    scale = module_tensors(d, EXPERT)["weight_scale"].view(torch.uint8).clone()
    scale[1, 1], scale[2, 2] = 0x7F, scale[2, 2] | 0x80
    edit(d, f"{EXPERT}.weight_scale", scale.view(torch.float8_e4m3fn))
    edit(d, f"{EXPERT}.weight_global_scale", torch.zeros(1, dtype=torch.float32))
    doc = run_json("verify", str(d), "--no-progress", code=1)
    assert sorted((f["code"], f["tensor"], f["actual"]) for f in doc["findings"] if f["severity"] == "error") == [
        ("SCALE_NOT_POSITIVE", f"{EXPERT}.weight_global_scale", 1),
        ("SCALE_NOT_POSITIVE", f"{EXPERT}.weight_scale", 1), ("VALUE_NAN", f"{EXPERT}.weight_scale", 1)]


@pytest.mark.parametrize("given,expect", [("stored", ("INDEX_TOTAL_PARAMETERS", "info")), ("parameters", None),
                                          ("less-buffers", ("INDEX_TOTAL_PARAMETERS", "info")),
                                          ("other", ("INDEX_TOTAL_PARAMETERS", "warning"))])
def test_index_total_parameters_is_compared_with_the_models(checkpoints: dict[str, Path], tmp_path: Path,
                                                            given: str, expect: tuple[str, str] | None) -> None:
    """llmcompressor's metadata.total_parameters counts the stored elements (compressed words and scales), or
    those less the buffers (family.md: gaps of 4, 12, 16 seen): an info naming both counts; the model's own
    count: nothing; anything else: a warning."""
    d = Path(shutil.copytree(checkpoints["nvfp4a16"], tmp_path / "nv"))
    tensors = {n: t for shard in set(weight_map(d).values()) for n, t in load_file(str(d / shard)).items()}
    stored = sum(t.numel() for t in tensors.values())
    buffers = sum(t.numel() for n, t in tensors.items() if n.endswith("rotary_emb.inv_freq"))
    assert buffers > 0  # the case is not the stored one
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["metadata"]["total_parameters"] = {"stored": stored, "parameters": unquantized_total(), "other": 12,
                                             "less-buffers": stored - buffers}[given]
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    doc = run_json("audit", str(d), "--no-progress")
    got = [(f["code"], f["severity"]) for f in doc["findings"]]
    assert got == ([] if expect is None else [expect])
    if given == "stored":
        assert (doc["findings"][0]["expected"], doc["findings"][0]["actual"]) == (unquantized_total(), stored)


def test_v4_stored_tensors_are_what_transformers_allocates() -> None:
    """transformers 5.25 loads `quant_method: fp8` checkpoints into FP8Linear (one weight_scale_inv per block,
    F8_E8M0 with scale_fmt ue8m0; the quantizer renames DeepSeek's `.scale` to it) and, with expert_dtype fp4,
    FP8Experts whose gate_up_proj / down_proj hold every expert's I8 [out, in/2] and F8_E8M0 [out, in/32]: the
    same dtypes and shapes the V4 schemes store per module."""
    from types import SimpleNamespace

    from transformers.integrations.finegrained_fp8 import FP8Experts, FP8Linear

    dt = {torch.float8_e4m3fn: "F8_E4M3", torch.float8_e8m0fnu: "F8_E8M0", torch.int8: "I8"}
    for block, (out, inp) in (((128, 128), (1024, 4096)), ((32, 32), (96, 200))):
        linear = FP8Linear(inp, out, block_size=block, scale_fmt="ue8m0")
        scheme = Fp8Block(block=block, scale_fmt="ue8m0", scale_suffix=".scale", scale_dtype="F8_E8M0")
        assert [(s.dtype, s.shape) for s in scheme.stored(out, inp)] == [
            (dt[p.dtype], tuple(p.shape)) for p in (linear.weight, linear.weight_scale_inv)]
    hidden, inter, experts = 256, 128, 4
    cfg = SimpleNamespace(hidden_size=hidden, moe_intermediate_size=inter, num_experts=experts, hidden_act="silu")
    moe = FP8Experts(cfg, block_size=(128, 128), scale_fmt="ue8m0", expert_dtype="fp4")
    w1, s1 = Fp4Experts().stored(inter, hidden)
    w2, s2 = Fp4Experts().stored(hidden, inter)
    assert (dt[moe.gate_up_proj.dtype], tuple(moe.gate_up_proj.shape)) == (w1.dtype, (experts, 2 * inter, w1.shape[1]))
    assert (dt[moe.gate_up_proj_scale_inv.dtype], tuple(moe.gate_up_proj_scale_inv.shape)) == (
        s1.dtype, (experts, 2 * inter, s1.shape[1]))
    assert (dt[moe.down_proj.dtype], tuple(moe.down_proj.shape)) == (w2.dtype, (experts, *w2.shape))
    assert (dt[moe.down_proj_scale_inv.dtype], tuple(moe.down_proj_scale_inv.shape)) == (s2.dtype, (experts, *s2.shape))


# ------------------------------------------------------------------ DeepSeek-V4 end to end, on its module tree


V4_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "weight_block_size": [32, 32],
          "activation_scheme": "dynamic", "expert_dtype": "fp4"}
"""V4.1's spelling: 32 x 32 blocks, expert_dtype inside quantization_config."""


def e8m0_block_quantize(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 e4m3 codes and F8_E8M0 scales of a weight, per block: the scale the power of two at or above
    amax / 448 (DeepSeek's ue8m0 cast)."""
    out, inp = w.shape
    rows, cols = -(-out // block[0]), -(-inp // block[1])
    pad = torch.nn.functional.pad(w.float(), (0, cols * block[1] - inp, 0, rows * block[0] - out))
    g = pad.reshape(rows, block[0], cols, block[1])
    amax = g.abs().amax((1, 3)).clamp(min=1e-12)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
    q = (g / scale[:, None, :, None]).reshape(pad.shape)[:out, :inp].to(torch.float8_e4m3fn)
    return q, scale.to(torch.float8_e8m0fnu)


@dataclass
class V4Release:
    """A tiny DeepSeek-V4 checkpoint in the release's names (tests/test_lineage_differential.RELEASE_SPELLING),
    stored as `quant` says: FP8 Linear weights with an F8_E8M0 `.scale` per block, routed experts FP4 (I8 pairs,
    F8_E8M0 `.scale` per 32 inputs) when expert_dtype is fp4."""

    path: Path
    tensors: dict[str, torch.Tensor]
    shapes: dict[str, tuple[int, int]]
    """Each quantized module's logical [out, in]."""
    layout: dict[str, Any]
    numel: int
    """The BF16 model's parameters."""
    config: dict[str, Any]


def write_v4_release(tmp_path: Path, quant: dict[str, Any] = V4_FP8, top: dict[str, Any] | None = None,
                     drop: str | None = None) -> V4Release:
    """The tiny V4 saved by transformers, respelled as the release and quantized as `quant` (+ `top`-level config
    keys, e.g. V4's `expert_dtype`), with the tensor `drop` left out."""
    from transformers import AutoModelForCausalLM, DeepseekV4Config

    from kimi_audit.model.layout import expected_layout
    from test_lineage_differential import TINY, respell, with_v4_mtp

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(DeepseekV4Config(**TINY["deepseek_v4"]), dtype=torch.bfloat16)
    saved = tmp_path / "saved"
    model.save_pretrained(saved)
    numel = sum(p.numel() for p in model.parameters())
    raw = json.loads((saved / "config.json").read_text())
    raw["quantization_config"] = quant
    raw.update(top or {})
    layout = expected_layout(model_config_from_dict(raw))
    shards = {"all": {n: t for f in saved.glob("*.safetensors") for n, t in load_file(str(f)).items()}}
    respell("deepseek_v4")(shards)  # the release's names, and its BF16 gains
    tensors = shards["all"]
    with_v4_mtp({"all": tensors})  # the release's MTP stage, as vLLM's loader reads it
    block = tuple(quant["weight_block_size"])
    gen = torch.Generator().manual_seed(1)
    shapes = {}
    for name in list(tensors):
        e = layout.get(name)
        if e is None or e.dtype not in ("F8_E4M3", "I8"):
            continue
        module, w = name[: -len(".weight")], tensors.pop(name)
        shapes[module] = tuple(w.shape)
        if e.dtype == "F8_E4M3":
            tensors[name], tensors[module + ".scale"] = e8m0_block_quantize(w, block)
        else:
            tensors[name] = torch.randint(-128, 128, e.shape, generator=gen, dtype=torch.int8)
            shape = layout[module + ".scale"].shape
            tensors[module + ".scale"] = torch.randint(118, 127, shape, generator=gen, dtype=torch.uint8).view(
                torch.float8_e8m0fnu)
    assert set(tensors) == set(layout) and all(str(tensors[n].shape) == str(torch.Size(e.shape))
                                               for n, e in layout.items())
    if drop is not None:
        del tensors[drop]
    d = tmp_path / "release"
    d.mkdir()
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(raw))
    return V4Release(d, tensors, shapes, layout, numel, raw)


def test_v4_release_in_deepseeks_fp8_and_fp4_audits_clean_and_dequantizes_as_transformers(tmp_path: Path) -> None:
    """A tiny DeepSeek-V4 saved by transformers, in the release's names, its Linear weights stored as the plan
    says (FP8 with F8_E8M0 `.scale` per 32 x 32 block, routed experts FP4 I8 pairs with `.scale` per 32 inputs):
    audits with no finding, counts the BF16 model's parameters, and `tensor --dequant` of an expert gives
    transformers' own dequantization (Fp8Dequantize) of the same bytes."""
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    release = write_v4_release(tmp_path)
    d, tensors, layout, numel = release.path, release.tensors, release.layout, release.numel
    doc = run_json("audit", str(d), "--values", "--no-progress")
    assert [f["code"] for f in doc["findings"]] == ["VALUES_CHECKED"], doc["findings"]
    assert run_json("params", str(d))["total"]["found"] == numel + sum(
        e.numel for e in layout.values() if e.name.endswith("ffn.gate.bias") and e.block != MTP) + sum(  # buffers
        e.logical for e in layout.values() if e.name.startswith("mtp."))  # the MTP stage transformers builds none of
    expert = next(n for n in layout if ".experts.1.w2.weight" in n)[: -len(".weight")]
    doc = run_json("tensor", str(d), expert, "--dequant")
    ref = Fp8Dequantize(None)._dequantize_one(tensors[expert + ".weight"], tensors[expert + ".scale"],
                                               torch.bfloat16).double()
    assert doc["scheme"] == Fp4Experts.key and doc["dequantized"]["min"] == float(ref.min())
    assert doc["dequantized"]["max"] == float(ref.max()) and doc["ok"]


# ------------------------------------------------------------------ DeepSeek-V4 in transformers 5.25's loader

V4_SPELLINGS = {"v4": (V4_QUANT, {"expert_dtype": "fp4"}), "v4.1": (V4_FP8, None)}
"""V4: 128 x 128 blocks, `expert_dtype: fp4` at the top level (DeepseekV4Config moves it into the
quantization config); V4.1: 32 x 32 blocks, expert_dtype inside quantization_config."""

V4_LOAD_PATHS = ["dequantize", "fp8-modules"]
"""How transformers loads a `quant_method: fp8` checkpoint. With no GPU (FineGrainedFP8HfQuantizer.
validate_environment) it sets `dequantize=True`: Fp8Dequantize folds each `.scale` into its weight (the experts'
before they are merged) and the model holds plain BF16 Linears. On a GPU of compute capability >= 8.9 it keeps
the checkpoint quantized: FP8Linear (weight + weight_scale_inv) and FP8Experts (gate_up_proj / down_proj I8 and
their *_scale_inv), the quantizer renaming `.scale` to `weight_scale_inv`. That path is loaded here on the CPU
with the capability check answered as an H100's (loading only: no FP8 kernel runs)."""


def load_v4(path: Path, how: str) -> tuple[Any, dict[str, Any]]:
    from unittest import mock

    from transformers import AutoModelForCausalLM

    with contextlib.ExitStack() as stack:
        gpu = how == "fp8-modules"  # the machine the quantizer's validate_environment sees, whatever this one is
        stack.enter_context(mock.patch("torch.cuda.is_available", return_value=gpu))
        stack.enter_context(mock.patch(
            "transformers.quantizers.quantizer_finegrained_fp8.is_torch_xpu_available", return_value=False))
        if gpu:
            stack.enter_context(mock.patch("torch.cuda.get_device_capability", return_value=(9, 0)))
        model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, device_map="cpu")
    return model, info


def v4_expected_missing_and_unexpected(model: Any, checkpoint: set[str]) -> None:
    """Every way transformers 5.25 drops a key from `missing_keys` / `unexpected_keys` before reporting them
    (PreTrainedModel._adjust_missing_and_unexpected_keys, tie_weights), shown to drop nothing here:
    - `_keys_to_ignore_on_load_missing`: none for DeepseekV4;
    - tied weights (`lm_head.weight` to the embedding, whose absence tie_weights removes from missing_keys):
      none, tie_word_embeddings is false in V4's config;
    - `_keys_to_ignore_on_load_unexpected`: `mtp.*` (the release's multi-token-prediction module, which
      transformers does not build), plus `rotary_emb.inv_freq` / `position_ids` patterns for old checkpoints:
      no checkpoint key matches;
    - non-persistent buffers are outside the state dict (neither expected nor missing): only the rotary
      embeddings' inverse frequencies, which transformers computes from the config (rope_theta, compress_rope_theta).
    The persistent buffers (hash routing's tid2eid, the routers' e_score_correction_bias) are in the state
    dict, and loaded from the checkpoint's `gate.tid2eid` / `gate.bias`."""
    assert not model._keys_to_ignore_on_load_missing
    assert model.all_tied_weights_keys == {} and model.config.tie_word_embeddings is False
    assert set(model._keys_to_ignore_on_load_unexpected) == {r"(^|\.)mtp\..*"}
    patterns = [*model._keys_to_ignore_on_load_unexpected, r"rotary_emb\.inv_freq", r"(^|\.)position_ids$"]
    # what transformers ignores is exactly the release's MTP stage (the audit checks it: vLLM loads it)
    assert [k for k in checkpoint if any(re.search(p, k) for p in patterns)] == [
        k for k in checkpoint if k.startswith("mtp.0.")] != []
    state = model.state_dict()
    transient = {n for n, _ in model.named_buffers() if n not in state}
    assert transient and all(re.search(r"\.rotary_emb\.(main|compress)(_original)?_inv_freq$", n) for n in transient)
    persistent = {n for n, _ in model.named_buffers() if n in state}
    assert persistent and all(n.endswith((".gate.tid2eid", ".gate.e_score_correction_bias")) for n in persistent)


@pytest.mark.parametrize("how", V4_LOAD_PATHS)
@pytest.mark.parametrize("spelling", list(V4_SPELLINGS))
def test_v4_release_loads_in_transformers_with_no_missing_or_unexpected_keys(tmp_path: Path, spelling: str,
                                                                            how: str) -> None:
    """transformers 5.25 loads a tiny DeepSeek-V4 in DeepSeek's own names (FP8 with F8_E8M0 `.scale`, FP4
    routed experts): no missing, unexpected or mismatched key, on both load paths; the same directory audits
    clean. Quantized, the model holds the checkpoint's bytes (`.scale` as weight_scale_inv, each expert's
    w1 / w3 stacked into gate_up_proj); dequantized, it holds bit for bit kimi-audit's own dequantization of
    every module (a twin checkpoint of those BF16 weights, loaded alike)."""
    from transformers.integrations.finegrained_fp8 import FP8Experts, FP8Linear

    quant, top = V4_SPELLINGS[spelling]
    release = write_v4_release(tmp_path, quant, top)
    model, info = load_v4(release.path, how)
    assert info == {"missing_keys": set(), "unexpected_keys": set(), "mismatched_keys": set(), "error_msgs": []}
    v4_expected_missing_and_unexpected(model, set(release.tensors))
    if how == "fp8-modules":  # V4's top-level expert_dtype reached the quantizer
        assert model.config.quantization_config.expert_dtype == "fp4"
    doc = run_json("audit", str(release.path), "--values", "--no-progress")
    assert [f["code"] for f in doc["findings"]] == ["VALUES_CHECKED"], doc["findings"]

    state = model.state_dict()
    fp8 = [m for m in model.modules() if isinstance(m, FP8Linear)]  # FP8GroupedLinear (o_a_proj) too
    experts = [m for m in model.modules() if isinstance(m, FP8Experts)]
    routed = {m for m in release.shapes if ".experts." in m and not m.startswith("mtp.")}
    if how == "dequantize":
        assert fp8 == [] and experts == []
        assert all(t.dtype != torch.float8_e4m3fn and t.dtype != torch.int8 for t in state.values())
        plan = quant_plan(release.config["quantization_config"], "BF16", release.config, V4_RELEASE)
        assert plan is not None
        twin: dict[str, torch.Tensor] = {}
        for name, t in release.tensors.items():
            module = name.rsplit(".", 1)[0]
            if module not in release.shapes:
                twin[name] = t
            elif name.endswith(".weight"):
                stored = {".weight": to_np(t), ".scale": to_np(release.tensors[module + ".scale"])}
                deq = plan.scheme_for(module).dequantize(stored, *release.shapes[module])
                twin[name] = torch.from_numpy(np.ascontiguousarray(deq).view(np.int16)).view(torch.bfloat16)
        d = tmp_path / "twin"
        d.mkdir()
        save_file(twin, str(d / "model.safetensors"), metadata={"format": "pt"})
        (d / "config.json").write_text(json.dumps({k: v for k, v in release.config.items()
                                                   if k not in ("quantization_config", "expert_dtype")}))
        torch.manual_seed(7)  # another init than the first load's, for any key both left unloaded
        reference, twin_info = load_v4(d, how)
        assert twin_info["missing_keys"] == set() and twin_info["unexpected_keys"] == set()
        ref = reference.state_dict()
        assert set(ref) == set(state)
        unequal = [n for n in state if not torch.equal(state[n].view(torch.uint8), ref[n].view(torch.uint8))]
        assert unequal == []
        return
    # quantized: one FP8Linear per FP8 module, one FP8Experts per MoE layer, every scale loaded as the checkpoint's
    assert len(fp8) == sum(not m.startswith("mtp.") for m in release.shapes) - len(routed)  # no MTP stage built
    assert len(experts) == release.config["num_hidden_layers"]
    scales = [n for n in state if n.endswith("scale_inv")]
    assert len(scales) == len(fp8) + 2 * len(experts)
    assert all(state[n].dtype == torch.float8_e8m0fnu for n in scales)
    t = release.tensors
    for layer in range(release.config["num_hidden_layers"]):
        for ours, theirs, parts in ((".weight", "", ("w1", "w3")), (".scale", "_scale_inv", ("w1", "w3")),
                                    (".weight", "", ("w2",)), (".scale", "_scale_inv", ("w2",))):
            stacked = torch.stack([torch.cat([t[f"layers.{layer}.ffn.experts.{e}.{w}{ours}"] for w in parts])
                                   for e in range(release.config["n_routed_experts"])])
            target = "gate_up_proj" if parts[0] == "w1" else "down_proj"
            got = state[f"model.layers.{layer}.mlp.experts.{target}{theirs}"]
            assert torch.equal(got.view(torch.uint8), stacked.view(torch.uint8))
    wq_b = state["model.layers.2.self_attn.q_b_proj.weight_scale_inv"]
    assert torch.equal(wq_b.view(torch.uint8), t["layers.2.attn.wq_b.scale"].view(torch.uint8))


SILENT = "silent"
V4_DROPPED: dict[str, dict[str, str]] = {
    "layers.2.attn.wq_b.scale": {"dequantize": SILENT,
                                 "fp8-modules": "missing model.layers.2.self_attn.q_b_proj.weight_scale_inv"},
    "layers.1.attn.indexer.wq_b.weight": {
        "dequantize": "missing model.layers.1.self_attn.compressor.indexer.q_b_proj.weight",
        "fp8-modules": "raises NotImplementedError: \"normal_kernel_cpu\" not implemented for 'Float8_e4m3fn'"},
    "layers.2.ffn.experts.1.w1.weight": {"dequantize": "raises RuntimeError: automatic conversion",
                                         "fp8-modules": "raises RuntimeError: automatic conversion"},
    "layers.3.ffn.gate.bias": {"dequantize": "missing model.layers.3.mlp.gate.e_score_correction_bias",
                               "fp8-modules": "missing model.layers.3.mlp.gate.e_score_correction_bias"},
    "layers.0.ffn.gate.tid2eid": {"dequantize": "missing model.layers.0.mlp.gate.tid2eid",
                                  "fp8-modules": "missing model.layers.0.mlp.gate.tid2eid"},
}
"""A tensor left out of the release -> what transformers 5.25 does on each load path, as measured:
- the missing key, reported (output_loading_info) and newly initialized;
- a missing FP8 weight on the FP8 path: reported missing, then `_init_weights` fails to draw normal_ values
  into a float8_e4m3fn parameter on the CPU (the error, from torch.nn.init);
- one expert's w1 missing: the merge of 3 experts' w1 with 4 w3 (Concatenate) or 4 scales (Fp8Dequantize's
  "weight/scale count mismatch") fails, and from_pretrained raises "issues during automatic conversion";
- SILENT: a non-expert `.scale` missing on the dequantize path (the CPU default) is no missing key at all:
  Fp8Dequantize.convert passes a weight with no sibling scale through as "stored unquantized", so the FP8
  codes load cast to BF16, unscaled. Only the audit names it."""


@pytest.mark.parametrize("how", V4_LOAD_PATHS)
@pytest.mark.parametrize("dropped", list(V4_DROPPED))
def test_v4_release_missing_a_tensor_in_transformers_and_the_audit(tmp_path: Path, dropped: str, how: str) -> None:
    """The load check above can fail: the release without one tensor is, to transformers, what V4_DROPPED
    says (a missing key, a load error, or, for a scale on the dequantize path, nothing), and to the audit
    always one error naming that tensor."""
    release = write_v4_release(tmp_path, V4_FP8, drop=dropped)
    expect = V4_DROPPED[dropped][how]
    if expect.startswith("raises"):
        kind, match = expect.removeprefix("raises ").split(": ", 1)
        with pytest.raises({"RuntimeError": RuntimeError, "NotImplementedError": NotImplementedError}[kind],
                           match=re.escape(match)):
            load_v4(release.path, how)
    else:
        model, info = load_v4(release.path, how)
        missing = set() if expect == SILENT else {expect.removeprefix("missing ")}
        assert info["missing_keys"] == missing and info["unexpected_keys"] == set() and not info["mismatched_keys"]
        if expect == SILENT:
            got = model.state_dict()["model.layers.2.self_attn.q_b_proj.weight"]
            assert torch.equal(got, release.tensors["layers.2.attn.wq_b.weight"].to(torch.bfloat16))
    doc = run_json("audit", str(release.path), "--no-progress", code=1)
    errors = sorted((f["code"], f["tensor"]) for f in doc["findings"] if f["severity"] == "error")
    module = dropped.removesuffix(".weight")
    if module in release.shapes:  # its `.scale`, still stored, is covered by the missing weight (as in V3)
        assert errors == [("TENSOR_MISSING", dropped)], doc["findings"]
        assert module + ".scale stored without it" in doc["findings"][0]["message"]
    else:
        assert [t for _, t in errors] == [dropped], doc["findings"]


def test_rmsnorm_reads_v4s_own_query_norm(tmp_path: Path) -> None:
    """Issue 32: `rmsnorm` on a DeepSeek-V4 checkpoint named a tensor that does not exist
    (`…self_attn.q_a_layernorm.weight`); the part is the architecture's (V4: `attn.q_norm`)."""
    release = write_v4_release(tmp_path)
    doc = run_json("rmsnorm", str(release.path), "--all")
    assert [r["tensor"] for r in doc["layers"]][:2] == ["layers.0.attn.q_norm.weight", "layers.1.attn.q_norm.weight"]
    assert doc["ok"]
