"""The parameter accounting tree: derived counts from config, found counts from headers, mismatches flagged."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from typer.testing import CliRunner

from hub_repos import TINY_REPO
from kimi_audit.cli import app
from kimi_audit.format.header import TensorInfo
from kimi_audit.model.accounting.account import accounting_of_checkpoint, build_accounting
from kimi_audit.model.accounting.tree import UNACCOUNTED
from kimi_audit.model.checkpoint import load_checkpoint
from kimi_audit.model.config import model_config_from_dict, parse_config_bytes, pinned_config_bytes
from kimi_audit.model.kinds import BUFFER, PACKED, PARAMETER, SCALE
from kimi_audit.model.layout import expected_layout
from kimi_audit.replica.build import ReplicaTensor, replica_shards, write_shard
from kimi_audit.report.accounting import accounting_dict
from kimi_audit.sources import LocalSource
from tiny_checkpoint import TINY_CONFIG, tiny_shards, write_tiny

# Figures recorded for the pinned checkpoint (an inspection of its headers: shared/reference/kimi-k2-instruct.layout.md,
# not a figure its publisher states): compared against, never used to compute.
PINNED_PARAMETERS = 1_026_408_232_448
PINNED_BY_DTYPE = {"F8_E4M3": 1_023_893_241_856, "BF16": 2_514_967_552, "F32": 23_040}
PINNED_SCALE_ELEMENTS = 62_495_192
PINNED_BUFFER_ELEMENTS = 3_416
MOE_QA = "blocks.moe.attention.q_compression.q_a_layernorm"
runner = CliRunner()


def acc_of(path):
    return accounting_of_checkpoint(load_checkpoint(LocalSource(path)))


def layout_parameters(cfg) -> int:
    return sum(t.numel for t in expected_layout(cfg).values() if t.kind == PARAMETER)


@pytest.fixture(scope="module")
def replica_acc(replica_dir):
    return acc_of(replica_dir)


def assert_all_agree(acc):
    for _, n in acc.root.walk():
        assert (n.derived, n.derived_tensors) == (n.found, n.found_tensors), n.key
        assert not n.mismatch, n.key


def test_replica_tree_totals_equal_the_pinned_count(replica_acc):
    assert replica_acc.derived == replica_acc.found == PINNED_PARAMETERS
    assert {r.dtype: r.found for r in replica_acc.dtypes} == PINNED_BY_DTYPE
    assert {r.dtype: r.derived for r in replica_acc.dtypes} == PINNED_BY_DTYPE
    assert_all_agree(replica_acc)
    excluded = {kind: sum(r.found_elements for r in replica_acc.excluded if r.kind == kind) for kind in
                (SCALE, BUFFER)}
    assert excluded == {SCALE: PINNED_SCALE_ELEMENTS, BUFFER: PINNED_BUFFER_ELEMENTS}


def test_replica_tree_structure_and_formulas_follow_the_config(replica_acc):
    _, cfg = parse_config_bytes(pinned_config_bytes())
    n_moe = sum(1 for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i))
    qa = replica_acc.node(MOE_QA)
    assert qa.derived == cfg.q_lora_rank * n_moe
    assert qa.formula == f"{cfg.q_lora_rank:,} × {n_moe} MoE blocks = {cfg.q_lora_rank * n_moe:,}"
    assert [n.title for n in replica_acc.path_to(MOE_QA)][1:] == [
        f"{cfg.num_hidden_layers} transformer blocks", f"{n_moe} MoE blocks", "Latent attention",
        "Query compression", "Query latent RMSNorm"]
    assert [c.key for c in replica_acc.root.children] == ["embedding", "blocks", "norm", "lm_head"]
    moe = replica_acc.node("blocks.moe")
    assert [c.name for c in moe.children] == ["norms", "attention", "router", "experts", "shared_experts"]
    experts = replica_acc.node("blocks.moe.experts")
    per_expert = 3 * cfg.moe_intermediate_size * cfg.hidden_size
    assert experts.per_instance == per_expert
    assert experts.derived == per_expert * cfg.n_routed_experts * n_moe
    bias = replica_acc.node("blocks.moe.router.e_score_correction_bias")
    assert bias.derived == cfg.n_routed_experts * n_moe and {t.dtype for t in bias.tensors} == {"F32"}
    # every node's formula ends in its own derived count
    for _, n in replica_acc.root.walk():
        assert n.formula.endswith(f"{n.derived:,}"), n.key
    # the tree and the expected layout (built independently) agree on every parameter
    assert replica_acc.derived == layout_parameters(cfg)


def test_activated_parameters_per_token(replica_acc):
    _, cfg = parse_config_bytes(pinned_config_bytes())
    n_moe = sum(1 for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i))
    per_expert = 3 * cfg.moe_intermediate_size * cfg.hidden_size
    routed = per_expert * cfg.n_routed_experts * n_moe
    want = PINNED_PARAMETERS - routed + per_expert * cfg.num_experts_per_tok * n_moe
    a = replica_acc.activation
    assert a.per_token == want
    assert a.routed_total == routed
    assert a.without_embedding == want - cfg.vocab_size * cfg.hidden_size
    tech, card = replica_acc.comparisons
    assert tech.published_activated == 32.6e9 and card.published_total == 1e12
    assert tech.activated_ratio == pytest.approx(want / 32.6e9)
    assert tech.total_ratio == pytest.approx(PINNED_PARAMETERS / 1.04e12)
    # 1.026T is within 2% of the tech report's "1.04T"; 32.86B is within 1% of its "32.6B"
    assert abs(tech.total_ratio - 1) < 0.02 and abs(tech.activated_ratio - 1) < 0.01


def test_fault_in_a_full_scale_shard_flags_exactly_its_node(replica_copy):
    _, cfg = parse_config_bytes(pinned_config_bytes())
    shard = "model-6-of-61.safetensors"
    victim = "model.layers.5.self_attn.q_a_layernorm.weight"
    tensors = [ReplicaTensor(t.name, t.dtype, (1535,)) if t.name == victim else t
               for t in replica_shards(cfg)[shard]]
    write_shard(replica_copy / (shard + ".new"), tensors, seed=5, fill_small=False)
    os.replace(replica_copy / (shard + ".new"), replica_copy / shard)
    acc = acc_of(replica_copy)
    qa = acc.node(MOE_QA)
    assert qa.own_mismatch and (qa.derived, qa.found) == (92_160, 92_159)
    flagged = {n.key for _, n in acc.root.walk() if n.mismatch}
    assert flagged == {"model", "blocks", "blocks.moe", "blocks.moe.attention", "blocks.moe.attention.q_compression",
                       MOE_QA}
    assert {n.key for _, n in acc.root.walk() if n.own_mismatch} == {MOE_QA}
    assert acc.found == PINNED_PARAMETERS - 1


def test_tiny_tree_agrees_with_its_layout(tiny_dir):
    acc = acc_of(tiny_dir)
    cfg = model_config_from_dict(TINY_CONFIG)
    assert acc.derived == acc.found == layout_parameters(cfg)
    assert_all_agree(acc)
    assert acc.node(MOE_QA).derived == TINY_CONFIG["q_lora_rank"] * 3
    assert acc.comparisons == ()  # the published figures are Kimi-K2's, not this model's


def mutated(tmp_path, mutate):
    shards = tiny_shards()
    mutate(shards)
    return write_tiny(tmp_path / "ckpt", shards)


S2 = "model-2-of-3.safetensors"


def test_missing_and_wrong_dtype_tensors_are_flagged(tmp_path):
    def mutate(s):
        s[S2].pop("model.layers.1.mlp.experts.3.up_proj.weight")
        s[S2].pop("model.layers.1.mlp.experts.3.up_proj.weight_scale_inv")
        # F16 in a BF16 checkpoint: no writer variance explains it (F32 or the config's dtype would: WRITER_DTYPE)
        s[S2]["model.layers.2.self_attn.kv_a_layernorm.weight"] = \
            s[S2]["model.layers.2.self_attn.kv_a_layernorm.weight"].astype(np.float16)
    acc = acc_of(mutated(tmp_path, mutate))
    up = acc.node("blocks.moe.experts.up_proj")
    assert up.found_tensors == up.derived_tensors - 1 and up.found == up.derived - up.per_instance
    kv = acc.node("blocks.moe.attention.kv_compression.kv_a_layernorm")
    assert kv.found == kv.derived and not kv.dtype_ok and kv.own_mismatch
    assert {n.key for _, n in acc.root.walk() if n.own_mismatch} == {up.key, kv.key}
    assert {r.dtype: r.found for r in acc.dtypes}["F16"] > {r.dtype: r.derived for r in acc.dtypes}["F16"]


def test_a_norm_kept_in_float32_is_writer_variance(tmp_path):
    """Gains stored F32 in a BF16 checkpoint (a writer that keeps norms in float32): counted, not flagged, in
    params as in audit (WRITER_DTYPE, info), where every one is so; one cast on its own is flagged in both."""
    def every(s):
        for tensors in s.values():
            for n in [n for n in tensors if n.endswith("self_attn.kv_a_layernorm.weight")]:
                tensors[n] = tensors[n].astype(np.float32)
    acc = acc_of(mutated(tmp_path / "every", every))
    kv = acc.node("blocks.moe.attention.kv_compression.kv_a_layernorm")
    assert kv.found == kv.derived and kv.dtype_ok and not acc.mismatch

    def one(s):
        s[S2]["model.layers.2.self_attn.kv_a_layernorm.weight"] = \
            s[S2]["model.layers.2.self_attn.kv_a_layernorm.weight"].astype(np.float32)
    kv = acc_of(mutated(tmp_path / "one", one)).node("blocks.moe.attention.kv_compression.kv_a_layernorm")
    assert kv.found == kv.derived and not kv.dtype_ok


def test_extra_expert_and_unknown_tensor_are_flagged(tmp_path):
    def mutate(s):
        n = TINY_CONFIG["n_routed_experts"]
        first = s[S2]["model.layers.1.mlp.experts.0.gate_proj.weight"]
        s[S2][f"model.layers.1.mlp.experts.{n}.gate_proj.weight"] = first
        s[S2]["model.layers.1.self_attn.extra.weight"] = np.ones(7, dtype=ml_dtypes.bfloat16)
    acc = acc_of(mutated(tmp_path, mutate))
    gate = acc.node("blocks.moe.experts.gate_proj")
    assert gate.found_tensors == gate.derived_tensors + 1 and gate.own_mismatch
    extra = acc.node(UNACCOUNTED)
    assert [t.name for t in extra.tensors] == ["model.layers.1.self_attn.extra.weight"]
    assert extra.found == 7 and extra.mismatch and acc.found == acc.derived + gate.per_instance + 7


@pytest.mark.parametrize("change", [
    {"tie_word_embeddings": True},
    {"q_lora_rank": None},
    {"num_nextn_predict_layers": 1},
    {"n_shared_experts": 2, "attention_bias": True},
    {"first_k_dense_replace": 2, "moe_layer_freq": 2, "num_hidden_layers": 6},
    {"quantization_config": None, "topk_method": "greedy"},
])
def test_derived_tree_matches_the_layout_for_config_variants(change):
    cfg = model_config_from_dict({**TINY_CONFIG, **change})
    acc = build_accounting(cfg, {})
    assert acc.derived == layout_parameters(cfg)
    assert acc.found == 0 and acc.mismatch
    keys = {n.key for n in acc.nodes()}
    assert ("lm_head" in keys) is not cfg.tie_word_embeddings
    assert ("mtp" in keys) is (cfg.num_nextn_predict_layers > 0)
    assert ("blocks.moe.attention.q_projection.q_proj" in keys) is (cfg.q_lora_rank is None)
    dtypes = {r.dtype for r in acc.dtypes}
    assert ("F8_E4M3" in dtypes) is (cfg.quant is not None)


def test_params_cli_json_and_exit_codes(tiny_dir, tmp_path):
    r = runner.invoke(app, ["params", str(tiny_dir), "--json", "--no-progress", "--depth", "1"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "kimi-audit/params/1"
    assert doc["total"] == {"derived": doc["tree"]["found"], "found": doc["tree"]["found"], "mismatch": False,
                            "complete": True, "incomplete": None}
    assert [c["key"] for c in doc["tree"]["children"]] == ["embedding", "blocks", "norm", "lm_head"]
    assert all("children" not in c for c in doc["tree"]["children"])  # --depth 1
    assert sum(r["found"] for r in doc["by_dtype"]) == doc["total"]["found"]
    assert doc["activated"]["per_token"] < doc["total"]["derived"]
    r = runner.invoke(app, ["params", str(tiny_dir), "--no-progress"])
    assert r.exit_code == 0 and "Query latent RMSNorm" in r.stdout and "MATCH" in r.stdout
    bad = mutated(tmp_path, lambda s: s[S2].pop("model.layers.1.self_attn.q_a_layernorm.weight"))
    r = runner.invoke(app, ["params", str(bad), "--no-progress"])
    assert r.exit_code == 1 and "MISMATCH" in r.stdout
    r = runner.invoke(app, ["params", str(tmp_path / "nope"), "--no-progress"])
    assert r.exit_code == 2


def test_accounting_dict_is_json_and_complete(tiny_dir):
    acc = acc_of(tiny_dir)
    doc = json.loads(json.dumps(accounting_dict(acc)))
    leaves = []

    def walk(n):
        if "children" in n:
            for c in n["children"]:
                walk(c)
        else:
            leaves.append(n)
    walk(doc["tree"])
    assert sum(leaf["found"] for leaf in leaves) == acc.found
    assert all(leaf["formula"] and leaf["tensors"] for leaf in leaves)


def test_params_over_the_hub_equal_local(hub, tiny_dir):
    commit = hub.repos[TINY_REPO].commit
    r = runner.invoke(app, ["params", f"{TINY_REPO}@{commit[:8]}", "--json", "--no-progress"])
    assert r.exit_code == 0, r.output
    remote = json.loads(r.stdout)
    local = accounting_dict(acc_of(tiny_dir))
    assert remote["revision"] == commit
    assert remote["tree"] == local["tree"] and remote["total"] == local["total"]
    r = runner.invoke(app, ["explain", TINY_REPO, "q_a_layernorm", "--no-progress"])
    assert r.exit_code == 0 and "Query latent RMSNorm" in r.stdout


# --- the family beyond Kimi-K2-Instruct: INT4 (Kimi-K2-Thinking), MTP (DeepSeek-V3), indexer (V3.2) -------------

DATA = Path(__file__).parent.parent / "kimi_audit" / "data"
DEEPSEEK_V3 = Path(__file__).parent / "data" / "deepseek-v3.config.json"
# Figures from family.md (derived there from the config)
V3_PARAMETERS = 684_489_845_504
V3_MAIN_ONLY = 671_026_419_200
V3_TENSORS_WITHOUT_BUFFERS = 91_991
V3_ELEMENTS_WITH_SCALES = 684_531_386_000
V32_ELEMENTS_WITH_SCALES = 685_396_921_376
EXPERT_GATE = "blocks.moe.experts.gate_proj"


def thinking_raw() -> dict:
    """Kimi-K2-Thinking's config, as the package ships it."""
    return json.loads((DATA / "kimi-k2-thinking.config.json").read_text())


def v32_raw() -> dict:
    """DeepSeek-V3.2's config, as the package ships it."""
    return json.loads((DATA / "deepseek-v32.config.json").read_text())


def as_found(layout) -> dict:
    """Headers holding exactly the layout (a Located table, no files): the found side of a faithful checkpoint."""
    return {e.name: (TensorInfo(e.name, e.dtype, e.shape, 0, 0), f"model-{(e.layer or 0) + 1}.safetensors")
            for e in layout.values()}


def layout_elements(layout, kinds=(PARAMETER, PACKED, SCALE, BUFFER)) -> Counter:
    out: Counter = Counter()
    for e in layout.values():
        if e.kind in kinds:
            out[e.dtype] += e.numel
    return out


@pytest.fixture(scope="module")
def thinking():
    cfg = model_config_from_dict(thinking_raw())
    layout = expected_layout(cfg)
    return cfg, layout, build_accounting(cfg, as_found(layout), layout)


def test_thinking_counts_int4_modules_as_out_times_in(thinking):
    cfg, layout, acc = thinking
    _, instruct = parse_config_bytes(pinned_config_bytes())
    derived_only = build_accounting(cfg, {})
    assert derived_only.derived == build_accounting(instruct, {}).derived == PINNED_PARAMETERS
    assert acc.derived == acc.found == PINNED_PARAMETERS
    assert_all_agree(acc)
    routed = 3 * cfg.moe_intermediate_size * cfg.hidden_size * cfg.n_routed_experts * 60
    params = {r.dtype: (r.derived, r.found) for r in acc.dtypes}
    assert params["INT4"] == (routed, routed)
    assert params["BF16"][0] == PINNED_PARAMETERS - routed - 23_040 and params["F32"] == (23_040, 23_040)
    # stored elements by dtype add up to the layout's, tensor for tensor (packed words, group scales, shapes)
    stored = {r.dtype: (r.derived, r.found) for r in acc.stored}
    assert {d: v[0] for d, v in stored.items()} == layout_elements(layout)
    assert all(d == f for d, f in stored.values())
    assert stored["I32"][0] == routed // 8 + 2 * 3 * cfg.n_routed_experts * 60 and "I64" not in stored  # shapes
    # metadata is listed apart and never counted
    meta = [r for r in acc.excluded if r.kind == SCALE]
    assert {r.pattern.rsplit(".", 1)[1] for r in meta} == {"weight_scale", "weight_shape"}
    assert sum(r.found_elements for r in meta) == sum(layout_elements(layout, (SCALE,)).values())


def test_thinking_expert_node_shows_its_packing(thinking):
    _, _, acc = thinking
    gate = acc.node(EXPERT_GATE)
    (p,) = gate.parts
    assert (p.kind, p.dtype, p.logical_dtype) == (PACKED, "I32", "INT4")
    assert p.component == "mlp.experts.gate_proj.weight_packed"
    assert (p.calculation(), p.numel) == ("2,048 × 7,168", 14_680_064)
    assert gate.formula == "2,048 × 7,168 × 384 experts × 60 MoE blocks = 338,228,674,560"
    assert [(s.component.rsplit(".", 1)[1], s.dtype, s.shape, s.kind) for s in gate.stored_parts] == [
        ("weight_packed", "I32", (2048, 896), PACKED), ("weight_scale", "BF16", (2048, 224), SCALE),
        ("weight_shape", "I32", (2,), SCALE)]
    assert gate.stored_parts[0].logical == 14_680_064 and gate.stored_parts[1].logical == 0
    (scheme,) = gate.schemes
    assert "INT4" in scheme and "8 per I32 word" in scheme and "32 inputs" in scheme
    assert gate.found == gate.derived and gate.found_tensors == 23_040 and len(gate.scales) == 2 * 23_040
    assert {r.dtype: r.derived for r in gate.stored} == {"I32": 23_040 * 2048 * 896 + 23_040 * 2,
                                                          "BF16": 23_040 * 2048 * 224}
    # attention, shared experts, the dense MLP and lm_head stay BF16 (the ignore list), without metadata
    for key in ("blocks.moe.attention.q_compression.q_a_proj", "blocks.moe.shared_experts.gate_proj",
                "blocks.dense.mlp.down_proj", "lm_head"):
        (q,) = acc.node(key).parts
        assert (q.kind, q.dtype, q.meta) == (PARAMETER, "BF16", ()), key


def test_thinking_missing_packed_words_and_scales(thinking):
    cfg, layout, _ = thinking
    found = as_found(layout)
    del found["model.layers.7.mlp.experts.5.up_proj.weight_packed"]
    del found["model.layers.9.mlp.experts.1.down_proj.weight_scale"]
    acc = build_accounting(cfg, found, layout)
    up = acc.node("blocks.moe.experts.up_proj")
    assert up.own_mismatch and up.derived - up.found == 14_680_064
    assert {n.key for _, n in acc.root.walk() if n.own_mismatch} == {up.key}  # metadata is no parameter
    (row,) = [r for r in acc.excluded if r.derived_tensors != r.found_tensors]
    assert row.kind == SCALE and row.pattern.endswith("down_proj.weight_scale")


def test_thinking_accounting_dict(thinking):
    _, _, acc = thinking
    doc = json.loads(json.dumps(accounting_dict(acc)))
    assert {r["dtype"] for r in doc["by_dtype"]} == {"INT4", "BF16", "F32"}
    assert sum(r["derived"] for r in doc["stored_by_dtype"]) == sum(r.derived for r in acc.stored)
    assert doc["mtp"] is None and doc["tree"]["stored_by_dtype"]

    def find(n, key):
        if n["key"] == key:
            return n
        return next((f for c in n.get("children", []) if (f := find(c, key))), None)
    gate = find(doc["tree"], EXPERT_GATE)
    assert gate["parts"][0]["dtype"] == "INT4" and gate["parts"][0]["stored_dtype"] == "I32"
    assert [t["dtype"] for t in gate["stored_tensors"]] == ["I32", "BF16", "I32"]
    assert gate["stored_tensors"][0]["counts_for"] == 14_680_064 and "INT4" in gate["quantization"][0]
    assert gate["metadata"] and all(".weight_s" in m for m in gate["metadata"])


def test_deepseek_v3_mtp_is_its_own_node():
    cfg = model_config_from_dict(json.loads(DEEPSEEK_V3.read_text()))
    acc = build_accounting(cfg, {})
    assert [c.key for c in acc.root.children] == ["embedding", "blocks", "mtp", "norm", "lm_head"]
    mtp = acc.node("mtp")
    assert mtp.title == "Multi-token prediction (layer 61)" and mtp.layers == (61,)
    table = cfg.vocab_size * cfg.hidden_size
    assert acc.derived == acc.mtp.total == V3_PARAMETERS
    assert acc.mtp.main == V3_MAIN_ONLY == V3_PARAMETERS - mtp.derived
    assert acc.mtp.duplicates == 2 * table and acc.mtp.counted_once == V3_PARAMETERS - 2 * table
    embed, head = acc.node("mtp.mtp_head.embed_tokens"), acc.node("mtp.mtp_head.shared_head_head")
    assert embed.derived == head.derived == table
    assert "model.embed_tokens" in embed.note and "lm_head" in head.note
    (eh,) = acc.node("mtp.mtp_head.eh_proj").parts
    assert (eh.dtype, eh.meta, eh.numel) == ("BF16", (), cfg.hidden_size * 2 * cfg.hidden_size)  # no scale
    assert acc.node("mtp.experts.gate_proj").parts[0].meta[0].dtype == "F32"  # a full FP8 MoE block
    # activated parameters exclude MTP
    a = acc.activation
    routed = acc.node("blocks.moe.experts").derived
    assert a.mtp_excluded == mtp.derived
    assert a.per_token == V3_MAIN_ONLY - routed + routed * cfg.num_experts_per_tok // cfg.n_routed_experts
    # totals on a full-scale replica (family.md): tensors and elements, scales included, buffers not
    meta = [r for r in acc.excluded if r.kind == SCALE]
    # buffers are optional: the stored totals count those stored, on both sides
    buffers = sum(r.found_elements for r in acc.excluded if r.kind == BUFFER)
    assert acc.root.derived_tensors + sum(r.derived_tensors for r in meta) == V3_TENSORS_WITHOUT_BUFFERS
    assert sum(r.derived for r in acc.stored) - buffers == V3_ELEMENTS_WITH_SCALES
    doc = accounting_dict(acc)
    assert doc["mtp"]["main_only"] == V3_MAIN_ONLY and doc["mtp"]["total_with_mtp"] == V3_PARAMETERS


def test_deepseek_v32_indexer_and_f32_gains():
    cfg = model_config_from_dict(v32_raw())
    layout = expected_layout(cfg)
    acc = build_accounting(cfg, as_found(layout), layout)
    assert_all_agree(acc)
    idx = acc.node("blocks.moe.attention.indexer")
    assert [c.name for c in idx.children] == ["wq_b", "wk", "k_norm", "weights_proj"]
    assert idx.per_instance == 8192 * 1536 + 128 * 7168 + 2 * 128 + 64 * 7168
    assert [(p.label, p.dtype) for p in acc.node("blocks.moe.attention.indexer.k_norm").parts] == [
        ("Learned gain", "F32"), ("Bias", "F32")]
    assert [s.shape for s in acc.node("blocks.moe.attention.indexer.wq_b").stored_parts] == [(8192, 1536), (64, 12)]
    assert acc.node("mtp.attention.indexer").derived == idx.per_instance
    for key in ("blocks.moe.norms.input_layernorm", "blocks.dense.attention.q_compression.q_a_layernorm",
                "mtp.mtp_head.enorm", "norm"):
        assert {p.dtype for p in acc.node(key).parts} == {"F32"}, key
        assert {t.dtype for t in acc.node(key).tensors} == {"F32"}, key
    # buffers are optional: the stored totals count those stored, on both sides
    buffers = sum(r.found_elements for r in acc.excluded if r.kind == BUFFER)
    assert sum(r.derived for r in acc.stored) - buffers == V32_ELEMENTS_WITH_SCALES
