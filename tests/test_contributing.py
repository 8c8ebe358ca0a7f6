"""docs/contributing.md's worked examples run: its three `python` blocks (a toy architecture, a toy format, the
toy model's GGUF dialect), taken from the page as written and run in order as one module, register what they
describe; tiny checkpoints written here with them audit clean (plain, in the toy format with its values read,
and as a GGUF file), and the toy format dequantizes through the library. Nothing of the package is touched."""

from __future__ import annotations

import json
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

import kimi_audit
from kimi_audit.model.arch import spec
from kimi_audit.model.arch.registry import architecture_of
from kimi_audit.model.quant.scheme import Scheme
from kimi_audit.model.roles import kind_of, role_of

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "contributing.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)


@pytest.fixture
def guide() -> Iterator[types.ModuleType]:
    """The guide's blocks run as one module; what they registered taken out again afterwards."""
    module = types.ModuleType("contributing_examples")
    sys.modules[module.__name__] = module
    try:
        for i, block in enumerate(blocks()):
            exec(compile(block, f"{GUIDE}:python block {i + 1}", "exec"), module.__dict__)
        yield module
    finally:
        sys.modules.pop(module.__name__, None)
        arch = module.__dict__.get("TOY")
        if arch is not None:
            spec.unregister(arch)
        scheme = module.__dict__.get("ToyNibbles")
        if scheme is not None:
            scheme.unregister()


def write_toy(d: Path, g: types.ModuleType, quantized: bool) -> int:
    """A toy checkpoint (its parameters returned): F32 weights, or the Linear weights in the guide's format."""
    rng = np.random.default_rng(0)
    h, i, v = (g.TOY_DEFAULTS[k] for k in ("hidden_size", "intermediate_size", "vocab_size"))
    cfg: dict[str, Any] = {"model_type": "toy_mlp", "dtype": "float32", **g.TOY_DEFAULTS}
    if quantized:
        cfg["quantization_config"] = {"quant_method": "toy"}
    tensors: dict[str, np.ndarray] = {"embed.weight": rng.standard_normal((v, h), dtype=np.float32)}
    params = v * h
    for layer in range(g.TOY_DEFAULTS["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        tensors[p + "norm.weight"] = np.ones(h, np.float32)
        params += h
        for module, (o, n) in (("up", (i, h)), ("down", (h, i))):
            params += o * n
            if quantized:
                tensors[p + module + g.TOY_PACKED] = rng.integers(0, 256, (o, n // 2), dtype=np.uint8)
                tensors[p + module + g.TOY_SCALE] = np.full((o, 1), 0.01, np.float32)
            else:
                tensors[p + module + ".weight"] = rng.standard_normal((o, n), dtype=np.float32)
    d.mkdir()
    save_file(tensors, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(cfg))
    return params


def not_info(report: Any) -> list[str]:
    return [f"{f.code}: {f.message}" for f in report.findings if f.severity.value != "info"]


def test_the_guide_has_one_block_per_protocol() -> None:
    assert len(blocks()) == 3


@pytest.mark.parametrize("quantized", [False, True], ids=["plain", "toy-format"])
def test_the_guides_architecture_and_format_audit_clean(tmp_path: Path, guide: types.ModuleType,
                                                        quantized: bool) -> None:
    params = write_toy(tmp_path / "toy", guide, quantized)
    report = kimi_audit.audit(tmp_path / "toy", values=True)
    assert not_info(report) == []
    assert report.stats.parameters == params
    assert architecture_of({"architectures": ["ToyMlpForCausalLM"]}) is guide.TOY
    if quantized:
        assert Scheme.registry[("toy", None)] is guide.ToyNibbles
        assert role_of("model.layers.0.up" + guide.TOY_SCALE) == "group_scale"
        assert kind_of("model.layers.0.up" + guide.TOY_PACKED) == "packed"
        assert "VALUES_CHECKED" in {f.code for f in report.findings}


def test_the_guides_format_checks_its_scales_values(tmp_path: Path, guide: types.ModuleType) -> None:
    """The role the guide gives the toy scale (group_scale) brings its value rule: a zero scale is
    SCALE_NOT_POSITIVE."""
    write_toy(tmp_path / "toy", guide, quantized=True)
    from safetensors.numpy import load_file

    path = tmp_path / "toy" / "model.safetensors"
    tensors = load_file(str(path))
    tensors["model.layers.1.down" + guide.TOY_SCALE][3] = 0.0
    save_file(tensors, str(path))
    report = kimi_audit.audit(tmp_path / "toy", values=True)
    assert "SCALE_NOT_POSITIVE" in {f.code for f in report.findings}


def test_the_guides_format_dequantizes_through_the_library(tmp_path: Path, guide: types.ModuleType) -> None:
    write_toy(tmp_path / "toy", guide, quantized=True)
    result = kimi_audit.tensor(tmp_path / "toy", "model.layers.1.down", dequantize=True)
    assert result.ok and result.doc["scheme"] == guide.ToyNibbles.key, result.doc


def test_the_guides_format_refuses_what_it_does_not_implement(tmp_path: Path, guide: types.ModuleType) -> None:
    write_toy(tmp_path / "toy", guide, quantized=True)
    cfg = json.loads((tmp_path / "toy" / "config.json").read_text())
    cfg["quantization_config"]["bits"] = 3
    (tmp_path / "toy" / "config.json").write_text(json.dumps(cfg))
    assert "QUANT_UNSUPPORTED" in {f.code for f in kimi_audit.audit(tmp_path / "toy").findings}


def write_toy_gguf(path: Path, g: types.ModuleType) -> None:
    """The toy model as a GGUF file, written with llama.cpp's gguf-py: the dialect's keys and names, F32."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(1)
    h, i, v = (g.TOY_DEFAULTS[k] for k in ("hidden_size", "intermediate_size", "vocab_size"))
    n = g.TOY_DEFAULTS["num_hidden_layers"]
    w = gguf.GGUFWriter(str(path), g.TOY_GGUF_ARCH)
    w.add_uint32(f"{g.TOY_GGUF_ARCH}.embedding_length", h)
    w.add_uint32(f"{g.TOY_GGUF_ARCH}.feed_forward_length", i)
    w.add_uint32(f"{g.TOY_GGUF_ARCH}.block_count", n)
    w.add_string("tokenizer.ggml.model", "none")
    w.add_tensor("token_embd.weight", rng.standard_normal((v, h), dtype=np.float32))
    for layer in range(n):
        w.add_tensor(f"blk.{layer}.ffn_norm.weight", np.ones(h, np.float32))
        w.add_tensor(f"blk.{layer}.ffn_up.weight", rng.standard_normal((i, h), dtype=np.float32))
        w.add_tensor(f"blk.{layer}.ffn_down.weight", rng.standard_normal((h, i), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_the_guides_gguf_dialect_reads_a_gguf_file(tmp_path: Path, guide: types.ModuleType) -> None:
    (tmp_path / "gguf").mkdir()
    write_toy_gguf(tmp_path / "gguf" / "toy-F32.gguf", guide)
    report = kimi_audit.audit(tmp_path / "gguf")
    assert not_info(report) == []
    assert guide.TOY.gguf is guide.TOY_GGUF
    assert guide.TOY_GGUF.rename("model.layers.1.up.weight") == "blk.1.ffn_up.weight"
    cfg = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2}
    assert guide.toy_gguf_metadata(cfg) == {"toymlp.embedding_length": 64, "toymlp.feed_forward_length": 96,
                                            "toymlp.block_count": 2}
