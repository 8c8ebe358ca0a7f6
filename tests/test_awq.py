"""AWQ GEMM checkpoints written by GPTQModel 7.7's AWQ (its port of AutoAWQ / llm-awq), in its own venv:
tests/writers/awq_generate.py; the output and PROVENANCE.json are tests/data/awq/. A tiny DeepseekV3 (MLA with
q_lora; its MoE layer is what GPTQModel's AWQ cannot quantize, see the script) audits clean with the unquantized
model's parameter count, and every weight dequantizes to the bytes of GPTQModel's own `dequantize_gemm`."""

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

DATA = Path(__file__).parent / "data" / "awq"


@pytest.fixture(scope="module")
def unquantized_parameters(tmp_path_factory: pytest.TempPathFactory) -> int:
    return writer_data.unquantized_parameters(DATA / "PROVENANCE.json", tmp_path_factory.mktemp("bf16"))


def test_what_gptqmodels_awq_writes_audits_clean(unquantized_parameters):
    report = kimi_audit.audit(DATA / "gemm", values=True)
    assert report.errors == 0 and report.warnings == 0, [f.message for f in report.findings]
    assert report.stats.parameters == unquantized_parameters
    assert report.model["quantization"] == {"method": "awq", "version": "gemm", "bits": 4, "group_size": 32,
                                            "scale_dtype": "BF16"}


def test_the_provenance_matches_the_generator():
    prov = json.loads((DATA / "PROVENANCE.json").read_text())
    script = Path(__file__).parent / "writers" / "awq_generate.py"
    assert prov["writer"].startswith("gptqmodel 7.7") and prov["script"] == "tests/writers/awq_generate.py"
    assert prov["script_sha256"] == hashlib.sha256(script.read_bytes()).hexdigest(), "rerun the generator"


def test_dequantization_is_gptqmodels_dequantize_gemm_bit_for_bit():
    ref = json.loads((DATA / "gemm" / "reference.json").read_text())
    cfg = model_config_from_dict(json.loads((DATA / "gemm" / "config.json").read_text()))
    assert cfg.quant is not None
    with safe_open(str(DATA / "gemm" / "model.safetensors"), "np") as f:
        assert len(ref["modules"]) == 16
        for module, r in ref["modules"].items():
            out, inp = r["shape"]
            stored = {s: f.get_tensor(module + s) for s in (".qweight", ".qzeros", ".scales")}
            w = cfg.quant.scheme_for(module).dequantize(stored, out, inp)
            assert hashlib.sha256(np.ascontiguousarray(w).view(np.int16).tobytes()).hexdigest() == r["sha256"], module


def test_tensor_dequant_of_an_awq_module():
    check = kimi_audit.tensor(DATA / "gemm", "model.layers.1.self_attn.kv_a_proj_with_mqa", dequantize=True)
    assert check.ok and check.doc["scheme"] == "awq"
    assert check.doc["dequantized"]["count"] == 320 * 256


def test_a_missing_qzeros_and_a_wrong_group_are_each_one_finding(tmp_path):
    path = Path(shutil.copytree(DATA / "gemm", tmp_path / "gemm"))
    with safe_open(str(path / "model.safetensors"), "np") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118  (a safe_open handle, not a dict)
    gone, regrouped = "model.layers.0.mlp.down_proj.qzeros", "model.layers.1.mlp.up_proj.scales"
    del tensors[gone]
    tensors[regrouped] = np.repeat(tensors[regrouped], 2, axis=0)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    errors = [f for f in kimi_audit.audit(path).findings if f.severity.value == "error"]
    assert sorted((f.code, f.tensor) for f in errors) == [("SCALE_MISSING", gone), ("SCALE_SHAPE", regrouped)], \
        [f.message for f in errors]


AUTOAWQ = Path(__file__).resolve().parent / "data" / "autoawq"


def test_autoawqs_own_output_audits_clean_and_dequantizes_as_it_does() -> None:
    """AutoAWQ 0.2.9 (tests/writers/autoawq_generate.py) from a BF16 model: F16 scales beside a bfloat16 config, as
    its WQLinear_GEMM writes them; the unquantized count; every module byte for byte as its dequantize_gemm."""
    from writer_data import check_provenance, dequantized_as_the_writer, transformers_parameters

    prov = check_provenance(AUTOAWQ, "autoawq_generate.py")
    report = kimi_audit.audit(AUTOAWQ)
    assert [f.code for f in report.findings if f.severity.value != "info"] == ["MTP_ABSENT"]
    assert report.model["quantization"]["scale_dtype"] == "F16"
    assert report.stats.parameters == transformers_parameters(prov["source_config"])
    assert dequantized_as_the_writer(AUTOAWQ) == {"AWQ INT4"}
