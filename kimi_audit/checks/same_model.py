"""A quantized release against the checkpoint it was quantized from (`audit QUANT --against ORIGINAL`, both
safetensors): is it the same model, only quantized?

Held, from the headers:
- the architecture and config: every config.json key equal, the quantization's and the writer's own aside
  (`WRITER_KEYS`, `RUNTIME_KEYS`): AGAINST_CONFIG, one per key;
- every tensor of the original accounted for: as it is (the same name and shape), or, where the release's config
  quantizes its Linear module, by every tensor the format stores for it (AGAINST_MISSING, AGAINST_SHAPE); every
  tensor of the release standing for one of the original's, or quantization metadata (AGAINST_EXTRA);
- the logical parameter counts equal (the accounting's, a packed weight counting its module's out x in):
  AGAINST_PARAMS.
With `--values`, read in row bands (checks.rows.SourceRows: memory bounded whatever a tensor's size):
- every unquantized tensor bit-equal to the original's after the cast the writer does to the release's dtype
  (BF16 -> BF16 as is, F32 -> BF16 rounded to nearest even): AGAINST_UNQUANTIZED, one per tensor;
- every quantized weight, dequantized as its format says, within its format's relative RMS error bound
  (`Scheme.error_bound`, model.quant.bounds): AGAINST_DEQUANTIZED, one per weight. A weight from another model,
  layer or expert is about 1.41 off, every bound under 0.95.
AGAINST_SAME_MODEL says what was held on every run (and the quantization, `BF16 -> NVFP4`), AGAINST_ERROR_BOUNDS
what was compared and the worst weight of each format.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kimi_audit.checks.rows import BAND_BYTES, SourceRows, quantized_module
from kimi_audit.errors import KimiAuditError
from kimi_audit.findings import Finding, error, info
from kimi_audit.format.table import tensor_table
from kimi_audit.model.accounting.account import accounting_of_checkpoint
from kimi_audit.model.checkpoint import Checkpoint
from kimi_audit.model.kinds import PACKED, SCALE
from kimi_audit.sources.base import Source

if TYPE_CHECKING:
    import numpy as np

WRITER_KEYS = frozenset({"quantization_config", "compression_config", "dtype", "torch_dtype", "transformers_version",
                         "_name_or_path"})
"""config.json keys a quantizer writes or rewrites: its quantization, the dtype it records (AutoRound's AWQ
packing writes float16 beside BF16 tensors), the library version that saved it."""
RUNTIME_KEYS = frozenset({"output_router_logits", "output_attentions", "output_hidden_states", "use_cache",
                          "return_dict"})
"""Keys that ask a forward pass for more outputs (transformers writes False or null by version): not the model."""
FIRST = 3
FLOATS = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
"""Release dtypes an unquantized tensor is compared in: the original's values cast to it, bit for bit."""


@dataclass(frozen=True)
class Pair:
    """One tensor of the original and what holds it in the release."""

    original: str
    release: str
    """The release's tensor (a quantized module's `.weight` spelling where its format stores others)."""
    quantized: bool


@dataclass(frozen=True)
class Held:
    """The header-level comparison: what `diff` and `audit --against` both say."""

    config: tuple[tuple[str, Any, Any], ...]
    pairs: tuple[Pair, ...]
    missing: tuple[str, ...]
    extra: tuple[str, ...]
    shapes: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]
    parameters: tuple[int, int]
    """(the original's, the release's)."""
    quantization: tuple[str, str]
    """How each stores its Linear weights: `BF16`, `NVFP4`, `NVFP4 + FP8`."""

    @property
    def same(self) -> bool:
        return not (self.config or self.missing or self.extra or self.shapes) and self.parameters[0] == \
            self.parameters[1]


def _storage(ck: Checkpoint) -> str:
    plan = ck.config.quant
    names = [] if plan is None else list(dict.fromkeys(s.name for s in plan.schemes))
    return " + ".join(names) or ck.config.dtype


def held(q: Checkpoint, o: Checkpoint, parameters: Callable[[Checkpoint], int] | None = None) -> Held:
    """Pure, headers only: the release `q` against the original `o`. `parameters`: a checkpoint's logical
    parameter count (by default its accounting's, built here); a caller that has the counts (`diff`: its header
    diff's) passes them."""
    keys = list(o.config_raw) + [k for k in q.config_raw if k not in o.config_raw]
    config = tuple((k, o.config_raw.get(k), q.config_raw.get(k)) for k in keys
                   if k not in WRITER_KEYS | RUNTIME_KEYS and o.config_raw.get(k) != q.config_raw.get(k))
    o_table, _ = tensor_table(o.headers)
    q_table, _ = tensor_table(q.headers)
    o_dtype = dict(zip(o_table.names, o_table.dtypes))
    q_info = {n: (d, tuple(s)) for n, d, s in zip(q_table.names, q_table.dtypes, q_table.shapes)}
    used: set[str] = set()
    pairs: list[Pair] = []
    missing: list[str] = []
    shapes: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []
    for name, shape in zip(o_table.names, o_table.shapes):
        e = o.expected.get(name)
        if e is not None and e.kind == SCALE:
            continue  # the original's own quantization metadata
        spelled = name.rsplit(".", 1)[0] + ".weight" if e is not None and e.kind == PACKED else name
        om = quantized_module(o, spelled, lambda n: o_dtype.get(n, "")) if spelled.endswith(".weight") else None
        logical = (om[2], om[3]) if om is not None else tuple(shape)
        qm = quantized_module(q, spelled, lambda n: q_info.get(n, ("", ()))[0])
        if qm is not None:
            module, scheme, out, inp = qm
            stored = [module + s.suffix for s in scheme.stored(out, inp)]
            if not all(s in q_info for s in stored):
                missing.append(name)
                continue
            used.update(stored)
            if (out, inp) != logical:
                shapes.append((spelled, logical, (out, inp)))
            pairs.append(Pair(name, spelled, True))
        elif spelled in q_info:
            used.add(spelled)
            if q_info[spelled][1] != logical:
                shapes.append((spelled, logical, q_info[spelled][1]))
            pairs.append(Pair(name, spelled, False))
        else:
            missing.append(name)
    extra = []
    for name in q_table.names:
        e = q.expected.get(name)
        if name not in used and (e is None or e.kind != SCALE):
            extra.append(name)
    count = parameters or parameter_count
    params = (count(o), count(q))
    return Held(config, tuple(pairs), tuple(missing), tuple(extra), tuple(shapes), params, (_storage(o), _storage(q)))


def parameter_count(ck: Checkpoint) -> int:
    """The checkpoint's logical parameter count: its accounting's (a packed weight counting its module's out x in)."""
    return accounting_of_checkpoint(ck).found


def _listed(names: list[str] | tuple[str, ...]) -> str:
    return ", ".join(names[:FIRST]) + (f" and {len(names) - FIRST:,} more" if len(names) > FIRST else "")


def same_model_line(h: Held, model_type: str | None) -> str | None:
    """`same model (deepseek_v3, 6,212,056 parameters); quantization differs: BF16 → NVFP4`, where the headers
    say so; None where they do not."""
    if not h.same or h.quantization[0] == h.quantization[1]:
        return None
    return (f"same model ({model_type}, {h.parameters[1]:,} parameters); quantization differs: "
            f"{h.quantization[0]} → {h.quantization[1]}")


def same_model_findings(q: Checkpoint, q_source: Source, o: Checkpoint, o_source: Source, values: bool = False,
                        progress: Callable[[str, int, int], None] | None = None) -> list[Finding]:
    h = held(q, o)
    out: list[Finding] = []
    for key, want, have in h.config:
        out.append(error("AGAINST_CONFIG", f"config.json {key} is {have!r}; {o.label}'s is {want!r}", tensor=key,
                         expected=want, actual=have))
    if h.missing:
        out.append(error("AGAINST_MISSING", f"{len(h.missing):,} tensors of {o.label} are in no tensor of the "
                         f"release ({_listed(h.missing)})", tensor=h.missing[0], covers=len(h.missing)))
    if h.extra:
        out.append(error("AGAINST_EXTRA", f"{len(h.extra):,} tensors of the release stand for no tensor of "
                         f"{o.label} and are no quantization metadata ({_listed(h.extra)})", tensor=h.extra[0],
                         covers=len(h.extra)))
    for name, want_shape, have_shape in h.shapes:
        out.append(error("AGAINST_SHAPE", f"{name} is {list(have_shape)}; {o.label}'s is {list(want_shape)}",
                         tensor=name, expected=list(want_shape), actual=list(have_shape)))
    if h.parameters[0] != h.parameters[1]:
        out.append(error("AGAINST_PARAMS", f"the release counts {h.parameters[1]:,} parameters, {o.label} "
                         f"{h.parameters[0]:,}", expected=h.parameters[0], actual=h.parameters[1]))
    line = same_model_line(h, o.config_raw.get("model_type"))
    out.append(info("AGAINST_SAME_MODEL", (line + "; " if line else "") + f"held against {o.label}: config.json "
                    f"(quantization aside), {len(h.pairs):,} tensors accounted for, {h.parameters[0]:,} parameters"
                    + ("" if values else "; values not compared: add --values"), actual=o.label))
    if values:
        out.extend(_value_findings(q, q_source, o, o_source, h.pairs, progress))
    return out


def _value_findings(q: Checkpoint, q_source: Source, o: Checkpoint, o_source: Source, pairs: tuple[Pair, ...],
                    progress: Callable[[str, int, int], None] | None) -> list[Finding]:
    original, release = SourceRows(o, o_source, BAND_BYTES), SourceRows(q, q_source, BAND_BYTES)
    q_table, _ = tensor_table(q.headers)
    q_dtype = dict(zip(q_table.names, q_table.dtypes))
    out: list[Finding] = []
    worst: dict[str, tuple[float, str, float]] = {}  # format -> (largest relative error, weight, bound)
    compared, unbounded, unread = 0, [], []
    for done, pair in enumerate(pairs, 1):
        if progress:
            progress(pair.release, done, len(pairs))
        try:
            if pair.quantized:
                scheme = release.scheme(pair.release)
                bound = None if scheme is None else scheme.error_bound()
                if scheme is None or bound is None:
                    unbounded.append(pair.release)
                    continue
                rel, _ = _compare(original, release, pair, None)
                if rel > worst.get(scheme.name, (-1.0, "", 0.0))[0]:
                    worst[scheme.name] = (rel, pair.release, bound)
                if not rel <= bound:
                    out.append(error("AGAINST_DEQUANTIZED", f"{pair.release} dequantized ({scheme.name}) is "
                                     f"{rel:.3g} off {o.label}'s {pair.original} (relative RMS; its format's bound "
                                     f"{bound:.3g}): a weight from another model, layer or expert?",
                                     tensor=pair.release, expected=bound, actual=round(rel, 6)))
            else:
                rel, differ = _compare(original, release, pair, q_dtype[pair.release])
                if differ:
                    out.append(error("AGAINST_UNQUANTIZED", f"{pair.release}: {differ:,} values are not {o.label}'s "
                                     f"cast to {q_dtype[pair.release]} (relative RMS difference {rel:.3g}): from "
                                     "another model, layer or seed?", tensor=pair.release, actual=differ))
        except (KimiAuditError, MemoryError) as e:  # unreadable, or too large for this machine
            unread.append((pair.release, str(e) or type(e).__name__))
            original.drop()
            release.drop()
            continue
        compared += 1
    if unread:
        out.append(error("AGAINST_UNREAD", f"{len(unread):,} tensors could not be compared with {o.label}'s values "
                         f"({_listed([n for n, _ in unread])}): {unread[0][0]}: {unread[0][1]}",
                         tensor=unread[0][0], covers=len(unread)))
    bounds = ", ".join(f"{k} {rel:.3g}/{bound:.3g}" for k, (rel, _, bound) in sorted(worst.items()))
    out.append(info("AGAINST_ERROR_BOUNDS", f"{compared:,} tensors compared with {o.label}'s values: unquantized "
                    "ones bit for bit after the writer's cast, quantized weights dequantized within their format's "
                    f"relative error bound{' (worst/bound: ' + bounds + ')' if bounds else ''}"
                    + (f"; {len(unbounded):,} weights in formats with no bound derived not compared "
                       f"({_listed(unbounded)})" if unbounded else ""), actual=compared,
                    tensor=max(worst.values())[1] if worst else None))
    return out


def _compare(original: SourceRows, release: SourceRows, pair: Pair, dtype: str | None) -> tuple[float, int]:
    """(relative RMS difference, values that differ after the cast to `dtype`) of the pair, band by band of the
    release's rows; `dtype` None: a quantized weight (no cast, the count 0)."""
    import numpy as np

    shape = original.shape(pair.original)
    if shape != release.shape(pair.release):
        raise KimiAuditError(f"{pair.release} reads as {list(release.shape(pair.release))}, {pair.original} as "
                             f"{list(shape)}")
    rows = (shape or (1,))[0]
    step = release.band(pair.release)
    err = ref = 0.0
    differ = 0
    for a in range(0, rows, step):
        b = min(a + step, rows)
        x = original.rows(pair.original, a, b)
        y = release.rows(pair.release, a, b)
        if dtype is not None:
            x = _cast(x, dtype)
            differ += int(np.count_nonzero(x.view(np.uint32) != y.view(np.uint32)))
        d = y.astype(np.float64) - x
        err += float(np.sum(d * d))
        ref += float(np.sum(np.square(x, dtype=np.float64)))
    rel = math.sqrt(err / ref) if ref else (0.0 if err == 0 else math.inf)
    return rel, differ


def _cast(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values as the writer stores them in `dtype` (round to nearest even), back in float32."""
    import ml_dtypes
    import numpy as np

    values = np.ascontiguousarray(values, dtype=np.float32)
    if dtype not in FLOATS or dtype == "F32":
        return values
    target = ml_dtypes.bfloat16 if dtype == "BF16" else np.float16
    return values.astype(target).astype(np.float32)
