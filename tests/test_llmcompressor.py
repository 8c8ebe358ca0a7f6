"""llmcompressor's outputs, proven against the writer: tests/data/llmcompressor was written by llmcompressor
0.14.0.1's own `oneshot` (compressed-tensors 0.19) on the CPU (tests/writers/llmcompressor_generate.py,
PROVENANCE.json): FP8 weights with an FP8 KV cache (`kv_cache_scheme`: `self_attn.k_scale` / `v_scale` BF16 [1] per
layer), and W4A16 asymmetric. Each audits clean with transformers' parameter count of the unquantized model; the
KV-cache scales are metadata, a missing one named, undeclared ones one finding."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kimi_audit import audit
from writer_data import check_provenance, transformers_parameters, without

DATA = Path(__file__).resolve().parent / "data" / "llmcompressor"
VARIANTS = ("fp8-kv", "w4a16-asym")


def codes(report: object) -> list[str]:
    return [f.code for f in report.findings if f.severity.value != "info"]  # type: ignore[attr-defined]


def test_provenance_pins_the_generator_and_every_file() -> None:
    assert check_provenance(DATA, "llmcompressor_generate.py")["llmcompressor"] == "0.14.0.1"


@pytest.mark.parametrize("variant", VARIANTS)
def test_llmcompressor_outputs_audit_clean_with_the_unquantized_count(variant: str) -> None:
    report = audit(DATA / variant)
    assert codes(report) == ["MTP_ABSENT"], [(f.code, f.message) for f in report.findings]
    cfg = json.loads((DATA / "PROVENANCE.json").read_text())["source_config"]
    assert report.stats.parameters == transformers_parameters(cfg)


def test_glm5_w4a16_quantizes_the_indexers_weights_proj() -> None:
    """llmcompressor's `Linear` target takes GLM-5's indexer weights_proj (an nn.Linear in transformers): its packed
    weight, scale, zero point and shape are the layout's (the 10 false errors of GLM-5 W4A16 releases)."""
    report = audit(DATA / "glm5-w4a16-asym")
    assert [f.code for f in report.findings if f.severity.value != "info"] == []
    cfg = json.loads((DATA / "PROVENANCE.json").read_text())["glm5_config"]
    assert report.stats.parameters == transformers_parameters(cfg, "GlmMoeDsa")
    expected = report.checkpoint.expected  # type: ignore[union-attr]
    assert expected["model.layers.1.self_attn.indexer.weights_proj.weight_packed"].kind == "packed"


def test_the_kv_cache_scales_are_metadata_in_every_layer() -> None:
    report = audit(DATA / "fp8-kv", values=True)
    expected = report.checkpoint.expected  # type: ignore[union-attr]
    kv = [n for n in expected if n.endswith(("self_attn.k_scale", "self_attn.v_scale"))]
    assert len(kv) == 6 and all((expected[n].kind, expected[n].dtype, expected[n].shape) == ("scale", "BF16", (1,))
                                for n in kv)
    assert report.verdict() == "PASS"


def test_a_missing_kv_scale_is_named(tmp_path: Path) -> None:
    victim = "model.layers.2.self_attn.v_scale"
    errors = [(f.code, f.tensor) for f in audit(without(DATA / "fp8-kv", tmp_path / "kv", victim)).findings
              if f.severity.value == "error"]
    assert errors == [("TENSOR_MISSING", victim)]


def test_kv_scales_with_no_kv_cache_declared_are_one_finding(tmp_path: Path) -> None:
    d = Path(shutil.copytree(DATA / "fp8-kv", tmp_path / "kv"))
    cfg = json.loads((d / "config.json").read_text())
    del cfg["quantization_config"]["kv_cache_scheme"]
    (d / "config.json").write_text(json.dumps(cfg))
    errors = [f for f in audit(d).findings if f.severity.value == "error"]
    assert [f.code for f in errors] == ["KV_SCALE_UNDECLARED"] and errors[0].covers == 6


KIMI_LINEAR = Path(__file__).resolve().parent / "data" / "llmcompressor-kimi-linear"


def test_llmcompressors_misnamed_kimi_linear_experts_are_one_finding() -> None:
    """Issue 38: llmcompressor's FP8_BLOCK Kimi-Linear, written by llmcompressor itself
    (tests/writers/llmcompressor_kimi_linear_generate.py): its routed experts spelled `gate/up/down_proj` where the
    release and transformers' loader have `w1/w3/w2`. The fault is named once, TENSORS_RESPELLED, covering the
    misnamed weights, the release's names missing and the scale findings of those modules; nothing else fails."""
    prov = check_provenance(KIMI_LINEAR, "llmcompressor_kimi_linear_generate.py")
    report = audit(KIMI_LINEAR / "fp8-block")
    errors = [f for f in report.findings if f.severity.value == "error"]
    assert [f.code for f in report.findings if f.severity.value != "info"] == ["TENSORS_RESPELLED"]
    cfg = prov["source_config"]
    experts = cfg["mlp_layer_types"].count("sparse") * cfg["num_local_experts"]
    assert (errors[0].expected, errors[0].actual) == (["w1", "w2", "w3"], ["down_proj", "gate_proj", "up_proj"])
    assert errors[0].covers == 4 * 3 * experts  # weights missing and stored, their scales' two findings each
