"""Tiny DeepseekV3 checkpoints quantized by compressed-tensors itself, one per format the community ships.

The tiny architecture (tiny_checkpoint.TINY_CONFIG, with no quantization of its own) gives the Linear modules;
each one compressed-tensors' config targets gets its scales from compressed-tensors' own observer math
(`calculate_qparams` on min/max, `generate_gparam` for NVFP4's global scale) and is written by the format's own
compressor (`BaseCompressor.load_from_registry(format).compress`); config.json's quantization_config is written by
`ModelCompressor.update_config`. The tensors are saved with safetensors.torch in three shards with an index.
Activation scales that a calibration would store (a static `input_scale`, NVFP4's `input_global_scale`) are
written as fixed positive values of the dtype the layout expects. Test-time only (torch, compressed_tensors).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from compressed_tensors.compressors import BaseCompressor, ModelCompressor
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    QuantizationStrategy,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
from safetensors.torch import save_file

from tiny_checkpoint import TINY_CONFIG, tiny_shard_of

IGNORE = ["lm_head"]

PRESETS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "fp8_block": ("float-quantized", "FP8_BLOCK", {}),
    "fp8_dynamic": ("float-quantized", "FP8_DYNAMIC", {}),
    "fp8_static": ("float-quantized", "FP8", {}),
    "int8_w8a8": ("int-quantized", "W8A8", {}),
    "w4a16": ("pack-quantized", "W4A16", {"group_size": 32}),
    "w4a16_asym": ("pack-quantized", "W4A16_ASYM", {"group_size": 32}),
    "w8a16_channel": ("pack-quantized", "W8A16", {"strategy": "channel", "group_size": None}),
    "nvfp4a16": ("nvfp4-pack-quantized", "NVFP4A16", {}),
    "nvfp4": ("nvfp4-pack-quantized", "NVFP4", {}),
    "mxfp4a16": ("mxfp4-pack-quantized", "MXFP4A16", {}),
}
"""name -> (compressed-tensors format, preset scheme, changes to the preset's weights)."""


def preset_scheme(name: str, targets: list[str] | None = None) -> tuple[str, QuantizationScheme]:
    fmt, preset, changes = PRESETS[name]
    scheme = preset_name_to_scheme(preset, targets or ["Linear"])
    if changes:
        scheme = scheme.model_copy(update={"weights": QuantizationArgs(**{**scheme.weights.model_dump(), **changes})})
    return fmt, scheme


def qparams(w: torch.Tensor, args: QuantizationArgs) -> dict[str, torch.Tensor]:
    """compressed-tensors' min-max observer math for the weight: weight_scale (and zero point, global scale)."""
    s = args.strategy
    if s == QuantizationStrategy.CHANNEL:
        lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    elif s == QuantizationStrategy.TENSOR:
        lo, hi = w.amin().reshape(1), w.amax().reshape(1)
    elif s == QuantizationStrategy.BLOCK:
        b0, b1 = args.block_structure
        pad = torch.nn.functional.pad(w, (0, -w.shape[1] % b1, 0, -w.shape[0] % b0))
        g = pad.reshape(pad.shape[0] // b0, b0, pad.shape[1] // b1, b1)
        lo, hi = g.amin((1, 3)), g.amax((1, 3))
    else:
        g = w.unflatten(-1, (w.shape[-1] // args.group_size, args.group_size))
        lo, hi = g.amin(-1), g.amax(-1)
    out: dict[str, torch.Tensor] = {}
    gs = None
    if s == QuantizationStrategy.TENSOR_GROUP:
        gs = out["weight_global_scale"] = generate_gparam(w.amin(), w.amax())
    scale, zp = calculate_qparams(lo, hi, args, global_scale=gs)
    out["weight_scale"] = scale
    if not args.symmetric:
        out["weight_zero_point"] = zp
    return out


def compress_module(w: torch.Tensor, fmt: str, scheme: QuantizationScheme) -> dict[str, torch.Tensor]:
    """The tensors compressed-tensors' compressor for `fmt` stores for one Linear module's weight."""
    state = {"weight": w, **qparams(w, scheme.weights)}
    return dict(BaseCompressor.load_from_registry(fmt).compress(state, scheme))


def decompress_module(tensors: dict[str, torch.Tensor], fmt: str, scheme: QuantizationScheme) -> torch.Tensor:
    """compressed-tensors' own decompression of one module's stored tensors."""
    return BaseCompressor.load_from_registry(fmt).decompress(dict(tensors), scheme)["weight"]


def activation_scales(scheme: QuantizationScheme, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    acts = scheme.input_activations
    if acts is None or acts.dynamic is True:
        return {}
    if acts.strategy == QuantizationStrategy.TENSOR_GROUP:
        return {"input_global_scale": torch.tensor([448.0 * 6.0 / 3.0], dtype=torch.float32)}
    return {"input_scale": torch.tensor([0.0125], dtype=dtype)}


def build(d: Path, name: str, seed: int = 0, config: dict[str, Any] | None = None) -> Path:
    """A tiny checkpoint quantized as preset `name` (PRESETS), in directory `d`."""
    from kimi_audit.model.config import model_config_from_dict
    from kimi_audit.model.kinds import BUFFER
    from kimi_audit.model.layout import expected_layout

    fmt, scheme = preset_scheme(name)
    base = {k: v for k, v in (config or TINY_CONFIG).items() if k != "quantization_config"}
    plain = expected_layout(model_config_from_dict(base))  # every Linear module as a BF16 weight

    gen = torch.Generator().manual_seed(seed)
    dt = {"BF16": torch.bfloat16, "F32": torch.float32}
    shards: dict[str, dict[str, torch.Tensor]] = {}
    for tname, t in plain.items():
        module = tname[: -len(".weight")] if tname.endswith(".weight") else None
        if t.kind == BUFFER:
            made = {tname: torch.ones(t.shape, dtype=dt[t.dtype])}
        elif tname.endswith("norm.weight"):
            made = {tname: (1 + 0.1 * torch.randn(t.shape, generator=gen)).to(dt[t.dtype])}
        else:
            w = (0.02 * torch.randn(t.shape, generator=gen)).to(dt[t.dtype])
            if t.scheme and module is not None and module not in IGNORE:
                stored = {**compress_module(w, fmt, scheme), **activation_scales(scheme, w.dtype)}
                made = {f"{module}.{k}": v for k, v in stored.items()}
            else:
                made = {tname: w}
        for k, v in made.items():
            shards.setdefault(tiny_shard_of(k), {})[k] = v.contiguous()
    d.mkdir(parents=True)
    weight_map = {}
    for shard, members in shards.items():
        save_file(members, str(d / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(members, shard))
    total = sum(v.numel() * v.element_size() for m in shards.values() for v in m.values())
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                "weight_map": dict(sorted(weight_map.items()))}))
    (d / "config.json").write_text(json.dumps(base, indent=2))
    qc = QuantizationConfig(config_groups={"group_0": scheme}, format=fmt, ignore=IGNORE,
                            quantization_status="compressed")
    ModelCompressor(quantization_config=qc).update_config(str(d))
    return d


def as_released(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """compressed-tensors' output with `weight_shape` in the width Moonshot's releases store it, I32 (a public header
    dump of moonshotai/Kimi-K2.5: `weight_shape` `[2]` torch.int32); the compressor itself writes I64."""
    return {k: v.to(torch.int32) if k.endswith("weight_shape") else v for k, v in tensors.items()}
