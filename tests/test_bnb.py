"""bitsandbytes checkpoints written by their own writer: transformers 5.25 loads a tiny DeepseekV3 (Kimi-K2
shaped, the tiny demo's dimensions) with `BitsAndBytesConfig` on this CPU (bitsandbytes 0.50's CPU build) and
saves it. Each audits clean with the unquantized model's parameter count, transformers loads it back with no
missing or unexpected key, its weights dequantize bit for bit as `bitsandbytes.functional.dequantize_4bit` /
`int8_vectorwise_dequant`, and each fault kind is one finding."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import kimi_audit
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.numerics.kernels import tensor_stats
from tiny_checkpoint import TINY_CONFIG

torch = pytest.importorskip("torch")
bnb_functional = pytest.importorskip("bitsandbytes.functional")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

VARIANTS: dict[str, dict[str, Any]] = {
    "nf4": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
    "nf4-double": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True},
    "fp4": {"load_in_4bit": True, "bnb_4bit_quant_type": "fp4"},
    "fp4-double": {"load_in_4bit": True, "bnb_4bit_quant_type": "fp4", "bnb_4bit_use_double_quant": True},
    "int8": {"load_in_8bit": True},
    # a skip list replaces transformers' default (the output head): lm_head is quantized, q_a_proj is not
    "nf4-skip": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "llm_int8_skip_modules": ["q_a_proj"]},
}


def np_(t: Any) -> np.ndarray:
    t = t.detach().contiguous()
    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 else t.numpy()


@pytest.fixture(scope="module")
def unquantized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny DeepseekV3 in BF16, saved by transformers (the tiny demo's dimensions, no FP8)."""
    cfg = {k: v for k, v in TINY_CONFIG.items() if k not in ("quantization_config", "architectures")}
    cfg["model_type"] = "deepseek_v3"
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**cfg)).to(torch.bfloat16)
    out = tmp_path_factory.mktemp("bf16") / "bf16"
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def written(unquantized: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bnb")
    out = {}
    for name, kw in VARIANTS.items():
        if "load_in_4bit" in kw:
            kw = dict(kw, bnb_4bit_compute_dtype=torch.bfloat16)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            unquantized, quantization_config=transformers.BitsAndBytesConfig(**kw), device_map="cpu")
        model.save_pretrained(root / name)
        out[name] = root / name
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_what_transformers_saves_with_bitsandbytes_audits_clean(variant, written, unquantized):
    path = written[variant]
    report = kimi_audit.audit(path, values=True)
    assert report.errors == 0 and report.warnings == 0, [f.message for f in report.findings]
    assert report.stats.parameters == kimi_audit.audit(unquantized).stats.parameters
    assert report.model["quantization"]["method"] == "bitsandbytes"
    values = next(f for f in report.findings if f.code == "VALUES_CHECKED")
    assert "absmax/SCB" in values.message


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_transformers_loads_back_what_the_layout_expects(variant, written):
    path = written[variant]
    stored = set(load_file(str(path / "model.safetensors")))
    layout = kimi_audit.layout(path / "config.json")
    assert {e.name for e in layout.entries() if e.kind != "buffer"} == stored  # the rotary buffer: optional
    _, info = transformers.AutoModelForCausalLM.from_pretrained(path, device_map="cpu", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_a_skip_list_replaces_the_default_skip(written):
    stored = load_file(str(written["nf4-skip"] / "model.safetensors"))
    assert "lm_head.weight.absmax" in stored
    assert stored["model.layers.0.self_attn.q_a_proj.weight"].dtype == torch.bfloat16


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_dequantization_is_bitsandbytes_own_bit_for_bit(variant, written):
    from bitsandbytes.functional import QuantState

    path = written[variant]
    cfg = model_config_from_dict(json.loads((path / "config.json").read_text()))
    assert cfg.quant is not None
    tensors = load_file(str(path / "model.safetensors"))
    modules = sorted({n[: -len(".weight")] for n, t in tensors.items()
                      if n.endswith(".weight") and t.dtype in (torch.uint8, torch.int8)})
    assert len(modules) > 20
    for module in modules:
        scheme = cfg.quant.scheme_for(module)
        mine_in = {k[len(module):]: np_(v) for k, v in tensors.items() if k.startswith(module + ".")}
        if scheme.bits == 8:  # type: ignore[attr-defined]
            w = tensors[f"{module}.weight"]
            ref = bnb_functional.int8_vectorwise_dequant(w, tensors[f"{module}.SCB"])
            out, inp = w.shape
        else:
            qs = {k[len(module) + len(".weight."):]: v for k, v in tensors.items()
                  if k.startswith(module + ".weight.")}
            state = QuantState.from_dict(qs, device=torch.device("cpu"))
            ref = reference_4bit(tensors[f"{module}.weight"], state)
            out, inp = ref.shape
        mine = scheme.dequantize(mine_in, out, inp)
        assert np.array_equal(np.asarray(mine).view(np.uint8), np_(ref).view(np.uint8)), module


def test_tensor_dequant_gives_bitsandbytes_statistics(written):
    from bitsandbytes.functional import QuantState

    path = written["nf4-double"]
    module = "model.layers.1.self_attn.q_b_proj"
    check = kimi_audit.tensor(path, module, dequantize=True)
    tensors = load_file(str(path / "model.safetensors"))
    qs = {k[len(module) + len(".weight."):]: v for k, v in tensors.items() if k.startswith(module + ".weight.")}
    ref = reference_4bit(tensors[f"{module}.weight"], QuantState.from_dict(qs, torch.device("cpu")))
    assert check.ok
    assert check.doc["dequantized"] == tensor_stats(np_(ref)).to_json()


def reference_4bit(packed: Any, state: Any) -> Any:
    """bitsandbytes' own dequantization: `dequantize_4bit` where the row width is a multiple of the block, else
    its reference implementation (backends/default `_dequantize_4bit_compute`, which its CUDA kernel matches):
    0.50.2's CPU kernel reads the blocks of such rows otherwise (test below)."""
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute

    if state.shape[-1] % state.blocksize == 0:
        return bnb_functional.dequantize_4bit(packed, state)
    absmax = state.absmax
    if state.nested:
        absmax = bnb_functional.dequantize_blockwise(state.absmax, state.state2) + state.offset
    return _dequantize_4bit_compute(packed.reshape(-1), absmax.float(), state.code, state.blocksize, state.shape,
                                    state.dtype)


def test_bitsandbytes_cpu_kernel_departs_from_its_reference_where_rows_cross_blocks():
    """Why reference_4bit does not call dequantize_4bit there: measured on bitsandbytes 0.50.2's CPU build, a
    [256, 96] weight (rows of 96 cross the 64-value blocks) dequantizes farther from the weight through the CPU
    kernel than through the reference implementation. If a release fixes it, this fails: drop the detour."""
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute

    torch.manual_seed(1)
    w = torch.randn(256, 96, dtype=torch.bfloat16)
    q, state = bnb_functional.quantize_4bit(w, quant_type="nf4", blocksize=64)
    kernel = bnb_functional.dequantize_4bit(q, state).float()
    reference = _dequantize_4bit_compute(q.reshape(-1), state.absmax, state.code, 64, (256, 96), torch.bfloat16)
    assert (kernel - w.float()).abs().max() > 2 * (reference.float() - w.float()).abs().max()


def resave(path: Path, change: Any) -> None:
    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    index = path / "model.safetensors.index.json"
    if index.exists():
        doc = json.loads(index.read_text())
        doc["weight_map"] = {n: s for n, s in doc["weight_map"].items() if n in tensors}
        index.write_text(json.dumps(doc))


def test_a_missing_absmax_is_one_finding(written, tmp_path):
    path = Path(shutil.copytree(written["nf4"], tmp_path / "m"))
    name = "model.layers.2.self_attn.o_proj.weight.absmax"
    resave(path, lambda t: t.pop(name))
    errors = [f for f in kimi_audit.audit(path).findings if f.severity.value == "error"]
    assert [(f.code, f.tensor) for f in errors] == [("SCALE_MISSING", name)], [f.message for f in errors]


def test_a_quant_state_for_another_shape_is_found_by_the_values_pass(written, tmp_path):
    """Same length, another shape: the headers cannot tell; the values pass reads the JSON."""
    path = Path(shutil.copytree(written["nf4"], tmp_path / "m"))
    name = "model.layers.1.self_attn.o_proj.weight.quant_state.bitsandbytes__nf4"

    def swap(t: dict[str, Any]) -> None:
        doc = json.loads(bytes(t[name].tolist()))
        doc["shape"] = [doc["shape"][0] // 2, doc["shape"][1]]  # [320, 128] -> [160, 128]: as many digits
        raw = json.dumps(doc).encode()
        assert len(raw) == len(t[name])
        t[name] = torch.tensor(list(raw), dtype=torch.uint8)

    resave(path, swap)
    assert kimi_audit.audit(path).errors == 0
    report = kimi_audit.audit(path, values=True)
    assert [(f.code, f.tensor) for f in report.findings if f.severity.value == "error"] == [
        ("QUANT_STATE_INVALID", name)]


def test_a_negative_absmax_is_found_by_the_values_pass(written, tmp_path):
    path = Path(shutil.copytree(written["nf4"], tmp_path / "m"))
    name = "model.layers.3.mlp.shared_experts.up_proj.weight.absmax"

    def negate(t: dict[str, Any]) -> None:
        t[name] = t[name].clone()
        t[name][3] = -t[name][3]

    resave(path, negate)
    report = kimi_audit.audit(path, values=True)
    assert [(f.code, f.tensor) for f in report.findings if f.severity.value == "error"] == [
        ("SCALE_NEGATIVE", name)]


@pytest.mark.parametrize("shape", ["transposed", "flat"])
def test_a_quant_state_with_the_modules_values_in_another_shape_is_found(written, tmp_path, shape):
    """[in, out] for an [out, in] module, or [out x in]: as many values, still not the module's shape. The values
    pass and `tensor --dequant` name it (both passed it: a false PASS)."""
    from typer.testing import CliRunner

    from kimi_audit.cli import app

    path = Path(shutil.copytree(written["nf4"], tmp_path / "m"))
    module = "model.layers.1.self_attn.o_proj"
    name = f"{module}.weight.quant_state.bitsandbytes__nf4"

    def swap(t: dict[str, Any]) -> None:
        doc = json.loads(bytes(t[name].tolist()))
        out, inp = doc["shape"]
        doc["shape"] = [inp, out] if shape == "transposed" else [out * inp]
        t[name] = torch.tensor(list(json.dumps(doc).encode()), dtype=torch.uint8)

    resave(path, swap)
    report = kimi_audit.audit(path, values=True)
    assert ("QUANT_STATE_INVALID", name) in [(f.code, f.tensor) for f in report.findings]
    result = CliRunner().invoke(app, ["tensor", str(path), module, "--dequant", "--json"])
    assert result.exit_code == 1 and not json.loads(result.stdout)["ok"]


@pytest.mark.parametrize("payload", ["[" * 5000 + "]" * 5000, '{"shape": [' + "9" * 5000 + ', 2]}'])
def test_a_hostile_quant_state_is_one_finding(written, tmp_path, payload):
    """Deeply nested JSON, an integer of thousands of digits: QUANT_STATE_INVALID, never a traceback."""
    path = Path(shutil.copytree(written["nf4"], tmp_path / "m"))
    name = "model.layers.1.self_attn.o_proj.weight.quant_state.bitsandbytes__nf4"

    def swap(t: dict[str, Any]) -> None:
        t[name] = torch.tensor(list(payload.encode()), dtype=torch.uint8)

    resave(path, swap)
    report = kimi_audit.audit(path, values=True)
    assert ("QUANT_STATE_INVALID", name) in [(f.code, f.tensor) for f in report.findings]
