"""Mistral's own layout as a source, beyond one consolidated.safetensors (tests/test_mistral_format.py): its sharded
releases' `consolidated.safetensors.index.json`, params.json's RoPE blocks, vLLM's reading of the names and keys, and
params.json as a stranger would write it.

Proof from implementations that are not ours:
- the index: written by compressed-tensors' own `update_safetensors_index` (the writer of
  RedHatAI/Mistral-Small-4-119B-2603-NVFP4's index, which it finds under that name: `find_safetensors_index_file`)
  beside shards the safetensors writer stores under Mistral's names; the files read are the ones vLLM's
  `--load-format mistral` and llama.cpp's converter read (tests/data/loader_names/mistral_format.vllm.json,
  mistral_format.llamacpp.json);
- RoPE: the `deepseek2.*` metadata llama.cpp's converter wrote from each params.json (PROVENANCE.json, by
  tests/writers/mistral_format_generate.py) against the metadata the tool derives from the same params.json;
- vLLM: MistralLarge3ForCausalLM's remapping and adapt_config_dict's key maps, transcribed in
  tests/data/loader_names/mistral_format.vllm.json, applied to the names and keys the tool reads;
- a dual-layout folder: a Mistral4 saved by transformers 5.25 beside the consolidated layout of the same config.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import kimi_audit
from kimi_audit.cli import app
from kimi_audit.model.arch import mistral_params
from kimi_audit.model.arch.deepseek_v3.gguf import gguf_metadata
from kimi_audit.model.checkpoint import load_checkpoint
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.layout import expected_layout
from kimi_audit.model.quant.mistral_fp8 import MistralFp8
from kimi_audit.sources import LocalSource

DATA = Path(__file__).parent / "data"
PROVENANCE = json.loads((DATA / "mistral_format" / "PROVENANCE.json").read_text())
VLLM = json.loads((DATA / "loader_names" / "mistral_format.vllm.json").read_text())
sys.path.insert(0, str(Path(__file__).parent / "writers"))

import mistral_format_generate as generate  # noqa: E402

INDEX = "consolidated.safetensors.index.json"
SHARDS = ("consolidated-00001-of-00002.safetensors", "consolidated-00002-of-00002.safetensors")
"""Mistral's shard names (`consolidated-00001-of-00013.safetensors` in Mistral-Small-4-119B-2603-NVFP4)."""
VISION = ("vision_encoder.", "pre_mm_projector_norm.", "patch_merger.", "vision_language_adapter.")


def text_params() -> dict[str, Any]:
    """The text model's params.json with the committed checkpoint's RoPE blocks, a copy (the writer's dicts are
    never mutated)."""
    p = generate.params("rope") | {"yarn": generate.PARAMS["yarn"],
                                   "llama_4_scaling": generate.PARAMS["llama_4_scaling"]}
    return json.loads(json.dumps(p))


def split(d: Path, variant: str = "bf16", p: dict[str, Any] | None = None) -> dict[str, str]:
    """The variant's checkpoint in `d` as Mistral shards it: two consolidated shards (layer 1 in the second) and the
    index compressed-tensors writes in place of an existing one; returns its weight_map."""
    from compressed_tensors.utils.safetensors_load import update_safetensors_index
    from safetensors.torch import load_file, save_file

    generate.write_checkpoint(d, variant, p=p)
    tensors = load_file(d / "consolidated.safetensors")
    (d / "consolidated.safetensors").unlink()
    parts: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
    for name, t in tensors.items():
        parts[name.startswith("layers.1.")][name] = t
    weight_map = {}
    for shard, part in zip(SHARDS, parts, strict=True):
        save_file(part, str(d / shard))
        weight_map.update(dict.fromkeys(part, shard))
    (d / INDEX).write_text("{}")  # update_safetensors_index rewrites an index it finds, whatever its name
    update_safetensors_index(d, sum(t.numel() * t.element_size() for t in tensors.values()), weight_map)
    return weight_map


def errors(d: Path) -> list[tuple[str, str | None]]:
    return [(f.code, f.tensor or f.shard) for f in kimi_audit.audit(d).findings if f.severity.value == "error"]


# --- 1. consolidated.safetensors.index.json: read as model.safetensors.index.json is ----------------------------


def test_a_sharded_release_is_read_through_its_consolidated_index(tmp_path: Path) -> None:
    from compressed_tensors.utils.safetensors_load import get_checkpoint_files, get_weight_map

    d = tmp_path / "m"
    weight_map = split(d)
    report = kimi_audit.audit(d)
    assert report.findings == (), [f.message for f in report.findings]
    assert report.stats.parameters == PROVENANCE["variants"]["bf16"]["parameters"]
    ckpt = load_checkpoint(LocalSource(d))
    assert ckpt.index is not None and ckpt.index.name == INDEX and sorted(ckpt.headers) == list(SHARDS)
    assert ckpt.index.weight_map == weight_map == get_weight_map(get_checkpoint_files(str(d)))


def test_the_files_read_are_the_ones_vllm_and_llama_cpp_read() -> None:
    assert VLLM["load_format_mistral"] == {"allow_patterns": [mistral_params.CONSOLIDATED_SHARDS],
                                           "index_file": mistral_params.CONSOLIDATED_INDEX}
    llama = json.loads((DATA / "loader_names" / "mistral_format.llamacpp.json").read_text())["read"]
    assert "the shards are `consolidated*.safetensors`; no index is read" in llama


def _drop_shard(d: Path, wm: dict[str, str]) -> str:
    (d / SHARDS[1]).unlink()
    return SHARDS[1]


def _unlisted_tensor(d: Path, wm: dict[str, str]) -> str:
    doc = json.loads((d / INDEX).read_text())
    del doc["weight_map"]["layers.1.gate.weight"]
    (d / INDEX).write_text(json.dumps(doc))
    return "layers.1.gate.weight"


def _stray_shard(d: Path, wm: dict[str, str]) -> str:
    shutil.copy(d / SHARDS[0], d / "consolidated-00003-of-00002.safetensors")
    return "consolidated-00003-of-00002.safetensors"


def _listed_absent(d: Path, wm: dict[str, str]) -> str:
    doc = json.loads((d / INDEX).read_text())
    doc["weight_map"]["layers.1.experts.9.w1.weight"] = SHARDS[1]
    (d / INDEX).write_text(json.dumps(doc))
    return "layers.1.experts.9.w1.weight"


def _not_json(d: Path, wm: dict[str, str]) -> str:
    (d / INDEX).write_text('{"weight_map": ')
    return INDEX


@pytest.mark.parametrize(("fault", "code"), [
    (_drop_shard, "INDEX_SHARD_ABSENT"), (_unlisted_tensor, "INDEX_ENTRY_MISSING"),
    (_stray_shard, "SHARD_LOADED_UNINDEXED"), (_listed_absent, "INDEX_TENSOR_ABSENT"), (_not_json, "INDEX_INVALID")])
def test_each_index_fault_is_one_finding_naming_the_consolidated_index(tmp_path: Path, fault: Any, code: str) -> None:
    d = tmp_path / "m"
    where = fault(d, split(d))
    found = [f for f in kimi_audit.audit(d).findings if f.severity.value == "error"]
    assert [(f.code, f.tensor or f.shard) for f in found] == [(code, where)], [f.message for f in found]
    assert INDEX in found[0].message
    if code == "SHARD_LOADED_UNINDEXED":  # vLLM keeps the indexed shards; llama.cpp's converter reads every one
        assert mistral_params.CONVERTER in found[0].message


def test_shards_without_their_index_are_one_warning_naming_it(tmp_path: Path) -> None:
    d = tmp_path / "m"
    split(d)
    (d / INDEX).unlink()
    found = kimi_audit.audit(d).findings
    assert [(f.code, f.message) for f in found] == [("INDEX_MISSING", f"2 shards but no {INDEX}")]


def test_a_root_shard_finding_and_the_sarif_artifact_name_the_consolidated_index(tmp_path: Path) -> None:
    from kimi_audit.report.sarif import sarif_dict

    d = tmp_path / "m"
    split(d)
    (d / SHARDS[1]).write_bytes(b"\x00" * 4)  # unreadable: the tensors the index puts there are its one finding
    report = kimi_audit.audit(d)
    root = [f for f in report.findings if f.shard == SHARDS[1]]
    assert len(root) == 1 and f"tensors {INDEX} lists in it not checked" in root[0].message, root
    split(tmp_path / "n")
    doc = json.loads((tmp_path / "n" / INDEX).read_text())
    doc["metadata"]["total_size"] += 1
    (tmp_path / "n" / INDEX).write_text(json.dumps(doc))
    report = kimi_audit.audit(tmp_path / "n")
    assert [f.code for f in report.findings] == ["INDEX_TOTAL_SIZE"]
    (result,) = sarif_dict(report)["runs"][0]["results"]
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == INDEX


# --- 2. yarn and llama_4_scaling: the GGUF the converter writes, and malformed blocks -----------------------------


def _float32(v: Any) -> Any:
    return float(np.float32(v)) if isinstance(v, float) else v


@pytest.mark.parametrize("variant", ["bf16", "rope"])
def test_the_gguf_metadata_is_what_the_converter_wrote_from_params_json(variant: str) -> None:
    written = PROVENANCE["variants"][variant]["text_gguf"]["metadata"]
    derived = gguf_metadata(mistral_params.config_from_params(generate.params(variant)))
    assert {k: _float32(v) for k, v in derived.items()} == {k: _float32(v) for k, v in written.items()}
    scaling = generate.params(variant)["llama_4_scaling"]
    assert written["deepseek2.attention.temperature_scale"] == pytest.approx(scaling["beta"])


def test_the_rope_variant_warns_that_the_two_lengths_differ(tmp_path: Path) -> None:
    """llama.cpp wrote yarn's length as attention.temperature_length (above); vLLM reads llama_4_scaling's."""
    generate.write_checkpoint(tmp_path / "m", "rope")
    found = kimi_audit.audit(tmp_path / "m").findings
    assert [(f.code, f.expected, f.actual) for f in found] == [("PARAMS_ROPE_LENGTHS", 1024, 2048)]
    assert PROVENANCE["variants"]["rope"]["text_gguf"]["metadata"]["deepseek2.attention.temperature_length"] == 1024


ROPE_FAULTS: list[tuple[str, Any, str]] = [
    ("yarn", None, "yarn missing"), ("yarn", [1], "yarn is a list"),
    ("yarn", {"factor": 4.0}, "beta missing"), ("yarn.apply_scale", "false", "apply_scale 'false'"),
    ("yarn.factor", 0.5, "factor 0.5"), ("yarn.factor", True, "factor True"),
    ("yarn.factor", 10**400, "factor 1000000"), ("llama_4_scaling.beta", -(10**400), "beta -1000000"),
    ("yarn.original_max_position_embeddings", 0, "original_max_position_embeddings 0"),
    ("yarn.original_max_position_embeddings", 2**40, "original_max_position_embeddings 1099511627776"),
    ("yarn.original_max_position_embeddings", 1024.0, "original_max_position_embeddings 1024.0"),
    ("yarn.alpha", 64.0, "beta 32.0 (beta_fast) is below alpha 64.0"), ("yarn.beta", float("nan"), "beta nan"),
    ("yarn.mscale", 1.0, "mscale unknown"), ("llama_4_scaling", None, "llama_4_scaling missing"),
    ("llama_4_scaling", {"beta": 0.1}, "original_max_position_embeddings missing"),
    ("llama_4_scaling.beta", "0.1", "beta '0.1'"),
]


def _set(p: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    head, _, tail = key.partition(".")
    p = json.loads(json.dumps(p))
    if tail:
        p[head][tail] = value
    elif value is None:
        del p[head]
    else:
        p[head] = value
    return p


@pytest.mark.parametrize(("key", "value", "said"), ROPE_FAULTS)
def test_a_malformed_rope_block_is_one_finding(tmp_path: Path, key: str, value: Any, said: str) -> None:
    d = tmp_path / "m"
    generate.write_checkpoint(d, "rope", p=_set(text_params(), key, value))
    found = kimi_audit.audit(d).findings
    assert [(f.code, f.shard) for f in found] == [("PARAMS_ROPE_INVALID", "params.json")], [f.message for f in found]
    assert said in found[0].message
    if key.startswith("yarn"):  # no rope_scaling made of a malformed yarn
        assert "rope_scaling" not in mistral_params.config_from_params(_set(text_params(), key, value))


def test_two_problems_of_one_block_are_one_finding_naming_both(tmp_path: Path) -> None:
    d = tmp_path / "m"
    generate.write_checkpoint(d, "rope", p=_set(_set(text_params(), "yarn.factor", 0.5), "yarn.alpha", -1))
    found = kimi_audit.audit(d).findings
    assert [f.code for f in found] == ["PARAMS_ROPE_INVALID"]
    assert "factor 0.5" in found[0].message and "alpha -1" in found[0].message


# --- 3. vLLM: the names and the params.json keys ------------------------------------------------------------------


def vllm_name(name: str) -> str:
    """MistralLarge3ForCausalLM._remap_mistral_to_ds, from the record: ValueError where no pattern matches."""
    for pattern, replacement in VLLM["remap"]:
        if re.fullmatch(pattern, name):
            name = re.sub(pattern, replacement, name)
            break
    else:
        raise ValueError(f"Cannot remap {name}")
    for old, new in VLLM["suffixes"].items():
        if name.endswith(old):
            return name[: -len(old)] + new
    return name


def transformers_names(p: dict[str, Any]) -> set[str]:
    """The same model laid out as the tool's DeepseekV3 (transformers' names, one expert per module), whose
    checkpoint vLLM's DeepseekV3ForCausalLM loads: no MTP layer, no router bias (MistralLarge3's topk_method None),
    the rotary buffers aside (load_weights skips rotary_emb.inv_freq), the FP8 scales under vLLM's names and none
    for lm_head (a ParallelLMHead, which vLLM's Fp8Config leaves unquantized: Mistral's release keeps `output`
    plain)."""
    cfg = {k: v for k, v in mistral_params.config_from_params(p).items()
           if k not in ("load_format", "source_format", "vision_config")}
    cfg.update(model_type="deepseek_v3", topk_method="greedy", num_nextn_predict_layers=0)
    out = set()
    for name in expected_layout(model_config_from_dict(cfg)).names:
        scale = next((s for s in VLLM["suffixes"] if name.endswith(s)), None)
        if scale is None and not name.endswith("rotary_emb.inv_freq"):
            out.add(name)
        elif scale is not None and not name.startswith("lm_head."):
            out.add(name[: -len(scale)] + VLLM["suffixes"][scale])
    return out


@pytest.mark.parametrize("variant", ["bf16", "fp8"])
def test_vllm_remaps_every_text_name_the_tool_lays_out_to_the_tree_it_describes(variant: str) -> None:
    p = generate.params(variant)
    names = set(expected_layout(model_config_from_dict(mistral_params.config_from_params(p))).names)
    text = {n for n in names if not n.startswith(VISION)}
    assert set(VLLM["suffixes"]) == {s for s, _ in MistralFp8.roles}
    mapped = {vllm_name(n) for n in text}  # every name: none "Cannot remap"
    assert len(mapped) == len(text)
    assert mapped == transformers_names(p)
    assert (variant == "fp8") == any(n.endswith(tuple(VLLM["suffixes"])) for n in text)


@pytest.mark.parametrize("scheme", ["TENSOR", "NO_SCALES", "absent", "PER_CHANNEL"])
def test_the_fp8_activation_scheme_is_vllms(scheme: str) -> None:
    """qscheme_act as vLLM's adapter reads it: a static scheme stores qscale_act, a dynamic one none; another value
    is QUANT_UNSUPPORTED (vLLM asserts against it)."""
    p = generate.params("fp8")
    if scheme != "absent":
        p = p | {"quantization": {**generate.FP8, "qscheme_act": scheme}}
    cfg = model_config_from_dict(mistral_params.config_from_params(p))
    said = VLLM["quantization_fp8_e4m3_qscheme_act"].get(scheme)
    if said is None:
        assert cfg.quant is None and "qscheme_act 'PER_CHANNEL'" in str(cfg.quant_unsupported)
        return
    acts = {n for n in expected_layout(cfg).names if n.endswith(".qscale_act")}
    assert bool(acts) == (said == "static")
    assert cfg.quant is not None and cfg.quant.quantized.summary()["activations"] == said


def test_a_dynamic_fp8_release_without_activation_scales_audits_clean(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    d = tmp_path / "m"
    generate.write_checkpoint(d, "fp8", p=generate.params("fp8") | {"quantization": {**generate.FP8,
                                                                                      "qscheme_act": "NO_SCALES"}})
    kept = {k: v for k, v in load_file(d / "consolidated.safetensors").items() if not k.endswith(".qscale_act")}
    save_file(kept, str(d / "consolidated.safetensors"))
    report = kimi_audit.audit(d)
    assert report.findings == () and report.stats.parameters == PROVENANCE["variants"]["fp8"]["parameters"]


def vllm_rope(params: dict[str, Any]) -> dict[str, Any]:
    """_remap_mistral_yarn_args, from the record."""
    yarn = dict(params["yarn"])
    out: dict[str, Any] = dict(VLLM["yarn_set"])
    if "rope_theta" in params:
        out["rope_theta"] = params["rope_theta"]
    casts = {"float": float, "int": int}
    for old, (new, cast) in VLLM["yarn_config_map"].items():
        if old in yarn:
            out[new] = casts[cast](yarn.pop(old))
    if not yarn.pop("apply_scale", True):
        out.update(VLLM["yarn_apply_scale_false"])
    assert not yarn
    return out


@pytest.mark.parametrize("variant", ["bf16", "rope"])
def test_the_adapter_maps_params_json_as_vllms_does(variant: str) -> None:
    assert VLLM["config_mapping"] == mistral_params.TOP
    assert VLLM["moe_config_map"] == mistral_params.MOE
    assert {k: v[0] for k, v in VLLM["yarn_config_map"].items()} == mistral_params.YARN
    assert list(mistral_params.LLAMA4) == VLLM["llama_4_scaling_keys"]
    p = generate.params(variant)
    cfg = mistral_params.config_from_params(p)
    for key, (theirs, default) in VLLM["top_level_mapping_with_default"].items():
        if key in ("tie_word_embeddings", "max_position_embeddings"):
            assert cfg[key] == p.get(theirs, default), key
    assert {k: cfg[k] for k in ("norm_topk_prob", "scoring_func")} == {
        k: VLLM["moe_set"][k] for k in ("norm_topk_prob", "scoring_func")}
    rope = dict(cfg["rope_scaling"])
    assert rope.pop(mistral_params.LLAMA4_BETA) == p["llama_4_scaling"]["beta"]
    assert rope == vllm_rope(p)


# --- 5. params.json as a stranger writes it: one clear finding each, a non-zero exit, no traceback --------------


def cli(d: Path) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["audit", str(d)])
    assert "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r.exit_code, r.output


def _params(d: Path, text: str) -> None:
    (d / "params.json").write_text(text)


ATTACKS: list[tuple[str, Any, str]] = [
    ("not JSON", lambda d: _params(d, '{"dim": 128,'), "params.json is not valid JSON"),
    ("a list", lambda d: _params(d, "[1, 2]"), "params.json is not a JSON object"),
    ("not UTF-8", lambda d: (d / "params.json").write_bytes(b'{"dim": "\xff"}'), "params.json is not valid JSON"),
    ("huge layers", lambda d: _params(d, json.dumps(_set(text_params(), "n_layers", 10**30))),
     "params.json 'n_layers' (read as num_hidden_layers) is a 100-bit integer"),
    ("huge experts", lambda d: _params(d, json.dumps(_set(text_params(), "moe", {**text_params()["moe"],
                                                                               "num_experts": 10**9}))),
     "params.json implies about"),
    ("negative experts", lambda d: _params(d, json.dumps(_set(text_params(), "moe", {**text_params()["moe"],
                                                                                   "num_experts": -4}))),
     "params.json 'moe.num_experts' (read as n_routed_experts) must be a non-negative integer, got -4"),
    ("a string width", lambda d: _params(d, json.dumps(_set(text_params(), "dim", "128"))),
     "params.json 'dim' (read as hidden_size) must be a non-negative integer"),
    ("an infinite eps", lambda d: _params(d, json.dumps(text_params()).replace('"norm_eps": 1e-06',
                                                                              '"norm_eps": 1e999')),
     "params.json norm_eps (read as rms_norm_eps) must be a non-negative number"),
    ("moe a number", lambda d: _params(d, json.dumps(_set(text_params(), "moe", 3))), "params.json moe is a int"),
    ("tied a string", lambda d: _params(d, json.dumps(_set(text_params(), "tied_embeddings", "false"))),
     "params.json tied_embeddings must be true or false, got 'false'"),
    ("a negative vision width", lambda d: _params(d, json.dumps(generate.params("bf16") | {
        "vision_encoder": {**generate.VISION, "hidden_size": -1}})),
     "params.json 'vision_encoder.hidden_size' (read as vision_config.hidden_size) must be a non-negative integer"),
    ("no patch merge", lambda d: _params(d, json.dumps(generate.params("bf16") | {
        "vision_encoder": {**generate.VISION, "spatial_merge_size": 0}})),
     "params.json vision_encoder.spatial_merge_size (read as spatial_merge_size) must be positive, got 0"),
]


@pytest.mark.parametrize(("what", "attack", "said"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_a_hostile_params_json_is_one_line_and_exit_2(tmp_path: Path, what: str, attack: Any, said: str) -> None:
    d = tmp_path / "m"
    generate.write_checkpoint(d, "rope", p=text_params())
    attack(d)
    code, out = cli(d)
    assert code == 2 and said in out, out
    assert len([line for line in out.splitlines() if line.strip()]) == 1, out


def test_a_params_json_linking_out_of_the_folder_is_not_opened(tmp_path: Path) -> None:
    d = tmp_path / "m"
    generate.write_checkpoint(d, "rope", p=text_params())
    outside = tmp_path / "outside.json"
    (d / "params.json").rename(outside)
    (d / "params.json").symlink_to(outside)
    code, out = cli(d)
    assert code == 2 and "params.json is a symlink that leaves the checkpoint directory: not opened" in out


@pytest.fixture(scope="module")
def dual(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """transformers' layout (a Mistral4 saved by transformers, sharded, of the text params' config) with Mistral's
    layout of the same config beside it, as Mistral publishes its repos."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = mistral_params.config_from_params(text_params())
    keys = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "n_routed_experts", "n_shared_experts", "kv_lora_rank",
            "q_lora_rank", "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim", "first_k_dense_replace",
            "num_experts_per_tok", "rms_norm_eps", "n_group", "topk_group", "tie_word_embeddings")
    torch.manual_seed(0)
    model = transformers.Mistral4ForCausalLM(transformers.Mistral4Config(**{k: cfg[k] for k in keys}))
    d = tmp_path_factory.mktemp("dual") / "m"
    model.to(torch.bfloat16).save_pretrained(d, max_shard_size="200KB")
    split(d, "rope", p=text_params())
    return d


def test_a_dual_layout_folder_audits_config_jsons_layout_and_sets_the_other_aside(dual: Path) -> None:
    found = kimi_audit.audit(dual).findings
    assert [(f.code, f.actual) for f in found] == [("MISTRAL_LAYOUT_BESIDE", 2)], [f.message for f in found]
    assert f"--include '{mistral_params.CONSOLIDATED_SHARDS}' --include params.json --include {INDEX}" in \
        found[0].message


def test_the_other_layout_audits_clean_through_include(dual: Path) -> None:
    from kimi_audit.checks.audit import audit_source
    from kimi_audit.sources.selected import Selected

    report = audit_source(Selected(LocalSource(dual), (mistral_params.CONSOLIDATED_SHARDS, "params.json", INDEX)))
    assert report.findings == (), [f.message for f in report.findings]
    assert report.checkpoint is not None and report.checkpoint.config_raw["source_format"] == "params.json"


@pytest.mark.parametrize(("key", "value", "said"), [
    ("n_layers", 3, "n_layers 3 (its num_hidden_layers 2)"),
    ("moe.num_experts", 8, "moe.num_experts 8 (its n_routed_experts 4)"),
    ("kv_lora_rank", 32, "kv_lora_rank 32 (its kv_lora_rank 64)")])
def test_params_json_disagreeing_with_config_json_is_one_finding(dual: Path, tmp_path: Path, key: str, value: Any,
                                                                   said: str) -> None:
    d = Path(shutil.copytree(dual, tmp_path / "m"))
    p = text_params()
    head, _, tail = key.partition(".")
    (p[head].__setitem__(tail, value) if tail else p.__setitem__(key, value))
    (d / "params.json").write_text(json.dumps(p))
    found = [f for f in kimi_audit.audit(d).findings if f.code != "MISTRAL_LAYOUT_BESIDE"]
    assert [(f.code, f.shard) for f in found] == [("PARAMS_DISAGREES", "params.json")], [f.message for f in found]
    assert said in found[0].message
    assert cli(d)[0] == 1


def test_an_unreadable_params_json_beside_config_json_is_one_finding(dual: Path, tmp_path: Path) -> None:
    d = Path(shutil.copytree(dual, tmp_path / "m"))
    (d / "params.json").write_text("[")
    found = [f for f in kimi_audit.audit(d).findings if f.code != "MISTRAL_LAYOUT_BESIDE"]
    assert [f.code for f in found] == ["PARAMS_DISAGREES"] and "cannot be read" in found[0].message


@pytest.mark.parametrize(("change", "stray"), [
    ({"add_pre_mm_projector_layer_norm": False}, "pre_mm_projector_norm.weight"),
    ({"mm_projector_id": "mlp"}, "patch_merger.merging_layer.weight")])
def test_the_projectors_norm_and_merger_follow_vision_encoder(tmp_path: Path, change: dict[str, Any],
                                                              stray: str) -> None:
    """vision_encoder says whether the projector has its RMSNorm (add_pre_mm_projector_layer_norm) and its patch
    merger (mm_projector_id 'patch_merge'), as vLLM's VisionEncoderArgs builds it: one stored where the params say
    none is TENSOR_UNEXPECTED (each was a PASS, round three of the red team)."""
    from kimi_audit import audit

    d = tmp_path / "m"
    shutil.copytree(Path(__file__).resolve().parent / "data" / "mistral_format" / "bf16", d)
    params = json.loads((d / "params.json").read_text())
    params["vision_encoder"].update(change)
    (d / "params.json").write_text(json.dumps(params))
    assert [(f.code, f.tensor) for f in audit(d).findings] == [("TENSOR_UNEXPECTED", stray)]


def test_a_mistral_checkpoint_claims_no_missing_gains() -> None:
    """The q_a_layernorm summary looked for `self_attn.q_a_layernorm` and printed every layer's gain missing on a
    PASS of Mistral's own names (`attention.q_a_norm`): the summary now makes no claim on a tree that names it
    otherwise (red team round three)."""
    from kimi_audit import audit

    report = audit(Path(__file__).resolve().parent / "data" / "mistral_format" / "bf16")
    assert report.verdict() == "PASS" and report.audit.q_a_layernorm.rows == ()
