"""The expected layout derived from config.json, against the figures recorded for the pinned Kimi-K2-Instruct."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from kimi_audit.errors import ConfigError
from kimi_audit.model.arch.spec import DENSE, MOE, MTP
from kimi_audit.model.config import model_config_from_dict, parse_config_bytes, pinned_config_bytes
from kimi_audit.model.kinds import BUFFER, PARAMETER, SCALE
from kimi_audit.model.layout import expected_layout
from kimi_audit.model.quant.deepseek import Fp8Block


@pytest.fixture(scope="module")
def kimi():
    raw, cfg = parse_config_bytes(pinned_config_bytes())
    return raw, cfg, expected_layout(cfg)


def test_pinned_config_is_the_shipped_data(kimi):
    raw, cfg, _ = kimi
    assert raw["model_type"] == "kimi_k2" and cfg.num_hidden_layers == 61 and cfg.q_lora_rank == 1536


def test_kimi_totals_match_the_recorded_inspection(kimi):
    _, _, layout = kimi
    assert len(layout) == 139_644
    params = sum(t.numel for t in layout.values() if t.kind == PARAMETER)
    assert params == 1_026_408_232_448
    by = Counter()
    for t in layout.values():
        by[(t.kind, t.dtype)] += t.numel
    assert by[(PARAMETER, "F8_E4M3")] == 1_023_893_241_856
    assert by[(PARAMETER, "BF16")] == 2_514_967_552
    assert by[(PARAMETER, "F32")] == 23_040
    assert by[(SCALE, "F32")] == 62_495_192


def test_q_a_layernorm_in_every_block(kimi):
    _, _cfg, layout = kimi
    gains = [t for t in layout.values() if t.component == "self_attn.q_a_layernorm.weight"]
    assert len(gains) == 61
    assert all(t.dtype == "BF16" and t.shape == (1536,) for t in gains)
    moe = [t for t in gains if t.block == MOE]
    assert len(moe) == 60 and sum(t.numel for t in moe) == 92_160
    assert [t.layer for t in gains if t.block == DENSE] == [0]


def test_pinned_per_layer_shapes(kimi):
    _, _, L = kimi
    p = "model.layers.1."
    assert L[p + "self_attn.q_b_proj.weight"].shape == (12288, 1536)
    assert L[p + "self_attn.q_b_proj.weight_scale_inv"].shape == (96, 12)
    assert L[p + "self_attn.kv_a_proj_with_mqa.weight_scale_inv"].shape == (5, 56)
    assert L[p + "self_attn.kv_b_proj.weight"].shape == (16384, 512)
    assert L[p + "self_attn.o_proj.weight_scale_inv"].shape == (56, 64)
    assert L[p + "mlp.gate.weight"].dtype == "BF16" and L[p + "mlp.gate.weight"].shape == (384, 7168)
    assert L[p + "mlp.gate.e_score_correction_bias"].dtype == "F32"
    assert L[p + "mlp.experts.383.down_proj.weight_scale_inv"].shape == (56, 16)
    assert L["model.layers.0.mlp.down_proj.weight_scale_inv"].shape == (56, 144)
    assert L["model.layers.0.self_attn.rotary_emb.inv_freq"].kind == BUFFER
    assert "model.layers.61.input_layernorm.weight" not in L


def test_scale_shape_rounds_partial_blocks_up():
    assert Fp8Block().grid(576, 7168) == (5, 56)
    assert Fp8Block().grid(1, 1) == (1, 1)
    assert Fp8Block().grid(129, 256) == (2, 2)


def deepseek_like(**over):
    raw = json.loads(pinned_config_bytes())
    raw.update(over)
    return model_config_from_dict(raw)


def test_dense_and_moe_blocks_follow_modeling_deepseek():
    cfg = deepseek_like(first_k_dense_replace=3, moe_layer_freq=2, num_hidden_layers=8)
    assert [cfg.is_moe_layer(i) for i in range(8)] == [False, False, False, False, True, False, True, False]
    layout = expected_layout(cfg)
    assert "model.layers.4.mlp.experts.0.up_proj.weight" in layout
    assert "model.layers.5.mlp.down_proj.weight" in layout
    assert "model.layers.5.mlp.experts.0.up_proj.weight" not in layout


def test_mtp_layer_is_expected_after_the_main_stack():
    cfg = deepseek_like(num_hidden_layers=4, num_nextn_predict_layers=1)
    layout = expected_layout(cfg)
    assert layout["model.layers.4.eh_proj.weight"].shape == (7168, 14336)
    assert layout["model.layers.4.shared_head.head.weight"].block == MTP
    assert "model.layers.4.mlp.experts.0.gate_proj.weight" in layout


def test_tied_embeddings_and_no_quantization():
    cfg = deepseek_like(tie_word_embeddings=True, quantization_config=None, num_hidden_layers=2)
    layout = expected_layout(cfg)
    assert "lm_head.weight" not in layout
    assert not any(t.kind == SCALE for t in layout.values())
    assert layout["model.layers.1.self_attn.o_proj.weight"].dtype == "BF16"


def test_no_query_compression_uses_q_proj():
    layout = expected_layout(deepseek_like(q_lora_rank=None, num_hidden_layers=1))
    assert layout["model.layers.0.self_attn.q_proj.weight"].shape == (64 * 192, 7168)
    assert "model.layers.0.self_attn.q_a_layernorm.weight" not in layout


@pytest.mark.parametrize("bad", [{"hidden_size": None}, {"hidden_size": "7168"}, {"moe_layer_freq": 0},
                                 {"torch_dtype": "int4"}, {"quantization_config": "fp8"}])
def test_bad_config_values_are_config_errors(bad):
    with pytest.raises(ConfigError):
        deepseek_like(**bad)


def test_missing_config_key_is_named():
    raw = json.loads(pinned_config_bytes())
    del raw["kv_lora_rank"]
    with pytest.raises(ConfigError, match="kv_lora_rank"):
        model_config_from_dict(raw)



@pytest.mark.parametrize("mtp", [0, 1])
def test_every_scale_follows_its_weight_in_the_expected_layout(mtp: int) -> None:
    """checks.layout pairs each scale with the tensor listed just before it: the layout keeps that order."""
    raw = json.loads(pinned_config_bytes())
    raw["num_nextn_predict_layers"] = mtp
    layout = expected_layout(model_config_from_dict(raw))
    names, kinds = list(layout), [e.kind for e in layout.values()]
    scales = [j for j, k in enumerate(kinds) if k == SCALE]
    assert len(scales) == 69_608 if not mtp else len(scales) > 69_608
    assert all(names[j - 1] == names[j].removesuffix("_scale_inv") for j in scales)


def test_each_entry_knows_its_payload_and_place(kimi):
    """nbytes and position are stamped from per-block templates: each must still be the tensor's own."""
    from math import prod

    from kimi_audit.constants import DTYPE_BITS

    layout = kimi[2]
    for position, (name, e) in enumerate(layout.items()):
        assert e.name == name and e.position == position
        assert e.nbytes == prod(e.shape) * DTYPE_BITS[e.dtype] // 8


def test_specs_by_name_is_the_layout_without_entries(kimi):
    """What sizing remote header reads looks up: each name's Spec, the same dtype, shape and size."""
    layout = kimi[2]
    specs = layout.specs_by_name
    assert len(specs) == len(layout) and list(specs)[:3] == list(layout)[:3]
    for name in ("model.embed_tokens.weight", "model.layers.5.mlp.experts.7.gate_proj.weight_scale_inv",
                 "lm_head.weight"):
        e, s = layout[name], specs[name]
        assert (s.dtype, s.shape, s.nbytes) == (e.dtype, e.shape, e.nbytes)
    assert specs.get("no.such.tensor") is None


def test_the_layout_and_the_accounting_walk_one_description() -> None:
    """Every leaf part of the accounting tree is a component the layout expects in that block, and every
    counted tensor the layout expects is some leaf's part: both are walks over model.arch's description."""
    from kimi_audit.model.accounting.account import build_accounting
    from kimi_audit.model.kinds import PACKED

    raw = json.loads(pinned_config_bytes())
    cfg = model_config_from_dict(dict(raw, num_hidden_layers=4, n_routed_experts=3, num_experts_per_tok=2,
                                      attention_bias=True))
    layout = expected_layout(cfg)
    expected = {(e.block, e.component) for e in layout.values() if e.kind in (PARAMETER, PACKED)}
    acc = build_accounting(cfg, {}, layout)
    block = {"blocks.dense": DENSE, "blocks.moe": MOE, "mtp": MTP}
    parts = {(next((b for k, b in block.items() if n.key.startswith(k + ".")), None), p.component)
             for n in acc.root.leaves() for p in n.parts}
    assert parts == expected
