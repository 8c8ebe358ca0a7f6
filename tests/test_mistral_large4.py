"""mistral_large4 against transformers 5.25, which implements it: a tiny MistralLarge4ForConditionalGeneration with
every layer kind (dense and MoE, RoPE and NoPE, its own and a shared latent KV, a full and a shared indexer) and a
Pixtral vision tower, saved sharded by save_pretrained (which writes Mistral's native names, the release's,
through its conversion mapping reversed), audits clean with parameters = sum(numel) and as many tensors as the
layout; transformers' loader reads those files back with no missing or unexpected key; the layout's dtypes are
what it saved (the router gate and `lerope.alpha` F32)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import MistralLarge4Config

from kimi_audit.checks.audit import audit_source
from kimi_audit.errors import ConfigError
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.sources import LocalSource
from multimodal_saves import layout_of, loads_back, save, stored

TEXT: dict[str, Any] = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16,
    "num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "kv_lora_rank": 16, "qk_rope_head_dim": 4, "v_head_dim": 8, "qk_nope_head_dim": 8,
    "index_n_heads": 2, "index_head_dim": 8, "first_k_dense_replace": 1, "n_shared_experts": 2,
    "kv_source_layers": [0, 0, 2, 3, 3], "indexer_types": ["full", "shared", "full", "shared", "full"]}
"""Layer 0 dense; 1 shares layer 0's KV and indexer; 3 is NoPE (no_rope_layer_interval 4); 4 shares layer 3's KV."""
VISION: dict[str, Any] = {"hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 2,
                          "patch_size": 4, "image_size": 16}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    config = MistralLarge4Config(text_config=TEXT, vision_config=VISION, multimodal_projector_bias=True)
    return save(config, tmp_path_factory.mktemp("ml4"))


def test_save_pretrained_audits_clean(saved: tuple[Path, int]) -> None:
    d, numel = saved
    report = audit_source(LocalSource(d))
    assert report.findings == ()
    assert report.stats.parameters == numel
    assert layout_of(d) == stored(d)


def test_transformers_reads_the_layouts_names_with_nothing_missing(saved: tuple[Path, int]) -> None:
    loads_back(*saved)


def test_every_layer_kind_is_described(saved: tuple[Path, int]) -> None:
    cfg = model_config_from_dict(json.loads((saved[0] / "config.json").read_text()))
    assert cfg.layer_kinds == ("dense_rope_kv_indexer", "moe_rope_sharedkv_sharedindexer", "moe_rope_kv_indexer",
                               "moe_nope_kv_sharedindexer", "moe_rope_sharedkv_indexer")


@pytest.mark.parametrize(("keys", "match"), [({"kv_source_layers": [0, 2, 2, 3, 4]}, "kv_source_layers"),
                                             ({"no_rope_layers": [1, 2, 1, 1, 1]}, "no_rope_layers"),
                                             ({"indexer_types": ["full"] * 4}, "indexer_types")])
def test_a_bad_schedule_is_a_config_error(keys: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        model_config_from_dict({"model_type": "mistral_large4", "text_config": {**TEXT, **keys}})
