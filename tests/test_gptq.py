"""GPTQ checkpoints written by GPTQModel 7.7 itself (in its own venv: tests/writers/gptq_generate.py; the output,
with PROVENANCE.json, is tests/data/gptq/): a tiny DeepseekV3 (MLA with q_lora, one dense and one MoE layer of 4
experts) in both checkpoint formats. Each audits clean with the unquantized model's parameter count (the same
config built by transformers here, saved, audited), transformers' config names it, and every weight
dequantizes to the bytes GPTQModel's own TorchQuantLinear.dequantize_weight gave (the sha256 it recorded)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

import kimi_audit
import writer_data
from kimi_audit.model.config import model_config_from_dict

DATA = Path(__file__).parent / "data" / "gptq"
FORMATS = ("gptq", "gptq_v2")


@pytest.fixture(scope="module")
def unquantized_parameters(tmp_path_factory: pytest.TempPathFactory) -> int:
    return writer_data.unquantized_parameters(DATA / "PROVENANCE.json", tmp_path_factory.mktemp("bf16"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_what_gptqmodel_writes_audits_clean(fmt, unquantized_parameters):
    report = kimi_audit.audit(DATA / fmt, values=True)
    assert report.errors == 0 and report.warnings == 0, [f.message for f in report.findings]
    assert report.stats.parameters == unquantized_parameters
    assert report.model["quantization"]["checkpoint_format"] == fmt
    values = next(f for f in report.findings if f.code == "VALUES_CHECKED")
    assert "28 group scales" in values.message


def test_the_provenance_names_the_writer_and_this_script():
    prov = json.loads((DATA / "PROVENANCE.json").read_text())
    assert prov["writer"].startswith("gptqmodel 7.7")
    script = Path(__file__).parent / "writers" / "gptq_generate.py"
    assert prov["script"] == "tests/writers/gptq_generate.py"
    assert prov["script_sha256"] == hashlib.sha256(script.read_bytes()).hexdigest(), "rerun the generator"


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantization_is_gptqmodels_bit_for_bit(fmt):
    ref = json.loads((DATA / fmt / "reference.json").read_text())
    cfg = model_config_from_dict(json.loads((DATA / fmt / "config.json").read_text()))
    assert cfg.quant is not None
    with safe_open(str(DATA / fmt / "model.safetensors"), "np") as f:
        assert len(ref["modules"]) == 28
        for module, r in ref["modules"].items():
            scheme = cfg.quant.scheme_for(module)
            out, inp = r["shape"]
            stored = {s: f.get_tensor(module + s) for s in (".qweight", ".qzeros", ".scales", ".g_idx")}
            w = scheme.dequantize(stored, out, inp)
            assert str(w.dtype) == r["dtype"]
            assert hashlib.sha256(np.ascontiguousarray(w).view(np.int16).tobytes()).hexdigest() == r["sha256"], module


def test_v1_and_v2_differ_exactly_by_one_in_every_zero_point():
    from kimi_audit.numerics.gptq import unpack_columns

    with safe_open(str(DATA / "gptq" / "model.safetensors"), "np") as v1, \
            safe_open(str(DATA / "gptq_v2" / "model.safetensors"), "np") as v2:
        name = "model.layers.1.mlp.experts.2.down_proj.qzeros"
        assert np.array_equal(unpack_columns(v1.get_tensor(name), 4) + 1, unpack_columns(v2.get_tensor(name), 4))


def test_tensor_dequant_of_a_gptq_module(tmp_path):
    check = kimi_audit.tensor(DATA / "gptq_v2", "model.layers.1.self_attn.q_b_proj", dequantize=True)
    assert check.ok and check.doc["scheme"] == "gptq"
    assert check.doc["dequantized"]["count"] == 128 * 128


def copy(fmt: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(DATA / fmt, tmp_path / fmt))


def rewrite(path: Path, change) -> None:
    with safe_open(str(path / "model.safetensors"), "np") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118  (a safe_open handle, not a dict)
    change(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def test_a_missing_qzeros_is_one_finding(tmp_path):
    path = copy("gptq", tmp_path)
    name = "model.layers.0.mlp.up_proj.qzeros"
    rewrite(path, lambda t: t.pop(name))
    errors = [f for f in kimi_audit.audit(path).findings if f.severity.value == "error"]
    assert [(f.code, f.tensor) for f in errors] == [("SCALE_MISSING", name)], [f.message for f in errors]


def test_scales_of_another_group_size_are_named(tmp_path):
    path = copy("gptq", tmp_path)
    name = "model.layers.1.self_attn.q_a_proj.scales"
    rewrite(path, lambda t: t.__setitem__(name, np.repeat(t[name], 2, axis=0)))  # groups of 16, not 32
    errors = [f for f in kimi_audit.audit(path).findings if f.severity.value == "error"]
    assert [(f.code, f.tensor) for f in errors] == [("SCALE_SHAPE", name)], [f.message for f in errors]


def test_a_zero_scale_is_found_by_the_values_pass(tmp_path):
    path = copy("gptq_v2", tmp_path)
    name = "model.layers.1.mlp.shared_experts.gate_proj.scales"

    def zero(t):
        t[name] = t[name].copy()
        t[name][0, 3] = 0

    rewrite(path, zero)
    assert kimi_audit.audit(path).errors == 0
    report = kimi_audit.audit(path, values=True)
    assert [(f.code, f.tensor) for f in report.findings if f.severity.value == "error"] == [("SCALE_ZERO", name)]
