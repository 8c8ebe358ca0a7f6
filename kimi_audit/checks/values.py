"""The opt-in `audit --values` pass: fetch every small tensor and check its values.

Small tensors are the RMSNorm gains (`*norm.weight`), the router biases
(`mlp.gate.e_score_correction_bias`), every FP8 block scale (`*.weight_scale_inv`) and, for
compressed-tensors INT4, every group scale (`*.weight_scale`) and `*.weight_shape`: about 250 MB
of Kimi-K2's 959 GiB; every scale the formats store besides (model.kinds' roles: global, input and KV-cache
scales, MLX's and GPTQ's group scales, bitsandbytes' absmax); in a GGUF set, the block scales of each quantized
tensor of at most MAX_GGML_BYTES, read whole (the larger ones are counted as left to `verify`).
Each is fetched by byte range (neighbours in a shard coalesced into one read
when the gap between them is small), decoded with kimi_audit.numerics.kernels, and reported when it holds
NaN or Inf, when a scale is not > 0, when a gain is all zeros, when a `weight_shape` is not the [out, in]
the config implies, or (quantization_config `scale_fmt: ue8m0`, DeepSeek-V3.1 on) when an FP8 scale is
not an exact power of two (a warning for `self_attn.o_proj`, whose scales break it in the published
V3.1 release).  No big weight is ever read (a GGUF tensor read for its block scales is 4 MiB at most).
numpy and the kernels are imported by the functions that decode (only `audit --values` runs them).

A local shard's sparse holes (a header-only or partial copy: `kimi-audit download --headers-only`)
are looked up before anything is read: a tensor any of whose bytes lies in a hole is not read (its
bytes would read as zeros, which are not its values) and the pass reports one DATA_NOT_PRESENT info
for all of them, never zero gains or scales.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from kimi_audit.checks.value_rules import (
    ACTIVATION_SCALE,
    AFFINE_BIAS,
    AFFINE_SCALE,
    BNB_ABSMAX,
    BNB_QUANT_MAP,
    EXPERT_ID,
    GAIN,
    GGML_SCALES,
    GLOBAL_SCALE,
    GROUP_SCALE,
    QUANT_STATE,
    ROUTER_BIAS,
    SCALE,
    VALUES,
    WEIGHT_SHAPE,
    check_values,
    value_kind,
)
from kimi_audit.constants import GGUF_SUFFIX
from kimi_audit.errors import SourceError
from kimi_audit.findings import Finding, Severity, error, info, warning
from kimi_audit.format.gguf_types import GGML_BY_NAME
from kimi_audit.format.header import ShardHeader, TensorInfo
from kimi_audit.model import kinds
from kimi_audit.model.roles import suffix_roles, weight_suffixes
from kimi_audit.numerics.tensor_io import data_holes, in_hole, read_exact, windowed_map
from kimi_audit.sources.base import Source

if TYPE_CHECKING:

    from kimi_audit.checks.audit import AuditReport
    from kimi_audit.model.checkpoint import ProgressFn
    from kimi_audit.model.config_fields import ModelConfig
    from kimi_audit.model.layout import ExpectedLayout

MAX_GAP = 1 << 16
"""Two small tensors closer than this in a shard are fetched with one read (the gap read too)."""
MAX_SPAN = 1 << 24
"""No coalesced read is longer than this."""
MAX_SMALL_BYTES = 1 << 26
"""A 'small' tensor bigger than this is not fetched by the values pass (reported as skipped)."""
MAX_GGML_BYTES = 1 << 22
"""A quantized GGUF tensor bigger than this is not read for its block scales (they lie inside each block: no range
read takes them alone); the pass says how many it left to `verify`, which reads every block."""
MAX_OTHER_BYTES = 1 << 18
"""A float tensor of no class of its own (an attention sink, a hyper-connection mix, KDA's A and dt bias, a residual
score) up to this size is read too, for NaN and Inf: the small parameters an architecture adds, not its weights."""
FLOATS = ("F32", "F16", "BF16", "F64")
MAX_PER_CODE = 50
"""Findings listed one by one per code; the rest are counted in one summary finding."""

ValuesProgressFn = Callable[[str, int, int], None]
"""(shard, tensors done, tensors total)."""

Job = tuple[str, int, int, int, list[TensorInfo]]
"""One coalesced read: (shard, data_start, begin, end, members), offsets relative to the data buffer."""


def small_tensors(headers: dict[str, ShardHeader]) -> list[tuple[str, TensorInfo, str]]:
    """(shard, entry, kind) of every small tensor, by shard then by offset; every quantized GGUF tensor whose blocks
    carry scales llama.cpp checks (GGML_SCALES: its size is bounded where the reads are planned)."""
    out: list[tuple[str, TensorInfo, str]] = []
    for shard, header in headers.items():
        mine = []
        for name, t in header.tensors.items():
            ggml = GGML_BY_NAME.get(t.dtype)
            kind = GGML_SCALES if ggml is not None and ggml.quantized and ggml.scales else value_kind(name, t.dtype)
            if kind is None and t.dtype in FLOATS and 0 <= t.nbytes <= MAX_OTHER_BYTES:
                kind = VALUES
            if kind is not None:
                mine.append((shard, t, kind))
        mine.sort(key=lambda r: r[1].begin)
        out.extend(mine)
    return out


def plan_reads(
    infos: Iterable[TensorInfo], max_gap: int = MAX_GAP, max_span: int = MAX_SPAN
) -> list[tuple[int, int, list[TensorInfo]]]:
    """Group tensors (offsets relative to the data buffer) into (begin, end, members) reads. Linear in the tensors:
    a member joins its group's list in place (a copy of the list a member made 200,000 tiny tensors coalesced into
    a few reads take 50 s to plan)."""
    groups: list[tuple[int, int, list[TensorInfo]]] = []
    for t in sorted(infos, key=lambda t: (t.begin, t.end)):
        if groups:
            g0, g1, members = groups[-1]
            if t.begin - g1 <= max_gap and max(g1, t.end) - g0 <= max_span and t.begin >= g0:
                members.append(t)
                groups[-1] = (g0, max(g1, t.end), members)
                continue
        groups.append((t.begin, t.end, [t]))
    return groups


def read_tensors(
    source: Source,
    shard: str,
    data_start: int,
    infos: Iterable[TensorInfo],
    *,
    max_gap: int = MAX_GAP,
    max_span: int = MAX_SPAN,
) -> Iterator[tuple[TensorInfo, bytes]]:
    """The bytes of each tensor, in offset order, with coalesced range reads. Raises SourceError."""
    for g0, g1, members in plan_reads(infos, max_gap, max_span):
        data = read_exact(source, shard, data_start + g0, g1 - g0)
        for t in members:
            yield t, data[t.begin - g0 : t.end - g0]


def value_findings(
    source: Source,
    headers: dict[str, ShardHeader],
    progress: ValuesProgressFn | None = None,
    *,
    max_per_code: int = MAX_PER_CODE,
    max_gap: int = MAX_GAP,
    ue8m0: bool = False,
    weight_shapes: Mapping[str, tuple[int, ...]] | None = None,
    experts: int | None = None,
) -> list[Finding]:
    """Fetch every small tensor (gains, router biases, FP8 and INT4 scales, INT4 weight_shapes, hash-routing
    tables, any other float tensor up to 256 KiB) and report bad values. `ue8m0`: FP8 scales must be powers of
    two; `weight_shapes`: `X.weight_shape` name -> the [out, in] it must hold (from the layout); `experts`: the
    routed experts a hash-routing table's ids index."""
    from kimi_audit.numerics.dtypes import NumericsError, decode
    from kimi_audit.numerics.scan import ggml_scales

    todo = small_tensors(headers)
    kinds = {(s, t.name): k for s, t, k in todo}
    skipped: list[Finding] = []
    jobs: list[Job] = []
    by_shard: dict[str, list[TensorInfo]] = {}
    ggml_left: list[TensorInfo] = []
    for shard, t, kind in todo:
        if kind == GGML_SCALES and t.nbytes > MAX_GGML_BYTES:
            ggml_left.append(t)
            continue
        if t.nbytes > MAX_SMALL_BYTES or t.end < t.begin:
            skipped.append(skipped_finding(t, shard, f"{t.nbytes:,} bytes, not fetched by the values pass"))
            continue
        by_shard.setdefault(shard, []).append(t)
    if ggml_left:
        skipped.append(info("VALUES_SKIPPED", f"{len(ggml_left):,} quantized GGUF tensors over "
                            f"{MAX_GGML_BYTES:,} bytes ({sum(t.nbytes for t in ggml_left):,} bytes; the first "
                            f"{ggml_left[0].name}): their block scales were not read (each lies inside its block: "
                            "only a whole tensor's read holds them); `kimi-audit verify` reads every block's",
                            tensor=ggml_left[0].name, actual=len(ggml_left), covers=len(ggml_left)))
    absent: list[tuple[str, TensorInfo]] = []
    for shard, infos in by_shard.items():
        h = headers[shard]
        try:
            holes = data_holes(source, shard, h.data_start, h.file_size)
        except SourceError:
            holes = ()  # the reads fail too, and report it
        if holes:
            present = []
            for t in infos:
                if in_hole(holes, h.data_start + t.begin, h.data_start + t.end):
                    absent.append((shard, t))
                else:
                    present.append(t)
            infos = present
        for g0, g1, members in plan_reads(infos, max_gap):
            if h.data_start + g1 > h.file_size:  # the header check reports the data past the end of file
                skipped.extend(skipped_finding(t, shard, "its data lies past the end of the file") for t in members)
                continue
            jobs.append((shard, h.data_start, g0, g1, members))

    def fetch(job: Job) -> tuple[Job, bytes | None, SourceError | None]:
        shard, start, g0, g1, _members = job
        try:
            return job, read_exact(source, shard, start + g0, g1 - g0), None
        except SourceError as e:
            return job, None, e

    issues: dict[tuple[str, Severity], list[Finding]] = {}
    totals: dict[tuple[str, Severity], int] = {}
    findings: list[Finding] = []
    checked = 0
    checked_kinds = {GAIN: 0, ROUTER_BIAS: 0, SCALE: 0, GROUP_SCALE: 0, GLOBAL_SCALE: 0, WEIGHT_SHAPE: 0,
                     AFFINE_SCALE: 0, AFFINE_BIAS: 0, BNB_ABSMAX: 0, BNB_QUANT_MAP: 0, QUANT_STATE: 0,
                     ACTIVATION_SCALE: 0, GGML_SCALES: 0, VALUES: 0, EXPERT_ID: 0}
    shapes = weight_shapes or {}
    fetched_bytes = 0
    workers = max(1, min(source.parallel_reads, 32))
    total = sum(len(j[4]) for j in jobs)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for (shard, _start, g0, g1, members), data, err in windowed_map(pool, fetch, jobs, 4 * workers):
            if data is None:
                findings.append(error("VALUE_UNREADABLE", f"{shard}: {err}", shard=shard,
                                      tensor=members[0].name if len(members) == 1 else None))
                continue
            fetched_bytes += g1 - g0
            for t in members:
                raw = data[t.begin - g0 : t.end - g0]
                kind = kinds[(shard, t.name)]
                try:
                    arr = (ggml_scales(raw, 0, len(raw) // GGML_BY_NAME[t.dtype].size, t.dtype) if kind == GGML_SCALES
                           else decode(raw, t.dtype, t.shape))
                except NumericsError as e:  # the header checks name a size or dtype violation; never a silent pass
                    skipped.append(skipped_finding(t, shard, f"not decoded ({e})"))
                    continue
                for finding in check_values(t.name, kind, arr, ue8m0=ue8m0, expected_shape=shapes.get(t.name),
                                            shard=shard, experts=experts):
                    key = (finding.code, finding.severity)
                    totals[key] = totals.get(key, 0) + 1
                    lst = issues.setdefault(key, [])
                    if len(lst) < max_per_code:
                        lst.append(finding)
                checked += 1
                checked_kinds[kind] += 1
            if progress:
                progress(shard, checked, total)
    for (code, sev), lst in issues.items():
        findings.extend(lst)
        more = totals[(code, sev)] - len(lst)
        if more > 0:
            findings.append((warning if sev == Severity.WARNING else error)(
                code, f"... and {more:,} more tensors with {code} ({totals[(code, sev)]:,} in all)",
                actual=totals[(code, sev)]))
    if absent:
        findings.append(not_present_finding(absent))
    counts = checked_kinds
    gguf = any(shard.endswith(GGUF_SUFFIX) for shard in headers)
    findings.append(info(
        "VALUES_CHECKED",
        f"values pass: {_n(checked, 'small tensor')} checked ({_n(counts[GAIN], 'gain')}, "
        f"{_n(counts[ROUTER_BIAS], 'router bias', 'router biases')}"
        + (f", {_n(counts[SCALE], 'FP8 scale')}" if counts[SCALE] or not gguf else "")  # a GGUF holds none
        + (f", {_n(counts[GROUP_SCALE], 'weight scale')}, {_n(counts[WEIGHT_SHAPE], 'weight_shape')}"
           if counts[GROUP_SCALE] or counts[WEIGHT_SHAPE] else "")
        + (f", {_n(counts[GLOBAL_SCALE], 'global scale')}" if counts[GLOBAL_SCALE] else "")
        + (f", {_n(counts[ACTIVATION_SCALE], 'input or KV-cache scale', 'input and KV-cache scales')}"
           if counts[ACTIVATION_SCALE] else "")
        + (f", the block scales of {_n(counts[GGML_SCALES], 'quantized GGUF tensor')}, each read whole"
           if counts[GGML_SCALES] else "")
        + (f", {_n(counts[AFFINE_SCALE], 'group scale')} (MLX, GPTQ, AWQ)" if counts[AFFINE_SCALE] else "")
        + (f", {_n(counts[VALUES], 'other float tensor')} up to {MAX_OTHER_BYTES // 1024} KiB" if counts[VALUES]
           else "")
        + (f", {_n(counts[EXPERT_ID], 'hash-routing table')}" if counts[EXPERT_ID] else "")
        + (f", {_n(counts[AFFINE_BIAS], 'affine bias', 'affine biases')}" if counts[AFFINE_BIAS] else "")
        + (f", {counts[BNB_ABSMAX]:,} absmax/SCB, {_n(counts[BNB_QUANT_MAP], 'quant map')}, "
           f"{_n(counts[QUANT_STATE], 'quant state')}" if counts[BNB_ABSMAX] or counts[QUANT_STATE] else "") + "), "
        f"{fetched_bytes:,} bytes fetched in {_n(len(jobs), 'read')}"
        + (f"; {len(absent):,} not present (sparse holes)" if absent else ""),
        actual=checked,
    ))
    return findings + skipped


def _n(count: int, one: str, many: str = "") -> str:
    """`1 read`, `2 reads` (a message never says `1 reads`)."""
    return f"{count:,} {one if count == 1 else many or one + 's'}"


def skipped_finding(t: TensorInfo, shard: str, why: str) -> Finding:
    """A small tensor the pass did not check, and why (VALUES_SKIPPED): none is left out silently."""
    return info("VALUES_SKIPPED", f"{t.name}: {why}; its values were not checked", tensor=t.name, shard=shard,
                actual=t.nbytes)


def not_present_finding(absent: list[tuple[str, TensorInfo]]) -> Finding:
    """One DATA_NOT_PRESENT info for every small tensor that lies in a hole (not one per tensor)."""
    n = len(absent)
    nbytes = sum(t.nbytes for _, t in absent)
    shards = sorted({s for s, _ in absent})
    first_shard, first = absent[0]
    where = f"{len(shards):,} shards" if len(shards) > 1 else shards[0]
    return info(
        "DATA_NOT_PRESENT",
        f"{n:,} small tensor{'s' if n > 1 else ''} ({nbytes:,} bytes) in {where}: the data is not present "
        "(sparse holes: a header-only or partial copy), so the values were not checked"
        + (f"; the first is {first.name} in {first_shard}" if n > 1 else f": {first.name}"),
        tensor=first.name if n == 1 else None,
        shard=shards[0] if len(shards) == 1 else None,
        actual=n,
        covers=n,
    )


def packed_shapes(layout: ExpectedLayout, cfg: ModelConfig | None = None) -> dict[str, tuple[int, ...]]:
    """`X.weight_shape` -> the [out, in] the layout gives module X, for every packed (INT4) module (the packed
    and shape suffixes: the formats' own, model.roles); a bitsandbytes quant_state -> the [out, in] of the module
    whose packed weight it describes (`cfg`'s tree; without it, (out x in,), its parameters)."""
    from kimi_audit.model.layout import linear_shapes

    out: dict[str, tuple[int, ...]] = {}
    states = tuple(s for s, role in suffix_roles() if role == kinds.QUANT_STATE)
    modules: dict[tuple[str | None, str], tuple[int, int]] | None = None
    for pos, owner in zip(layout.meta_at, layout.meta_owner):
        name = layout.names[pos]
        if states and name.endswith(states):
            if modules is None:  # a bitsandbytes checkpoint: its modules' shapes, once
                modules = linear_shapes(cfg) if cfg is not None else {}
            spec = layout.specs[layout.spec_of[owner]]
            module = spec.component.rsplit(".", 1)[0]  # `mlp.experts.gate_proj.weight` -> its module
            out[name] = modules.get((spec.block, module), (spec.logical,))
    packed = weight_suffixes()[1:]
    shapes = [s for s, role in suffix_roles() if role == kinds.WEIGHT_SHAPE]
    for pos, name in enumerate(layout.names):
        if packed and name.endswith(packed):
            spec = layout.specs[layout.spec_of[pos]]
            rows = spec.shape[0]
            if rows:
                out.update((kinds.module_name(name) + s, (rows, spec.logical // rows)) for s in shapes)
    return out


def audit_with_values(source: Source, progress: ProgressFn | None = None,
                      values_progress: ValuesProgressFn | None = None) -> AuditReport:
    """audit_source plus the values pass (its findings appended to the report's)."""
    from kimi_audit.checks.audit import audit_checkpoint
    from kimi_audit.model.checkpoint import load_checkpoint

    ckpt = load_checkpoint(source, progress)
    report = audit_checkpoint(ckpt)
    plan = ckpt.config.quant
    ue8m0 = plan is not None and any(s.power_of_two_scales for s in plan.schemes)
    extra = value_findings(source, ckpt.headers, values_progress, ue8m0=ue8m0,
                           weight_shapes=packed_shapes(ckpt.expected, ckpt.config),
                           experts=ckpt.config.n_routed_experts or None)
    return dataclasses.replace(report, findings=tuple(report.findings) + tuple(extra), values_checked=True)
