"""Mistral Small 4 as published: the `mistral3` wrapper (Mistral3ForConditionalGeneration: a `mistral4` text model, a
Pixtral tower, its projector) against transformers 5.25, which implements it. A tiny model saved sharded by
save_pretrained writes the names the release's loaders read (tests/data/loader_names/mistral3.json,
test_loader_names.py) and audits clean with parameters = sum(numel); transformers' loader reads the files back;
the spelling transformers 4.52-4.57 saved is one LAYOUT_DIALECT info; a `mistral3` around a text model of another
kind is one LAYOUT_UNSUPPORTED that names it (exit 3); a bad `vision_feature_layer` is one config error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import kimi_audit
from kimi_audit.errors import ConfigError
from kimi_audit.findings import EXIT_INCONCLUSIVE
from kimi_audit.model.config import model_config_from_dict

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from multimodal_saves import layout_of, loads_back, save, stored  # noqa: E402 (needs torch)

TEXT: dict[str, Any] = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16,
    "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 2, "n_routed_experts": 4,
    "kv_lora_rank": 8, "q_lora_rank": 16, "qk_rope_head_dim": 4, "v_head_dim": 8, "qk_nope_head_dim": 8,
    "first_k_dense_replace": 1, "num_experts_per_tok": 2}
VISION: dict[str, Any] = {"hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 2,
                          "head_dim": 8, "patch_size": 4, "image_size": 16}


def config(**top: Any) -> Any:
    return transformers.Mistral3Config(text_config=transformers.Mistral4Config(**TEXT).to_dict(),
                                       vision_config=VISION, **top)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    return save(config(tie_word_embeddings=False, multimodal_projector_bias=True), tmp_path_factory.mktemp("m3"))


def test_save_pretrained_audits_clean_with_sum_numel(saved: tuple[Path, int]) -> None:
    path, numel = saved
    report = kimi_audit.audit(path)
    assert report.findings == (), [f.message for f in report.findings]
    assert report.stats.parameters == numel
    assert stored(path) == {n: v for n, v in layout_of(path).items() if not n.endswith("rotary_emb.inv_freq")}
    names = set(stored(path))
    assert {"language_model.lm_head.weight", "language_model.model.layers.1.mlp.experts.gate_up_proj",
            "vision_tower.transformer.layers.1.feed_forward.gate_proj.weight",
            "multi_modal_projector.linear_1.bias"} <= names
    assert not any("e_score_correction_bias" in n for n in names)


def test_transformers_loads_the_files_back(saved: tuple[Path, int]) -> None:
    loads_back(*saved)


def test_the_top_level_tie_decides_the_output_head(tmp_path: Path) -> None:
    """Mistral3Config ties by default (transformers 5.25): no `language_model.lm_head.weight` is saved, and the
    layout of that config has none."""
    path, numel = save(config(), tmp_path / "tied")
    assert "language_model.lm_head.weight" not in stored(path)
    report = kimi_audit.audit(path)
    assert report.findings == () and report.stats.parameters == numel


def test_the_4_52_spelling_is_one_dialect_info(saved: tuple[Path, int], tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    out = Path(shutil.copytree(saved[0], tmp_path / "old"))
    spell = (("language_model.model.", "model.language_model."), ("language_model.lm_head.", "lm_head."),
             ("vision_tower.", "model.vision_tower."), ("multi_modal_projector.", "model.multi_modal_projector."))

    def respelled(name: str) -> str:
        for canonical, dialect in spell:
            if name.startswith(canonical):
                return dialect + name[len(canonical):]
        raise AssertionError(name)

    index = json.loads((out / "model.safetensors.index.json").read_text())
    for shard in set(index["weight_map"].values()):
        save_file({respelled(k): v for k, v in load_file(out / shard).items()}, out / shard, metadata={"format": "pt"})
    index["weight_map"] = {respelled(k): v for k, v in index["weight_map"].items()}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    report = kimi_audit.audit(out)
    assert [(f.severity.value, f.code) for f in report.findings] == [("info", "LAYOUT_DIALECT")]
    assert "4.52" in report.findings[0].message and report.stats.parameters == saved[1]


def test_a_mistral3_around_another_text_model_is_unsupported_and_says_which(saved: tuple[Path, int],
                                                                           tmp_path: Path) -> None:
    out = Path(shutil.copytree(saved[0], tmp_path / "small3"))
    cfg = json.loads((out / "config.json").read_text())
    cfg["text_config"]["model_type"] = "mistral"
    (out / "config.json").write_text(json.dumps(cfg))
    report = kimi_audit.audit(out)
    assert [f.code for f in report.findings] == ["LAYOUT_UNSUPPORTED"]
    assert "text_config" in report.findings[0].message and "'mistral'" in report.findings[0].message
    assert report.exit_code() == EXIT_INCONCLUSIVE


@pytest.mark.parametrize("bad", ["last", [], 1.5, ["a"]])
def test_a_bad_vision_feature_layer_is_one_config_error(saved: tuple[Path, int], bad: Any) -> None:
    cfg = json.loads((saved[0] / "config.json").read_text())
    with pytest.raises(ConfigError, match="vision_feature_layer"):
        model_config_from_dict({**cfg, "vision_feature_layer": bad})


def test_two_feature_layers_widen_the_projectors_input(saved: tuple[Path, int]) -> None:
    cfg = json.loads((saved[0] / "config.json").read_text())
    layout = kimi_audit.layout({**cfg, "vision_feature_layer": [-1, -2]})
    assert layout["multi_modal_projector.linear_1.weight"].shape == (32, 2 * 16)


def test_the_layout_in_the_old_spelling_is_asked_for_by_its_name(saved: tuple[Path, int]) -> None:
    """transformers 5's own save writes the release's names, so `--dialect transformers` is no dialect of mistral3;
    the 4.52-4.57 spelling is `transformers-4.52`."""
    cfg = saved[0] / "config.json"
    old = kimi_audit.layout(cfg, dialect="transformers-4.52")
    assert "model.language_model.layers.1.mlp.experts.gate_up_proj" in old.names and "lm_head.weight" in old.names
    with pytest.raises(kimi_audit.KimiAuditError, match=r"transformers-4\.52"):
        kimi_audit.layout(cfg, dialect="transformers")
