"""MLX affine checkpoints written by MLX's own writer, mlx-lm 0.32 (`load_model` + `quantize_model` +
`save_model` + `save_config`: mlx_lm.convert's steps without a tokenizer), from the tiny Kimi-K2 checkpoint
(`demo --tiny`, DeepSeek FP8): mlx-lm's DeepseekV3 `sanitize` dequantizes the FP8 weights, stacks the experts
into `switch_mlp`, splits kv_b_proj into `embed_q`/`unembed_out`, and its loader (`load_model`, strict) reads
them back. Each audits clean with the unquantized model's logical parameter count, dequantizes bit for bit as
`mx.dequantize`, and each fault kind is one finding."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import kimi_audit
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.numerics.kernels import tensor_stats
from tiny_checkpoint import build_tiny

mx = pytest.importorskip("mlx.core")
mlx_utils = pytest.importorskip("mlx_lm.utils")

RECIPES: dict[str, dict[str, Any]] = {
    "4bit-g64": {"bits": 4, "group_size": 64},
    "8bit-g32": {"bits": 8, "group_size": 32},
    "3bit-g32": {"bits": 3, "group_size": 32},
    # mlx-lm's mixed recipes give some modules their own bits: written per path into the config
    "mixed": {"bits": 4, "group_size": 64, "quant_predicate": lambda path, module: (
        {"bits": 8, "group_size": 32, "mode": "affine"} if "shared_experts" in path or "lm_head" in path else True)},
    # MLX's floating-point modes (mlx_lm.convert --q-mode): U8 scales, no biases
    "mxfp4": {"mode": "mxfp4"},
    "nvfp4": {"mode": "nvfp4"},
    "mxfp8": {"mode": "mxfp8"},
}


def convert(src: Path, dst: Path, bits: int | None = None, group_size: int | None = None, quant_predicate: Any = None,
            mode: str = "affine") -> Path:
    """mlx_lm.convert(src, dst, quantize=True) without the tokenizer step."""
    model, config = mlx_utils.load_model(src, lazy=True)
    model, config = mlx_utils.quantize_model(model, config, group_size=group_size, bits=bits, mode=mode,
                                             quant_predicate=quant_predicate)
    mlx_utils.save_model(dst, model)
    mlx_utils.save_config(config, config_path=dst / "config.json")
    return dst


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "tiny")


@pytest.fixture(scope="module")
def written(original: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mlx")
    return {name: convert(original, root / name, **recipe) for name, recipe in RECIPES.items()}


def codes(report: kimi_audit.AuditReport) -> Counter[str]:
    return Counter(f.code for f in report.findings if f.severity.value != "info")


def rewrite(path: Path, change: Any) -> None:
    """Re-save model.safetensors with mlx's own writer after `change(arrays)`."""
    shard = path / "model.safetensors"
    arrays = dict(mx.load(str(shard)))
    change(arrays)
    mx.save_safetensors(str(shard), arrays, metadata={"format": "mlx"})


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_what_mlx_lm_writes_audits_clean_with_the_logical_parameter_count(recipe, written, original):
    path = written[recipe]
    report = kimi_audit.audit(path, values=True)
    assert report.errors == 0 and report.warnings == 0, [f.message for f in report.findings]
    assert report.exit_code() == 0
    index = json.loads((path / "model.safetensors.index.json").read_text())
    # the unquantized model's count (the FP8 original, MTP-free as mlx-lm saves it) == mlx-lm's own total
    assert report.stats.parameters == kimi_audit.audit(original).stats.parameters
    assert report.stats.parameters == index["metadata"]["total_parameters"]
    assert report.model["quantization"]["method"] == "mlx"
    values = next(f for f in report.findings if f.code == "VALUES_CHECKED")
    q = report.model["quantization"]
    if q.get("groups", [q])[0]["mode"] == "affine":
        assert "group scales (MLX, GPTQ, AWQ)" in values.message and "affine biases" in values.message
    else:  # U8 scales: E8M0 or F8_E4M3 bits by the mode alone, not claimed as checked
        assert "group scales" not in values.message


def test_mlx_lm_loads_what_the_layout_expects(written):
    """mlx-lm's own loader (strict: every parameter of its model, no other) reads the files, and the layout
    names exactly the tensors in them."""
    path = written["mixed"]
    mlx_utils.load_model(path, lazy=True, strict=True)
    stored = set(json.loads((path / "model.safetensors.index.json").read_text())["weight_map"])
    cfg = model_config_from_dict(json.loads((path / "config.json").read_text()))
    assert set(kimi_audit.layout(path / "config.json").names) == stored
    assert cfg.quant is not None and cfg.quant.tree == "mlx-lm"
    assert any(n.endswith("switch_mlp.gate_proj.weight") for n in stored)
    # qk_nope_head_dim 32 is not a multiple of group_size 64: mlx-lm leaves embed_q plain, as the layout says
    assert "model.layers.0.self_attn.embed_q.weight" in stored
    assert "model.layers.0.self_attn.embed_q.scales" not in stored
    assert "model.layers.1.mlp.switch_mlp.gate_proj.scales" in stored


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_dequantization_is_mx_dequantize_bit_for_bit(recipe, written):
    path = written[recipe]
    cfg = model_config_from_dict(json.loads((path / "config.json").read_text()))
    assert cfg.quant is not None
    arrays = mx.load(str(path / "model.safetensors"))
    modules = [n[: -len(".scales")] for n in arrays if n.endswith(".scales")]
    assert len(modules) > 30
    for module in modules:
        w, s = arrays[f"{module}.weight"], arrays[f"{module}.scales"]
        b = arrays.get(f"{module}.biases")
        scheme = cfg.quant.scheme_for(module)
        group, bits, mode = scheme.group_size, scheme.bits, scheme.mode  # type: ignore[attr-defined]
        ref = np.array(mx.dequantize(w, s, b, group_size=group, bits=bits, mode=mode).astype(mx.float32))
        stored = {".weight": np.array(w), ".scales": to_np(s)}
        if b is not None:
            stored[".biases"] = to_np(b)
        rows = int(np.prod(w.shape[:-1]))
        mine = scheme.dequantize(stored, rows, s.shape[-1] * group)
        assert mine.dtype == (stored[".scales"].dtype if b is not None else ml_dtypes.bfloat16)
        ref_bits = ref.reshape(rows, -1)
        assert np.array_equal(mine.astype(np.float32), ref_bits), module


def to_np(a: Any) -> np.ndarray:
    if a.dtype == mx.bfloat16:
        return np.array(a.view(mx.uint16)).view(ml_dtypes.bfloat16)
    return np.array(a)


def test_tensor_dequant_of_a_stacked_expert_gives_mx_dequantize_statistics(written):
    path = written["4bit-g64"]
    name = "model.layers.1.mlp.switch_mlp.gate_proj"
    check = kimi_audit.tensor(path, name, dequantize=True)
    arrays = mx.load(str(path / "model.safetensors"))
    ref = mx.dequantize(*(arrays[f"{name}.{k}"] for k in ("weight", "scales", "biases")), group_size=64, bits=4)
    assert check.ok
    assert check.doc["dequantized"] == tensor_stats(to_np(ref).reshape(-1, ref.shape[-1])).to_json()


def test_a_missing_scales_tensor_is_one_finding(written, tmp_path):
    path = copy(written["4bit-g64"], tmp_path / "m")
    name = "model.layers.2.mlp.switch_mlp.up_proj.scales"
    rewrite(path, lambda a: a.pop(name))
    index = json.loads((path / "model.safetensors.index.json").read_text())
    del index["weight_map"][name]
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    report = kimi_audit.audit(path)
    errors = [f for f in report.findings if f.severity.value == "error"]
    assert len(errors) == 1 and errors[0].tensor == name, [f.message for f in errors]


def test_scales_in_another_group_size_are_one_finding_per_tensor_named(written, tmp_path):
    """Scales and biases in groups of 32 where the config says 64: each of the two tensors named once."""
    path = copy(written["4bit-g64"], tmp_path / "m")
    module = "model.layers.1.self_attn.q_a_proj"

    def regroup(a: dict[str, Any]) -> None:
        w = mx.dequantize(a[f"{module}.weight"], a[f"{module}.scales"], a[f"{module}.biases"], group_size=64, bits=4)
        a[f"{module}.weight"], a[f"{module}.scales"], a[f"{module}.biases"] = mx.quantize(w, group_size=32, bits=4)

    rewrite(path, regroup)
    report = kimi_audit.audit(path)
    errors = [f for f in report.findings if f.severity.value == "error"]
    assert sorted(f.tensor for f in errors) == [f"{module}.biases", f"{module}.scales"], [f.message for f in errors]
    assert report.exit_code() == 1


def test_a_stray_shard_mlx_lm_would_load_is_one_error(written, tmp_path):
    path = copy(written["4bit-g64"], tmp_path / "m")
    shutil.copy(path / "model.safetensors", path / "model-00002-of-00002.safetensors")
    report = kimi_audit.audit(path)
    errors = [f for f in report.findings if f.severity.value == "error"]
    assert [f.code for f in errors] == ["SHARD_LOADED_UNINDEXED"]
    assert errors[0].shard == "model-00002-of-00002.safetensors"


@pytest.mark.parametrize(("value", "code"), [(float("nan"), "VALUE_NAN"), (0.0, "SCALE_ZERO")])
def test_a_bad_affine_scale_is_found_by_the_values_pass(written, tmp_path, value, code):
    path = copy(written["4bit-g64"], tmp_path / "m")
    name = "model.layers.3.mlp.switch_mlp.up_proj.scales"

    def poison(a: dict[str, Any]) -> None:
        s = np.array(a[name].astype(mx.float32))
        s.reshape(-1)[5] = value
        a[name] = mx.array(s).astype(a[name].dtype)

    rewrite(path, poison)
    assert kimi_audit.audit(path).errors == 0  # headers alone cannot see it
    report = kimi_audit.audit(path, values=True)
    assert [(f.code, f.tensor) for f in report.findings if f.severity.value == "error"] == [(code, name)]


def test_negative_affine_scales_are_not_findings(written):
    arrays = mx.load(str(written["4bit-g64"] / "model.safetensors"))
    assert any(bool((v < 0).any()) for k, v in arrays.items() if k.endswith(".scales"))
    assert kimi_audit.audit(written["4bit-g64"], values=True).errors == 0


def test_the_replica_config_is_what_mlx_lm_writes_for_kimi_k2_instruct(tmp_path):
    """kimi-k2-instruct-mlx-4bit's config.json is mlx-lm's save_config of the pinned config quantized as
    mlx-community's 4-bit (quantize_model's `quantization`, which replaces the FP8 quantization_config)."""
    from importlib import resources

    data = resources.files("kimi_audit").joinpath("data")
    cfg = json.loads(data.joinpath("kimi-k2-instruct.config.json").read_text())
    cfg["quantization"] = {"group_size": 64, "bits": 4, "mode": "affine"}
    mlx_utils.save_config(cfg, config_path=tmp_path / "config.json")
    shipped = json.loads(data.joinpath("kimi-k2-instruct-mlx-4bit.config.json").read_text())
    assert shipped == json.loads((tmp_path / "config.json").read_text())


def test_the_mlx_replica_audits_clean_with_the_fp8_originals_parameter_count(family_replica, replica_dir):
    report = kimi_audit.audit(family_replica("kimi-k2-instruct-mlx-4bit"))
    assert report.errors == 0 and report.warnings == 0, [f.message for f in report.findings]
    assert report.listed_shards == 180
    assert report.stats.parameters == kimi_audit.audit(replica_dir).stats.parameters
    assert report.model["quantization"] == {"method": "mlx", "mode": "affine", "bits": 4, "group_size": 64,
                                            "scale_dtype": "BF16"}


def test_an_mlx_mode_mx_quantize_does_not_have_is_quant_unsupported():
    from importlib import resources

    cfg = json.loads(resources.files("kimi_audit").joinpath("data/kimi-k2-instruct-mlx-4bit.config.json").read_text())
    cfg["quantization"] = cfg["quantization_config"] = {"group_size": 32, "bits": 4, "mode": "int4-lut"}
    parsed = model_config_from_dict(cfg)
    assert parsed.quant is None and parsed.quant_unsupported == "mlx mode 'int4-lut'"


def test_an_mlx_checkpoint_of_an_architecture_whose_mlx_lm_tree_is_not_described_is_quant_unsupported():
    from importlib import resources

    cfg = json.loads(resources.files("kimi_audit").joinpath("data/deepseek-v4-flash.config.json").read_text())
    cfg.pop("quantization_config", None)
    cfg["quantization"] = cfg["quantization_config"] = {"group_size": 64, "bits": 4, "mode": "affine"}
    parsed = model_config_from_dict(cfg)
    assert parsed.quant is None
    assert parsed.quant_unsupported is not None and "mlx-lm" in parsed.quant_unsupported


def test_params_verify_and_the_html_page_read_an_mlx_checkpoint(written, original, tmp_path):
    """The stacked experts count as the repeated ones do: the activated parameters equal the original's."""
    from typer.testing import CliRunner

    from kimi_audit.cli import app

    runner = CliRunner()
    path = written["4bit-g64"]
    mine = runner.invoke(app, ["params", str(path), "--json"])
    theirs = runner.invoke(app, ["params", str(original), "--json"])
    assert mine.exit_code == 0 and theirs.exit_code == 0, mine.output
    assert json.loads(mine.stdout)["activated"] == json.loads(theirs.stdout)["activated"]
    verified = runner.invoke(app, ["verify", str(path)])
    assert verified.exit_code == 0, verified.output
    page = tmp_path / "report.html"
    assert runner.invoke(app, ["audit", str(path), "-o", str(page)]).exit_code == 0
    html = page.read_text()
    assert "mlx, mode affine, bits 4, group_size 64" in html and "mlp.switch_mlp.gate_proj" in html


def test_an_older_mlx_lm_config_with_quantization_alone_is_read_and_an_unrelated_key_is_not():
    from importlib import resources

    cfg = json.loads(resources.files("kimi_audit").joinpath("data/kimi-k2-instruct-mlx-4bit.config.json").read_text())
    cfg.pop("quantization_config")  # mlx-lm before its #957 wrote `quantization` only
    parsed = model_config_from_dict(cfg)
    assert parsed.quant is not None and parsed.quant.tree == "mlx-lm"
    cfg["quantization"] = {"method": "something else"}  # not mlx-lm's: no quantization read from it
    parsed = model_config_from_dict(cfg)
    assert parsed.quant is None and parsed.quant_unsupported is None


def test_mlx_lms_8_bit_deepseek_v32_quantizes_the_indexers_weights_proj(tmp_path):
    """mlx-lm 0.32's DeepSeek-V3.2 (models/deepseek_v32.py) holds the indexer's weights_proj as an nn.Linear, which
    its quantization stores like any other: an 8-bit conversion of transformers' tiny V3.2 audits with no error,
    with mlx-lm's own total."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    text = {"vocab_size": 64, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 64,
            "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 2, "n_shared_experts": 1,
            "n_routed_experts": 4, "kv_lora_rank": 32, "q_lora_rank": 64, "qk_rope_head_dim": 16, "v_head_dim": 32,
            "qk_nope_head_dim": 32, "n_group": 1, "topk_group": 1, "num_experts_per_tok": 2,
            "first_k_dense_replace": 1, "tie_word_embeddings": False, "index_n_heads": 2, "index_head_dim": 32}
    torch.manual_seed(0)
    model = transformers.DeepseekV32ForCausalLM(transformers.DeepseekV32Config(**text)).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "src")
    out = convert(tmp_path / "src", tmp_path / "mlx8", bits=8, group_size=32)
    report = kimi_audit.audit(out)
    assert report.errors == 0 and report.warnings == 0, [f.message for f in report.findings]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert report.stats.parameters == index["metadata"]["total_parameters"]
    assert report.checkpoint.expected["model.layers.1.self_attn.indexer.weights_proj.scales"].kind == "scale"
