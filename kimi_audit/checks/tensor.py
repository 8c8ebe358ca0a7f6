"""One tensor, checked: the library side of `kimi-audit tensor` (kimi_audit.tensor). The tensor is read by
byte range through its source; a Linear module's stored weight brings its scheme's other tensors (scales,
shapes, zero points) with it, each value-checked as the values pass checks it; with `dequantize`, the weight
is dequantized by its scheme (model.quant) and its statistics given. Nothing here renders."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kimi_audit.errors import KimiAuditError
from kimi_audit.findings import Finding, Severity, error
from kimi_audit.format.header import TensorInfo
from kimi_audit.model.checkpoint import load_config
from kimi_audit.model.kinds import PACKED_WEIGHT, PARAMETER, WEIGHT, module_name
from kimi_audit.model.layout import expected_layout, linear_shapes, scheme_of
from kimi_audit.model.quant.deepseek import Fp8Block
from kimi_audit.model.quant.scheme import FP8_DTYPE, Scheme, Unquantized, fp8_block
from kimi_audit.model.roles import role_of, weight_suffixes
from kimi_audit.numerics.tensor_io import DEFAULT_MAX_TENSOR_BYTES, TensorFetcher, check_memory
from kimi_audit.sources.base import Source

if TYPE_CHECKING:
    import numpy as np

__all__ = ["TensorCheck", "check_tensor"]


@dataclass(frozen=True)
class TensorCheck:
    """What `check_tensor` found: `doc` is the plain-data report (`tensor --json`), `findings` the value
    findings behind its `problems`, `scheme` the module's quantization scheme (None: not a quantized weight)."""

    doc: dict[str, Any]
    findings: tuple[Finding, ...] = ()
    scheme: Scheme | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return bool(self.doc["ok"])


def _resolve(fetch: TensorFetcher, name: str) -> str:
    """A tensor's name as given; a Linear module's name: its stored weight (`.weight`, INT4 `.weight_packed`)."""
    if fetch.listed(name):
        return name
    for suffix in weight_suffixes():
        if fetch.listed(name + suffix):
            return name + suffix
    return name  # not found: the read says so


PROBE_WIDTH = 4096
"""An input width every format quantizes (a multiple of every group and block): what the module's stored
weight is, asked of its scheme before its real width is known (MLX leaves widths off its groups plain)."""


def _quantized_module(src: Source, name: str, t: TensorInfo) -> tuple[str, Scheme, int | None, int | None] | None:
    """(module, scheme, out, in) for a quantized module's stored weight (the first tensor its scheme stores: an FP8
    or INT8 `weight`, packed `weight_packed` words, DeepSeek-V4's FP4 `weight` bytes), else None. The scheme is the
    one the config's plan gives the module (FP8 weights it does not describe as such: DeepSeek's blocks); out x in
    comes from the layout config.json implies (None for a packed module the layout lacks: then from
    weight_shape)."""
    role = role_of(name)
    fp8 = role == WEIGHT and t.dtype == FP8_DTYPE and len(t.shape) == 2
    if role not in (WEIGHT, PACKED_WEIGHT):
        return None
    module = module_name(name)
    try:
        _, cfg = load_config(src)
    except KimiAuditError:
        if not fp8 and role != PACKED_WEIGHT:
            return None
        if not fp8:
            raise
        return module, Fp8Block(), t.shape[0], t.shape[1]  # no usable config: DeepSeek's blocks
    scheme = scheme_of(cfg, module)
    main = scheme.stored(1, PROBE_WIDTH)[0]
    if fp8 and main.dtype != FP8_DTYPE:  # FP8 weights the config does not describe as such: DeepSeek's blocks
        return module, Fp8Block(fp8_block(cfg.quant)), t.shape[0], t.shape[1]
    if role == WEIGHT and (isinstance(scheme, Unquantized) or t.dtype != main.dtype):
        return None  # a plain tensor under a quantized module's name: its own dtype is what the layout checks
    if module + main.suffix != name:
        raise KimiAuditError(f"{name}: config.json does not describe {module} as stored in {t.dtype} "
                             f"{name[len(module) + 1:]} ({scheme.describe()})")
    e = expected_layout(cfg).get(name)
    shape = None if e is None else scheme.module_shape(e.shape, e.logical)
    if shape is None and e is not None:  # flattened bytes (bitsandbytes' 4-bit): the tree's [out, in]
        shape = linear_shapes(cfg).get((e.block, e.component[: -len(main.suffix)]))
    if shape is None:
        if main.kind == PARAMETER and len(t.shape) == 2:
            return module, scheme, t.shape[0], t.shape[1]
        return module, scheme, None, None
    return module, scheme, *shape


def check_tensor(src: Source, name: str, *, dequant: bool = False,
                 max_bytes: int = DEFAULT_MAX_TENSOR_BYTES) -> TensorCheck:
    """Fetch one tensor by byte range and check its values (and its scales'). A module name stands for its
    stored weight (`.weight`, or a format's packed words). Problems: NaN/Inf values, scales that are not finite
    and > 0, a quantization tensor absent, a packed weight_shape that disagrees with the config's [out, in]."""

    from kimi_audit.checks.value_rules import (
        GLOBAL_SCALE,
        GROUP_SCALE,
        QUANT_STATE,
        SCALE,
        VALUES,
        WEIGHT_SHAPE,
        check_values,
        scale_values,
        value_kind,
    )
    from kimi_audit.numerics.bnb import read_quant_state
    from kimi_audit.numerics.dtypes import NumericsError
    from kimi_audit.numerics.ggml_quants import is_quantized
    from kimi_audit.numerics.kernels import tensor_stats

    fetch = TensorFetcher(src)
    name = _resolve(fetch, name)
    arr, t, shard = fetch.read(name, max_bytes)
    st = tensor_stats(arr, dtype=t.dtype)
    findings = check_values(name, value_kind(name, t.dtype) or VALUES, arr, shard=shard)
    scale_st = deq_st = None
    scale_name: str | None = None
    weight_shape: list[int] | None = None
    notes: list[str] = []
    quant = _quantized_module(src, name, t)
    if quant is not None:
        module, scheme, out, inp = quant
        kind = scheme.name
        stored: dict[str, np.ndarray] = {name[len(module):]: arr}
        complete = True
        for s in scheme.stored(out or 1, inp or 1):
            full = module + s.suffix
            if s.suffix in stored:
                continue
            if not fetch.listed(full):
                findings.append(error("SCALE_MISSING", f"{name} is {kind} but {full} is absent", tensor=full))
                complete = False
                continue
            a, ti, s_shard = fetch.read(full, max_bytes)
            stored[s.suffix] = a
            what = value_kind(full, ti.dtype)
            if what in (SCALE, GROUP_SCALE, GLOBAL_SCALE):
                if scale_name is None and what != GLOBAL_SCALE:
                    scale_name, scale_st = full, tensor_stats(scale_values(a, ti.dtype), dtype=ti.dtype)
                findings += check_values(full, what, a, shard=s_shard)
            elif what == QUANT_STATE:  # bitsandbytes: its [out, in] where the packed bytes do not say it
                bad = check_values(full, QUANT_STATE, a, shard=s_shard)
                findings += bad
                held = read_quant_state(a).get("shape") if not bad else None
                if out is None and isinstance(held, list) and len(held) == 2:
                    out, inp = held
                complete = complete and not bad
            elif what == WEIGHT_SHAPE:
                weight_shape = [int(v) for v in a.reshape(-1)]
                if out is None and len(weight_shape) == 2:
                    out, inp = weight_shape
                else:
                    bad = check_values(full, WEIGHT_SHAPE, a, expected_shape=(out or 0, inp or 0), shard=s_shard)
                    findings += bad
                    complete = complete and not bad
        if dequant and complete and out is not None and inp is not None:
            check_memory(scheme.dequant_bytes_per_value * out * inp, f"dequantizing {module} ({out * inp:,} values)")
            try:
                deq_st = tensor_stats(scheme.dequantize(stored, out, inp))
            except NumericsError as e:
                findings.append(error("SHAPE_MISMATCH", f"{module}: cannot dequantize: {e}", tensor=module))
    elif is_quantized(t.dtype):  # a GGUF weight: read at all only dequantized (numerics.ggml_quants)
        deq_st = st if dequant else None
        notes.append(f"{name} is ggml {t.dtype}: its values are its blocks dequantized by gguf-py, llama.cpp's "
                     "own reference")
    elif dequant:
        notes.append(f"{name} is {t.dtype}, not a quantized weight: nothing to dequantize")

    problems = [f"{f.code}: {f.message}" for f in findings if f.severity == Severity.ERROR]
    doc = {
        "source": src.label,
        "revision": src.revision,
        "tensor": name,
        "module": None if quant is None else quant[0],
        "scheme": None if quant is None else quant[1].key,
        "shard": shard,
        "dtype": t.dtype,
        "shape": list(t.shape),
        "bytes": t.nbytes,
        "stats": st.to_json(),
        "scale": None if scale_st is None else {"tensor": scale_name, "stats": scale_st.to_json()},
        "weight_shape": weight_shape,
        "dequantized": None if deq_st is None else deq_st.to_json(),
        "ok": not problems,
        "problems": problems,
    }
    return TensorCheck(doc, tuple(findings), None if quant is None else quant[1], tuple(notes))
