"""deepseek_v4 and kimi_linear against transformers 5.25, an independent implementation of both (issue 23,
items 2 and 4).

1. The full-size expected layout, in the release's spelling, against the state_dict of a meta-device model
   built from the same config: each of our names is renamed by transformers' own checkpoint conversion mapping
   (what `from_pretrained` applies to the release's files) and must land on a tensor of its state_dict with
   the same shape, or on one of the tensors it fuses (routed experts, KDA convolutions) with the fused shape;
   no state_dict tensor is left over.
2. Tiny models written by transformers' own `save_pretrained`, sharded, audit clean in transformers' spelling
   (one LAYOUT_DIALECT info), and again once renamed to the release's spelling; the audit's parameter total is
   `sum(p.numel() for p in model.parameters())` plus the routing biases, which transformers holds as buffers and
   the layout counts as parameters, as DeepSeek's and Moonshot's published totals do for DeepSeek-V3/Kimi-K2.
3. Faults of each new kind, each named once: a missing routing bias, hash table, KDA forget-gate bias or expert,
   a hyper-connection or KDA convolution of the wrong shape, an absent shard, a mixture of spellings.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, DeepseekV4Config, KimiLinearConfig, PreTrainedModel
from transformers.conversion_mapping import get_model_conversion_mapping
from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
from typer.testing import CliRunner

from kimi_audit.checks.audit import AuditReport, audit_source
from kimi_audit.cli import app
from kimi_audit.constants import INDEX_FILE
from kimi_audit.errors import ConfigError
from kimi_audit.findings import Finding, Severity
from kimi_audit.model.arch.spec import MTP
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.model.kinds import BUFFER
from kimi_audit.model.layout import ExpectedTensor, expected_layout
from kimi_audit.sources import LocalSource

pytestmark = pytest.mark.usefixtures("quiet_transformers")


# --- 1. the full-size layout is transformers' state_dict ------------------------------------------------------

FULL = {"deepseek_v4": DeepseekV4Config, "kimi_linear": KimiLinearConfig}
"""Full-size configs: transformers 5.25's defaults, documented as DeepSeek-V4-Flash(-Base)'s and
Kimi-Linear-48B-A3B-Instruct's dimensions (configuration_deepseek_v4.py, configuration_kimi_linear.py)."""

FUSED = {
    "experts": r"\.experts\.\*\.w[123]\.weight",
    "conv": r"self_attn\.[qkv]_conv1d\.weight",
}
"""What transformers holds fused, by the converter source pattern that fuses it: each MoE layer's experts as
3-D `mlp.experts.gate_up_proj` [E, 2I, H] (w1 then w3) and `mlp.experts.down_proj` [E, H, I]; a KDA layer's
q/k/v short convolutions as one `self_attn.conv1d.weight` [3D, 1, K] (Concatenate dim 0). The layout keeps
the release's per-expert and per-projection tensors."""


def fused_shape(parts: list[tuple[str, tuple[int, ...]]]) -> tuple[int, ...]:
    """The shape transformers fuses these (name, shape) of ours into."""
    if ".experts." not in parts[0][0]:  # KDA convolutions: concatenated along dim 0
        shapes = [s for _, s in parts]
        assert len({s[1:] for s in shapes}) == 1
        return (sum(s[0] for s in shapes), *shapes[0][1:])
    by: dict[str, list[tuple[int, ...]]] = {}
    for n, s in parts:
        by.setdefault(re.sub(r".*\.experts\.\d+\.(w\d)\.weight$", r"\1", n), []).append(s)
    if "w2" in by:  # down_proj: the experts stacked
        (shape,) = set(by["w2"])
        return (len(by["w2"]), *shape)
    (g,), (u,) = set(by["w1"]), set(by["w3"])  # gate_up_proj: stacked, w1 and w3 concatenated
    assert g == u and len(by["w1"]) == len(by["w3"])
    return (len(by["w1"]), g[0] + u[0], g[1])


def built(cfg: ModelConfig) -> list[ExpectedTensor]:
    """The layout less its MTP stages: what transformers 5.25 builds (it builds no MTP layer, for V3 as for V4)."""
    return [t for t in expected_layout(cfg).values() if t.block != MTP]


def against_state_dict(cfg: ModelConfig, model: PreTrainedModel) -> tuple[dict[str, int], dict[str, Any]]:
    """Our names by how they reach transformers' state_dict (`same`: one to one, or a FUSED kind), and what is
    left unexplained (must be empty)."""
    theirs = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    counts = {"same": 0, **{k: 0 for k in FUSED}}
    unexplained: dict[str, Any] = {}
    fused: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
    for t in built(cfg):
        key, pattern = rename_source_key(t.name, renamings, converters, "model", theirs)
        if pattern is None:
            counts["same"] += 1
            if theirs.get(key) != t.shape:
                unexplained[f"ours:{t.name}"] = (key, t.shape, theirs.get(key))
            continue
        kind = next(k for k, p in FUSED.items() if re.search(p, pattern) or re.fullmatch(p, pattern))
        counts[kind] += 1
        fused.setdefault(key, []).append((t.name, t.shape))
    for key, parts in fused.items():
        if theirs.get(key) != fused_shape(parts):
            unexplained[f"fused:{key}"] = (fused_shape(parts), theirs.get(key))
    reached = {rename_source_key(t.name, renamings, converters, "model", theirs)[0] for t in built(cfg)}
    unexplained.update({f"theirs:{k}": s for k, s in theirs.items() if k not in reached})
    return counts, unexplained


def full_size(model_type: str) -> tuple[ModelConfig, PreTrainedModel]:
    config = FULL[model_type]()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return model_config_from_dict(config.to_dict()), model


def router_biases(cfg: ModelConfig) -> int:
    """Elements of the routing biases the layout counts as parameters (transformers: buffers)."""
    return sum(t.numel for t in built(cfg) if t.name.endswith(("ffn.gate.bias", "gate.e_score_correction_bias")))


def test_deepseek_v4_flash_layout_is_transformers_state_dict() -> None:
    cfg, model = full_size("deepseek_v4")
    assert cfg.num_hidden_layers == 43 and cfg.layer_kinds[43:] == (MTP,)  # and DeepseekV4Config's one MTP stage
    counts, unexplained = against_state_dict(cfg, model)
    assert unexplained == {}
    # 43 MoE layers × 256 experts × 3 projections fused; everything else one to one under another name
    assert counts == {"same": counts["same"], "experts": 43 * 256 * 3, "conv": 0}
    layout = built(cfg)
    tables = [t for t in layout if t.kind == BUFFER]
    assert {t.name for t in tables} == {f"layers.{i}.ffn.gate.tid2eid" for i in range(3)}  # 3 hash-routed layers
    # parameters: transformers' parameters plus the 40 routing biases it holds as buffers; the hash tables
    # (I64 token -> expert ids) are buffers on both sides
    params = sum(t.logical for t in layout)
    assert router_biases(cfg) == 40 * 256
    assert params == sum(p.numel() for p in model.parameters()) + router_biases(cfg)
    assert params + sum(t.numel for t in tables) == sum(v.numel() for v in model.state_dict().values())
    assert 280e9 < params < 290e9  # "~284 B total" (family.md, unconfirmed): a snapshot, not a published figure


def test_kimi_linear_layout_is_transformers_state_dict() -> None:
    cfg, model = full_size("kimi_linear")
    counts, unexplained = against_state_dict(cfg, model)
    assert unexplained == {}
    kinds = cfg.layer_kinds
    kda, moe = sum(k.endswith("_kda") for k in kinds), sum(k.startswith("moe_") for k in kinds)
    assert (len(kinds), kda, moe) == (27, 21, 26)  # transformers' default schedule: MLA every 4th layer from 4
    assert counts == {"same": counts["same"], "experts": moe * 256 * 3, "conv": kda * 3}
    params = sum(t.logical for t in built(cfg))
    assert params == sum(p.numel() for p in model.parameters()) + router_biases(cfg)
    assert params == sum(v.numel() for v in model.state_dict().values())


V4_ATTENTION = {"sliding_attention": "swa", "compressed_sparse_attention": "csa", "heavily_compressed_attention": "hca"}


@pytest.mark.parametrize("keys", [
    {},
    {"num_hidden_layers": 7, "num_hash_layers": 2, "compress_ratios": [0, 4, 128, 4, 128, 4, 0, 4]},
    {"num_hidden_layers": 5, "mlp_layer_types": ["hash_moe", "moe", "hash_moe", "moe", "moe"],
     "compress_rate_csa": 8, "compress_rate_hca": 64},
], ids=["defaults", "legacy-ratios", "explicit"])
def test_deepseek_v4_schedule_is_read_as_transformers_reads_it(keys: dict[str, Any]) -> None:
    """Legacy keys (DeepSeek's `compress_ratios`, one more than the layers with the MTP layer's, and
    `num_hash_layers`, `compress_rate_*`) fold in as DeepseekV4Config.__post_init__ folds them."""
    theirs = DeepseekV4Config(**keys)
    cfg = model_config_from_dict({"model_type": "deepseek_v4", **keys})
    want = tuple(f"{'moe_hash' if m == 'hash_moe' else 'moe'}_{V4_ATTENTION[a]}"
                 for m, a in zip(theirs.mlp_layer_types, theirs.layer_types))
    assert cfg.layer_kinds == want + (MTP,) * theirs.num_nextn_predict_layers  # the MTP stages after the layers
    assert (cfg.dim("csa_rate"), cfg.dim("hca_rate")) == tuple(theirs.compress_rates[k] for k in (
        "compressed_sparse_attention", "heavily_compressed_attention"))


@pytest.mark.parametrize("keys", [
    {},
    {"num_hidden_layers": 6, "first_k_dense_replace": 2, "num_experts": 8,
     "linear_attn_config": {"full_attn_layers": [3, 6], "kda_layers": [1, 2, 4, 5], "head_dim": 64, "num_heads": 4,
                            "short_conv_kernel_size": 3}},
], ids=["defaults", "moonshot-keys"])
def test_kimi_linear_schedule_is_read_as_transformers_reads_it(keys: dict[str, Any]) -> None:
    """Moonshot's `linear_attn_config` (1-indexed layer lists) and `first_k_dense_replace`, as KimiLinearConfig."""
    theirs = KimiLinearConfig(**keys)
    cfg = model_config_from_dict({"model_type": "kimi_linear", **keys})
    want = tuple(f"{'moe' if m == 'sparse' else 'dense'}_{'mla' if a == 'full_attention' else 'kda'}"
                 for m, a in zip(theirs.mlp_layer_types, theirs.layer_types))
    assert cfg.layer_kinds == want
    assert (cfg.dim("linear_head_dim"), cfg.dim("linear_num_heads"), cfg.dim("linear_conv_kernel_dim"),
            cfg.n_routed_experts) == (theirs.linear_head_dim, theirs.linear_num_heads, theirs.linear_conv_kernel_dim,
                                      theirs.num_local_experts)


@pytest.mark.parametrize(("model_type", "keys", "match"), [
    ("deepseek_v4", {"num_hidden_layers": 3, "layer_types": ["sliding_attention"]}, "layer_types"),
    ("deepseek_v4", {"compress_ratios": [0, 3]}, "compress_ratios"),
    ("deepseek_v4", {"o_groups": 7}, "o_groups"),
    ("kimi_linear", {"num_hidden_layers": 2, "linear_attn_config": {"full_attn_layers": [1], "kda_layers": [3]}},
     "kda_layers"),
    ("kimi_linear", {"hidden_size": -1}, "hidden_size"),
])
def test_a_bad_lineage_config_is_a_config_error(model_type: str, keys: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        model_config_from_dict({"model_type": model_type, **keys})


# --- 2. tiny models written by save_pretrained --------------------------------------------------------------

TINY: dict[str, dict[str, Any]] = {
    "deepseek_v4": {
        "vocab_size": 64, "hidden_size": 32, "moe_intermediate_size": 16, "num_hidden_layers": 4,
        "num_attention_heads": 4, "head_dim": 16, "q_lora_rank": 24, "num_experts_per_tok": 2,
        "n_routed_experts": 4, "o_groups": 2, "o_lora_rank": 8, "index_n_heads": 2, "index_head_dim": 8,
        "hc_mult": 2, "sliding_window": 8, "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
        "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                        "compressed_sparse_attention"]},
    "kimi_linear": {
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 16,
        "q_lora_rank": 12, "qk_rope_head_dim": 4, "v_head_dim": 8, "qk_nope_head_dim": 8,
        "num_experts_per_tok": 2, "num_local_experts": 4, "n_shared_experts": 2, "linear_head_dim": 8,
        "linear_num_heads": 4, "linear_conv_kernel_dim": 4, "pad_token_id": 0, "bos_token_id": 1,
        "eos_token_id": 2, "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
        "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"]},
}
"""Every layer kind of each: V4 SWA (hash-routed), CSA (with the indexer) and HCA; Kimi-Linear a dense and MoE
MLP, KDA and MLA (with a query latent) layers, two shared experts."""

SHARD = "20KB"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int]]:
    """model_type -> (its tiny save_pretrained checkpoint, sum of its parameters' numel)."""
    out = {}
    for model_type, keys in TINY.items():
        torch.manual_seed(0)
        config = FULL[model_type](**keys)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        d = tmp_path_factory.mktemp(model_type)
        model.save_pretrained(d, max_shard_size=SHARD)
        assert len(list(d.glob("*.safetensors"))) >= 2 and (d / INDEX_FILE).is_file()
        out[model_type] = d, sum(p.numel() for p in model.parameters())
    return out


def audit(path: Path) -> AuditReport:
    return audit_source(LocalSource(path))


def by_severity(report: AuditReport, severity: Severity) -> list[Finding]:
    return [f for f in report.findings if f.severity is severity]


@pytest.mark.parametrize("model_type", list(TINY))
def test_save_pretrained_audits_clean(saved: dict[str, tuple[Path, int]], model_type: str) -> None:
    d, numel = saved[model_type]
    report = audit(d)
    cfg = model_config_from_dict(json.loads((d / "config.json").read_text()))
    mtp = ["MTP_ABSENT"] if cfg.num_nextn_predict_layers else []  # transformers saves no MTP stage (V4's config: 1)
    assert by_severity(report, Severity.ERROR) == []
    assert [f.code for f in by_severity(report, Severity.WARNING)] == mtp
    # transformers keeps V4's gains F32 where the release stores BF16 (RELEASE_NORM_DTYPE): one info for them all
    kept = ["WRITER_DTYPE"] if model_type in RELEASE_NORM_DTYPE else []
    assert [f.code for f in report.findings] == ["LAYOUT_DIALECT", *mtp, *kept]
    assert "transformers" in report.findings[0].message
    assert report.stats.parameters == numel + router_biases(cfg)
    assert report.stats.tensors == len(built(cfg))


Shards = dict[str, dict[str, torch.Tensor]]

RELEASE_SPELLING: dict[str, list[tuple[str, str]]] = {
    # the attention's `kv_norm` as vLLM's loader reads the release (vllm-project/vllm@0a291a2e
    # model_executor/layers/deepseek_v4_attention.py, DeepseekV4MLAModules.kv_norm, under `layers.N.attn.` with
    # no renaming in deepseek_v4.py's WeightsMapper @f1b76c19); transformers' save writes it `attn.norm`
    "deepseek_v4": [(r"^model\.embed_tokens\.", "embed."), (r"^model\.hc_head\.hc_", "hc_head_"),
                    (r"\.attn\.norm\.", ".attn.kv_norm."), (r"^model\.", "")],
    "kimi_linear": [(r"\.block_sparse_moe\.(gate|up|down)_proj\.", r".mlp.\1_proj.")],
}
"""transformers' spelling back to the release's (the conversion mapping's renames that save_pretrained
reverses, read once more)."""


def rewrite(src: Path, dst: Path, change: Callable[[Shards], None], drop: str | None = None) -> None:
    """A copy of `src` with `change` applied to its shards (and the shard `drop` deleted), its index kept true."""
    shutil.copytree(src, dst)
    index = json.loads((dst / INDEX_FILE).read_text())
    shards: Shards = {f: load_file(dst / f) for f in sorted(set(index["weight_map"].values()))}
    change(shards)
    index["weight_map"] = {n: f for f, ts in shards.items() for n in sorted(ts)}
    index["metadata"]["total_size"] = sum(t.numel() * t.element_size() for ts in shards.values() for t in ts.values())
    index["metadata"].pop("total_parameters", None)
    for f, tensors in shards.items():
        save_file(tensors, dst / f, metadata={"format": "pt"})
    if drop is not None:
        (dst / drop).unlink()
    (dst / INDEX_FILE).write_text(json.dumps(index, indent=2))


RELEASE_NORM_DTYPE = {"deepseek_v4": torch.bfloat16}
"""The RMSNorm gains' dtype where the release's differs from transformers' save: DeepSeek-V4-Flash's published
index total_size holds only with BF16 gains (tests/data/published_totals.json); transformers keeps them F32."""


def respell(model_type: str, only: str | None = None) -> Callable[[Shards], None]:
    def change(shards: Shards) -> None:
        for f, ts in shards.items():
            renamed = {}
            for n, t in ts.items():
                if only is None or n == only:
                    for pattern, to in RELEASE_SPELLING[model_type]:
                        n = re.sub(pattern, to, n)
                    if model_type in RELEASE_NORM_DTYPE and n.endswith("norm.weight"):
                        t = t.to(RELEASE_NORM_DTYPE[model_type])
                renamed[n] = t
            shards[f] = renamed
    return change


@pytest.mark.parametrize("model_type", list(TINY))
def test_params_agrees_with_the_audit(saved: dict[str, tuple[Path, int]], model_type: str) -> None:
    """`params` reads the same tree: the derived total matches the stored one, exit 0 as the audit's."""
    r = CliRunner().invoke(app, ["params", str(saved[model_type][0])], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "MATCH" in r.stdout and "✗" not in r.stdout


V4_MTP_OWN = {"e_proj.weight": ("h", "h"), "h_proj.weight": ("h", "h"), "enorm.weight": ("h",),
              "hnorm.weight": ("h",), "norm.weight": ("h",), "hc_head_fn": ("c", "c*h"), "hc_head_base": ("c",),
              "hc_head_scale": (1,)}
"""An MTP stage's own tensors, as vLLM's loader reads them from the release (vllm-project/vllm@45292767
model_executor/models/deepseek_v4_mtp.py: DeepSeekV4MultiTokenPredictorLayer's enorm, hnorm, e_proj, h_proj
[hidden, hidden], hc_head_{fn,base,scale}, and `.norm.weight` for its shared head); beside them its `mtp_block`,
a DeepseekV4DecoderLayer named like any layer, under `mtp.{i}.` (the loader maps `mtp.{i}.` onto it)."""


def with_v4_mtp(shards: Shards) -> None:
    """The release's MTP stage `mtp.0.*`: V4_MTP_OWN, and a decoder layer (sliding-window attention as the MTP
    layer's compress ratio 0 gives, the routing bias as every layer past the hash-routed ones) built from the
    tiny model's own layer 0 attention and layer 1 MoE."""
    keys = TINY["deepseek_v4"]
    h, c = keys["hidden_size"], keys["hc_mult"]
    size = {"h": h, "c": c, "c*h": c * h, 1: 1}
    first = next(iter(shards.values()))
    for name, dims in V4_MTP_OWN.items():
        dtype = torch.bfloat16 if name.endswith(("proj.weight", "norm.weight")) else torch.float32
        first["mtp.0." + name] = torch.ones(tuple(size[d] for d in dims), dtype=dtype) / 8
    with_v4_stage_layers(shards, ["mtp.0."])


def with_v4_stage_layers(shards: Shards, stages: list[str]) -> None:
    """A decoder layer under each stage prefix, in the first shard: the tiny model's layer 0 attention
    (sliding-window, as every MTP stage's) and layer 1 MoE (bias-routed, as every layer past the hash-routed)."""
    first = next(iter(shards.values()))
    for ts in list(shards.values()):
        for name, t in list(ts.items()):
            for layer, parts in ((0, ("attn.", "attn_norm.", "hc_attn_")), (1, ("ffn.", "ffn_norm.", "hc_ffn_"))):
                rest = name.removeprefix(f"layers.{layer}.")
                if rest != name and rest.startswith(parts):
                    for stage in stages:
                        first[stage + rest] = t.clone()


@pytest.mark.parametrize("model_type", list(TINY))
def test_release_spelling_audits_clean(saved: dict[str, tuple[Path, int]], tmp_path: Path, model_type: str) -> None:
    """transformers' save respelled as the release (the loaders' names), with V4's MTP stage as vLLM reads it:
    no finding at all."""
    def change(shards: Shards) -> None:
        respell(model_type)(shards)
        if model_type == "deepseek_v4":
            with_v4_mtp(shards)

    rewrite(saved[model_type][0], tmp_path / "release", change)
    report = audit(tmp_path / "release")
    assert report.findings == ()
    cfg = model_config_from_dict(json.loads((tmp_path / "release" / "config.json").read_text()))
    assert report.stats.tensors == len(expected_layout(cfg))  # V4: its MTP stage included


def test_v4_mtp_stage_is_described_and_checked(saved: dict[str, tuple[Path, int]], tmp_path: Path) -> None:
    """The release's `mtp.0.*` was set aside as undescribed (one TENSORS_UNDESCRIBED, its scales SCALE_UNEXPECTED);
    it is now described and checked: a stage missing one tensor is that one finding, an unknown tensor inside it
    is TENSOR_UNEXPECTED."""
    def change(shards: Shards) -> None:
        respell("deepseek_v4")(shards)
        with_v4_mtp(shards)
        first = next(iter(shards.values()))
        del first["mtp.0.hnorm.weight"]
        first["mtp.0.ffn.extra.weight"] = torch.zeros(2)
    rewrite(saved["deepseek_v4"][0], tmp_path / "mtp", change)
    report = audit(tmp_path / "mtp")
    assert sorted((f.code, f.tensor) for f in report.findings) == [
        ("TENSOR_MISSING", "mtp.0.hnorm.weight"), ("TENSOR_UNEXPECTED", "mtp.0.ffn.extra.weight")]


def test_a_mixture_of_spellings_is_findings(saved: dict[str, tuple[Path, int]], tmp_path: Path) -> None:
    rewrite(saved["deepseek_v4"][0], tmp_path / "mixed", respell("deepseek_v4", only="model.embed_tokens.weight"))
    report = audit(tmp_path / "mixed")
    got = {(f.code, f.tensor) for f in by_severity(report, Severity.ERROR)}
    assert got == {("TENSOR_MISSING", "model.embed_tokens.weight"), ("TENSOR_UNEXPECTED", "embed.weight")}


def holding(shards: Shards, name: str) -> dict[str, torch.Tensor]:
    return next(t for t in shards.values() if name in t)


def remove(name: str) -> Callable[[Shards], None]:
    def change(s: Shards) -> None:
        del holding(s, name)[name]
    return change


def reshape(name: str) -> Callable[[Shards], None]:
    def change(s: Shards) -> None:
        shard = holding(s, name)
        shard[name] = shard[name][:-1].contiguous()
    return change


L = "model.layers."
FAULTS: dict[str, tuple[str, Callable[[Shards], None], tuple[str, str]]] = {
    "v4-router-bias-missing": ("deepseek_v4", remove(f"{L}1.ffn.gate.bias"),
                               ("TENSOR_MISSING", f"{L}1.ffn.gate.bias")),
    "v4-hash-table-missing": ("deepseek_v4", remove(f"{L}0.ffn.gate.tid2eid"),
                              ("TENSOR_MISSING", f"{L}0.ffn.gate.tid2eid")),
    "v4-indexer-missing": ("deepseek_v4", remove(f"{L}3.attn.indexer.wq_b.weight"),
                           ("TENSOR_MISSING", f"{L}3.attn.indexer.wq_b.weight")),
    "v4-hyper-connection-shape": ("deepseek_v4", reshape(f"{L}2.hc_ffn_fn"), ("SHAPE_MISMATCH", f"{L}2.hc_ffn_fn")),
    "v4-compressor-shape": ("deepseek_v4", reshape(f"{L}2.attn.compressor.ape"),
                            ("SHAPE_MISMATCH", f"{L}2.attn.compressor.ape")),
    "kda-conv-shape": ("kimi_linear", reshape(f"{L}0.self_attn.k_conv1d.weight"),
                       ("SHAPE_MISMATCH", f"{L}0.self_attn.k_conv1d.weight")),
    "kda-dt-bias-missing": ("kimi_linear", remove(f"{L}2.self_attn.dt_bias"),
                            ("TENSOR_MISSING", f"{L}2.self_attn.dt_bias")),
    "kimi-linear-expert-missing": ("kimi_linear", remove(f"{L}3.block_sparse_moe.experts.1.w3.weight"),
                                   ("TENSOR_MISSING", f"{L}3.block_sparse_moe.experts.1.w3.weight")),
    "mla-latent-norm-missing": ("kimi_linear", remove(f"{L}1.self_attn.q_a_layernorm.weight"),
                                ("TENSOR_MISSING", f"{L}1.self_attn.q_a_layernorm.weight")),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fault_is_named_once(saved: dict[str, tuple[Path, int]], tmp_path: Path, fault: str) -> None:
    model_type, change, want = FAULTS[fault]
    rewrite(saved[model_type][0], tmp_path / fault, change)
    report = audit(tmp_path / fault)
    assert [(f.code, f.tensor) for f in by_severity(report, Severity.ERROR)] == [want]


@pytest.mark.parametrize("model_type", list(TINY))
def test_an_absent_shard_is_one_finding(saved: dict[str, tuple[Path, int]], tmp_path: Path, model_type: str) -> None:
    src = saved[model_type][0]
    shard = sorted(src.glob("*.safetensors"))[1].name
    rewrite(src, tmp_path / "absent", lambda s: None, drop=shard)
    errors = by_severity(audit(tmp_path / "absent"), Severity.ERROR)
    assert [(f.code, f.shard) for f in errors] == [("INDEX_SHARD_ABSENT", shard)] and errors[0].covers


def test_a_module_family_in_another_spelling_is_one_finding(saved: dict[str, tuple[Path, int]],
                                                            tmp_path: Path) -> None:
    """llmcompressor writes Kimi-Linear's routed experts `gate/up/down_proj` where the release has `w1/w3/w2`
    (family.md): 218 findings on a tiny model, one TENSOR_MISSING and one TENSOR_UNEXPECTED per tensor. Each
    respelled family is now one TENSORS_RESPELLED, covering its pairs; a lone odd name stays its own finding."""
    spelled = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}

    def change(shards: Shards) -> None:
        respell("kimi_linear")(shards)
        for f, ts in shards.items():
            shards[f] = {re.sub(r"(\.experts\.\d+\.)(w[123])\.", lambda m: m.group(1) + spelled[m.group(2)] + ".", n):
                         t for n, t in ts.items()}
        first = next(iter(shards.values()))
        first["model.layers.1.block_sparse_moe.stray.weight"] = torch.zeros(2)
    rewrite(saved["kimi_linear"][0], tmp_path / "llmc", change)
    report = audit(tmp_path / "llmc")
    respelled = [(f.expected, f.actual, f.covers) for f in report.findings if f.code == "TENSORS_RESPELLED"]
    experts = sum(1 for k in TINY["kimi_linear"]["mlp_layer_types"] if k == "sparse") * \
        TINY["kimi_linear"]["num_local_experts"]
    assert respelled == [(["w1", "w2", "w3"], ["down_proj", "gate_proj", "up_proj"], 2 * 3 * experts)]
    assert [(f.code, f.tensor) for f in report.findings if f.code != "TENSORS_RESPELLED"] == [
        ("TENSOR_UNEXPECTED", "model.layers.1.block_sparse_moe.stray.weight")]


def test_a_respelled_fp8_block_family_covers_its_scales(tmp_path: Path) -> None:
    """Issue 38: llmcompressor's FP8_BLOCK Kimi-Linear, experts `gate/up/down_proj` with their `weight_scale`: the
    family was one TENSORS_RESPELLED, but each misnamed weight's scale was two more errors (its scale unplanned,
    a DeepSeek scale asked for): 72 on a tiny model. The respelled modules' scale findings are the same cause.
    (The stored names and shapes come from the layout here: what is under test is the folding, not the layout.)"""
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file as save_numpy

    cfg = KimiLinearConfig(**TINY["kimi_linear"]).to_dict()
    cfg["torch_dtype"] = "bfloat16"
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
        "ignore": ["lm_head"], "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128], "symmetric": True,
            "dynamic": False}}}}
    dtypes = {"BF16": ml_dtypes.bfloat16, "F32": np.float32, "F8_E4M3": ml_dtypes.float8_e4m3fn}
    spelled = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}
    tensors = {re.sub(r"(\.experts\.\d+\.)(w[123])\.", lambda m: m.group(1) + spelled[m.group(2)] + ".", n):
               np.ones(e.shape, dtypes[e.dtype]) for n, e in expected_layout(model_config_from_dict(cfg)).items()
               if e.kind != BUFFER}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_numpy(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    report = audit(tmp_path)
    experts = sum(1 for k in TINY["kimi_linear"]["mlp_layer_types"] if k == "sparse") * \
        TINY["kimi_linear"]["num_local_experts"]
    assert [(f.code, f.covers) for f in report.findings if f.severity is Severity.ERROR] == [
        ("TENSORS_RESPELLED", 4 * 3 * experts)]  # the weights missing and stored, and the two scale findings each
