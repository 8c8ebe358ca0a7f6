"""kimi_k25 (Kimi-K2.5, K2.6, K2.7-Code): its config (a nested `text_config`, with its own
`quantization_config` or one at the top), INT4 routed experts packed by compressed-tensors itself, the
transformers dialect, and the full-scale Kimi-K2.6 replica."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.utils import calculate_qparams

from ct_checkpoint import as_released
from kimi_audit.checks.audit import AuditReport, audit_source
from kimi_audit.errors import ConfigError
from kimi_audit.findings import Severity
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.kinds import BUFFER, PACKED, SCALE
from kimi_audit.model.layout import expected_layout
from kimi_audit.replica.models import replica_model
from kimi_audit.sources import LocalSource

K26 = json.loads(replica_model("kimi-k2.6").config_bytes())
TEXT: dict[str, Any] = {
    "model_type": "kimi_k2", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 96,
    "moe_intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2, "n_shared_experts": 1,
    "n_routed_experts": 4, "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "v_head_dim": 16,
    "qk_nope_head_dim": 16, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "num_nextn_predict_layers": 0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
VISION = {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 48, "patch_size": 2,
          "pos_emb_height": 4, "pos_emb_width": 4, "merge_kernel_size": [2, 2]}


def tiny_config(quant_in_text: bool) -> dict[str, Any]:
    """Kimi-K2.6's config (kimi_audit/data) at a tiny size, its quantization_config inside text_config or at
    the top (both seen: family.md)."""
    q = K26["quantization_config"]
    text = {**TEXT, "quantization_config": q} if quant_in_text else TEXT
    top = {} if quant_in_text else {"quantization_config": q}
    return {"model_type": "kimi_k25", "architectures": K26["architectures"], "text_config": text,
            "vision_config": VISION, "projection_hidden_size": 32, **top}


@pytest.mark.parametrize("quant_in_text", [True, False], ids=["in-text_config", "top-level"])
def test_nested_text_config_and_its_quantization(quant_in_text: bool) -> None:
    cfg = model_config_from_dict(tiny_config(quant_in_text))
    assert (cfg.model_type, cfg.prefix, cfg.hidden_size, cfg.n_routed_experts) == ("kimi_k25", "language_model.",
                                                                                    64, 4)
    assert cfg.quant is not None and cfg.quant.summary()["format"] == "pack-quantized"
    layout = expected_layout(cfg)
    packed = {n for n in layout if layout[n].kind == PACKED}
    # routed experts alone are INT4: 2 MoE layers x 4 experts x 3 projections
    assert len(packed) == 2 * 4 * 3 and all(".mlp.experts." in n for n in packed)
    assert all(n.startswith("language_model.model.layers.") for n in packed)
    assert "language_model.lm_head.weight" in layout and "language_model.model.embed_tokens.weight" in layout
    assert layout["vision_tower.encoder.blocks.1.wqkv.weight"].shape == (3 * 32, 32)
    assert layout["mm_projector.proj.0.weight"].shape == (32 * 4, 32 * 4)
    assert layout["mm_projector.proj.2.weight"].shape == (64, 32 * 4)


def test_the_published_ignore_spells_lm_head_without_the_prefix() -> None:
    """Issue 40: Kimi-K2.5's published `ignore` says `lm_head` (its writer saw the text model alone, family.md):
    it leaves `language_model.lm_head` plain, as the prefixed spelling does; with neither, lm_head is INT4."""
    def layout_with(ignore: list[str]):  # type: ignore[no-untyped-def]
        raw = tiny_config(False)
        raw["quantization_config"] = dict(K26["quantization_config"], ignore=ignore)
        return expected_layout(model_config_from_dict(raw))

    rest = [i for i in K26["quantization_config"]["ignore"] if i.startswith("re:")]
    published, prefixed, neither = (layout_with(extra + rest) for extra in (["lm_head"], ["language_model.lm_head"],
                                                                            []))
    assert list(published) == list(prefixed) and "language_model.lm_head.weight" in published
    assert "language_model.lm_head.weight_packed" in neither


def test_kimi_k25_without_text_config_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="text_config"):
        model_config_from_dict({"model_type": "kimi_k25", "vision_config": VISION})


def build(d: Path, config: dict[str, Any]) -> Path:
    """The tiny kimi_k25 INT4 checkpoint: each routed expert projection packed by compressed-tensors'
    PackedQuantizationCompressor, the rest BF16/F32, in three shards with an index; no rotary buffers."""
    from safetensors.torch import save_file

    layout = expected_layout(model_config_from_dict(config))
    gen = torch.Generator().manual_seed(0)
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=32)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    dt = {"BF16": torch.bfloat16, "F32": torch.float32}
    shards: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in layout.items():
        if t.kind in (SCALE, BUFFER):
            continue  # scales are written by the compressor with their weight
        if t.kind == PACKED:
            module = name[: -len(".weight_packed")]
            out, inp = t.shape[0], t.logical // t.shape[0]
            w = (torch.randn(out, inp, generator=gen) * 0.02).to(torch.bfloat16)
            groups = w.float().reshape(out, inp // 32, 32)
            scale, _zp = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
            state = {"weight": w, "weight_scale": scale.to(torch.bfloat16)}
            made = as_released({f"{module}.{k}": v
                                for k, v in PackedQuantizationCompressor.compress(state, scheme).items()})
        else:
            made = {name: (0.02 * torch.randn(t.shape, generator=gen)).to(dt[t.dtype])}
        shard = ("model-00003-of-000003.safetensors" if name.startswith(("vision_tower.", "mm_projector."))
                 else "model-00002-of-000003.safetensors" if ".layers.2." in name
                 else "model-00001-of-000003.safetensors")
        for k, v in made.items():
            shards.setdefault(shard, {})[k] = v.contiguous()
    d.mkdir(parents=True)
    weight_map = {}
    for shard, members in shards.items():
        save_file(members, str(d / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(members, shard))
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (d / "config.json").write_text(json.dumps(config, indent=2))
    return d


@pytest.fixture(scope="module")
def int4_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("k25") / "ckpt", tiny_config(quant_in_text=True))


def audit(d: Path) -> AuditReport:
    return audit_source(LocalSource(d))


def errors(r: AuditReport) -> list[tuple[str, str | None]]:
    return [(f.code, f.tensor) for f in r.findings if f.severity is Severity.ERROR]


def test_tiny_int4_kimi_k25_audits_clean(int4_dir: Path) -> None:
    r = audit(int4_dir)
    assert r.findings == () and r.model["model_type"] == "kimi_k25"
    assert r.model["quantization"]["format"] == "pack-quantized"
    assert r.stats.parameters == sum(e.logical for e in expected_layout(
        model_config_from_dict(tiny_config(True))).values())


def rewrite(src: Path, dst: Path, rename: dict[str, str | None]) -> Path:
    """A copy with tensors renamed (or dropped: None), the index following."""
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    index = json.loads((src / "model.safetensors.index.json").read_text())
    for old, new in rename.items():
        shard = index["weight_map"].pop(old)
        if new is not None:
            index["weight_map"][new] = shard
    for f in src.glob("*.safetensors"):
        tensors = load_file(f)
        for old, new in rename.items():
            if old in tensors:
                t = tensors.pop(old)
                if new is not None:
                    tensors[new] = t
        save_file(tensors, dst / f.name, metadata={"format": "pt"})
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    (dst / "config.json").write_bytes((src / "config.json").read_bytes())
    return dst


PACKED_NAME = "language_model.model.layers.2.mlp.experts.3.down_proj.weight_packed"


def test_missing_expert_weight_packed_is_named_once(int4_dir: Path, tmp_path: Path) -> None:
    r = audit(rewrite(int4_dir, tmp_path / "x", {PACKED_NAME: None}))
    # its group scale and weight_shape, still stored, are covered by it (one cause) and named in its message
    assert errors(r) == [("TENSOR_MISSING", PACKED_NAME)]
    (f,) = [f for f in r.findings if f.code == "TENSOR_MISSING"]
    assert f.covers == 2 and PACKED_NAME.replace("weight_packed", "weight_shape") in f.message


def test_a_whole_dialect_is_one_info_and_a_mixture_is_findings(int4_dir: Path, tmp_path: Path) -> None:
    names = json.loads((int4_dir / "model.safetensors.index.json").read_text())["weight_map"]
    spelled = {n: n.replace("language_model.model.layers.", "language_model.model.blocks.")
               .replace("vision_tower.patch_embed.proj.", "vision_tower.encoder.patch_embed.proj.")
               .replace("mm_projector.pre_norm.", "model.mm_projector.pre_norm.") for n in names}
    whole = audit(rewrite(int4_dir, tmp_path / "whole", {k: v for k, v in spelled.items() if k != v}))
    assert [(f.severity.value, f.code) for f in whole.findings] == [("info", "LAYOUT_DIALECT")]
    one = "language_model.model.layers.0.input_layernorm.weight"
    mixed = audit(rewrite(int4_dir, tmp_path / "mixed", {one: spelled[one]}))
    assert ("TENSOR_MISSING", one) in errors(mixed) and ("TENSOR_UNEXPECTED", spelled[one]) in errors(mixed)
    assert "LAYOUT_DIALECT" not in {f.code for f in mixed.findings}


def test_full_scale_kimi_k26_replica(family_replica: Callable[[str], Path]) -> None:
    """Snapshot figures of this tool's K2.6 replica (not published ones): the layout the cited config implies.
    family.md's "~595 GB" (unconfirmed) agrees with the payload."""
    d = family_replica("kimi-k2.6")
    shards = sorted(p.name for p in d.glob("*.safetensors"))
    assert len(shards) == 64 and shards[0] == "model-00001-of-000064.safetensors"
    r = audit(d)
    assert r.findings == ()
    assert r.stats.tensors == 208_550  # snapshot: 208,611 in the layout less 61 optional rotary buffers
    assert r.stats.parameters == 1_026_879_376_368  # snapshot: Kimi-K2's 1,026,408,232,448 + vision 471,143,920
    assert round(r.stats.payload_bytes / 1e9) == 595


def test_a_dialect_quantization_lists_its_ignores_in_the_dialect(tmp_path: Path) -> None:
    """A quantization of transformers' re-save lists exact `ignore` module names in the saved spelling
    (family.md): read as the release's names, the same modules stay unquantized."""
    from kimi_audit.model.arch.kimi_k25 import TRANSFORMERS

    config = tiny_config(quant_in_text=False)
    layout = expected_layout(model_config_from_dict(config))
    plain_modules = sorted({n.rpartition(".")[0] for n in layout if n.endswith(".weight") and layout[n].scheme
                            and layout[n].kind != PACKED})
    exact = {**config["quantization_config"], "ignore": plain_modules}
    canonical = build(tmp_path / "canonical", {**config, "quantization_config": exact})
    assert [f.code for f in audit(canonical).findings] == []
    names = json.loads((canonical / "model.safetensors.index.json").read_text())["weight_map"]
    spelled = rewrite(canonical, tmp_path / "spelled", {n: TRANSFORMERS.rename(n) for n in names
                                                         if TRANSFORMERS.rename(n) != n})
    q = {**exact, "ignore": [TRANSFORMERS.rename(m) for m in plain_modules]}
    assert any(".blocks." in m for m in q["ignore"])
    (spelled / "config.json").write_text(json.dumps({**config, "quantization_config": q}))
    assert [(f.severity.value, f.code) for f in audit(spelled).findings] == [("info", "LAYOUT_DIALECT")]


def test_the_published_quantization_leaves_the_vision_tower_unquantized() -> None:
    """Kimi-K2.5's published block targets every `Linear` and names no vision module; a public header dump of the
    release lists the tower and projector in BF16 (tests/data/published_totals.json): the quantizer saw the text
    model alone (RELEASE.unreached), so their Linear weights are expected BF16, and the experts INT4."""
    from importlib import resources

    raw = json.loads(resources.files("kimi_audit").joinpath("data/kimi-k2.6.config.json").read_text())
    assert not any("vision" in i or "mm_projector" in i for i in raw["quantization_config"]["ignore"])
    layout = expected_layout(model_config_from_dict(raw))
    vision = {n: t for n, t in layout.items() if n.startswith(("vision_tower.", "mm_projector."))}
    assert vision["vision_tower.encoder.blocks.0.wqkv.weight"].dtype == "BF16"
    assert vision["mm_projector.proj.0.weight"].shape == (4608, 4608)
    assert not any(t.scheme and t.scheme != "none" for t in vision.values())
    assert layout["language_model.model.layers.1.mlp.experts.0.gate_proj.weight_packed"].dtype == "I32"
