"""The `rmsnorm` command's numerics: its inputs, the real query latent, and the per-layer check.

`check_layer` runs on a layer's q_a_layernorm gain and the RMSNorm output computed with it: NaN/Inf in
either, an all-zero gain, and per position RMS(y) and RMS(y / gain) - 1. `query_latent` is the input
the layer's q_a_layernorm sees in the model for given embedding rows (input_layernorm, then the
dequantized q_a_proj). cli/numerics.py renders the results; it imports this module only when the
command runs, as this one loads numpy. `check_input_memory` refuses (exit 2, with the figures) an
input whose arrays would not fit in the memory available, before anything is allocated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kimi_audit.errors import KimiAuditError
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.model.layout import role_name, scheme_of
from kimi_audit.model.quant.deepseek import Fp8Block
from kimi_audit.model.quant.scheme import FP8_DTYPE, fp8_block
from kimi_audit.numerics.kernels import (
    TensorStats,
    bfloat16,
    f32_to_bf16,
    rms_norm,
    tensor_stats,
    to_float32,
)
from kimi_audit.numerics.tensor_io import NotEnoughMemoryError, TensorFetcher, check_memory

Q_A_LAYERNORM = "self_attn.q_a_layernorm.weight"
INPUT_LAYERNORM = "input_layernorm.weight"
Q_A_PROJ = "self_attn.q_a_proj.weight"
EMBED = "model.embed_tokens.weight"

BYTES_PER_ELEMENT = 32
"""Peak memory per input element of one layer's check: the bf16 input and output (2 + 2), the float32
draw of a random input (4) and the float64 arrays of position_stats (about 20); 28 measured."""
BYTES_PER_POSITION = 64
"""Per position and layer: the two floats each LayerResult keeps (output RMS, unit deviation)."""


@dataclass(frozen=True)
class LayerResult:
    """One layer's check: the gain's and the output's statistics, per-position RMS, problems found."""

    layer: int
    block: str
    tensor: str
    shard: str
    gain: TensorStats
    output: TensorStats
    output_rms: tuple[float, ...]
    """RMS of the normalized output y over the hidden axis, per position (B*T positions)."""
    unit_deviation: tuple[float | None, ...]
    """RMS(y / gain) - 1 per position (elements with gain == 0 left out)."""
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "block": self.block,
            "tensor": self.tensor,
            "shard": self.shard,
            "gain": self.gain.to_json(),
            "output": self.output.to_json(),
            "output_rms": list(self.output_rms),
            "rms_y_over_gain_minus_1": list(self.unit_deviation),
            "max_abs_deviation": max_abs(self.unit_deviation),
            "ok": self.ok,
            "problems": list(self.problems),
        }


def max_abs(vals: tuple[float | None, ...]) -> float | None:
    """The largest |v| of the finite values, None when there is none."""
    finite = [abs(v) for v in vals if v is not None and math.isfinite(v)]
    return max(finite) if finite else None


def position_stats(y: np.ndarray, gain: np.ndarray) -> tuple[tuple[float, ...], tuple[float | None, ...]]:
    """Per position: RMS(y) and RMS(y / gain) - 1 (float64; zero gains excluded)."""
    d = y.shape[-1]
    y64 = to_float32(y).astype(np.float64).reshape(-1, d)
    g64 = to_float32(gain).astype(np.float64)
    with np.errstate(all="ignore"):
        rms = np.sqrt(np.mean(y64 * y64, axis=-1))
        nz = g64 != 0
        if nz.any():
            ratio = y64[:, nz] / g64[nz]
            dev = np.sqrt(np.mean(ratio * ratio, axis=-1)) - 1.0
            devs: tuple[float | None, ...] = tuple(float(v) for v in dev)
        else:
            devs = tuple(None for _ in range(y64.shape[0]))
    return tuple(float(v) for v in rms), devs


def check_layer(layer: int, block: str, tensor: str, shard: str, gain: np.ndarray, y: np.ndarray) -> LayerResult:
    """The checks of one layer's gain and RMSNorm output y."""
    gs = tensor_stats(gain)
    ys = tensor_stats(y)
    problems = []
    if gs.nan or gs.inf:
        problems.append(f"gain has {gs.nan} NaN and {gs.inf} Inf values")
    if gs.all_zero:
        problems.append("gain is all zeros: the output is identically zero")
    if ys.nan or ys.inf:
        problems.append(f"output has {ys.nan:,} NaN and {ys.inf:,} Inf values")
    rms, dev = position_stats(y, gain)
    return LayerResult(layer, block, tensor, shard, gs, ys, rms, dev, tuple(problems))


def check_input_memory(shape: tuple[int, ...], layers: int, extra: int = 0, what: str | None = None) -> None:
    """NotEnoughMemoryError when checking `layers` layers on an input of `shape` (plus `extra` bytes)
    needs more memory than is available."""
    positions = math.prod(shape[:-1])
    need = extra + positions * shape[-1] * BYTES_PER_ELEMENT + positions * layers * BYTES_PER_POSITION
    plural = "s" if layers != 1 else ""
    check_memory(need, what or f"rmsnorm on a {list(shape)} input ({layers} layer{plural})")


def random_input(seed: int, batch: int, tokens: int, width: int) -> np.ndarray:
    """Seeded N(0, 1) activations [batch, tokens, width], rounded to bf16."""
    rng = np.random.default_rng(seed)
    try:
        return f32_to_bf16(rng.standard_normal((batch, tokens, width), dtype=np.float32))
    except MemoryError:
        raise NotEnoughMemoryError(f"out of memory drawing a [{batch}, {tokens}, {width}] input") from None


def normalize_and_check(layer: int, block: str, tensor: str, shard: str, x: np.ndarray, gain: np.ndarray,
                        eps: float) -> LayerResult:
    """rms_norm(x, gain) and check_layer on the output (an out-of-memory is an error, exit 2)."""
    try:
        return check_layer(layer, block, tensor, shard, gain, rms_norm(x, gain, eps))
    except MemoryError:
        raise NotEnoughMemoryError(f"out of memory normalizing a {list(x.shape)} input") from None


def load_input(path: Path, width: int, layers: int = 1) -> np.ndarray:
    """An --input .npy array as bf16 [B, T, width] (1-D and 2-D arrays get the missing axes); its memory
    checked (check_input_memory, plus the file's own array) from its header before it is loaded."""
    try:
        peek = np.load(path, mmap_mode="r", allow_pickle=False)
        shape, nbytes = tuple(int(d) for d in peek.shape), int(peek.nbytes)
        del peek
    except (ValueError, OSError, TypeError):
        shape, nbytes = (), 0  # np.load below says what is wrong
    if shape and shape[-1] == width and len(shape) <= 3:
        check_input_memory(shape, layers, nbytes, f"rmsnorm on --input {path} {list(shape)}")
    try:
        a: np.ndarray = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise KimiAuditError(f"--input: no such file {path}") from None
    except (ValueError, OSError) as e:
        raise KimiAuditError(f"--input {path}: not a readable .npy array ({e})") from None
    if a.dtype != bfloat16 and a.dtype.kind != "f":
        raise KimiAuditError(f"--input {path}: dtype {a.dtype} is not a float type")
    if a.ndim == 1:
        a = a[None, None, :]
    elif a.ndim == 2:
        a = a[None]
    if a.ndim != 3 or a.shape[-1] != width:
        raise KimiAuditError(f"--input {path}: shape {list(a.shape)} is not [B, T, {width}]")
    if a.dtype != bfloat16:
        a = f32_to_bf16(a.astype(np.float32))  # the model's activations are bf16
    return a


def linear_weight(fetch: TensorFetcher, cfg: ModelConfig, module: str, out: int, inp: int) -> np.ndarray:
    """A Linear module's weight [out, in], dequantized by the scheme the config's plan gives it (FP8 weights
    the config does not describe as such: DeepSeek's blocks), from the tensors that scheme stores."""
    scheme = scheme_of(cfg, module)
    main = scheme.stored(out, inp)[0]
    w, wt, _ = fetch.read(module + main.suffix)
    if wt.dtype == FP8_DTYPE and main.dtype != FP8_DTYPE:
        scheme = Fp8Block(fp8_block(cfg.quant))
    tensors = {s.suffix: w if s.suffix == main.suffix else fetch.read(module + s.suffix)[0]
               for s in scheme.stored(out, inp)}
    return scheme.dequantize(tensors, out, inp)


def query_latent(fetch: TensorFetcher, cfg: ModelConfig, layer: int, emb: np.ndarray) -> np.ndarray:
    """embedding rows -> layer's input_layernorm -> q_a_proj (dequantized), bf16 [1, T, q_lora_rank]."""
    p = cfg.layer_name(layer)
    g_in, _, _ = fetch.read(role_name(cfg, layer, "input_layernorm") or p + INPUT_LAYERNORM)
    h = rms_norm(emb, g_in, cfg.rms_norm_eps)
    w = linear_weight(fetch, cfg, role_name(cfg, layer, "q_a_proj") or p + Q_A_PROJ[: -len(".weight")],
                      cfg.q_lora_rank or 0, cfg.hidden_size)
    # F.linear: float32 accumulation, one rounding to bf16 (not bit-matched to a particular GEMM)
    q = to_float32(h) @ to_float32(w).T
    return f32_to_bf16(q)[None]
