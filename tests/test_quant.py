"""Quantization schemes as data (model.quant) and the layouts they give for each family member."""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
from math import prod
from pathlib import Path

import pytest

from kimi_audit.model.config import model_config_from_dict, pinned_config_bytes
from kimi_audit.model.kinds import PACKED, PARAMETER, SCALE
from kimi_audit.model.layout import ExpectedLayout, expected_layout
from kimi_audit.model.quant import dispatch
from kimi_audit.model.quant.compressed.pack import PackQuantized
from kimi_audit.model.quant.dispatch import quant_plan
from kimi_audit.model.quant.scheme import QuantPlan, ReleaseQuant, Scheme, Unquantized, UnsupportedQuantization
from kimi_audit.model.quant.skips import OUTPUT_HEAD, skipped
from kimi_audit.replica.models import replica_model

DATA = Path(__file__).parent / "data"
THINKING_QUANT = json.loads(replica_model("kimi-k2-thinking").config_bytes())["quantization_config"]
"""Kimi-K2-Thinking's compressed-tensors quantization_config, as the package ships it."""


def instruct() -> dict:
    return json.loads(pinned_config_bytes())


def thinking() -> dict:
    return dict(instruct(), quantization_config=THINKING_QUANT)


def deepseek_v3() -> dict:
    return json.loads((DATA / "deepseek-v3.config.json").read_text())


def deepseek_v32() -> dict:
    return dict(deepseek_v3(), model_type="deepseek_v32", architectures=["DeepseekV32ForCausalLM"],
                index_n_heads=64, index_head_dim=128, index_topk=2048)


def layout(raw: dict) -> ExpectedLayout:
    return expected_layout(model_config_from_dict(raw))


def defined_schemes() -> set[type[Scheme]]:
    """Every Scheme subclass a module of the model.quant package defines (walked as dispatch.load_formats walks
    it), read from the modules themselves, not from the registry."""
    package = dispatch.__name__.rpartition(".")[0]
    quant_dir = Path(dispatch.__file__).parent
    out: set[type[Scheme]] = set()
    for m in pkgutil.walk_packages([str(quant_dir)], package + "."):
        module = importlib.import_module(m.name)
        out |= {c for c in vars(module).values()
                if isinstance(c, type) and issubclass(c, Scheme) and c.__module__ == m.name and c.key}
    return out


def test_every_scheme_registers_under_its_method_and_format() -> None:
    """The registry is derived, not listed here: every scheme class model.quant defines is registered once, under
    its key and the (quant_method, format) pairs it names, and the registry holds nothing else."""
    defined = defined_schemes()
    assert Unquantized in defined and PackQuantized in defined
    assert set(Scheme.classes) == defined and len(Scheme.classes) == len(defined)
    assert len({c.key for c in defined}) == len(defined)
    assert Scheme.registry == {pair: c for c in Scheme.classes for pair in c.formats}
    assert sum(len(c.formats) for c in defined) == len(Scheme.registry)  # no pair claimed twice


def test_quant_plan_dispatches_through_the_registry() -> None:
    """A scheme class registered for a (method, format) pair is what quant_plan builds: a new format is one
    class (here a throwaway one, removed from the registry afterwards)."""

    class Probe(Unquantized):
        key = "probe"
        formats = (("probe-method", "probe-format"),)

        @classmethod
        def plan(cls, q: dict, plain: Unquantized, config: dict, release: ReleaseQuant) -> QuantPlan:
            return QuantPlan(cls(dtype="F16"), plain)

    try:
        plan = quant_plan({"quant_method": "probe-method", "format": "probe-format"}, "BF16")
        assert plan is not None and type(plan.quantized) is Probe and plan.quantized.dtype == "F16"
    finally:
        Probe.unregister()
    assert ("probe-method", "probe-format") not in Scheme.registry and Probe not in Scheme.classes
    with pytest.raises(UnsupportedQuantization, match="quant_method 'probe-method'"):
        quant_plan({"quant_method": "probe-method", "format": "probe-format"}, "BF16")
    with pytest.raises(UnsupportedQuantization, match="compressed-tensors format 'marlin-24'"):
        quant_plan({"quant_method": "compressed-tensors", "format": "marlin-24"}, "BF16")


def test_the_summary_gives_each_schemes_own_fields() -> None:
    """`model.quantization` in `audit --json`: FP8 keeps method/fmt/block; INT4 gives its real fields, not a
    phantom FP8 block."""
    fp8 = model_config_from_dict(instruct()).quant
    assert fp8 is not None and fp8.summary() == {"method": "fp8", "fmt": "e4m3", "block": [128, 128]}
    int4 = model_config_from_dict(thinking()).quant
    assert int4 is not None and int4.summary() == {
        "method": "compressed-tensors", "format": "pack-quantized", "bits": 4, "group_size": 32,
        "strategy": "group", "symmetric": True}


def test_int4_experts_store_packed_words_group_scales_and_their_shape() -> None:
    s = PackQuantized(bits=4, group_size=32, scale_dtype="BF16")
    gate, down = s.stored(2048, 7168), s.stored(7168, 2048)
    assert [(t.suffix, t.dtype, t.shape, t.kind) for t in gate] == [
        (".weight_packed", "I32", (2048, 896), PACKED), (".weight_scale", "BF16", (2048, 224), SCALE),
        (".weight_shape", "I32", (2,), SCALE)]
    assert [t.shape for t in down][:2] == [(7168, 256), (7168, 64)]
    assert gate[0].logical == 2048 * 7168 and all(t.logical == 0 for t in gate[1:])
    asym = PackQuantized(bits=4, group_size=32, symmetric=False, actorder="group").stored(100, 70)
    assert [(t.suffix, t.shape) for t in asym[3:]] == [(".weight_zero_point", (13, 3)), (".weight_g_idx", (70,))]


def test_the_plan_follows_compressed_tensors_targets_and_ignore() -> None:
    plan = quant_plan(THINKING_QUANT, "BF16")
    assert plan is not None
    quantized = [m for m in ("model.layers.1.mlp.experts.7.gate_proj", "model.layers.1.self_attn.q_a_proj",
                             "model.layers.1.mlp.shared_experts.up_proj", "model.layers.0.mlp.down_proj", "lm_head",
                             "model.layers.60.mlp.experts.383.down_proj")
                 if plan.scheme_for(m) is plan.quantized]
    assert quantized == ["model.layers.1.mlp.experts.7.gate_proj", "model.layers.60.mlp.experts.383.down_proj"]


@pytest.mark.parametrize("ignore", [["re:model\\.layers\\.1\\d\\..*", "model.layers.3.mlp.experts.0.up_proj"],
                                    ["re:.*experts\\.[0-9]\\..*"], []])
def test_the_columnwise_mask_is_scheme_for_module_by_module(ignore: list[str]) -> None:
    plan = quant_plan(dict(THINKING_QUANT, ignore=ignore), "BF16")
    assert isinstance(plan, QuantPlan)
    names = [f"model.layers.{layer}.mlp.experts.{e}.{p}" for layer in (1, 3, 12, 19, 20) for e in (0, 5, 17)
             for p in ("gate_proj", "up_proj")] + ["lm_head", "model.layers.1.eh_proj"]
    assert plan.choices(names) == tuple(-1 if plan.scheme_for(n) is plan.plain else 0 for n in names)


def test_choices_of_several_groups_and_patterns_are_scheme_for_module_by_module() -> None:
    """Several config groups, `re:` targets that overlap (the first group that matches wins), an exact target and
    an ignore pattern: `choices` (one RE2 scan per pattern over a layer's names) is `scheme_for` name by name."""
    w4 = THINKING_QUANT["config_groups"]["group_0"]
    w8 = dict(w4, weights=dict(w4["weights"], num_bits=8))
    raw = dict(THINKING_QUANT, ignore=["re:.*experts\\.1\\..*"], config_groups={
        "a": dict(w4, targets=["re:.*experts\\.\\d+\\.gate_proj$", "model.layers.2.self_attn.q_a_proj"]),
        "b": dict(w8, targets=["re:.*experts\\.[0-3]\\..*", "re:.*shared_experts.*"])})
    plan = quant_plan(raw, "BF16")
    assert isinstance(plan, QuantPlan) and len(plan.schemes) == 2
    names = [f"model.layers.{layer}.mlp.{e}.{p}" for layer in (1, 2) for e in
             ("experts.0", "experts.1", "experts.3", "experts.9", "shared_experts")
             for p in ("gate_proj", "up_proj", "down_proj")] + ["model.layers.2.self_attn.q_a_proj", "lm_head"]
    want = tuple(-1 if s is plan.plain else plan.schemes.index(s) for s in map(plan.scheme_for, names))
    assert plan.choices(names) == want
    assert {-1, 0, 1} <= set(want)


def test_thinking_layout_totals_equal_instructs() -> None:
    """208,276 tensors; logical parameters 1,026,408,232,448, Instruct's; only routed experts quantized."""
    t, i = layout(thinking()), layout(instruct())
    assert (len(t), len(i)) == (208_276, 139_644)
    assert sum(e.logical for e in t.values()) == sum(e.logical for e in i.values()) == 1_026_408_232_448
    packed = [e for e in t.values() if e.kind == PACKED]
    assert len(packed) == 60 * 384 * 3 and all(".mlp.experts." in e.name for e in packed)
    assert t["model.layers.1.self_attn.q_a_proj.weight"].dtype == "BF16"
    assert t["lm_head.weight"].kind == PARAMETER


def test_per_layer_choices_make_their_own_templates() -> None:
    """An ignore entry naming one layer's module changes that layer only."""
    raw = dict(instruct(), quantization_config=dict(THINKING_QUANT, ignore=[
        *THINKING_QUANT["ignore"], "model.layers.7.mlp.experts.3.gate_proj"]))
    t = layout(raw)
    assert t["model.layers.7.mlp.experts.3.gate_proj.weight"].dtype == "BF16"
    assert "model.layers.7.mlp.experts.3.gate_proj.weight_packed" not in t
    assert "model.layers.8.mlp.experts.3.gate_proj.weight_packed" in t
    assert len(t) == 208_276 - 2  # three packed tensors become one weight


def test_deepseek_v3_and_v32_totals() -> None:
    v3, v32 = layout(deepseek_v3()), layout(deepseek_v32())
    stored = [e for e in v3.values() if e.kind != "buffer"]  # V3 stores no rotary_emb.inv_freq
    assert len(stored) == 91_991
    assert sum(e.logical for e in v3.values()) == 684_489_845_504
    assert sum(prod(e.shape) for e in stored) == 684_531_386_000
    assert len(v32) == 92_425 and sum(prod(e.shape) for e in v32.values()) == 685_396_921_376
    indexer = [e for e in v32.values() if e.layer == 5 and ".indexer." in e.name]
    assert {(e.name.split("indexer.")[1], e.dtype, e.shape) for e in indexer} == {
        ("wq_b.weight", "F8_E4M3", (8192, 1536)), ("wq_b.weight_scale_inv", "F32", (64, 12)),
        ("wk.weight", "F8_E4M3", (128, 7168)), ("wk.weight_scale_inv", "F32", (1, 56)),
        ("weights_proj.weight", "BF16", (64, 7168)), ("k_norm.weight", "F32", (128,)),
        ("k_norm.bias", "F32", (128,))}
    assert v32["model.layers.5.input_layernorm.weight"].dtype == "F32"
    assert v3["model.layers.61.eh_proj.weight"].dtype == "BF16"  # the MTP projection: no scale
    assert "model.layers.61.eh_proj.weight_scale_inv" not in v3


@pytest.mark.parametrize("raw", [instruct, thinking, deepseek_v3, deepseek_v32], ids=lambda f: f.__name__)
def test_stamped_metadata_columns_equal_those_derived_from_the_specs(raw) -> None:
    t = layout(raw())
    derived = ExpectedLayout(t.names, t.spec_of, t.specs, t.layer_of)
    assert (t.meta_at, t.meta_owner) == (derived.meta_at, derived.meta_owner)
    owner_suffix = re.compile(r"\.weight(_packed)?$")
    assert all(owner_suffix.search(t.names[q]) for q in t.meta_owner)
    assert all(t.names[p].rsplit(".", 1)[0] == t.names[q].rsplit(".", 1)[0]
               for p, q in zip(t.meta_at, t.meta_owner))


def test_unknown_methods_and_formats_are_named_not_raised() -> None:
    cfg = model_config_from_dict(dict(instruct(), quantization_config={"quant_method": "hqq"}))
    assert cfg.quant is None and cfg.quant_unsupported == "quant_method 'hqq'"
    cfg = model_config_from_dict(dict(instruct(), quantization_config=dict(THINKING_QUANT, format="marlin-24")))
    assert cfg.quant_unsupported == "compressed-tensors format 'marlin-24'"


# --- the output head's default skip and transformers' skip-list matching: model.quant.skips, one helper ---

SKIP_NAMES = ["lm_head", "model.layers.1.self_attn.q_a_proj", "model.layers.11.self_attn.q_a_proj",
              "model.layers.1.mlp.gate", "model.layers.1.mlp.gate_proj", "model.layers.2.mlp.down_proj",
              "model.layers.12.mlp.experts.3.up_proj", "vision_tower.blocks.0.fc1", "model.embed_tokens"]
SKIP_KEYS = [["lm_head"], ["model.layers.1"], ["model.layers.1."], ["mlp.gate"], ["down_proj"], ["fc1"],
             ["model.layers.1.*"], ["model\\.layers\\.1\\."], [r"model.layers.\d+.mlp.experts"], ["q_a_proj", "lm"],
             ["vision_tower"], []]


@pytest.mark.parametrize("keys", SKIP_KEYS, ids=str)
def test_skip_lists_match_as_transformers_should_convert_module(keys: list[str]) -> None:
    """transformers 5.25's own function is the oracle (bitsandbytes' and AWQ's integrations call it on module
    names): a key ending in a dot skips by its boundary before the name too (bitsandbytes' copy of the rule did
    not), and AWQ's `modules_to_not_convert` is matched so, not as whole names only."""
    from transformers.quantizers.quantizers_utils import should_convert_module

    patterns = skipped(keys, "test")
    got = [patterns is not None and patterns.match(n) for n in SKIP_NAMES]
    assert got == [not should_convert_module(n, keys) for n in SKIP_NAMES]
    for method in ({"quant_method": "bitsandbytes", "load_in_4bit": True, "llm_int8_skip_modules": keys},
                   {"quant_method": "awq", "modules_to_not_convert": keys, "lm_head": True}):
        plan = quant_plan(method, "BF16")
        assert plan is not None
        plain = [plan.scheme_for(n) is plan.plain for n in SKIP_NAMES if ".experts." not in n]
        assert plain == [not should_convert_module(n, keys) for n in SKIP_NAMES if ".experts." not in n], method


@pytest.mark.parametrize("method", [{"quant_method": "gptq"}, {"quant_method": "awq"},
                                    {"quant_method": "bitsandbytes", "load_in_8bit": True}, {"quant_method": "fp8"}])
def test_the_output_head_stays_plain_by_default_in_every_format_that_says_so(method: dict) -> None:
    plan = quant_plan(method, "BF16")
    assert plan is not None and plan.scheme_for(OUTPUT_HEAD) is plan.plain
    assert plan.scheme_for("model.layers.3.self_attn.o_proj") is not plan.plain


def test_the_output_heads_name_is_spelled_once_in_model_quant() -> None:
    """The default skip was `release.alias({"lm_head"})` in three formats and a keep_plain entry in a fourth: one
    constant now (skips.OUTPUT_HEAD), which every format reads."""
    quant_dir = Path(dispatch.__file__).parent
    spelled = [f"{p.relative_to(quant_dir)}:{n.lineno}" for p in sorted(quant_dir.rglob("*.py"))
               for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Constant) and n.value == OUTPUT_HEAD]
    assert spelled == ["skips.py:" + str(next(
        n.lineno for n in ast.walk(ast.parse((quant_dir / "skips.py").read_text()))
        if isinstance(n, ast.Constant) and n.value == OUTPUT_HEAD))]
