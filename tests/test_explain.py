"""Explain cards: the seed card's content for q_a_layernorm, computed from config and headers; node lookup."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kimi_audit.cli import app
from kimi_audit.errors import KimiAuditError
from kimi_audit.model.accounting.account import accounting_of_checkpoint, build_accounting
from kimi_audit.model.checkpoint import load_checkpoint
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.explain import build_card, find_nodes
from kimi_audit.model.explain_docs import DOCS
from kimi_audit.model.layout import expected_layout
from kimi_audit.report.explain import card_dict, card_text
from kimi_audit.sources import LocalSource
from test_accounting import DEEPSEEK_V3, as_found, thinking_raw, v32_raw
from tiny_checkpoint import TINY_CONFIG, tiny_shards, write_tiny

runner = CliRunner()


@pytest.fixture(scope="module")
def replica(replica_dir):
    ckpt = load_checkpoint(LocalSource(replica_dir))
    return ckpt, accounting_of_checkpoint(ckpt)


def cards(ckpt, acc, query):
    return [build_card(acc, ckpt.config, ckpt.config_raw, n) for n in find_nodes(acc, ckpt.config, query)]


def test_q_a_layernorm_card_matches_the_seed(replica):
    ckpt, acc = replica
    cfg = ckpt.config
    moe, dense = cards(ckpt, acc, "q_a_layernorm")
    n_moe = sum(1 for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i))
    # The seed card (shared/seeds): "61 transformer blocks › 60 MoE blocks › Latent attention › Query compression"
    assert moe.breadcrumb == (f"{cfg.num_hidden_layers} transformer blocks", f"{n_moe} MoE blocks",
                              "Latent attention", "Query compression")
    assert moe.title == "Query latent RMSNorm"
    assert moe.computes == "self.q_a_layernorm(self.q_a_proj(hidden_states))"
    assert moe.inputs == (("c^Q", f"[B batch, T positions, {cfg.q_lora_rank} q latent]"),)
    assert moe.outputs == (("ĉ^Q", f"[B batch, T positions, {cfg.q_lora_rank} q latent]"),)
    assert moe.formula == f"{cfg.q_lora_rank:,} × {n_moe} MoE blocks = {cfg.q_lora_rank * n_moe:,}"
    assert moe.rows == (("Learned gain", f"{cfg.q_lora_rank:,}", cfg.q_lora_rank),)
    assert moe.per_instance == cfg.q_lora_rank and moe.instance_count == n_moe
    assert moe.eps == cfg.rms_norm_eps
    assert not moe.mismatch and "matches the checkpoint's tensors" in moe.verdict
    (g,) = moe.tensors
    assert (g.names, g.dtype, g.shape, g.count) == (
        f"model.layers.{{1-{n_moe}}}.self_attn.q_a_layernorm.weight", "BF16", (cfg.q_lora_rank,), n_moe)
    assert g.shards == f"model-{{2-{n_moe + 1}}}-of-61.safetensors"
    assert dict(moe.config)["q_lora_rank"] == cfg.q_lora_rank
    assert {"rms_norm_eps", "first_k_dense_replace", "num_hidden_layers"} <= dict(moe.config).keys()
    assert dense.breadcrumb[1] == "1 dense block" and dense.derived == cfg.q_lora_rank
    assert dense.tensors[0].names == "model.layers.0.self_attn.q_a_layernorm.weight"
    text = card_text(moe)
    assert text.startswith("Kimi K2 · Query latent RMSNorm")
    assert "1,536 × 60 MoE blocks = 92,160" in text  # the seed's line


def test_fp8_leaf_card_lists_its_scales_apart(replica):
    ckpt, acc = replica
    (card,) = cards(ckpt, acc, "blocks.moe.experts.down_proj")
    cfg = ckpt.config
    assert card.rows == (("Weight", f"{cfg.hidden_size:,} × {cfg.moe_intermediate_size:,}",
                          cfg.hidden_size * cfg.moe_intermediate_size),)
    (w,), (s,) = card.tensors, card.scales
    assert w.dtype == "F8_E4M3" and w.count == cfg.n_routed_experts * 60
    assert s.dtype == "F32" and s.shape == (-(-cfg.hidden_size // 128), -(-cfg.moe_intermediate_size // 128))
    assert "experts.{0-383}" in s.names


def test_group_card_accounts_for_its_children(replica):
    ckpt, acc = replica
    (card,) = cards(ckpt, acc, "blocks.moe")
    assert sum(p for _c, _calc, p in card.rows) == card.per_instance
    assert card.per_instance * card.instance_count == card.derived == card.found


def test_lookup_by_tensor_name_title_and_suffix(replica):
    ckpt, acc = replica
    assert [n.key for n in find_nodes(acc, ckpt.config, "model.layers.7.mlp.experts.3.gate_proj.weight_scale_inv")] \
        == ["blocks.moe.experts.gate_proj"]
    assert [n.key for n in find_nodes(acc, ckpt.config, "Query latent RMSNorm")] == [
        "blocks.moe.attention.q_compression.q_a_layernorm", "blocks.dense.attention.q_compression.q_a_layernorm"]
    assert [n.key for n in find_nodes(acc, ckpt.config, "shared_experts.gate_proj")] == [
        "blocks.moe.shared_experts.gate_proj"]
    assert len(find_nodes(acc, ckpt.config, "gate_proj")) == 3
    with pytest.raises(KimiAuditError, match="did you mean q_a_layernorm"):
        find_nodes(acc, ckpt.config, "q_a_layernrm")


def test_every_leaf_role_has_a_doc(replica):
    _, acc = replica
    for leaf in acc.root.leaves():
        assert leaf.role in DOCS, leaf.key


def test_explain_cli_on_tiny(tiny_dir, tmp_path):
    r = runner.invoke(app, ["explain", str(tiny_dir), "q_a_layernorm", "--no-progress"])
    assert r.exit_code == 0, r.output
    q = TINY_CONFIG["q_lora_rank"]
    assert f"{q:,} × 3 MoE blocks = {3 * q:,}" in r.stdout and f"{q:,} × 1 dense block = {q:,}" in r.stdout
    r = runner.invoke(app, ["explain", str(tiny_dir), "router", "--json", "--no-progress"])
    assert r.exit_code == 0
    (doc,) = json.loads(r.stdout)
    assert doc["key"] == "blocks.moe.router" and doc["found"] == doc["derived"]
    r = runner.invoke(app, ["explain", str(tiny_dir), "no_such_thing", "--no-progress"])
    assert r.exit_code == 2 and "no component" in r.output and "Traceback" not in r.output
    shards = tiny_shards()
    shards["model-2-of-3.safetensors"].pop("model.layers.2.self_attn.q_a_layernorm.weight")
    bad = write_tiny(tmp_path / "bad", shards)
    r = runner.invoke(app, ["explain", str(bad), "model.layers.2.self_attn.q_a_layernorm.weight", "--no-progress"])
    assert r.exit_code == 1 and "MISMATCH" in r.stdout


# --- INT4 (Kimi-K2-Thinking), MTP (DeepSeek-V3), the V3.2 indexer ----------------------------------------------

def derived_cards(raw, query, found=True):
    cfg = model_config_from_dict(raw)
    layout = expected_layout(cfg)
    acc = build_accounting(cfg, as_found(layout) if found else {}, layout)
    return cfg, acc, [build_card(acc, cfg, raw, n) for n in find_nodes(acc, cfg, query)]


@pytest.fixture(scope="module")
def thinking_acc():
    raw = thinking_raw()
    cfg = model_config_from_dict(raw)
    layout = expected_layout(cfg)
    return raw, cfg, build_accounting(cfg, as_found(layout), layout)


def test_int4_expert_card_shows_packing_and_metadata(thinking_acc):
    raw, cfg, acc = thinking_acc
    (card,) = [build_card(acc, cfg, raw, n) for n in find_nodes(acc, cfg, "experts.gate_proj")]
    assert card.rows == (("Weight (INT4, packed in I32 words)", "2,048 × 7,168", 14_680_064),)
    assert card.derived == card.found == 14_680_064 * 384 * 60 and not card.mismatch
    (scheme,) = card.quantization
    assert "INT4 symmetric" in scheme and "8 per I32 word" in scheme and "one BF16 scale per 32 inputs" in scheme
    assert [(s.component, s.dtype, s.shape) for s in card.stored] == [
        ("mlp.experts.gate_proj.weight_packed", "I32", (2048, 896)),
        ("mlp.experts.gate_proj.weight_scale", "BF16", (2048, 224)),
        ("mlp.experts.gate_proj.weight_shape", "I32", (2,))]
    (w,) = card.tensors
    assert (w.dtype, w.shape, w.count) == ("I32", (2048, 896), 23_040)
    assert {(g.dtype, g.shape) for g in card.scales} == {("BF16", (2048, 224)), ("I32", (2,))}
    assert dict((d, a) for d, a, _ in card.stored_by_dtype) == {"I32": 23_040 * 2048 * 896 + 46_080,
                                                                 "BF16": 23_040 * 2048 * 224}
    text = card_text(card)
    assert "2,048 × 7,168  =  14,680,064" in text
    assert "packed words, count for 14,680,064 parameters" in text and "quantization metadata, not counted" in text
    assert "Stored as: INT4 symmetric" in text
    doc = card_dict(card)
    assert doc["stored_per_instance"][0] == {"tensor": "mlp.experts.gate_proj.weight_packed", "dtype": "I32",
                                             "shape": [2048, 896], "kind": "packed", "counts_for": 14_680_064}
    assert doc["quantization"] == [scheme] and len(doc["scales_excluded"]) == 2


def test_int4_lookup_by_packed_and_metadata_names(thinking_acc):
    _, cfg, acc = thinking_acc
    for name in ("model.layers.3.mlp.experts.7.down_proj.weight_shape",
                 "model.layers.3.mlp.experts.7.down_proj.weight_scale",
                 "model.layers.3.mlp.experts.7.down_proj.weight_packed",
                 "model.layers.3.mlp.experts.7.down_proj.weight"):  # the unquantized name finds the module too
        assert [n.key for n in find_nodes(acc, cfg, name)] == ["blocks.moe.experts.down_proj"], name
    # an unquantized module of the same checkpoint: BF16, no metadata
    (card,) = [build_card(acc, cfg, {}, n) for n in find_nodes(acc, cfg, "blocks.moe.attention.q_compression.q_b_proj")]
    assert card.quantization == ("BF16, not quantized",) and card.scales == ()
    assert [(s.dtype, s.kind) for s in card.stored] == [("BF16", "parameter")]


def test_fp8_card_shows_its_block_scales(replica):
    ckpt, acc = replica
    (card,) = cards(ckpt, acc, "blocks.moe.experts.down_proj")
    assert card.quantization == ("FP8 e4m3, one F32 scale per 128x128 block",)
    assert [(s.dtype, s.shape, s.kind) for s in card.stored] == [("F8_E4M3", (7168, 2048), "parameter"),
                                                               ("F32", (56, 16), "scale")]
    assert "Quantization metadata (listed, excluded from the counts)" in card_text(card)


def test_mtp_cards_note_the_duplicated_tables():
    raw = json.loads(DEEPSEEK_V3.read_text())
    _, acc, (card,) = derived_cards(raw, "mtp", found=False)
    assert card.title == "Multi-token prediction (layer 61)" and card.derived == acc.mtp.parameters
    assert "activated" in card.note
    _, _, (embed,) = derived_cards(raw, "mtp.mtp_head.embed_tokens", found=False)
    assert embed.breadcrumb == ("Multi-token prediction (layer 61)", "MTP embedding, projection and head")
    assert "copy of model.embed_tokens.weight" in embed.note
    assert card_text(embed).startswith("DeepSeek-V3 · MTP token embedding")


def test_v32_indexer_cards():
    raw = v32_raw()
    cfg, acc, (wq_b, _dense, _mtp) = derived_cards(raw, "wq_b")
    assert wq_b.key == "blocks.moe.attention.indexer.wq_b" and not wq_b.mismatch
    assert wq_b.rows == (("Weight", "64 × 128 × 1,536", 64 * 128 * 1536),)
    assert [(s.dtype, s.shape) for s in wq_b.stored] == [("F8_E4M3", (8192, 1536)), ("F32", (64, 12))]
    assert wq_b.outputs == (("q^I", "[B batch, T positions, 8192 = 64 indexer heads × 128 indexer head dim]"),)
    for leaf in acc.root.leaves():
        assert leaf.role in DOCS, leaf.key
    (norm, *_) = [build_card(acc, cfg, raw, n) for n in find_nodes(acc, cfg, "q_a_layernorm")]
    assert [(s.dtype, s.shape) for s in norm.stored] == [("F32", (1536,))]
    assert "F32 [1,536]" in card_text(norm)
