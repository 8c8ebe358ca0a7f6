"""Independent proof for the 2026 lineage (issue 23, item 4): transformers 5.25's own implementations of
deepseek_v32, kimi_k25 and glm_moe_dsa (deepseek_v3: tests/test_transformers_differential.py).

1. A tiny model of each, built by transformers and written by its `save_pretrained` in several shards, audits
   clean (its writer's variance info, MTP declared but never written one warning), `params` exits as `audit`,
   and the parameter total equals `sum(p.numel() for p in model.parameters())` plus the router's
   `e_score_correction_bias`, which transformers holds as a buffer and the release counts as a parameter.
2. The meta-device state_dict of a full-size config matches the expected layout name for name and shape for
   shape, through transformers' own checkpoint conversion (conversion_mapping.py), every difference listed.
3. Faults of each new kind are named once: a missing routed expert, a vision-tower weight of the wrong shape,
   a missing indexer weight, an absent shard.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    DeepseekV32Config,
    DeepseekV32ForCausalLM,
    GlmMoeDsaConfig,
    GlmMoeDsaForCausalLM,
    Kimi_K25Config,
    Kimi_K25ForConditionalGeneration,
)
from typer.testing import CliRunner

from kimi_audit.checks.audit import AuditReport, audit_source
from kimi_audit.cli import app
from kimi_audit.constants import INDEX_FILE
from kimi_audit.findings import Severity
from kimi_audit.model.accounting.account import accounting_of_checkpoint
from kimi_audit.model.checkpoint import load_checkpoint
from kimi_audit.model.config import parse_config_bytes
from kimi_audit.model.kinds import BUFFER, SCALE
from kimi_audit.model.layout import expected_layout
from kimi_audit.sources import LocalSource

DATA = Path(__file__).parent.parent / "kimi_audit" / "data"

TEXT: dict[str, Any] = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16,
    "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 2, "n_shared_experts": 1,
    "n_routed_experts": 4, "kv_lora_rank": 8, "q_lora_rank": 12, "qk_rope_head_dim": 4, "v_head_dim": 8,
    "qk_nope_head_dim": 8, "n_group": 1, "topk_group": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
    "tie_word_embeddings": False,
}
"""Layer 0 dense, layers 1-2 MoE (4 experts); transformers' DeepseekV3/V32 default declares one MTP layer."""
VISION: dict[str, Any] = {"num_hidden_layers": 2, "hidden_size": 16, "intermediate_size": 24,
                          "num_attention_heads": 2, "patch_size": 2, "pos_emb_height": 4, "pos_emb_width": 4}


def tiny(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if arch == "deepseek_v32":
        return DeepseekV32ForCausalLM(DeepseekV32Config(**TEXT, index_n_heads=2, index_head_dim=8))
    if arch == "glm_moe_dsa":
        glm = {k: v for k, v in TEXT.items() if k not in ("n_group", "topk_group")}
        return GlmMoeDsaForCausalLM(GlmMoeDsaConfig(**glm, index_n_heads=2, index_head_dim=8))
    return Kimi_K25ForConditionalGeneration(Kimi_K25Config(
        text_config={"model_type": "deepseek_v3", **TEXT}, vision_config=VISION, projection_hidden_size=16,
        tie_word_embeddings=False))


ARCHS = ("deepseek_v32", "kimi_k25", "glm_moe_dsa")
MTP_DECLARED = {"deepseek_v32": True, "kimi_k25": True, "glm_moe_dsa": False}
"""transformers' DeepseekV3/V32 configs write num_nextn_predict_layers 1 and never the layer; GlmMoeDsaConfig
has no such key (GLM-5's layer 78 is dropped on load)."""


pytestmark = pytest.mark.usefixtures("quiet_transformers")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int]]:
    """arch -> (its tiny BF16 save_pretrained, sharded; the parameters the release would count)."""
    out = {}
    for arch in ARCHS:
        model = tiny(arch).to(torch.bfloat16)
        d = tmp_path_factory.mktemp(arch)
        model.save_pretrained(d, max_shard_size="20KB")
        assert len(list(d.glob("*.safetensors"))) >= 3 and (d / INDEX_FILE).is_file()
        biases = sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
        assert biases == 2 * TEXT["n_routed_experts"]  # two MoE layers' router bias: a buffer in transformers
        out[arch] = (d, sum(p.numel() for p in model.parameters()) + biases)
    return out


def audit(path: Path) -> AuditReport:
    return audit_source(LocalSource(path))


@pytest.mark.parametrize("arch", ARCHS)
def test_save_pretrained_audits_clean_with_the_same_total(saved: dict[str, tuple[Path, int]], arch: str) -> None:
    d, parameters = saved[arch]
    report = audit(d)
    assert report.model["model_type"] == arch
    assert [f for f in report.findings if f.severity is Severity.ERROR] == []
    warnings = [f.code for f in report.findings if f.severity is Severity.WARNING]
    assert warnings == (["MTP_ABSENT"] if MTP_DECLARED[arch] else [])
    infos = {f.code for f in report.findings if f.severity is Severity.INFO}
    # the BF16 cast: router biases (and V3.2's F32 norms, the indexer's LayerNorm) in the config's dtype
    assert infos <= {"ROUTER_DTYPE", "WRITER_DTYPE", "LAYOUT_DIALECT"} and "ROUTER_DTYPE" in infos
    assert ("LAYOUT_DIALECT" in infos) == (arch == "kimi_k25")
    assert report.stats.parameters == parameters
    # each layer's query-latent gain is found, under the names the writer used (kimi_k25: its dialect)
    assert all(row.ok for row in report.q_a_layernorm.rows if row.layer < TEXT["num_hidden_layers"])
    acc = accounting_of_checkpoint(load_checkpoint(LocalSource(d)))
    assert acc.found == acc.derived == parameters and not acc.mismatch
    result = CliRunner().invoke(app, ["params", str(d), "--no-progress"])
    assert result.exit_code == report.exit_code() == 0, result.output
    assert ("MTP_ABSENT" in result.output) == MTP_DECLARED[arch]


# --- 2. the full-size meta-device state_dict against the layout ------------------------------------------

def canonical_k25(name: str) -> str:
    """transformers' kimi_k25 parameter names as the release spells them: conversion_mapping.py's "kimi_k25"
    renames, reversed (q/k/v are folded into wqkv by the caller)."""
    for pattern, repl in (
        (r"^model\.language_model\.", "language_model.model."), (r"^lm_head\.", "language_model.lm_head."),
        (r"^model\.vision_tower\.layers\.(\d+)\.norm1\.", r"vision_tower.encoder.blocks.\1.norm0."),
        (r"^model\.vision_tower\.layers\.(\d+)\.norm2\.", r"vision_tower.encoder.blocks.\1.norm1."),
        (r"^model\.vision_tower\.layers\.(\d+)\.mlp\.fc1\.", r"vision_tower.encoder.blocks.\1.mlp.fc0."),
        (r"^model\.vision_tower\.layers\.(\d+)\.mlp\.fc2\.", r"vision_tower.encoder.blocks.\1.mlp.fc1."),
        (r"^model\.vision_tower\.layers\.(\d+)\.attn\.proj\.", r"vision_tower.encoder.blocks.\1.wo."),
        (r"^model\.vision_tower\.layers\.(\d+)\.attn\.[qkv]_proj\.", r"vision_tower.encoder.blocks.\1.wqkv."),
        (r"^model\.vision_tower\.final_layernorm\.", "vision_tower.encoder.final_layernorm."),
        (r"^model\.vision_tower\.patch_embed\.pos_emb\.position_embeddings$",
         "vision_tower.patch_embed.pos_emb.weight"),
        (r"^model\.vision_tower\.patch_embed\.", "vision_tower.patch_embed."),
        (r"^model\.mm_projector\.pre_norm\.", "mm_projector.pre_norm."),
        (r"^model\.mm_projector\.in_proj\.", "mm_projector.proj.0."),
        (r"^model\.mm_projector\.out_proj\.", "mm_projector.proj.2."),
    ):
        new = re.sub(pattern, repl, name)
        if new != name:
            return new
    return name


EXPERTS = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")

DIFFERENCES = {
    "experts": "transformers holds each MoE layer's routed experts fused as 3-D gate_up_proj [E, 2I, H] and "
               "down_proj [E, H, I]; the release (and save_pretrained) one Linear per expert and projection.",
    "wqkv": "transformers splits the vision tower's fused wqkv into q_proj, k_proj, v_proj (conversion_mapping's "
            "Chunk); the release stores them as one [3D, D] weight and [3D] bias.",
    "quantized": "INT4 routed experts (kimi_k25): weight_packed/weight_scale/weight_shape where transformers' "
                 "unquantized model holds the BF16 weight (its quantizer adds them only when loading).",
    "scale": "FP8 block scales (deepseek_v32): quantization metadata, not in transformers' unquantized model.",
    "mtp": "The MTP layer the config declares (deepseek_v32 layer 61): transformers builds none.",
    "bias": "e_score_correction_bias: a persistent buffer in transformers, in its state_dict like a parameter.",
    "inv_freq": "rotary_emb.inv_freq buffers (kimi_k25's text model, as Kimi-K2 stores them): optional; "
                "transformers' rotary buffers are not persistent.",
}


def full_size(arch: str) -> tuple[torch.nn.Module, Any]:
    if arch == "deepseek_v32":
        raw = json.loads((DATA / "deepseek-v32.config.json").read_text())
        args = {k: v for k, v in raw.items() if k not in ("quantization_config", "architectures", "auto_map",
                                                           "model_type", "torch_dtype", "dtype")}
        with torch.device("meta"):
            return DeepseekV32ForCausalLM(DeepseekV32Config(**args)), raw
    if arch == "glm_moe_dsa":  # transformers' defaults are GLM-5's dimensions (its docstring's checkpoint)
        with torch.device("meta"):
            model = GlmMoeDsaForCausalLM(GlmMoeDsaConfig())
        return model, {"model_type": "glm_moe_dsa", **{k: getattr(model.config, k) for k in (
            "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
            "num_attention_heads", "n_shared_experts", "n_routed_experts", "kv_lora_rank", "q_lora_rank",
            "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim", "num_experts_per_tok", "first_k_dense_replace",
            "index_n_heads", "index_head_dim", "tie_word_embeddings")}}
    raw = json.loads((DATA / "kimi-k2.6.config.json").read_text())
    text = {k: v for k, v in raw["text_config"].items() if k not in ("rope_scaling", "auto_map")}
    with torch.device("meta"):
        return Kimi_K25ForConditionalGeneration(Kimi_K25Config(
            text_config={**text, "model_type": "deepseek_v3"}, vision_config=raw["vision_config"],
            projection_hidden_size=raw["projection_hidden_size"], tie_word_embeddings=False)), raw


@pytest.mark.parametrize("arch", ARCHS)
def test_full_size_layout_is_transformers_state_dict(arch: str) -> None:
    model, raw = full_size(arch)
    cfg = parse_config_bytes(json.dumps(raw).encode())[1]
    layout = expected_layout(cfg)
    theirs: dict[str, tuple[int, ...]] = {}
    for name, t in model.state_dict().items():
        n = canonical_k25(name) if arch == "kimi_k25" else name
        if n in theirs:  # q, k, v -> wqkv: stacked on dim 0
            theirs[n] = (theirs[n][0] + t.shape[0], *theirs[n][1:])
        else:
            theirs[n] = tuple(t.shape)
    ours = {e.name: e for e in layout.values()}
    by: dict[str, list[str]] = {k: [] for k in DIFFERENCES}
    fused: dict[str, list[int]] = {}
    for name, e in ours.items():
        if name in theirs:
            if e.shape != theirs[name]:
                assert name.endswith("wqkv.weight") or name.endswith("wqkv.bias"), (name, e.shape, theirs[name])
            continue
        m = re.match(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.(weight\w*)$", name)
        if e.layer is not None and e.layer >= cfg.num_hidden_layers:
            by["mtp"].append(name)
        elif e.kind == SCALE:
            by["scale" if m is None or m[4] == "weight_scale_inv" else "quantized"].append(name)
        elif e.kind == BUFFER:
            by["inv_freq"].append(name)
        elif m is not None:
            by["experts" if m[4] == "weight" else "quantized"].append(name)
            key = f"{m[1]}.{'down_proj' if m[3] == 'down_proj' else 'gate_up_proj'}"
            fused.setdefault(key, [0, 0])[0 if m[3] != "up_proj" else 1] += 1
        else:
            pytest.fail(f"layout only: {name}")
    for name, shape in theirs.items():
        if name in ours:
            continue
        assert EXPERTS.match(name), f"transformers only: {name} {shape}"
        assert shape[0] == cfg.n_routed_experts and name in fused
    assert not any(n.endswith("e_score_correction_bias") and n not in theirs and n not in by["mtp"] for n in ours)
    counts = {k: len(v) for k, v in by.items() if v}
    layers_moe = cfg.num_hidden_layers - cfg.first_k_dense_replace
    e = cfg.n_routed_experts or 0
    if arch == "kimi_k25":  # INT4: 3 tensors per routed projection; 61 inv_freq buffers as Kimi-K2's
        assert counts == {"quantized": layers_moe * e * 3 * 3, "inv_freq": 61}
        assert sum(1 for n in ours if n.startswith(("vision_tower.", "mm_projector."))) == 329 + 6
    elif arch == "deepseek_v32":
        assert counts["experts"] == layers_moe * e * 3 and set(counts) == {"experts", "scale", "mtp"}
    else:
        assert counts == {"experts": layers_moe * e * 3}


# --- 3. faults of each new kind, named once -----------------------------------------------------------

def rewrite(src: Path, dst: Path, edit: Any) -> Path:
    """A copy of the save with `edit(shard_name, tensors)` applied to every shard (the index kept)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            tensors = load_file(f)
            edit(f.name, tensors)
            save_file(tensors, dst / f.name, metadata={"format": "pt"})
        else:
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def codes(report: AuditReport) -> list[tuple[str, str | None]]:
    return [(f.code, f.tensor) for f in report.findings if f.severity is Severity.ERROR]


EXPERT = "language_model.model.blocks.1.mlp.experts.2.up_proj.weight"
WQKV = "vision_tower.encoder.blocks.1.wqkv.weight"
INDEXER = "model.layers.2.self_attn.indexer.wk.weight"


def test_missing_routed_expert_is_named_once(saved: dict[str, tuple[Path, int]], tmp_path: Path) -> None:
    d = rewrite(saved["kimi_k25"][0], tmp_path / "x", lambda _s, t: t.pop(EXPERT, None))
    assert [c for c in codes(audit(d)) if c[0] == "TENSOR_MISSING"] == [("TENSOR_MISSING", EXPERT)]


def test_vision_weight_of_wrong_shape_is_named_once(saved: dict[str, tuple[Path, int]], tmp_path: Path) -> None:
    def edit(_s: str, t: dict[str, torch.Tensor]) -> None:
        if WQKV in t:
            t[WQKV] = t[WQKV][:-1].clone()
    assert codes(audit(rewrite(saved["kimi_k25"][0], tmp_path / "x", edit))) == [("SHAPE_MISMATCH", WQKV)]


def test_missing_indexer_weight_is_named_once(saved: dict[str, tuple[Path, int]], tmp_path: Path) -> None:
    d = rewrite(saved["glm_moe_dsa"][0], tmp_path / "x", lambda _s, t: t.pop(INDEXER, None))
    assert [c for c in codes(audit(d)) if c[0] == "TENSOR_MISSING"] == [("TENSOR_MISSING", INDEXER)]


@pytest.mark.parametrize("arch", ARCHS)
def test_absent_shard_is_named(saved: dict[str, tuple[Path, int]], tmp_path: Path, arch: str) -> None:
    src = saved[arch][0]
    shard = sorted(f.name for f in src.glob("*.safetensors"))[1]
    dst = tmp_path / "x"
    dst.mkdir()
    for f in src.iterdir():
        if f.name != shard:
            (dst / f.name).write_bytes(f.read_bytes())
    report = audit(dst)
    assert "INDEX_SHARD_ABSENT" in {c for c, _ in codes(report)}
    assert report.exit_code() == 1


def test_glm_config_defaults_are_transformers() -> None:
    """An absent key of a glm_moe_dsa config means GlmMoeDsaConfig's default: no MTP layer declared, an
    indexer of 32 heads x 128; an indexer mode other than full or shared is refused, not misread."""
    from kimi_audit.errors import ConfigError
    from kimi_audit.model.config import model_config_from_dict

    base = {"model_type": "glm_moe_dsa", **{k: v for k, v in TEXT.items() if k != "tie_word_embeddings"}}
    cfg = model_config_from_dict(base)
    d = GlmMoeDsaConfig()
    assert (cfg.num_nextn_predict_layers, cfg.index_n_heads, cfg.index_head_dim) == (0, d.index_n_heads,
                                                                                      d.index_head_dim)
    with pytest.raises(ConfigError, match="full or shared"):
        model_config_from_dict({**base, "indexer_types": ["full", "sometimes", "full"]})
    with pytest.raises(ConfigError, match="F and S"):
        model_config_from_dict({**base, "index_topk_pattern": "FXF"})


@pytest.mark.parametrize("keys", [{"indexer_types": ["full", "shared", "full"]}, {"index_topk_pattern": "FSS"},
                                  {"index_topk_freq": 2, "index_skip_topk_offset": 1}],
                         ids=["indexer_types", "pattern", "schedule"])
def test_glm_shared_indexer_layers_are_transformers(tmp_path: Path, keys: dict[str, Any]) -> None:
    """Issue 33: GLM-5.x's per-layer indexer. A layer whose indexer_types entry is `shared` reuses the previous
    full layer's selection and holds no indexer (GlmMoeDsaAttention); its configs were refused. A tiny model
    transformers 5.25 builds with each way of saying it audits clean, its total transformers' own."""
    torch.manual_seed(0)
    glm = {k: v for k, v in TEXT.items() if k not in ("n_group", "topk_group")}
    model = GlmMoeDsaForCausalLM(GlmMoeDsaConfig(**glm, **keys, index_n_heads=2, index_head_dim=8)).to(torch.bfloat16)
    shared = [t == "shared" for t in model.config.indexer_types]
    assert any(shared)
    d = tmp_path / "glm"
    model.save_pretrained(d, max_shard_size="20KB")
    report = audit(d)
    assert [f for f in report.findings if f.severity is not Severity.INFO] == [], report.findings
    biases = sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    assert report.stats.parameters == sum(p.numel() for p in model.parameters()) + biases
    names = set(model.state_dict())
    for i, is_shared in enumerate(shared):
        assert any(f"layers.{i}.self_attn.indexer." in n for n in names) != is_shared
