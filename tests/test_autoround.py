"""Intel AutoRound's exports, proven against the writer: tests/data/autoround was written by auto-round 0.16.1's own
quantizer and exporter on the CPU (tests/writers/autoround_generate.py, PROVENANCE.json): 4-bit in its GPTQ packing
and in its AWQ packing (whose config says float16 beside BF16 tensors: writer variance, one info), and a 2-bit mix
with 4-bit attention and 8-bit shared experts. Each audits clean with transformers' parameter count of the model
before quantization; every module dequantizes to the bytes AutoRound's own inference modules compute."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kimi_audit import audit
from writer_data import check_provenance, dequantized_as_the_writer, transformers_parameters, without

DATA = Path(__file__).resolve().parent / "data" / "autoround"
VARIANTS = ("w4g32-gptq", "w4g32-awq", "int2-mixed")


def codes(report: object) -> list[str]:
    return [f.code for f in report.findings if f.severity.value != "info"]  # type: ignore[attr-defined]


def test_provenance_pins_the_generator_and_every_file() -> None:
    assert check_provenance(DATA, "autoround_generate.py")["auto-round"] == "0.16.1"


@pytest.mark.parametrize("variant", VARIANTS)
def test_autoround_exports_audit_clean_with_the_unquantized_count(variant: str) -> None:
    report = audit(DATA / variant)
    assert codes(report) == ["MTP_ABSENT"], [(f.code, f.message) for f in report.findings]
    cfg = json.loads((DATA / "PROVENANCE.json").read_text())["source_config"]
    assert report.stats.parameters == transformers_parameters(cfg)
    assert report.model["quantization"]["method"] in ("auto-round", "awq")


def test_the_awq_exports_float16_is_one_writer_variance() -> None:
    report = audit(DATA / "w4g32-awq")
    variance = [f for f in report.findings if f.code == "WRITER_DTYPE"]
    assert len(variance) == 1 and variance[0].covers >= 10 and "exporter's" in variance[0].message


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_module_dequantizes_as_autorounds_inference_does(variant: str) -> None:
    kinds = dequantized_as_the_writer(DATA / variant)
    assert kinds == {"w4g32-gptq": {"GPTQ INT4"}, "w4g32-awq": {"AWQ INT4"},
                     "int2-mixed": {"GPTQ INT2", "GPTQ INT4", "GPTQ INT8"}}[variant]


def test_the_mixed_bits_are_read_per_module() -> None:
    report = audit(DATA / "int2-mixed")
    expected = report.checkpoint.expected  # type: ignore[union-attr]
    assert expected["model.layers.1.mlp.experts.2.up_proj.qweight"].shape == (128 * 2 // 32, 128)
    assert expected["model.layers.1.self_attn.o_proj.qweight"].shape == (64 * 4 // 32, 128)
    assert expected["model.layers.2.mlp.shared_experts.up_proj.qweight"].shape == (128 * 8 // 32, 128)
    assert expected["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"].dtype == "BF16"  # extra_config bits 16


@pytest.mark.parametrize(("variant", "victim", "code"), [
    ("w4g32-gptq", "model.layers.1.mlp.experts.1.down_proj.qzeros", "SCALE_MISSING"),
    ("w4g32-awq", "model.layers.2.mlp.experts.0.gate_proj.scales", "SCALE_MISSING"),
    ("int2-mixed", "model.layers.0.mlp.up_proj.qweight", "TENSOR_MISSING"),
])
def test_a_missing_tensor_is_one_finding(tmp_path: Path, variant: str, victim: str, code: str) -> None:
    report = audit(without(DATA / variant, tmp_path / variant, victim))
    errors = [(f.code, f.tensor) for f in report.findings if f.severity.value == "error"]
    assert errors == [(code, victim)]


def test_bits_that_are_not_the_stored_ones_are_one_finding(tmp_path: Path) -> None:
    d = Path(shutil.copytree(DATA / "int2-mixed", tmp_path / "m"))
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["bits"] = 4  # the experts are stored at 2 bits
    (d / "config.json").write_text(json.dumps(cfg))
    errors = [f for f in audit(d).findings if f.severity.value == "error"]
    assert errors and all(f.code in ("SHAPE_MISMATCH", "SCALE_SHAPE") for f in errors)
