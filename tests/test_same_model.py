"""`audit QUANT --against ORIGINAL` (checks.same_model) and `diff ORIGINAL QUANT`'s one line, proven on the
vendors' writer fixtures (tests/data/modelopt, quark, autoround, llmcompressor), each held against the BF16
original its writer quantized, rebuilt here by the writers' own code (seeded): the same bytes on this torch and
transformers, recorded in tests/data/originals/deepseek_v3-seed0.json (the writers' PROVENANCE.json records no
hash of the original)."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kimi_audit.cli import app

TESTS = Path(__file__).resolve().parent
DATA = TESTS / "data"
WRITERS = ("modelopt_generate", "quark_generate", "autoround_generate", "llmcompressor_generate")
FIXTURES = ("modelopt/nvfp4-kv", "modelopt/fp8", "modelopt/mixed", "quark/mxfp4-attnfp8", "quark/fp8-tensor",
            "autoround/w4g32-gptq", "autoround/w4g32-awq", "autoround/int2-mixed", "llmcompressor/fp8-kv",
            "llmcompressor/w4a16-asym")
runner = CliRunner()


def _writers() -> list:  # type: ignore[type-arg]
    sys.path.insert(0, str(TESTS / "writers"))
    import importlib

    return [importlib.import_module(w) for w in WRITERS]


def _digests(folder: Path) -> dict[str, str]:
    import torch
    from safetensors.torch import load_file

    out: dict[str, str] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        for name, t in load_file(shard).items():
            raw = t.contiguous().view(torch.uint16 if t.dtype == torch.bfloat16 else torch.uint8).numpy().tobytes()
            out[name] = hashlib.sha256(raw).hexdigest()
    return dict(sorted(out.items()))


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The BF16 original every writer quantized (one CONFIG and SEED in all four scripts), saved by
    quark_generate.save_source, its tensors the bytes recorded."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    writers = _writers()
    assert all(w.CONFIG == writers[0].CONFIG and w.SEED == writers[0].SEED for w in writers)
    for w in WRITERS:
        prov = json.loads((DATA / w.split("_")[0] / "PROVENANCE.json").read_text())
        assert prov["source_config"] == writers[0].CONFIG and prov["seed"] == writers[0].SEED
    out = tmp_path_factory.mktemp("original") / "bf16"
    writers[1].save_source(out)
    recorded = json.loads((DATA / "originals" / "deepseek_v3-seed0.json").read_text())
    assert _digests(out) == recorded["tensors"]
    return out


def against(path: Path, src: Path, *extra: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["audit", str(path), "--against", str(src), "--no-progress", "--json", *extra])
    assert result.exit_code in (0, 1), result.output[-3000:]
    return result.exit_code, json.loads(result.stdout)


def findings(doc: dict, code: str) -> list[dict]:
    return [f for f in doc["findings"] if f["code"] == code]


@pytest.mark.parametrize("fixture", FIXTURES)
def test_every_writer_fixture_is_its_original_quantized(original: Path, fixture: str) -> None:
    """Each vendor's release, as its writer produced it, PASSes against the original: config, every tensor, the
    parameter count; every unquantized tensor bit-equal, every quantized weight within its format's bound."""
    code, doc = against(DATA / fixture, original, "--values")
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert code == 0 and not errors, errors
    (same,) = findings(doc, "AGAINST_SAME_MODEL")
    assert same["message"].startswith("same model (deepseek_v3, 802,152 parameters); quantization differs: BF16 → ")
    (checked,) = findings(doc, "AGAINST_ERROR_BOUNDS")
    assert checked["actual"] == 67 and "worst/bound" in checked["message"]


def test_each_formats_bound_holds_with_room_and_rejects_another_weight(original: Path) -> None:
    """The bound derived for each format (model.quant.bounds) holds on every writer's weights, and stays under the
    ~1.41 of an unrelated weight and the 1.0 of a zeroed one."""
    import re

    worst: dict[str, tuple[float, float]] = {}
    for fixture in FIXTURES:
        _, doc = against(DATA / fixture, original, "--values")
        text = findings(doc, "AGAINST_ERROR_BOUNDS")[0]["message"]
        pairs = text.split("worst/bound: ")[1]
        for fmt, rel, bound in re.findall(r"([A-Z][A-Z0-9 ]*?) ([0-9.e-]+)/([0-9.e-]+)", pairs):
            worst[fmt.strip()] = max(worst.get(fmt.strip(), (0.0, 0.0)), (float(rel), float(bound)))
    assert {"NVFP4", "MXFP4", "FP8", "INT4", "GPTQ INT4", "GPTQ INT2", "GPTQ INT8", "AWQ INT4"} <= set(worst)
    assert all(rel <= bound < 1.0 for rel, bound in worst.values()), worst


def test_without_values_the_headers_are_held(original: Path) -> None:
    code, doc = against(DATA / "modelopt" / "nvfp4-kv", original)
    assert code == 0
    assert "values not compared: add --values" in findings(doc, "AGAINST_SAME_MODEL")[0]["message"]
    assert not findings(doc, "AGAINST_ERROR_BOUNDS")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _rewrite(folder: Path, change) -> None:  # type: ignore[no-untyped-def]
    from safetensors.torch import load_file, save_file

    for shard in sorted(folder.glob("*.safetensors")):
        tensors = load_file(shard)
        if change(tensors):
            save_file(tensors, shard, metadata={"format": "pt"})


def test_an_expert_from_another_seed(tmp_path: Path, original: Path) -> None:
    """The release's expert is not the original's (the original's expert here from seed 1): AGAINST_DEQUANTIZED
    names that weight, and only it."""
    import torch

    orig = _copy(original, tmp_path / "orig")
    name = "model.layers.1.mlp.experts.2.gate_proj.weight"

    def other(t: dict) -> bool:  # type: ignore[type-arg]
        if name not in t:
            return False
        g = torch.Generator().manual_seed(1)
        t[name] = (torch.randn(t[name].shape, generator=g) * t[name].float().std()).to(torch.bfloat16)
        return True

    _rewrite(orig, other)
    for fixture in ("modelopt/nvfp4-kv", "quark/mxfp4-attnfp8", "autoround/w4g32-gptq", "llmcompressor/w4a16-asym"):
        code, doc = against(DATA / fixture, orig, "--values")
        bad = findings(doc, "AGAINST_DEQUANTIZED")
        assert code == 1 and [f["tensor"] for f in bad] == [name], (fixture, bad)
        assert 1.2 < bad[0]["actual"] < 1.6


def test_two_layers_weights_swapped(tmp_path: Path, original: Path) -> None:
    """Layer 1's and layer 2's q_b_proj swapped in the release (every tensor NVFP4 stores for them): both named."""
    release = _copy(DATA / "modelopt" / "nvfp4-kv", tmp_path / "swapped")
    a, b = "model.layers.1.self_attn.q_b_proj", "model.layers.2.self_attn.q_b_proj"

    def swap(t: dict) -> bool:  # type: ignore[type-arg]
        for suffix in (".weight", ".weight_scale", ".weight_scale_2", ".input_scale"):
            t[a + suffix], t[b + suffix] = t[b + suffix], t[a + suffix]
        return True

    _rewrite(release, swap)
    code, doc = against(release, original, "--values")
    assert code == 1
    assert sorted(f["tensor"] for f in findings(doc, "AGAINST_DEQUANTIZED")) == [a + ".weight", b + ".weight"]


def test_a_gain_from_another_seed(tmp_path: Path, original: Path) -> None:
    """An unquantized gain that is not the original's, cast: AGAINST_UNQUANTIZED names it."""
    import torch

    release = _copy(DATA / "quark" / "fp8-tensor", tmp_path / "gain")
    name = "model.layers.2.self_attn.q_a_layernorm.weight"

    def gain(t: dict) -> bool:  # type: ignore[type-arg]
        if name not in t:
            return False
        g = torch.Generator().manual_seed(1)
        t[name] = (1 + 0.1 * torch.randn(t[name].shape, generator=g)).to(torch.bfloat16)
        return True

    _rewrite(release, gain)
    code, doc = against(release, original, "--values")
    assert code == 1 and [f["tensor"] for f in findings(doc, "AGAINST_UNQUANTIZED")] == [name]
    assert not findings(doc, "AGAINST_DEQUANTIZED")


def test_a_config_field_changed(tmp_path: Path, original: Path) -> None:
    """routed_scaling_factor edited in the release's config.json: AGAINST_CONFIG names the key; the writer's own
    keys (quantization_config, dtype, transformers_version) are not held."""
    release = _copy(DATA / "autoround" / "w4g32-awq", tmp_path / "config")
    cfg = json.loads((release / "config.json").read_text())
    cfg["routed_scaling_factor"] = 2.0
    (release / "config.json").write_text(json.dumps(cfg))
    code, doc = against(release, original)
    assert code == 1 and [f["tensor"] for f in findings(doc, "AGAINST_CONFIG")] == ["routed_scaling_factor"]


def test_a_tensor_missing_and_the_parameters(tmp_path: Path, original: Path) -> None:
    """A gain dropped from the release: AGAINST_MISSING names it, AGAINST_PARAMS counts what went."""
    release = _copy(DATA / "modelopt" / "fp8", tmp_path / "missing")
    name = "model.layers.0.input_layernorm.weight"
    _rewrite(release, lambda t: t.pop(name, None) is not None)
    code, doc = against(release, original)
    assert code == 1 and findings(doc, "AGAINST_MISSING")[0]["tensor"] == name
    (params,) = findings(doc, "AGAINST_PARAMS")
    assert params["expected"] - params["actual"] == 128


def test_a_tensor_the_original_does_not_have_and_another_shape(tmp_path: Path, original: Path) -> None:
    import torch

    release = _copy(DATA / "llmcompressor" / "fp8-kv", tmp_path / "extra")
    _rewrite(release, lambda t: t.update({"model.layers.0.extra.weight": torch.zeros(4)}) is None)
    code, doc = against(release, original)
    assert code == 1 and findings(doc, "AGAINST_EXTRA")[0]["tensor"] == "model.layers.0.extra.weight"
    orig = _copy(original, tmp_path / "orig")
    gain = "model.layers.0.input_layernorm.weight"

    def shorter(t: dict) -> bool:  # type: ignore[type-arg]
        if gain not in t:
            return False
        t[gain] = t[gain][:64].clone()
        return True

    _rewrite(orig, shorter)
    code, doc = against(DATA / "llmcompressor" / "fp8-kv", orig)
    assert code == 1 and findings(doc, "AGAINST_SHAPE")[0]["tensor"] == gain


def test_bands_bound_memory_and_equal_the_whole(original: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bands of 128 rows (the embedding's, lm_head's and dense MLP's 256 rows in two) find the same."""
    from kimi_audit.checks import same_model

    monkeypatch.setattr(same_model, "BAND_BYTES", 4096)
    code, doc = against(DATA / "modelopt" / "mixed", original, "--values")
    assert code == 0 and findings(doc, "AGAINST_ERROR_BOUNDS")[0]["actual"] == 67


def test_a_gguf_is_no_original_of_a_safetensors_release() -> None:
    gguf = DATA / "gguf" / "tiny-Q2_K.gguf"
    result = runner.invoke(app, ["audit", str(DATA / "modelopt" / "fp8"), "--against", str(gguf), "--no-progress"])
    assert result.exit_code == 2 and "quantized from" in result.output


def test_diff_says_same_model_quantization_differs(original: Path) -> None:
    """`diff ORIGINAL QUANT`: one line instead of the per-tensor lists; still DIFFERENT (exit 1), and --content
    finds every unquantized tensor's bytes equal and says the quantized ones are not compared byte for byte."""
    result = runner.invoke(app, ["diff", str(original), str(DATA / "modelopt" / "nvfp4-kv"), "--no-progress"])
    out = " ".join(result.output.split())
    assert result.exit_code == 1
    assert "same model (deepseek_v3, 802,152 parameters); quantization differs: BF16 → NVFP4" in out
    assert "changed (48)" not in out and "DIFFERENT" in out
    result = runner.invoke(app, ["diff", str(DATA / "quark" / "mxfp4-attnfp8"), str(original), "--no-progress",
                                 "--json", "--content"])
    doc = json.loads(result.stdout)
    assert result.exit_code == 1 and doc["verdict"] == "DIFFERENT"
    assert doc["same_model"].endswith("quantization differs: MXFP4 + FP8 → BF16")
    assert doc["content"]["differing"] == [] and doc["content"]["compared"] == 19
    result = runner.invoke(app, ["diff", str(DATA / "modelopt" / "fp8"), str(DATA / "modelopt" / "nvfp4-kv"),
                                 "--no-progress", "--json"])
    assert json.loads(result.stdout)["same_model"].endswith("FP8 → NVFP4")
