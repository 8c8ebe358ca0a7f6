"""Mistral's own release format (params.json beside consolidated.safetensors in Mistral's names) as a source like
any other: read through the one params.json adapter (model.arch.mistral_params) into the mistral4 architecture's
Mistral spelling, with Mistral's FP8 (`qscale_weight`, `qscale_act`, model.quant.mistral_fp8) and the Pixtral
vision encoder.

Proof from llama.cpp (ggml-org/llama.cpp@0c1e57098): tests/data/loader_names/mistral_format.llamacpp.json records the
params.json keys and the tensor names its converter reads, with the file and lines of each; the tiny checkpoint in
tests/data/mistral_format/bf16 (written by tests/writers/mistral_format_generate.py) was converted by its
`convert_hf_to_gguf.py --mistral-format` (text: deepseek2, --mmproj: clip), and PROVENANCE.json records the GGUFs'
element counts: the audit's parameter total is their sum. The FP8 variant is rebuilt seeded (its bytes are the ones
PROVENANCE.json names) and audits clean; the converter at that commit refuses it (PROVENANCE.json says why)."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

import kimi_audit
from kimi_audit.errors import ConfigError
from kimi_audit.model.arch import mistral_params
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.layout import expected_layout

DATA = Path(__file__).parent / "data"
CHECKPOINT = DATA / "mistral_format" / "bf16"
PROVENANCE = json.loads((DATA / "mistral_format" / "PROVENANCE.json").read_text())
RECORD = json.loads((DATA / "loader_names" / "mistral_format.llamacpp.json").read_text())
sys.path.insert(0, str(Path(__file__).parent / "writers"))

import mistral_format_generate as generate  # noqa: E402


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def record_names(p: dict[str, Any]) -> set[str]:
    """The names llama.cpp's converter reads for params.json `p`, from the record alone."""
    moe, vis = p["moe"], p.get("vision_encoder")
    names = set(RECORD["top"])
    for i in range(p["n_layers"]):
        names |= {f"layers.{i}.{n}" for n in RECORD["layer"]}
        if i < moe.get("first_k_dense_replace", 0):
            names |= {f"layers.{i}.{n}" for n in RECORD["dense_layer"]}
            continue
        names |= {f"layers.{i}.{n}" for n in RECORD["moe_layer"]}
        names |= {f"layers.{i}.experts.{e}.{n}" for e in range(moe["num_experts"]) for n in RECORD["expert"]}
    if vis:
        names |= set(RECORD["vision_top"])
        names |= {f"vision_encoder.transformer.layers.{i}.{n}" for i in range(vis["num_hidden_layers"])
                  for n in RECORD["vision_block"]}
    if "quantization" in p:
        names |= {n.removesuffix(".weight") + s for n in names
                  if n.startswith("layers.") and not n.endswith(("norm.weight", "gate.weight"))
                  for s in RECORD["fp8_suffixes"]}
    return names


def layout_names(p: dict[str, Any]) -> set[str]:
    return set(expected_layout(model_config_from_dict(mistral_params.config_from_params(p))).names)


@pytest.mark.parametrize("variant", ["bf16", "fp8"])
def test_the_layout_is_the_names_llama_cpp_reads(variant: str) -> None:
    p = generate.params(variant)
    assert layout_names(p) == record_names(p)


def test_the_adapter_reads_the_keys_llama_cpp_reads() -> None:
    top = {k: v for k, v in RECORD["params_top"].items() if k != "tied_embeddings"}
    assert top == mistral_params.TOP
    assert RECORD["params_moe"] == mistral_params.MOE
    assert set(mistral_params.SAME) == set(RECORD["params_same"])


def test_the_committed_checkpoint_is_the_one_llama_cpp_converted() -> None:
    row = PROVENANCE["variants"]["bf16"]
    assert {f.name: sha256(f) for f in sorted(CHECKPOINT.iterdir())} == row["files"]
    assert row["text_gguf"]["architecture"] == "deepseek2" and row["mmproj_gguf"]["architecture"] == "clip"


def test_it_audits_clean_with_parameters_equal_to_the_converted_ggufs() -> None:
    report = kimi_audit.audit(CHECKPOINT)
    assert report.findings == (), [f.message for f in report.findings]
    row = PROVENANCE["variants"]["bf16"]
    # the mmproj file adds `v.token_embd.img_break`, a copy of one row of tok_embeddings (the image-break
    # token's: conversion/llava.py lines 123-128), so the GGUFs hold one hidden-size row more than the release
    copied_row = generate.PARAMS["dim"]
    assert report.stats.parameters == row["text_gguf"]["elements"] + row["mmproj_gguf"]["elements"] - copied_row
    assert report.stats.parameters == row["parameters"]


@pytest.fixture(scope="module")
def fp8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("mistral_fp8") / "fp8"
    generate.write_checkpoint(d, "fp8")
    return d


def test_fp8_audits_clean_as_mistrals_format(fp8: Path) -> None:
    row = PROVENANCE["variants"]["fp8"]
    assert sha256(fp8 / "consolidated.safetensors") == row["files"]["consolidated.safetensors"]
    report = kimi_audit.audit(fp8)
    assert report.findings == (), [f.message for f in report.findings]
    assert report.stats.parameters == row["parameters"] == PROVENANCE["variants"]["bf16"]["text_gguf"]["elements"]
    assert "input_scale" in row["text_gguf_refused"]


def errors(d: Path) -> list[tuple[str, str | None]]:
    return [(f.code, f.tensor) for f in kimi_audit.audit(d).findings if f.severity.value == "error"]


def test_a_missing_qscale_weight_is_one_finding(tmp_path: Path) -> None:
    name = "layers.1.experts.2.w1.qscale_weight"
    generate.write_checkpoint(tmp_path / "m", "fp8", drop=(name,))
    assert errors(tmp_path / "m") == [("SCALE_MISSING", name)]


def test_a_missing_expert_is_its_three_weights(tmp_path: Path) -> None:
    """Its scales are not reported again: the weight's finding covers them."""
    drop = tuple(f"layers.1.experts.2.{w}.{s}" for w in ("w1", "w2", "w3") for s in ("weight", "qscale_weight",
                                                                                      "qscale_act"))
    generate.write_checkpoint(tmp_path / "m", "fp8", drop=drop)
    found = kimi_audit.audit(tmp_path / "m").findings
    assert [(f.code, f.covers) for f in found if f.severity.value == "error"] == [("TENSOR_MISSING", 3)]
    assert "layers.1.experts.2: expert missing" in found[0].message


def test_a_params_field_that_disagrees_with_the_shards_names_the_tensors_it_shapes(tmp_path: Path) -> None:
    d = tmp_path / "m"
    generate.write_checkpoint(d, "bf16")
    p = json.loads((d / "params.json").read_text())
    p["moe"]["expert_hidden_dim"] = 32
    (d / "params.json").write_text(json.dumps(p))
    found = kimi_audit.audit(d).findings
    assert [f.code for f in found] == ["CONFIG_DISAGREES"]  # one cause: the params.json value, its 15 tensors under it
    mlps = (*(f"experts.{i}" for i in range(4)), "shared_experts")
    assert found[0].covers == len(mlps) * 3 and found[0].tensor == "params.json moe.expert_hidden_dim"
    assert (found[0].expected, found[0].actual) == (32, 64) or found[0].expected == 32


def test_a_folder_with_neither_config_nor_params_says_both(tmp_path: Path) -> None:
    shutil.copy(CHECKPOINT / "consolidated.safetensors", tmp_path)
    with pytest.raises(ConfigError, match=r"no config\.json \(nor Mistral's params\.json\)"):
        kimi_audit.audit(tmp_path)


def test_config_json_wins_over_params_json(tmp_path: Path) -> None:
    """A folder with both is audited by its config.json (one path: params.json is read only where there is no
    config.json), here transformers' spelling of the same model, so Mistral's names are unexpected."""
    d = Path(shutil.copytree(CHECKPOINT, tmp_path / "m"))
    cfg = mistral_params.config_from_params(json.loads((d / "params.json").read_text()))
    del cfg["load_format"]
    (d / "config.json").write_text(json.dumps(cfg))
    found = {(f.code, f.tensor) for f in kimi_audit.audit(d).findings}
    assert ("TENSOR_MISSING", "model.embed_tokens.weight") in found
    assert ("TENSOR_UNEXPECTED", "tok_embeddings.weight") in found


@pytest.mark.parametrize(("params", "model_type"), [({"dim": 8, "n_layers": 1}, "mistral"),
                                                    ({"dim": 8, "moe": {"num_experts": 8}}, "mixtral")])
def test_a_params_json_outside_the_family_is_layout_unsupported(params: dict[str, Any], model_type: str) -> None:
    cfg = mistral_params.config_from_params(params)
    assert cfg["model_type"] == model_type and not model_config_from_dict(cfg).layout_supported


@pytest.mark.parametrize("params", [[1], {"moe": 3, "kv_lora_rank": 1}, {"moe": {}, "kv_lora_rank": 1,
                                                                          "vision_encoder": 1}])
def test_a_malformed_params_json_is_a_config_error(params: Any) -> None:
    with pytest.raises(ConfigError, match=r"params\.json"):
        mistral_params.config_from_params(params)
