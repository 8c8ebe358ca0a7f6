"""AMD Quark's exports, proven against the writer: tests/data/quark was written by amd-quark 0.13's own file-to-file
quantization (`direct_quantize_checkpoint`, the flow of amd/Kimi-K2.5-MXFP4-AttnFP8) on the CPU
(tests/writers/quark_generate.py, PROVENANCE.json): OCP MXFP4 with FP8 per-channel attention, and FP8 per tensor.
Each audits clean with transformers' parameter count of the model before quantization, its index's total_size (whole
files, as Quark counts) included; every module dequantizes to the bytes Quark's own importer gives."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kimi_audit import audit
from writer_data import check_provenance, dequantized_as_the_writer, transformers_parameters, without

DATA = Path(__file__).resolve().parent / "data" / "quark"
VARIANTS = ("mxfp4-attnfp8", "fp8-tensor")


def codes(report: object) -> list[str]:
    return [f.code for f in report.findings if f.severity.value != "info"]  # type: ignore[attr-defined]


def test_provenance_pins_the_generator_and_every_file() -> None:
    check_provenance(DATA, "quark_generate.py")


@pytest.mark.parametrize("variant", VARIANTS)
def test_quark_exports_audit_clean_with_the_unquantized_count(variant: str) -> None:
    report = audit(DATA / variant)
    assert codes(report) == ["MTP_ABSENT"], [(f.code, f.message) for f in report.findings]
    cfg = json.loads((DATA / "PROVENANCE.json").read_text())["source_config"]
    assert report.stats.parameters == transformers_parameters(cfg)
    assert report.model["quantization"]["method"] == "quark"


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_module_dequantizes_as_quarks_importer_does(variant: str) -> None:
    kinds = dequantized_as_the_writer(DATA / variant)
    assert kinds == {"mxfp4-attnfp8": {"MXFP4", "FP8"}, "fp8-tensor": {"FP8"}}[variant]


def test_the_index_total_counts_whole_files_as_quark_writes_it(tmp_path: Path) -> None:
    """Quark's total_size is the shards' file sizes; one that is neither that nor the payload is still named."""
    d = Path(shutil.copytree(DATA / "mxfp4-attnfp8", tmp_path / "q"))
    index = json.loads((d / "model.safetensors.index.json").read_text())
    files = sum(p.stat().st_size for p in d.glob("*.safetensors"))
    assert index["metadata"]["total_size"] == files
    index["metadata"]["total_size"] = files + 1
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "INDEX_TOTAL_SIZE" in codes(audit(d))


@pytest.mark.parametrize(("variant", "victim", "code"), [
    ("mxfp4-attnfp8", "model.layers.1.mlp.experts.3.gate_proj.weight_scale", "SCALE_MISSING"),
    ("mxfp4-attnfp8", "model.layers.2.self_attn.o_proj.weight_scale", "SCALE_MISSING"),
    ("fp8-tensor", "model.layers.1.mlp.shared_experts.up_proj.weight", "TENSOR_MISSING"),
])
def test_a_missing_tensor_is_one_finding(tmp_path: Path, variant: str, victim: str, code: str) -> None:
    report = audit(without(DATA / variant, tmp_path / variant, victim))
    errors = [(f.code, f.tensor) for f in report.findings if f.severity.value == "error"]
    assert errors == [(code, victim)]


def test_attention_declared_mxfp4_but_stored_fp8_is_one_finding(tmp_path: Path) -> None:
    d = Path(shutil.copytree(DATA / "mxfp4-attnfp8", tmp_path / "q"))
    cfg = json.loads((d / "config.json").read_text())
    del cfg["quantization_config"]["layer_quant_config"]["*self_attn*"]
    (d / "config.json").write_text(json.dumps(cfg))
    errors = [f for f in audit(d).findings if f.severity.value == "error"]
    assert [f.code for f in errors] == ["QUANT_FORMAT_MISMATCH"] and errors[0].actual == "F8_E4M3"


def test_static_activation_scales_are_not_read(tmp_path: Path) -> None:
    d = Path(shutil.copytree(DATA / "fp8-tensor", tmp_path / "q"))
    cfg = json.loads((d / "config.json").read_text())
    g = cfg["quantization_config"]["global_quant_config"]
    g["input_tensors"] = dict(g["weight"], is_dynamic=False)
    (d / "config.json").write_text(json.dumps(cfg))
    assert "QUANT_UNSUPPORTED" in codes(audit(d))
