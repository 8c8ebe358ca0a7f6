"""glm5_next (GLM-5.3-Flash) against transformers 5.25, which implements it: a tiny Glm5NextForConditionalGeneration
with every layer kind (dense and MoE, KDA and NoPE MLA, a full and a shared indexer) and its vision tower, saved
sharded by save_pretrained (the release's names: its conversion mapping reversed, the names llama.cpp's
conversion/glm5next.py reads), audits clean with parameters = sum(numel), the layout's names, shapes and dtypes
exactly what it saved; transformers' loader reads the files back with no missing or unexpected key. The release's
MTP layer 45, which transformers ignores, is one TENSORS_UNDESCRIBED."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save_file
from transformers.models.glm5_next.configuration_glm5_next import Glm5NextConfig

from kimi_audit.checks.audit import audit_source
from kimi_audit.errors import ConfigError
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.layout import expected_layout
from kimi_audit.sources import LocalSource
from multimodal_saves import layout_of, loads_back, save, stored

TEXT: dict[str, Any] = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16,
    "num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_nope_head_dim": 8, "v_head_dim": 8,
    "index_n_heads": 2, "index_head_dim": 8, "index_topk": 16, "index_kpool": 16, "linear_head_dim": 8,
    "linear_num_heads": 4, "hc_mult": 2, "pad_token_id": 0, "n_shared_experts": 2,
    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse", "sparse"],
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "indexed_attention",
                    "indexed_attention"],
    "indexer_types": ["full", "full", "full", "full", "shared"]}
VISION: dict[str, Any] = {"hidden_size": 16, "depth": 2, "num_heads": 2, "intermediate_size": 24, "out_hidden_size": 32,
                          "projection_intermediate_size": 40, "patch_size": 2, "temporal_patch_size": 2,
                          "spatial_merge_size": 2}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    return save(Glm5NextConfig(text_config=TEXT, vision_config=VISION), tmp_path_factory.mktemp("glm5next"))


def test_save_pretrained_audits_clean(saved: tuple[Path, int]) -> None:
    d, numel = saved
    report = audit_source(LocalSource(d))
    assert report.findings == ()
    moe_layers = TEXT["mlp_layer_types"].count("sparse")
    assert report.stats.parameters == numel + moe_layers * TEXT["n_routed_experts"]  # the router biases: buffers
    assert layout_of(d) == stored(d)


def test_transformers_reads_the_layouts_names_with_nothing_missing(saved: tuple[Path, int]) -> None:
    loads_back(*saved)


def test_the_mtp_layer_is_one_undescribed_finding(saved: tuple[Path, int], tmp_path: Path) -> None:
    """GLM's MTP layer as the release stores it after the last layer (`layers.45.*` at GLM-5.3-Flash's 45 layers;
    here the tiny model's layers renamed to that index)."""
    d = tmp_path / "mtp"
    d.mkdir()
    index = json.loads((saved[0] / "model.safetensors.index.json").read_text())
    for f in saved[0].iterdir():
        if f.suffix == ".safetensors":
            tensors = load_file(str(f))
            extra = {n.replace(".layers.3.", ".layers.45."): t.clone() for n, t in tensors.items() if ".layers.3." in n}
            save_file({**tensors, **extra}, str(d / f.name), metadata={"format": "pt"})
            index["weight_map"].update(dict.fromkeys(extra, f.name))
            index["metadata"]["total_size"] += sum(t.numel() * t.element_size() for t in extra.values())
        else:
            (d / f.name).write_bytes(f.read_bytes())
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    report = audit_source(LocalSource(d))
    assert [(f.code, f.severity.value) for f in report.findings] == [("TENSORS_UNDESCRIBED", "info")]


@pytest.mark.parametrize(("keys", "match"), [({"layer_types": ["linear_attention"] * 4}, "layer_types"),
                                             ({"indexer_types": ["full", "half"] * 3}, "indexer_types"),
                                             ({"linear_attn_config": {"num_heads": -1}}, "num_heads")])
def test_a_bad_schedule_is_a_config_error(keys: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        model_config_from_dict({"model_type": "glm5_next", "text_config": {**TEXT, **keys}})


def test_llama_cpps_names_are_the_layouts(saved: tuple[Path, int]) -> None:
    """llama.cpp's converter for the release (tests/data/loader_names/glm5_next.llamacpp.json) reads the trunk
    under `model.language_model.`, the vision tower under `model.visual.`, and names per layer the
    hyper-connections (every layer), the k-pool compressor (layers with their own indexer) and the KDA decay:
    each of those names is in the layout exactly where it says, and nowhere else."""
    table = json.loads((Path(__file__).parent / "data" / "loader_names" / "glm5_next.llamacpp.json").read_text())
    assert table["source"].startswith("ggml-org/llama.cpp@")
    layout = expected_layout(model_config_from_dict(json.loads((saved[0] / "config.json").read_text())))
    names = set(layout)
    assert all(n.startswith((table["prefix"], table["vision_prefix"], "lm_head.")) for n in names)
    for i in range(TEXT["num_hidden_layers"]):
        at = f"{table['prefix']}layers.{i}."
        kda = TEXT["layer_types"][i] == "linear_attention"
        indexer = not kda and TEXT["indexer_types"][i] == "full"
        for group, present in (("every_layer", True), ("indexer_layer", indexer), ("kda_layer", kda)):
            assert {at + n in names for n in table[group]} == {present}, (i, group)
