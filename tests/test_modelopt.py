"""NVIDIA Model Optimizer's exports, proven against the writer: tests/data/modelopt was written by nvidia-modelopt
0.47's own `mtq.quantize` and `export_hf_checkpoint` on the CPU (tests/writers/modelopt_generate.py,
PROVENANCE.json): NVFP4 with the FP8 KV cache, FP8, and the MIXED_PRECISION export (NVFP4 experts, FP8 else).
Each audits clean with transformers' parameter count of the model before quantization; every module dequantizes
to the bytes ModelOpt's own NVFP4QTensor / FP8QTensor give (dequantized.json); each fault is one finding."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import pytest

from kimi_audit import audit
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.layout import scheme_of
from kimi_audit.sources import LocalSource

DATA = Path(__file__).resolve().parent / "data" / "modelopt"
VARIANTS = ("nvfp4-kv", "fp8", "mixed")


def codes(report: object) -> list[str]:
    return [f.code for f in report.findings if f.severity.value != "info"]  # type: ignore[attr-defined]


def test_provenance_pins_the_generator_and_every_file() -> None:
    prov = json.loads((DATA / "PROVENANCE.json").read_text())
    script = Path(__file__).resolve().parent / "writers" / "modelopt_generate.py"
    assert prov["script_sha256"] == hashlib.sha256(script.read_bytes()).hexdigest()
    assert prov["nvidia-modelopt"] == "0.47.0"
    for name, digest in prov["files"].items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("variant", VARIANTS)
def test_modelopt_exports_audit_clean_with_the_unquantized_count(variant: str) -> None:
    """transformers' DeepseekV3 of the generator's config: its parameters, plus the router biases it keeps as
    buffers (ModelOpt's export stores them). The MTP layer transformers never builds is the one warning."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    report = audit(DATA / variant)
    assert codes(report) == ["MTP_ABSENT"], [(f.code, f.message) for f in report.findings]
    cfg = json.loads((DATA / "PROVENANCE.json").read_text())["source_config"]
    with torch.device("meta"):
        model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**cfg))
    params = sum(p.numel() for p in model.parameters())
    biases = sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    assert report.stats.parameters == params + biases
    assert report.model["quantization"]["method"] == "modelopt"


def test_the_kv_cache_scales_are_metadata_in_every_layer() -> None:
    report = audit(DATA / "nvfp4-kv")
    expected = report.checkpoint.expected  # type: ignore[union-attr]
    kv = [n for n in expected if n.endswith((".k_proj.k_scale", ".v_proj.v_scale"))]
    assert len(kv) == 2 * 3 and all(expected[n].kind == "scale" and expected[n].shape == () for n in kv)
    assert audit(DATA / "fp8").checkpoint.expected.get("model.layers.0.self_attn.k_proj.k_scale") is None  # type: ignore[union-attr]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_module_dequantizes_as_modelopt_does(variant: str) -> None:
    """Each quantized module's weight, dequantized by its scheme, is byte for byte what ModelOpt's NVFP4QTensor /
    FP8QTensor.dequantize gave the generator (the sha256 of the bf16 bytes)."""
    from kimi_audit.numerics.tensor_io import TensorFetcher

    want = json.loads((DATA / variant / "dequantized.json").read_text())
    raw = json.loads((DATA / variant / "config.json").read_text())
    cfg = model_config_from_dict(raw)
    fetch = TensorFetcher(LocalSource(DATA / variant))
    kinds = set()
    for module, digest in want.items():
        scheme = scheme_of(cfg, module)
        kinds.add(scheme.name)
        stored = {s.suffix: fetch.read(module + s.suffix)[0] for s in scheme.stored(1, 16)}
        w = stored[".weight"]
        out, inp = w.shape[0], w.shape[1] * (2 if scheme.name == "NVFP4" else 1)
        got = scheme.dequantize(stored, out, inp)
        assert hashlib.sha256(got.tobytes()).hexdigest() == digest, module
    assert kinds == {"mixed": {"NVFP4", "FP8"}, "fp8": {"FP8"}, "nvfp4-kv": {"NVFP4"}}[variant]


def drop(src: Path, dst: Path, name: str) -> Path:
    """A copy of the export without one tensor, written again as a writer would (header and payload)."""
    shutil.copytree(src, dst)
    path = dst / "model.safetensors"
    blob = path.read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    meta = header.pop("__metadata__", None)
    del header[name]
    out, pos, parts = {}, 0, []
    for key, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, end = e["data_offsets"]
        parts.append(data[b:end])
        out[key] = {**e, "data_offsets": [pos, pos + end - b]}
        pos += end - b
    if meta is not None:
        out["__metadata__"] = meta
    head = json.dumps(out).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(parts))
    return dst


@pytest.mark.parametrize(("variant", "victim", "code"), [
    ("nvfp4-kv", "model.layers.1.mlp.experts.2.up_proj.weight_scale_2", "SCALE_MISSING"),
    ("nvfp4-kv", "model.layers.2.self_attn.v_proj.v_scale", "TENSOR_MISSING"),
    ("fp8", "model.layers.0.self_attn.q_a_proj.input_scale", "SCALE_MISSING"),
    ("mixed", "model.layers.2.mlp.experts.0.down_proj.weight_scale", "SCALE_MISSING"),
])
def test_a_missing_scale_is_one_finding(tmp_path: Path, variant: str, victim: str, code: str) -> None:
    report = audit(drop(DATA / variant, tmp_path / variant, victim))
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
    assert errors[0].covers == 5 * 48  # each module's weight dtype and shape, and its three scales


def test_an_unknown_modelopt_algorithm_is_quant_unsupported(tmp_path: Path) -> None:
    d = Path(shutil.copytree(DATA / "fp8", tmp_path / "w4a8"))
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["quant_algo"] = "W4A8_AWQ"
    (d / "config.json").write_text(json.dumps(cfg))
    report = audit(d)
    assert "QUANT_UNSUPPORTED" in codes(report) and "W4A8_AWQ" in next(
        f.message for f in report.findings if f.code == "QUANT_UNSUPPORTED")
