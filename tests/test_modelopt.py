"""NVIDIA Model Optimizer's exports, proven against the writer: tests/data/modelopt was written by nvidia-modelopt
0.47's own `mtq.quantize` and `export_hf_checkpoint` on the CPU (tests/writers/modelopt_generate.py,
PROVENANCE.json): NVFP4 with the FP8 KV cache, FP8, and the MIXED_PRECISION export (NVFP4 experts, FP8 else).
Each audits clean with transformers' parameter count of the model before quantization; every module dequantizes
to the bytes ModelOpt's own NVFP4QTensor / FP8QTensor give (dequantized.json); each fault is one finding."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kimi_audit import audit
from writer_data import check_provenance, dequantized_as_the_writer, transformers_parameters, without

DATA = Path(__file__).resolve().parent / "data" / "modelopt"
VARIANTS = ("nvfp4-kv", "fp8", "mixed")


def codes(report: object) -> list[str]:
    return [f.code for f in report.findings if f.severity.value != "info"]  # type: ignore[attr-defined]


def test_provenance_pins_the_generator_and_every_file() -> None:
    assert check_provenance(DATA, "modelopt_generate.py")["nvidia-modelopt"] == "0.47.0"


@pytest.mark.parametrize("variant", VARIANTS)
def test_modelopt_exports_audit_clean_with_the_unquantized_count(variant: str) -> None:
    """transformers' DeepseekV3 of the generator's config: its parameters, plus the router biases it keeps as
    buffers (ModelOpt's export stores them). The MTP layer transformers never builds is the one warning."""
    report = audit(DATA / variant)
    assert codes(report) == ["MTP_ABSENT"], [(f.code, f.message) for f in report.findings]
    cfg = json.loads((DATA / "PROVENANCE.json").read_text())["source_config"]
    assert report.stats.parameters == transformers_parameters(cfg)
    assert report.model["quantization"]["method"] == "modelopt"


def test_the_kv_cache_scales_are_metadata_in_every_layer() -> None:
    report = audit(DATA / "nvfp4-kv")
    expected = report.checkpoint.expected  # type: ignore[union-attr]
    kv = [n for n in expected if n.endswith((".k_proj.k_scale", ".v_proj.v_scale"))]
    assert len(kv) == 2 * 3 and all(expected[n].kind == "scale" and expected[n].shape == () for n in kv)
    fp8 = audit(DATA / "fp8").checkpoint
    assert fp8 is not None and fp8.expected.get("model.layers.0.self_attn.k_proj.k_scale") is None


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_module_dequantizes_as_modelopt_does(variant: str) -> None:
    """Each quantized module's weight, dequantized by its scheme, is byte for byte what ModelOpt's NVFP4QTensor /
    FP8QTensor.dequantize gave the generator (the sha256 of the bf16 bytes)."""
    kinds = dequantized_as_the_writer(DATA / variant)
    assert kinds == {"mixed": {"NVFP4", "FP8"}, "fp8": {"FP8"}, "nvfp4-kv": {"NVFP4"}}[variant]


@pytest.mark.parametrize(("variant", "victim", "code"), [
    ("nvfp4-kv", "model.layers.1.mlp.experts.2.up_proj.weight_scale_2", "SCALE_MISSING"),
    ("nvfp4-kv", "model.layers.2.self_attn.v_proj.v_scale", "TENSOR_MISSING"),
    ("fp8", "model.layers.0.self_attn.q_a_proj.input_scale", "SCALE_MISSING"),
    ("mixed", "model.layers.2.mlp.experts.0.down_proj.weight_scale", "SCALE_MISSING"),
])
def test_a_missing_scale_is_one_finding(tmp_path: Path, variant: str, victim: str, code: str) -> None:
    report = audit(without(DATA / variant, tmp_path / variant, victim))
    errors = [(f.code, f.tensor) for f in report.findings if f.severity.value == "error"]
    assert errors == [(code, victim)]


def test_a_config_that_says_nvfp4_for_an_fp8_export_is_caught(tmp_path: Path) -> None:
    d = Path(shutil.copytree(DATA / "fp8", tmp_path / "fp8"))
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["quant_algo"] = "NVFP4"
    (d / "config.json").write_text(json.dumps(cfg))
    report = audit(d)
    errors = [f for f in report.findings if f.severity.value == "error"]
    assert [f.code for f in errors] == ["QUANT_FORMAT_MISMATCH"] and errors[0].actual == "F8_E4M3"
    assert errors[0].covers == 5 * 48 and "every one is stored F8_E4M3" in errors[0].message  # weight, 3 scales


def test_an_unknown_modelopt_algorithm_is_quant_unsupported(tmp_path: Path) -> None:
    d = Path(shutil.copytree(DATA / "fp8", tmp_path / "w4a8"))
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["quant_algo"] = "W4A8_AWQ"
    (d / "config.json").write_text(json.dumps(cfg))
    report = audit(d)
    assert "QUANT_UNSUPPORTED" in codes(report) and "W4A8_AWQ" in next(
        f.message for f in report.findings if f.code == "QUANT_UNSUPPORTED")
