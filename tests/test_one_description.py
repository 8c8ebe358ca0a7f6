"""One description per architecture and per format (issue 29): a registered Architecture record
(model.arch.spec) owns every fact of a model, a registered Scheme class (model.quant) every fact of a format;
everything else reads them. These tests register a throwaway architecture and format from this module alone
(no package file touched), refuse duplicates, grep the package for facts spelled outside their owners, and
hold the drift bugs the copies made (each failed on the code before the registries)."""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from safetensors.numpy import save_file

import kimi_audit
from kimi_audit.errors import ConfigError
from kimi_audit.model.arch import deepseek_v3, deepseek_v4, kimi_linear
from kimi_audit.model.arch.registry import architecture, architecture_of, model_types
from kimi_audit.model.arch.spec import (
    BLOCK_KEYS,
    DENSE,
    Architecture,
    Factor,
    Leaf,
    Linear,
    ModelTree,
    Param,
    register,
    unregister,
)
from kimi_audit.model.config import model_config_from_dict, pinned_config_bytes
from kimi_audit.model.config_fields import LINEAGE_BASE, ModelConfig, read_int, weights_dtype
from kimi_audit.model.kinds import GAIN_SUFFIX, OTHER, PACKED, PACKED_WEIGHT, ROUTER_BIAS, SCALE, WEIGHT_SUFFIX
from kimi_audit.model.quant.dispatch import quant_plan
from kimi_audit.model.quant.scheme import DEEPSEEK_RELEASE, QuantPlan, ReleaseQuant, Scheme, Stored, Unquantized
from kimi_audit.model.roles import kind_of, role_of, suffix_roles

PACKAGE = Path(kimi_audit.__file__).parent
DATA = PACKAGE / "data"

# ------------------------------------------------------------------ a throwaway architecture and format

TOY_DEFAULTS = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "vocab_size": 128}


def toy_read(cfg: dict[str, Any]) -> ModelConfig:
    """A two-Linear MLP model: the same field readers every architecture reads with."""
    fields = {k: read_int(cfg, k, TOY_DEFAULTS) for k in TOY_DEFAULTS}
    dtype = weights_dtype(cfg)
    plan = quant_plan(cfg.get("quantization_config"), dtype, cfg, DEEPSEEK_RELEASE)
    return ModelConfig(**{**LINEAGE_BASE, **fields}, model_type="toy_mlp", dtype=dtype, norm_dtype=dtype,
                       quant=plan)


def toy_describe(cfg: ModelConfig) -> ModelTree:
    h = Factor(cfg.hidden_size, "hidden", ("hidden_size",))
    i = Factor(cfg.intermediate_size, "intermediate", ("intermediate_size",))
    v = Factor(cfg.vocab_size, "vocab", ("vocab_size",))
    layer = (
        Leaf("norm", "norm", "Pre-MLP norm", "input_layernorm",
             (Param("Learned gain", "norm.weight", (h,), cfg.dtype),), (BLOCK_KEYS,)),
        Leaf("up", "up", "Up projection", "up_proj", (Linear("up", (i,), (h,)),), (BLOCK_KEYS,)),
        Leaf("down", "down", "Down projection", "down_proj", (Linear("down", (h,), (i,)),), (BLOCK_KEYS,)),
    )
    before = (Leaf("embedding", "embed", "Token embedding", "embedding",
                   (Param("Embedding table", "embed.weight", (v, h), cfg.dtype),)),)
    return ModelTree(before, {DENSE: layer}, ())


TOY = Architecture(name="Toy MLP", model_types=("toy_mlp",), read=toy_read, describe=toy_describe,
                   class_names=("ToyMlpForCausalLM",))

TOY_PACKED, TOY_SCALE = ".toy_words", ".toy_scale"


@dataclass(frozen=True)
class ToyNibbles(Scheme):
    """A throwaway format: two 4-bit codes a byte (`toy_words`, U8 [out, in/2]) and one F32 scale a row
    (`toy_scale`, [out, 1]); w = (code - 8) * scale."""

    key: ClassVar[str] = "toy-nibbles"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = (("toy", None),)
    roles: ClassVar[tuple[tuple[str, str], ...]] = ((TOY_PACKED, PACKED_WEIGHT), (TOY_SCALE, "group_scale"))

    @classmethod
    def plan(cls, q: dict[str, Any], plain: Unquantized, config: Mapping[str, Any],
             release: ReleaseQuant) -> QuantPlan:
        return QuantPlan(cls(), plain)

    def summary(self) -> dict[str, Any]:
        return {"method": "toy", "bits": 4}

    @property
    def name(self) -> str:
        return "TOY4"

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        return (Stored(TOY_PACKED, "U8", (out, inp // 2), PACKED, out * inp),
                Stored(TOY_SCALE, "F32", (out, 1), SCALE))

    def describe(self) -> str:
        return "4-bit toy codes, one F32 scale per row"

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        w = tensors[TOY_PACKED]
        codes = np.stack([w & 0xF, w >> 4], axis=-1).reshape(out, inp).astype(np.float32)
        return (codes - 8) * tensors[TOY_SCALE]


ToyNibbles.unregister()  # registered by its class statement; each test that uses it registers it again


@pytest.fixture
def toy() -> Iterator[None]:
    register(TOY)
    ToyNibbles.register()
    try:
        yield
    finally:
        unregister(TOY)
        ToyNibbles.unregister()


def write_toy(d: Path, quantized: bool) -> int:
    """A toy checkpoint of two layers (its parameters returned): plain BF16-free F32 weights, or the Linear
    weights in ToyNibbles."""
    rng = np.random.default_rng(0)
    cfg: dict[str, Any] = {"model_type": "toy_mlp", "dtype": "float32", **TOY_DEFAULTS}
    if quantized:
        cfg["quantization_config"] = {"quant_method": "toy"}
    h, i, v = 64, 96, 128
    tensors: dict[str, np.ndarray] = {"embed.weight": rng.standard_normal((v, h), dtype=np.float32)}
    params = v * h
    for layer in range(2):
        p = f"model.layers.{layer}."
        tensors[p + "norm.weight"] = np.ones(h, np.float32)
        params += h
        for module, (o, n) in (("up", (i, h)), ("down", (h, i))):
            params += o * n
            if quantized:
                tensors[p + module + TOY_PACKED] = rng.integers(0, 256, (o, n // 2), dtype=np.uint8)
                tensors[p + module + TOY_SCALE] = np.full((o, 1), 0.01, np.float32)
            else:
                tensors[p + module + ".weight"] = rng.standard_normal((o, n), dtype=np.float32)
    d.mkdir()
    save_file(tensors, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(cfg))
    return params


@pytest.mark.parametrize("quantized", [False, True], ids=["plain", "toy-format"])
def test_a_throwaway_architecture_and_format_registered_here_audit_clean(tmp_path: Path, toy: None,
                                                                          quantized: bool) -> None:
    """The record and the class above are the whole of the toy model and format: the audit reads the config
    with the toy reader, expects the toy tree's tensors stored as the toy format says, counts the packed words
    for the parameters they stand for, and checks the toy scales' values."""
    params = write_toy(tmp_path / "toy", quantized)
    report = kimi_audit.audit(tmp_path / "toy", values=True)
    assert [f.code for f in report.findings if f.severity.value != "info"] == [], report.findings
    assert report.stats.parameters == params
    assert architecture_of({"architectures": ["ToyMlpForCausalLM"]}) is TOY
    if quantized:
        assert role_of("model.layers.0.up" + TOY_SCALE) == "group_scale"
        assert kind_of("model.layers.0.up" + TOY_PACKED) == PACKED
        st = {f.code for f in report.findings}
        assert "VALUES_CHECKED" in st


def test_a_throwaway_format_dequantizes_through_the_library(tmp_path: Path, toy: None) -> None:
    write_toy(tmp_path / "toy", quantized=True)
    result = kimi_audit.tensor(tmp_path / "toy", "model.layers.1.down", dequantize=True)
    doc = result.doc
    assert doc["scheme"] == ToyNibbles.key and result.ok, doc
    codes = np.frombuffer(_stored(tmp_path / "toy", "model.layers.1.down" + TOY_PACKED), np.uint8)
    values = (np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(-1).astype(np.float32) - 8) * np.float32(0.01)
    assert doc["dequantized"]["min"] == float(values.min()) and doc["dequantized"]["max"] == float(values.max())


def _stored(d: Path, name: str) -> bytes:
    from safetensors.numpy import load_file

    return load_file(str(d / "model.safetensors"))[name].tobytes()


def test_without_the_registration_the_toy_is_unsupported(tmp_path: Path) -> None:
    """The same files with nothing registered: the architecture is not known, so no layout check ran."""
    write_toy(tmp_path / "toy", quantized=False)
    report = kimi_audit.audit(tmp_path / "toy")
    assert "LAYOUT_UNSUPPORTED" in {f.code for f in report.findings}
    assert role_of("x" + TOY_PACKED) != PACKED_WEIGHT


def test_a_second_registration_is_refused() -> None:
    """gguf-py's rule: one class per quantization type, one table per architecture; a duplicate is an error,
    not a silent replacement of the first."""
    with pytest.raises(ValueError, match="deepseek_v3 already registered"):
        register(Architecture(name="Copy", model_types=("deepseek_v3",), read=deepseek_v3.read,
                              describe=deepseek_v3.describe))
    assert architecture("deepseek_v3") is deepseek_v3.ARCHITECTURE
    with pytest.raises(ValueError, match="already registered"):

        class Copy(Unquantized):
            key = "copy-fp8"
            formats = (("fp8", None),)
    assert Scheme.registry[("fp8", None)].key == "fp8"


def test_two_formats_giving_one_suffix_two_roles_are_refused(toy: None) -> None:
    class Clash(Unquantized):
        key = "clash"
        roles = ((TOY_PACKED, "zero_point"),)

    try:
        with pytest.raises(ValueError, match="two roles"):
            suffix_roles()
    finally:
        Clash.unregister()
    assert dict(suffix_roles())[TOY_PACKED] == PACKED_WEIGHT


# ------------------------------------------------------------------ no fact spelled outside its owner


def name_literals(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module that are not docstrings nor prose (no whitespace): names and keys."""
    tree = ast.parse(path.read_text())
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and id(n) not in docs and not any(c.isspace() for c in n.value)]


def test_no_module_outside_the_registries_names_a_model_type_or_a_format_suffix() -> None:
    """Every model_type is spelled in its model.arch module and every tensor suffix in its format class
    (model.quant) or architecture; any other module reads them through the registries."""
    types = set(model_types())
    suffixes = [s for s, _ in suffix_roles() if s not in (GAIN_SUFFIX, WEIGHT_SUFFIX)]
    owners = (PACKAGE / "model" / "arch", PACKAGE / "model" / "quant")
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if any(path.is_relative_to(o) for o in owners):
            continue
        found += [f"{path.relative_to(PACKAGE)}:{line}: {value!r}" for line, value in name_literals(path)
                  if value in types or any(s in value for s in suffixes)]
    assert not found, "\n".join(found)


def test_the_grep_finds_a_planted_literal(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('"""Docstrings may say deepseek_v4 and .weight_packed."""\nX = "deepseek_v4"\n'
                   'Y = "layers.0.mlp.weight_packed"\nZ = "a sentence naming .weight_packed"\n')
    assert [v for _, v in name_literals(bad)] == ["deepseek_v4", "layers.0.mlp.weight_packed"]


# ------------------------------------------------------------------ the drift bugs, one test each


def v4_config(**changes: Any) -> dict[str, Any]:
    return {**json.loads((DATA / "deepseek-v4-flash.config.json").read_text()), **changes}


def test_v4_routing_bias_is_a_router_bias_for_the_values_pass() -> None:
    """arch/deepseek_v4 names `ffn.gate.bias` its routing bias; the suffix classifier did not know it, so
    `audit --values` never read it."""
    assert role_of("layers.7.ffn.gate.bias") == ROUTER_BIAS
    assert ("ffn.gate.bias", ROUTER_BIAS) in deepseek_v4.ARCHITECTURE.value_roles


@pytest.mark.parametrize("model_type", ["deepseek_v3", "deepseek_v4", "kimi_linear", "glm_moe_dsa"])
def test_every_architecture_reads_its_config_with_the_same_bounds(model_type: str) -> None:
    """hidden_size 2^70 was refused for deepseek_v3 and accepted for deepseek_v4 (two config readers)."""
    base = (v4_config() if model_type == "deepseek_v4" else
            json.loads(pinned_config_bytes()) | {"model_type": model_type})
    with pytest.raises(ConfigError, match="over 2\\^63 - 1"):
        model_config_from_dict(dict(base, hidden_size=2**70))
    with pytest.raises(ConfigError, match="must be a non-negative integer"):
        model_config_from_dict(dict(base, hidden_size=-1))


def test_the_router_dtype_policy_is_one() -> None:
    """checks.layout (ROUTER_DTYPE) and the accounting (its dtype check) read one policy: Kimi-Linear's router
    weight, kept F32 by transformers, was writer variance to the layout and a wrong dtype to the accounting
    (which matched `mlp.gate.weight` only)."""
    from kimi_audit.model.accounting.account import build_accounting
    from kimi_audit.model.accounting.builder import writer_variance

    raw = {"model_type": "kimi_linear", "dtype": "bfloat16", "num_hidden_layers": 2}
    acc = build_accounting(model_config_from_dict(raw), {})
    parts = {p.component: p for n in acc.nodes() if n.is_leaf for p in n.parts}
    for component in kimi_linear.ARCHITECTURE.float32_routers:
        assert writer_variance(parts[component]), component


def test_the_accounting_places_a_name_under_the_configs_layer_prefix() -> None:
    """DeepSeek-V4's release names its layers `layers.N.`; the accounting's slot reader matched only
    `model.layers.N.`, so a V4 name got no layer."""
    from kimi_audit.model.accounting.tree import tensor_slot

    cfg = model_config_from_dict(v4_config())
    block, component, layer = tensor_slot(cfg, "layers.5.ffn.experts.9.w1.extra")
    assert (layer, component) == (5, "ffn.experts.w1.extra") and block is not None and block.startswith("moe")
    assert tensor_slot(cfg, "model.layers.5.ffn.norm.weight")[2] == 5  # transformers' spelling of the same


def test_explain_finds_a_v4_part_by_a_tensor_name() -> None:
    """explain mapped every V4 and Kimi-Linear block kind to "?" when it looked a tensor name up."""
    from kimi_audit.model.accounting.account import build_accounting
    from kimi_audit.model.explain import find_nodes

    raw = v4_config()
    cfg = model_config_from_dict(raw)
    nodes = find_nodes(build_accounting(cfg, {}), cfg, "layers.9.ffn.experts.999.w2.weight")
    assert nodes and all(n.key.startswith("blocks.moe") and n.key.endswith("w2") for n in nodes)


def test_explain_titles_come_from_the_architecture() -> None:
    from kimi_audit.report.explain import _model_title

    assert _model_title("kimi_k2") == "Kimi K2" and _model_title("deepseek_v4") == "DeepSeek-V4"
    assert _model_title("glm_moe_dsa") == "GLM-5" and _model_title("unknown_x") == "unknown_x"


def test_v41_blocks_are_the_architectures_fact() -> None:
    """QUANT_CONFIG accepts the blocks the architecture's release uses: [32, 32] for DeepSeek-V4, not V3."""
    from kimi_audit.checks.quantization import quantization_findings

    q = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [32, 32], "activation_scheme": "dynamic"}
    assert quantization_findings({"model_type": "deepseek_v4", "quantization_config": q}) == []
    assert [f.code for f in quantization_findings({"model_type": "deepseek_v3", "quantization_config": q})] == [
        "QUANT_CONFIG"]


# ------------------------------------------------------------------ no process-wide state


def process_state() -> dict[str, Any]:
    import gc
    import signal
    import sys
    import warnings

    return {"signals": {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE)},
            "gc": gc.get_threshold(), "gc_enabled": gc.isenabled(), "recursion": sys.getrecursionlimit(),
            "stdout": sys.stdout, "stderr": sys.stderr, "environ": dict(os.environ), "cwd": os.getcwd(),
            "warnings": list(warnings.filters), "numpy": np.geterr()}


def test_the_library_changes_no_process_wide_state(tiny_copy: Path) -> None:
    """Importing the package and calling the library (an audit with values, one tensor, a layout, a verify
    interrupted by Ctrl-C) leave signal dispositions, the cycle collector, the streams, the environment, the
    working directory, the warning filters and numpy's error state as they were. verify used to set SIGINT to
    ignored when it was interrupted."""
    from kimi_audit.sources.local import LocalSource
    from kimi_audit.verify.run import VerifyOptions, VerifyTarget, prepare, verify_files

    before = process_state()
    kimi_audit.audit(tiny_copy, values=True)
    kimi_audit.layout(tiny_copy / "config.json")
    kimi_audit.tensor(tiny_copy, "model.layers.1.self_attn.q_a_layernorm.weight")

    def interrupt(name: str, done: int) -> None:
        raise KeyboardInterrupt

    report, _ = verify_files(prepare(VerifyTarget(LocalSource(tiny_copy)), VerifyOptions(workers=1)), interrupt)
    assert report.interrupted
    assert process_state() == before


def test_a_part_an_architecture_declares_undescribed_is_one_info(tmp_path: Path) -> None:
    """`Architecture.undescribed`: names a release stores that the tree leaves out are one TENSORS_UNDESCRIBED
    info, not an error each; anything else unknown stays an error (DeepSeek-V4's MTP stage used it until it was
    described)."""
    from dataclasses import replace

    arch = replace(TOY, undescribed={r"^drafter\.": "the toy's drafter"})
    register(arch)
    ToyNibbles.register()
    try:
        write_toy(tmp_path / "toy", quantized=False)
        from safetensors.numpy import load_file

        tensors = load_file(str(tmp_path / "toy" / "model.safetensors"))
        tensors.update({f"drafter.{i}.weight": np.zeros(4, np.float32) for i in range(3)})
        tensors["model.layers.0.extra.weight"] = np.zeros(2, np.float32)
        save_file(tensors, str(tmp_path / "toy" / "model.safetensors"))
        report = kimi_audit.audit(tmp_path / "toy")
    finally:
        unregister(arch)
        ToyNibbles.unregister()
    assert sorted((f.code, f.covers) for f in report.findings) == [("TENSORS_UNDESCRIBED", 3),
                                                                   ("TENSOR_UNEXPECTED", 0)]


def test_a_compressed_tensors_config_decides_what_v4_quantizes() -> None:
    """Issue 33: the release's BF16 defaults (V4's compressor and indexer projections) overrode a
    compressed-tensors config that quantizes them, and `ignore: [lm_head]` did not reach V4's `head`. The
    release's own FP8 keeps them plain (ReleaseQuant.plain_suffixes); a compressed-tensors config's targets
    and ignore decide for its checkpoints, read in the release's names (ReleaseQuant.aliases)."""
    keys = {"vocab_size": 64, "hidden_size": 32, "moe_intermediate_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 4, "head_dim": 16, "q_lora_rank": 24, "num_experts_per_tok": 2,
            "n_routed_experts": 4, "o_groups": 2, "o_lora_rank": 8, "index_n_heads": 2, "index_head_dim": 8,
            "hc_mult": 2, "mlp_layer_types": ["moe", "moe"],
            "layer_types": ["compressed_sparse_attention", "heavily_compressed_attention"]}
    fp8_channel = {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
                   "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                       "num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True,
                       "dynamic": False}}}}
    ct = kimi_audit.layout({"model_type": "deepseek_v4", **keys, "quantization_config": fp8_channel})
    for module in ("layers.0.attn.compressor.wkv", "layers.0.attn.indexer.compressor.wgate",
                   "layers.0.attn.indexer.weights_proj", "layers.0.attn.wq_a"):
        assert ct[module + ".weight"].dtype == "F8_E4M3" and module + ".weight_scale" in ct, module
    assert ct["head.weight"].dtype == "BF16" and "head.weight_scale" not in ct  # `lm_head` is V4's `head`
    release = kimi_audit.layout({"model_type": "deepseek_v4", **keys, "quantization_config": {
        "quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}})
    assert release["layers.0.attn.compressor.wkv.weight"].dtype == "BF16"
    assert "layers.0.attn.compressor.wkv.scale" not in release and "layers.0.attn.wq_a.scale" in release


def test_role_of_is_the_longest_suffix_of_the_whole_table() -> None:
    """role_of compares a name with the suffixes that share its last characters (model.roles.TAIL), not with all of
    them: the answer is the table's own (the longest suffix that ends the name), for every suffix on every name
    that ends in it or in a part of it, and on names no suffix ends."""
    table = suffix_roles()

    def longest(name: str) -> str:
        return next((role for suffix, role in table if name.endswith(suffix)), OTHER)

    names = ["", "x", "ab", ".weight", "weight", "model.layers.0.mlp.experts.3.down_proj.weight_packed_x"]
    for suffix, _ in table:
        names += [suffix, "model.layers.7.mlp." + suffix, "blk.1" + suffix, suffix[1:], suffix[:-1], suffix + "x",
                  "q_a_layer" + suffix, suffix[-2:], suffix[-3:]]
    assert [role_of(n) for n in names] == [longest(n) for n in names]
