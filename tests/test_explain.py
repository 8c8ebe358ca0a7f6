"""Explain cards: the seed card's content for q_a_layernorm, computed from config and headers; node lookup."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kimi_audit.cli import app
from kimi_audit.errors import KimiAuditError
from kimi_audit.model.accounting import accounting_of_checkpoint
from kimi_audit.model.checkpoint import load_checkpoint
from kimi_audit.model.explain import DOCS, build_card, card_text, find_nodes
from kimi_audit.sources import LocalSource
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
