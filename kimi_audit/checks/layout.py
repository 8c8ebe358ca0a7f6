"""Actual tensors against the layout the config implies: presence, dtype, shape, FP8 scales, buffers."""

from __future__ import annotations

import dataclasses
from collections import Counter
from itertools import compress, count, filterfalse
from operator import ne, or_, sub
from typing import NamedTuple

from kimi_audit.constants import WIDE_FLOATS
from kimi_audit.findings import Finding, error, info, warning
from kimi_audit.format.table import TensorTable
from kimi_audit.model.kinds import BUFFER, KV_SCALE, PACKED, PARAMETER, ROTARY_BUFFER, SCALE
from kimi_audit.model.layout import ExpectedLayout, ExpectedTensor, shape_fits
from kimi_audit.model.quant.deepseek import SCALE_SUFFIX
from kimi_audit.model.quant.dispatch import writer_of
from kimi_audit.model.quant.gguf import GGML_ANY
from kimi_audit.model.quant.scheme import Unquantized
from kimi_audit.model.roles import float32_router, metadata_suffixes, role_of, varies_by_writer, weight_suffixes

MISMATCH_CODES = {
    PARAMETER: ("DTYPE_MISMATCH", "SHAPE_MISMATCH"),
    PACKED: ("DTYPE_MISMATCH", "SHAPE_MISMATCH"),
    SCALE: ("SCALE_DTYPE", "SCALE_SHAPE"),
    BUFFER: ("BUFFER_DTYPE", "BUFFER_SHAPE"),
}


def scale_of_weight(weight_name: str) -> str:
    return weight_name[: -len(".weight")] + SCALE_SUFFIX


class Alignment(NamedTuple):
    """The actual tensors against the layout, row by row (rows of a TensorTable)."""

    positions: list[int | None]
    """The layout position of each row (None: the layout lacks the name)."""
    specs: list[int]
    """The index of each row's Spec in the layout (-1 where the layout lacks the name)."""
    odd: list[int]
    """Rows whose name, dtype, shape or payload size the layout does not expect (Kimi-K2: the 61 buffers)."""


def align(actual: TensorTable, expected: ExpectedLayout) -> Alignment:
    """Look every actual name up in the layout, and compare whole columns against the expected Specs
    at builtin speed: rows are visited one by one only where something differs."""
    positions = list(map(expected.position.get, actual.names))
    spec_of = expected.spec_of
    if None in positions:
        spec_rows = [-1 if p is None else spec_of[p] for p in positions]
    else:
        spec_rows = list(map(spec_of.__getitem__, positions))  # type: ignore[arg-type]  # no None
    specs = expected.specs  # index -1 (an unexpected name) reads the sentinel None, equal to nothing
    differs = map(or_, map(ne, map([*(s.dtype for s in specs), None].__getitem__, spec_rows), actual.dtypes),
                  map(ne, map([*(s.shape for s in specs), None].__getitem__, spec_rows), actual.shapes))
    differs = map(or_, differs, map(ne, map([*(s.nbytes for s in specs), None].__getitem__, spec_rows),
                                    map(sub, actual.ends, actual.begins)))
    return Alignment(positions, spec_rows, list(compress(count(), differs)))


def layout_findings(
    actual: TensorTable, expected: ExpectedLayout, aligned: Alignment | None = None,
    covered: set[int] | frozenset[int] = frozenset(), none_missing: bool = False, config_dtype: str = "",
    invalid: set[str] | frozenset[str] = frozenset(), dtype_recorded: bool = True,
) -> list[Finding]:
    """Every tensor against the layout: missing, unexpected, of the wrong dtype or shape, scales apart
    from their weights. `covered`: positions a root cause explains (checks.root_causes), not reported
    missing; `none_missing`: report nothing missing at all (no index and a shard unusable); `config_dtype`:
    the weights' dtype config.json records (what explains a writer's float dtype, WRITER_DTYPE); `invalid`:
    names whose header entry is invalid, named by their format finding and not again as unexpected."""
    out: list[Finding] = []
    if aligned is None:
        aligned = align(actual, expected)
    positions = aligned.positions
    # Every actual name expected, and as many of them as expected: then none is missing.
    if (len(actual) != len(expected) or None in positions) and not none_missing:
        out.extend(_missing(expected, positions, covered))

    # One decision per class of tensors: rows of one Spec stored in one dtype and shape get the same findings
    # whatever their names (compressed-tensors' I64 weight_shape: 69,120 tensors, one class). A class whose one
    # finding is a writer's dtype (folded below into one info) is kept as its rows and its first row's finding.
    variance: list[Variance] = []  # WRITER_DTYPE / ROUTER_DTYPE: judged against siblings below
    shared: dict[tuple[int, str, tuple[int, ...]], Variance] = {}
    spec_rows, dtypes, shapes = aligned.specs, actual.dtypes, actual.shapes
    for row in aligned.odd:  # (a row of a class already decided costs a tuple and a look-up, no more)
        p = positions[row]
        if p is None:
            name = actual.names[row]
            if name in invalid:
                continue
            out.extend(_unexpected(name, dtypes[row], actual.shards[row], actual, expected))
        elif p not in covered:  # (a payload size alone that differs is the format's SIZE_MISMATCH)
            key = (spec_rows[row], dtypes[row], shapes[row])
            decided = shared.get(key)
            if decided is not None:
                decided.rows.append(row)
                continue
            found = mismatch_findings(actual.names[row], dtypes[row], shapes[row], actual.shards[row],
                                      expected.entry(p), config_dtype, dtype_recorded)
            if len(found) == 1 and found[0].code == "WRITER_DTYPE":
                variance.append(shared.setdefault(key, Variance([row], found[0])))
                continue
            variance.extend(Variance([row], f) for f in found if f.code in VARIANCE_CODES)
            out.extend(f for f in found if f.code not in VARIANCE_CODES)
    folded = fold_writer_dtype(exporters_dtype(uniform_variance(variance, actual, aligned, expected)))
    out.extend(f for f, _ in folded)
    out.extend(_scale_shard_findings(actual, expected, positions))
    return fold_kv_scales(fold_orphans(out))


def fold_kv_scales(findings: list[Finding]) -> list[Finding]:
    """KV-cache scales stored with no KV-cache quantization declared: one cause, one finding for all of them."""
    kv = [f for f in findings if f.code == "KV_SCALE_UNDECLARED"]
    if len(kv) < 2:
        return findings
    one = error("KV_SCALE_UNDECLARED", f"{len(kv):,} KV-cache scales are stored (first: {kv[0].tensor}), but "
                "quantization_config declares no KV-cache quantization (kv_cache_scheme, kv_cache_quant_algo): "
                "loaders ignore them, or refuse them", tensor=kv[0].tensor, shard=kv[0].shard, covers=len(kv))
    return [one, *(f for f in findings if f.code != "KV_SCALE_UNDECLARED")]


def exporters_dtype(findings: list[Counted]) -> list[Counted]:
    """The WRITER_DTYPE infos of a config whose dtype is its exporter's (QuantPlan.dtype_recorded false) as one:
    one cause, whatever the number of tensors. (`findings`: each with the number of tensors it stands for.)"""
    mine = [(f, n) for f, n in findings if f.code == "WRITER_DTYPE" and "exporter's" in f.message]
    total = sum(n for _, n in mine)
    if total < 2:
        return findings
    first = mine[0][0]
    dtypes = sorted({str(f.actual) for f, _ in mine})
    one = info("WRITER_DTYPE", f"{total:,} unquantized tensors stored {', '.join(dtypes)}; config.json's "
               f"{first.expected} is its exporter's, not the model's (the format records float16 and keeps "
               f"unquantized tensors as they were; first: {first.tensor})", tensor=first.tensor, shard=first.shard,
               expected=first.expected, actual=first.actual, covers=total)
    gone = {id(f) for f, _ in mine}
    return [(one, 1), *((f, n) for f, n in findings if id(f) not in gone)]


def fold_writer_dtype(findings: list[Counted]) -> list[Counted]:
    """A writer's float dtype for norms and biases (WRITER_DTYPE, uniform per component) is one convention: one
    info per pair of dtypes, whatever the number of tensors (transformers' DeepSeek-V4 save keeps every gain F32).
    (`findings`: each with the number of tensors it stands for; one that stands for several is always folded.)"""
    groups: dict[tuple[str, str, str], list[Counted]] = {}
    for f, n in findings:
        if f.code == "WRITER_DTYPE" and not f.covers:
            whose = f.message.partition(": as ")[2]  # a format's writer (writer_of), else a gain's or bias's
            groups.setdefault((str(f.expected), str(f.actual), whose), []).append((f, n))
    folded = {id(f) for fs in groups.values() if sum(n for _, n in fs) > 1 for f, _ in fs}
    if not folded:
        return findings
    out = [(f, n) for f, n in findings if id(f) not in folded]
    for (want, got, whose), fs in groups.items():
        total = sum(n for _, n in fs)
        if total > 1:
            first = fs[0][0]
            what = (f"quantization tensors stored {got}, the release stores {want} (first: {first.tensor}): as "
                    f"{whose}" if whose else f"norm gains or biases stored {got}, the release stores {want} (first: "
                    f"{first.tensor}): a writer that keeps the config's dtype or float32 for them; loaders cast them")
            out.append((info("WRITER_DTYPE", f"{total:,} {what}", tensor=first.tensor, shard=first.shard,
                             expected=want, actual=got, covers=total), 1))
    return out


def fold_orphans(findings: list[Finding]) -> list[Finding]:
    """A missing weight covers its own quantization tensors: their SCALE_ORPHANs are one cause, the weight's
    TENSOR_MISSING (which then says how many it stands for)."""
    missing = {f.tensor: i for i, f in enumerate(findings) if f.code == "TENSOR_MISSING"}
    orphans: dict[int, list[str]] = {}
    for f in findings:
        if f.code == "SCALE_ORPHAN" and f.expected in missing:
            orphans.setdefault(missing[f.expected], []).append(str(f.tensor))
    if not orphans:
        return findings
    out = []
    for i, f in enumerate(findings):
        if f.code == "SCALE_ORPHAN" and f.expected in missing:
            continue
        if i in orphans:
            held = orphans[i]
            f = dataclasses.replace(f, covers=f.covers + len(held), message=f"{f.message}; its quantization "
                                    f"tensor{'s' if len(held) > 1 else ''} {', '.join(held)} stored without it")
        out.append(f)
    return out


VARIANCE_CODES = frozenset(("WRITER_DTYPE", "ROUTER_DTYPE"))

Counted = tuple[Finding, int]
"""A finding and the number of tensors it stands for (a class of tensors decided once: layout_findings)."""


class Variance(NamedTuple):
    """A writer's dtype (WRITER_DTYPE / ROUTER_DTYPE) found on these rows alike: the finding is the first row's."""

    rows: list[int]
    finding: Finding


def uniform_variance(variance: list[Variance], actual: TensorTable, aligned: Alignment,
                     expected: ExpectedLayout) -> list[Counted]:
    """A writer's float dtype is variance (info) only where it is uniform: every stored tensor of that component
    (a norm's gain in every layer) in the one other dtype. One tensor that differs from its siblings (one
    layer's gain in F32 where the other 60 are BF16) was cast on its own: an error (DTYPE_MISMATCH)."""
    if not variance:
        return []
    specs = expected.specs
    present: Counter[str] = Counter()
    for i, n in Counter(aligned.specs).items():  # rows per Spec at builtin speed, then per component
        if i >= 0:
            present[specs[i].component] += n
    dtypes: dict[str, set[str]] = {}
    varied: Counter[str] = Counter()
    for rows, _ in variance:
        component = specs[aligned.specs[rows[0]]].component
        dtypes.setdefault(component, set()).add(actual.dtypes[rows[0]])
        varied[component] += len(rows)
    out: list[Counted] = []
    for rows, f in variance:
        component = specs[aligned.specs[rows[0]]].component
        if varied[component] == present[component] and len(dtypes[component]) == 1:
            out.append((f, len(rows)))
            continue
        kept = present[component] - varied[component]
        others = f"{kept:,} of {present[component]:,} stored {f.expected}" if kept else \
            f"stored in {', '.join(sorted(dtypes[component] - {str(f.actual)}))}"
        for row in rows:
            name = actual.names[row]
            out.append((error("DTYPE_MISMATCH", f"{name}: stored {f.actual}, unlike its siblings ({others}): a "
                              "tensor cast on its own, not a writer's convention", tensor=name,
                              shard=actual.shards[row], expected=f.expected, actual=f.actual), 1))
    return out


HALF = ("BF16", "F16")


def router_dtype(name: str, dtype: str, shard: str, e: ExpectedTensor) -> Finding | None:
    """The router stored in a float dtype other than the layout's, as transformers writes it: F32 gate
    weights in a BF16/F16 checkpoint (kept F32 on load), or a BF16/F16 router bias (`.to(dtype)` before
    saving: it lost precision DeepSeek keeps, which loaders upcast but cannot restore). Writer variance, not
    a fault (issue 23): info. None for any other deviation."""
    if not float32_router(e.component):
        return None
    if dtype == "F32" and e.dtype in HALF:
        return info("ROUTER_DTYPE", f"{name}: stored F32 in a {e.dtype} checkpoint (transformers keeps the router "
                    "in float32 on load and saves it so)", tensor=name, shard=shard, expected=e.dtype, actual=dtype)
    if e.dtype == "F32" and dtype in HALF:
        part = "correction bias" if name.endswith("bias") else "weight"
        return info("ROUTER_DTYPE", f"{name}: stored {dtype}, expected F32: the router's {part} lost "
                    "precision (loaders upcast it, the lost bits stay lost)", tensor=name, shard=shard,
                    expected=e.dtype, actual=dtype)
    return None


def optional_buffer(e: ExpectedTensor) -> bool:
    """A buffer loaders recompute and never read (`rotary_emb.inv_freq`): its absence or mismatch is no fault.
    A buffer holding trained state (DeepSeek-V4's hash-routing table `ffn.gate.tid2eid`) is checked as a
    parameter is, though never counted as one."""
    return e.kind == BUFFER and role_of(e.name) == ROTARY_BUFFER


def writer_dtype(name: str, dtype: str, shard: str, e: ExpectedTensor, config_dtype: str,
                 dtype_recorded: bool = True) -> Finding | None:
    """A norm's gain or a bias (a 1-D parameter outside the Linear weights) in another float dtype than the
    release's, where config.json's dtype explains it (the writer cast it to the config's dtype, or kept it
    in float32): writer variance, info (WRITER_DTYPE). Where the config's dtype is the exporter's, not the model's
    (QuantPlan.dtype_recorded false), any unquantized tensor in a float dtype. None for any other deviation."""
    whose = writer_of(e.scheme, e.name, dtype)
    if whose:
        return info("WRITER_DTYPE", f"{name}: stored {dtype}, the release stores {e.dtype}: as {whose} writes it; "
                    "loaders read its values alike", tensor=name, shard=shard, expected=e.dtype, actual=dtype)
    if not dtype_recorded and e.kind == PARAMETER and e.scheme in ("", Unquantized.key) and {
            e.dtype, dtype} <= set(WIDE_FLOATS):
        return info("WRITER_DTYPE", f"{name}: stored {dtype}; config.json's {e.dtype} is its exporter's, not the "
                    "model's (the format records float16 and keeps unquantized tensors as they were)", tensor=name,
                    shard=shard, expected=e.dtype, actual=dtype)
    if (e.kind != PARAMETER or not varies_by_writer(e.component, e.dtype, len(e.shape), bool(e.scheme))
            or len(e.shape) != 1 or dtype not in (config_dtype, "F32")):
        return None
    return info("WRITER_DTYPE", f"{name}: stored {dtype}, the release stores {e.dtype}: a writer that keeps the "
                f"config's dtype ({config_dtype}) or float32 for it; loaders cast it", tensor=name, shard=shard,
                expected=e.dtype, actual=dtype)


def mismatch_findings(name: str, dtype: str, shape: tuple[int, ...], shard: str, e: ExpectedTensor,
                      config_dtype: str = "", dtype_recorded: bool = True) -> list[Finding]:
    """A stored tensor's dtype and shape against its expected entry."""
    out: list[Finding] = []
    router = None
    if dtype != e.dtype:
        router = router_dtype(name, dtype, shard, e) or writer_dtype(name, dtype, shard, e, config_dtype,
                                                                     dtype_recorded)
    if router is not None:
        out.append(router)
        dtype = e.dtype  # reported above: the shape is still checked
    dtype_code, shape_code = MISMATCH_CODES[e.kind]
    make = info if optional_buffer(e) else error  # a rotary cache is dropped by every loader: not a fault
    what = {PARAMETER: "", PACKED: "packed weight ", SCALE: "quantization metadata ",
            BUFFER: "stored buffer (not a parameter) "}[e.kind]
    if dtype != e.dtype:
        f16_scale = e.scheme == "fp8" and e.kind == SCALE and (e.dtype, dtype) == ("F32", "F16")
        # an F16 block scale (seen in third-party FP8 checkpoints) loads, with less range: a warning
        out.append((warning if f16_scale else make)(
            dtype_code, f"{name}: {what}dtype {dtype}, expected " + (
                "a ggml type llama.cpp loads a weight in, whose blocks divide its rows" if e.dtype == GGML_ANY
                else e.dtype) + (
                " (an F16 block scale: loaders accept it, its range and precision are F16's)" if f16_scale else ""),
            tensor=name, shard=shard, expected=e.dtype, actual=dtype))
    if not shape_fits(shape, e.shape):
        out.append(make(shape_code, f"{name}: {what}shape {list(shape)}, expected {list(e.shape)}",
                        tensor=name, shard=shard, expected=list(e.shape), actual=list(shape)))
    return out


def scale_pair_finding(scale: str, weight: str, scale_shard: str, weight_shard: str | None) -> Finding:
    """Present quantization metadata whose weight is absent (None) or in another shard."""
    if weight_shard is None:
        return error("SCALE_ORPHAN", f"{scale}: quantization metadata without its weight {weight}", tensor=scale,
                     shard=scale_shard, expected=weight)
    # info (issue 23): the published DeepSeek-V3 itself splits pairs, and its loaders pair through the index
    return info("SCALE_SHARD_SPLIT", f"{scale} is in {scale_shard} but its weight is in "
                f"{weight_shard}; loaders pair them through the index, tools that convert one shard at a time "
                "miss it", tensor=scale, shard=scale_shard, expected=weight_shard, actual=scale_shard)


def _scale_shard_findings(actual: TensorTable, expected: ExpectedLayout, positions: list[int | None]) -> list[Finding]:
    """Each present quantization-metadata tensor against the tensor it describes: that one present, and in
    the same shard. The layout lists metadata right after its owner (layout.expected_layout), so the pairs
    are known by position: the shards at both compared column-wise."""
    out: list[Finding] = []
    at, owners = expected.meta_at, expected.meta_owner
    if not at:
        return out
    shard_at: list[str | None] = [None] * (len(expected) + 1)  # the last slot takes unexpected names (None)
    for p, shard in zip(positions, actual.shards):
        shard_at[-1 if p is None else p] = shard
    shard_at[-1] = None
    meta_shards = list(map(shard_at.__getitem__, at))
    owner_shards = list(map(shard_at.__getitem__, owners))
    names = expected.names
    for p, q, meta_shard, owner_shard in compress(zip(at, owners, meta_shards, owner_shards),
                                                  map(ne, meta_shards, owner_shards)):
        if meta_shard is not None:  # an absent one is _missing's
            out.append(scale_pair_finding(names[p], names[q], meta_shard, owner_shard))
    split = [f for f in out if f.code == "SCALE_SHARD_SPLIT"]
    if len(split) < 2:
        return out
    first = split[0]  # one writer's sharding, one info: not one per pair
    return [f for f in out if f.code != "SCALE_SHARD_SPLIT"] + [info(
        "SCALE_SHARD_SPLIT", f"{len(split):,} quantization tensors are in another shard than their weight (first: "
        f"{first.tensor} in {first.shard}, its weight in {first.expected}); loaders pair them through the index, "
        "tools that convert one shard at a time miss them", tensor=first.tensor, shard=first.shard,
        expected=first.expected, actual=first.actual, covers=len(split))]


def _missing(
    expected: ExpectedLayout, positions: list[int | None], covered: set[int] | frozenset[int]
) -> list[Finding]:
    """Expected tensors in no shard. A scale whose weight is missing too is the weight's finding."""
    out: list[Finding] = []
    # the absent positions by set difference (builtin speed): a checkpoint without the optional buffers
    # (DeepSeek-V3, Kimi-K2.6) lacks a few dozen of 200,000 names, no reason to visit every position
    absent = set(filterfalse(set(positions).__contains__, range(len(expected))))
    for p in sorted(absent.difference(covered)):
        e = expected.entry(p)
        if optional_buffer(e) or (e.owner and p - e.owner in absent):
            continue  # metadata of a missing tensor is that tensor's finding
        name, want = e.name, [e.dtype, list(e.shape)]
        if e.owner:
            owner = expected.names[p - e.owner]
            out.append(error("SCALE_MISSING", f"{name}: {owner} has no {name[name.rindex('.') + 1:]} "
                             f"(expected {e.dtype} {list(e.shape)})", tensor=name, expected=want))
        else:
            out.append(error("TENSOR_MISSING", f"{name}: expected {e.dtype} {list(e.shape)}, not in any shard",
                             tensor=name, expected=want))
    return out


def _unexpected(name: str, dtype: str, shard: str, actual: TensorTable, expected: ExpectedLayout) -> list[Finding]:
    if role_of(name) == KV_SCALE:
        return [error("KV_SCALE_UNDECLARED", f"{name}: a KV-cache scale, but quantization_config declares no KV-cache "
                      "quantization (kv_cache_scheme, kv_cache_quant_algo): loaders ignore it, or refuse it",
                      tensor=name, shard=shard)]
    if name.endswith(metadata_suffixes()):
        module = name[:name.rindex(".")]
        owners = [module + suffix for suffix in weight_suffixes()]
        present = [w for w in owners if w in actual]
        if not present:
            return [error("SCALE_ORPHAN", f"{name}: quantization metadata without its weight {owners[0]}",
                          tensor=name, shard=shard)]
        return [error("SCALE_UNEXPECTED", f"{name}: {present[0]} is not quantized this way in this layout, yet "
                      f"has a {name[name.rindex('.') + 1:]}", tensor=name, shard=shard)]
    out = [error("TENSOR_UNEXPECTED", f"{name}: {dtype} tensor the config does not account for",
                 tensor=name, shard=shard, actual=dtype)]
    if dtype.startswith("F8_") and name.endswith(".weight"):
        scale = scale_of_weight(name)
        if scale not in actual and scale not in expected:
            out.append(error("SCALE_MISSING", f"{name}: FP8 weight without {scale}", tensor=scale, shard=shard))
    return out
