"""GLM-4.x in the release's names (model.arch.glm4_moe: `glm4_moe`, GLM-4.5/4.5-Air/4.6/4.7) and GLM-4.7-Flash
(model.arch.glm4_moe_lite: `glm4_moe_lite`, DeepseekV3's tree), against implementations that are not this tool's:
transformers 5.25's classes (their config defaults; a tiny model of each saved sharded by save_pretrained audits
clean with parameters = sum(numel) + the router biases it keeps as buffers, and loads back) and vLLM's loaders
(tests/data/loader_names/glm4_moe.vllm.json, deepseek_v3.vllm.json: the names they consume are the layout's, the
NextN layer's those of vLLM's Glm4MoeMTP). The NextN layer's copies of the embedding and head, which GLM-4.5 and
4.5-Air store and GLM-4.6 does not, are one info where stored."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

import kimi_audit
from kimi_audit.errors import ConfigError
from kimi_audit.model.arch import glm4_moe, glm4_moe_lite
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.layout import expected_layout
from test_loader_names import loader_names as deepseek_v3_loader_names

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from multimodal_saves import stored  # noqa: E402 (needs torch)

ROOT = Path(__file__).resolve().parent
TABLE = json.loads((ROOT / "data" / "loader_names" / "glm4_moe.vllm.json").read_text())
GLM: dict[str, Any] = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "n_routed_experts": 4, "n_shared_experts": 1,
    "num_experts_per_tok": 2, "first_k_dense_replace": 1, "num_nextn_predict_layers": 0}
"""A tiny GLM-4.5 (more query than key-value heads, a head_dim of its own), no NextN layer (transformers builds
none: its save would hold none of the one Glm4MoeConfig declares by default)."""
LITE: dict[str, Any] = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16, "num_hidden_layers": 3,
    "num_attention_heads": 2, "num_key_value_heads": 2, "n_routed_experts": 4, "kv_lora_rank": 16, "q_lora_rank": 16,
    "qk_rope_head_dim": 8, "v_head_dim": 8, "qk_nope_head_dim": 8, "num_experts_per_tok": 2,
    "first_k_dense_replace": 1}
"""A tiny GLM-4.7-Flash, with the `first_k_dense_replace` its release's config.json holds (vLLM reads its dense
layers by it; transformers by `mlp_layer_types`, whose default agrees)."""
VARIANTS = {"bias and qk norms": {"attention_bias": True, "use_qk_norm": True}, "plain": {},
            "tied": {"tie_word_embeddings": True, "attention_bias": True}}


def save(model_type: str, cfg: dict[str, Any], d: Path) -> tuple[Path, int]:
    """transformers' model of `cfg` in BF16 (its float32 routers kept float32, as from_config keeps
    _keep_in_fp32_modules_strict), seeded, saved sharded; with sum(numel) and the router biases it keeps as buffers,
    which the release stores."""
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(d, max_shard_size="20KB")
    assert len(list(d.glob("*.safetensors"))) >= 2
    buffers = sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    return d, sum(p.numel() for p in model.parameters()) + buffers


def vllm_names(cfg: dict[str, Any]) -> set[str]:
    """Every checkpoint name vLLM's Glm4MoeForCausalLM (main layers) and Glm4MoeMTP (NextN layers) consume for `cfg`
    (tests/data/loader_names/glm4_moe.vllm.json), `copies`: the NextN layers store the embedding and head copies."""
    names = list(TABLE["top"])
    if cfg.get("tie_word_embeddings"):
        names.remove("lm_head.weight")
    n, nextn = cfg["num_hidden_layers"], cfg.get("num_nextn_predict_layers", 0)
    for layer in range(n + nextn):
        parts = list(TABLE["layer"]) + [p for key in ("attention_bias", "use_qk_norm") if cfg.get(key)
                                         for p in TABLE[key]]
        if layer >= cfg["first_k_dense_replace"]:
            parts += [p.format(e=e) for p in TABLE["moe"] for e in range(cfg["n_routed_experts"])
                      if "{e}" in p or e == 0]
        else:
            parts += TABLE["dense"]
        if layer >= n:
            parts += TABLE["nextn"] + (TABLE["nextn_copies"] if cfg.get("copies") else [])
        names += [f"model.layers.{layer}.{p}" for p in parts]
    assert len(names) == len(set(names))
    return set(names)


def clean(report: Any) -> bool:
    """No finding but the info that transformers kept the router's weight float32 where the release stores it in the
    model's dtype (ROUTER_DTYPE: writer variance, as for every DeepseekV3-family save)."""
    return report.verdict() == "PASS" and {f.code for f in report.findings} <= {"ROUTER_DTYPE"}


def layout(d: Path) -> set[str]:
    return set(expected_layout(model_config_from_dict(json.loads((d / "config.json").read_text()))))


def test_the_tables_cite_their_loaders() -> None:
    assert [s.split()[0] for s in TABLE["source"].split("; ")] == [
        "vllm-project/vllm@002d6073aa034d4f5545d45021b0e56d1f3c3593",
        "vllm-project/vllm@028aedf62adee9d2a1e99d4cda7c1ce1c997c8cc",
        "vllm-project/vllm@055e47c28003156421365af985d676fc921cb075"]


def test_defaults_are_transformers() -> None:
    """An absent key means what transformers' configuration class builds: Glm4MoeConfig's values for every key
    glm4_moe reads (its NextN layers by `num_mtp_layers`, head_dim hidden / heads), Glm4MoeLiteConfig's for
    glm4_moe_lite (its dense layers by `mlp_layer_types`; it declares no NextN layer)."""
    ours = model_config_from_dict({"model_type": "glm4_moe"})
    theirs = transformers.Glm4MoeConfig()
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "moe_intermediate_size", "num_experts_per_tok", "n_shared_experts", "n_routed_experts",
                "first_k_dense_replace", "rms_norm_eps", "tie_word_embeddings", "attention_bias"):
        assert getattr(ours, key) == getattr(theirs, key), key
    assert ours.num_nextn_predict_layers == theirs.num_mtp_layers
    assert (ours.dim("num_key_value_heads"), bool(ours.dim("use_qk_norm"))) == (theirs.num_key_value_heads,
                                                                                theirs.use_qk_norm)
    assert ours.dim("head_dim") == theirs.hidden_size // theirs.num_attention_heads
    lite, lite_theirs = model_config_from_dict({"model_type": "glm4_moe_lite"}), transformers.Glm4MoeLiteConfig()
    for key in ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
                "num_attention_heads", "n_shared_experts", "n_routed_experts", "kv_lora_rank", "q_lora_rank",
                "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim", "num_experts_per_tok", "rms_norm_eps",
                "tie_word_embeddings", "attention_bias"):
        assert getattr(lite, key) == getattr(lite_theirs, key), key
    assert [lite.is_moe_layer(i) for i in range(lite.num_hidden_layers)] == [
        t == "sparse" for t in lite_theirs.mlp_layer_types]
    assert lite.num_nextn_predict_layers == 0 and glm4_moe_lite.LITE_DEFAULTS["num_nextn_predict_layers"] == 0


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_glm4_moe_save_audits_clean_in_vllms_names(variant: str, tmp_path: Path) -> None:
    """PASS (no finding but ROUTER_DTYPE); parameters = sum(numel) + router biases; the names stored are the
    layout's and vLLM's."""
    cfg = {**GLM, **VARIANTS[variant]}
    d, numel = save("glm4_moe", cfg, tmp_path / "glm")
    report = kimi_audit.audit(d)
    assert clean(report), [f.message for f in report.findings]
    assert report.stats.parameters == numel
    assert set(stored(d)) == layout(d) == vllm_names(cfg)


def test_glm4_moe_lite_save_audits_clean_in_vllms_names(tmp_path: Path) -> None:
    """GLM-4.7-Flash's tree is DeepseekV3's: transformers' save audits clean, parameters = sum(numel) + router
    biases, its names those vLLM's DeepseekV2 MLA loader consumes (deepseek_v3.vllm.json, no FP8)."""
    d, numel = save("glm4_moe_lite", LITE, tmp_path / "lite")
    report = kimi_audit.audit(d)
    assert clean(report), [f.message for f in report.findings]
    assert report.stats.parameters == numel
    assert set(stored(d)) == layout(d) - {n for n in layout(d) if n.endswith("rotary_emb.inv_freq")} \
        == deepseek_v3_loader_names(LITE, fp8=False)
    assert report.model["model_type"] == "glm4_moe_lite"


def test_transformers_loads_the_glm4_moe_files_back(tmp_path: Path) -> None:
    d, numel = save("glm4_moe", {**GLM, **VARIANTS["bias and qk norms"]}, tmp_path / "glm")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert sum(p.numel() for p in model.parameters()) + 8 == numel  # the two MoE layers' four-expert biases


def generator() -> Any:
    sys.path.insert(0, str(ROOT / "writers"))
    import gguf_glm4_generate

    return gguf_glm4_generate


@pytest.mark.parametrize("arch", ["glm4moe", "glm4moe-lite"])
def test_a_release_with_its_nextn_layer(arch: str, tmp_path: Path) -> None:
    """The GGUF fixtures' source (transformers' model and a NextN layer as the releases store it): no error nor
    warning, its names vLLM's (Glm4MoeMTP's NextN layer), parameters = transformers' sum(numel) + router biases +
    the NextN head; GLM-4.7-Flash's NextN copies are DeepseekV3's MTP embedding and head."""
    writer = generator()
    d = tmp_path / arch
    writer.save_source(arch, d)
    report = kimi_audit.audit(d)
    assert [f for f in report.findings if f.severity.value in ("error", "warning")] == []
    cfg = json.loads((d / "config.json").read_text())
    names = set(stored(d))
    assert names == layout(d) - {n for n in layout(d) if n.endswith("rotary_emb.inv_freq")}
    if arch == "glm4moe":
        assert names == vllm_names(cfg)
    config_cls, model_cls = (getattr(transformers, n) for n in writer.CLASSES[arch])
    raw = {k: v for k, v in writer.CONFIGS[arch].items() if k not in writer.EXTRA}
    with torch.device("meta"):
        model = model_cls(config_cls(**{**raw, "num_hidden_layers": raw["num_hidden_layers"] + 1}))
    head = writer.mtp_head(arch, raw["hidden_size"], raw["vocab_size"], torch.Generator().manual_seed(0))
    numel = sum(p.numel() for p in model.parameters()) + sum(
        b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    assert report.stats.parameters == numel + sum(t.numel() for t in head.values())


def test_nextn_copies_where_a_glm4_moe_release_stores_them(tmp_path: Path) -> None:
    """GLM-4.5-Air's NextN layer also stores copies of the embedding and head (GLM-4.6's does not): one info
    naming the part, the audit PASS, the names vLLM's with the copies, their elements counted as stored."""
    from safetensors.torch import load_file, save_file

    writer = generator()
    d = tmp_path / "air"
    writer.save_source("glm4moe", d)
    before = kimi_audit.audit(d).stats.parameters
    tensors = load_file(str(d / "model.safetensors"))
    tensors.update({f"model.layers.3.{n}": torch.zeros(256, 128, dtype=torch.bfloat16) for n in writer.COPIES})
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    report = kimi_audit.audit(d)
    assert [(f.code, f.covers) for f in report.findings] == [("TENSORS_UNDESCRIBED", 2)]
    assert report.verdict() == "PASS" and report.stats.parameters == before + 2 * 256 * 128
    assert set(stored(d)) == vllm_names({**json.loads((d / "config.json").read_text()), "copies": True})


def test_a_glm4_moe_save_with_a_wrong_head_dim(tmp_path: Path) -> None:
    """config.json's head_dim says 8 over q/k/v/o and the q/k norms stored for 16: one CONFIG_DISAGREES naming the
    key, the 27 attention tensors it sizes (through heads × head_dim too) counted beneath, exit 1 (the only error;
    the index's total_parameters, the files', disagrees with the config's too: an info)."""
    d, _ = save("glm4_moe", {**GLM, **VARIANTS["bias and qk norms"]}, tmp_path / "glm")
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "head_dim": 8}))
    report = kimi_audit.audit(d)
    wrong = [(f.code, f.tensor, f.expected, f.actual, f.covers) for f in report.findings if f.severity.value == "error"]
    assert wrong == [("CONFIG_DISAGREES", "config.json head_dim", 8, 16, 27)] and report.exit_code() == 1


@pytest.mark.parametrize("bad", [{"num_key_value_heads": 3}, {"num_attention_heads": 0}, {"use_qk_norm": "yes"},
                                 *({"partial_rotary_factor": v} for v in (2.0, -1, 0, "half", 0.3))])
def test_a_config_glm4_moe_cannot_build(bad: dict[str, Any]) -> None:
    """Key-value heads that do not divide the heads, no heads, a flag that is no boolean, a rotary factor that
    rotates no even whole number of a head's dimensions (each a PASS before: it sizes no tensor): a ConfigError
    naming it."""
    with pytest.raises(ConfigError, match=next(iter(bad))):
        glm4_moe.read({**GLM, "model_type": "glm4_moe", **bad})
