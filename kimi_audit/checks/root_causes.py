"""Root causes first: a finding that explains others replaces them and says how many it covers.

- A shard the index names that could not be used (absent, unreadable, not read past the header budget,
  or whose header is unusable) covers the tensors the index puts there: they are not reported missing
  one by one, and the shard's own finding states their count.
- A tensor whose header entry is malformed is named by the format finding, not again as missing; an entry
  that is invalid (unknown dtype, invalid shape or offsets, not an object) is not also reported unexpected by
  the layout nor missing from the index: one cause, one finding.
- A declared multi-token-prediction layer of which no tensor is stored is one MTP_ABSENT warning.
- A shard the index does not list that the format's loader reads anyway (SHARD_LOADED_UNINDEXED, an error)
  covers what is found in it (its tensors duplicated elsewhere, or absent from the index): one finding per
  stray shard. A SHARD_NOT_IN_INDEX warning covers nothing: the errors it would hide are errors.
- A wrong or missing quantization_config is one QUANT_CONFIG error covering the per-tensor dtype and
  scale findings it explains.
- A quantization_config whose format is not the one stored (every weight it plans in one dtype stored in
  another: an FP8 export declared NVFP4) is one QUANT_FORMAT_MISMATCH error covering the findings of those
  modules' tensors.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from itertools import compress
from typing import Any

from kimi_audit.findings import Finding, Severity, error, info, warning
from kimi_audit.model.arch.registry import undescribed
from kimi_audit.model.checkpoint import Checkpoint
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.model.kinds import block_prefix
from kimi_audit.model.layout import ExpectedLayout
from kimi_audit.model.mistral_layout import index_name
from kimi_audit.model.quant.dispatch import formats
from kimi_audit.model.quant.scheme import Unquantized

ROOT_SHARD_CODES = ("INDEX_SHARD_ABSENT", "SHARD_UNREADABLE")
INVALID_ENTRY_CODES = frozenset(("TENSOR_ENTRY_INVALID", "DTYPE_UNKNOWN", "SHAPE_INVALID", "OFFSETS_INVALID"))
"""Format findings that make a header entry unusable: the entry's one finding."""
QUANT_COVERED = frozenset(("SCALE_MISSING", "SCALE_UNEXPECTED", "SCALE_SHAPE", "SCALE_DTYPE", "SCALE_ORPHAN"))


@dataclass
class Covered:
    """What the root causes explain, decided before the per-tensor checks run."""

    positions: set[int] = field(default_factory=set)
    """Layout positions not to report missing."""
    shards: set[str] = field(default_factory=set)
    """Shards whose tensors the index check does not look for."""
    counts: dict[str, int] = field(default_factory=dict)
    """Shard -> tensors the index puts there (for the shard's root finding)."""
    everything: bool = False
    """No index and some shard unusable: which tensors it held is unknown, so none is reported missing."""
    extra: list[Finding] = field(default_factory=list)
    """Root findings of their own (MTP_ABSENT)."""
    invalid: set[str] = field(default_factory=set)
    """Names whose header entry is invalid (INVALID_ENTRY_CODES): not also unexpected, nor missing from the index."""


def usable_shards(ckpt: Checkpoint) -> set[str]:
    """Shards whose header was read and is usable: no error, or at least one valid entry."""
    return {s for s, h in ckpt.headers.items() if h.ok or h.tensor_count}


def covered(ckpt: Checkpoint, expected: ExpectedLayout, positions: list[int | None]) -> Covered:
    out = Covered()
    if ckpt.config.quant_unsupported is not None:  # QUANT_UNSUPPORTED: how Linear modules are stored is unknown
        linear = [bool(s.scheme) for s in expected.specs]
        out.positions.update(compress(range(len(expected)), map(linear.__getitem__, expected.spec_of)))
    usable = usable_shards(ckpt)
    shards = [f for f in ckpt.files if f.endswith(".safetensors")]
    if ckpt.container == "gguf":  # a part missing or unreadable: its tensors are unknown, that finding the cause
        out.everything = any(f not in usable for f in ckpt.files) or any(
            f.code == "GGUF_PART_MISSING" for f in ckpt.findings)
    elif ckpt.index is not None:
        listed = Counter(ckpt.index.weight_map.values())
        out.shards = {s for s in listed if s not in usable}
        if out.shards:
            out.counts = {s: listed[s] for s in out.shards}
            where = expected.position
            for name, shard in ckpt.index.weight_map.items():
                if shard in out.shards and name in where:
                    out.positions.add(where[name])
    elif any(s not in usable for s in shards) or not shards:
        out.everything = True
    for h in ckpt.headers.values():  # a malformed entry is named by its format finding
        for f in h.findings:
            if f.severity is Severity.ERROR and f.tensor is not None:
                if f.tensor in expected.position:
                    out.positions.add(expected.position[f.tensor])
                if f.code in INVALID_ENTRY_CODES:
                    out.invalid.add(f.tensor)
    _mtp(ckpt, expected, positions, out)
    return out


def _mtp(ckpt: Checkpoint, expected: ExpectedLayout, positions: list[int | None], out: Covered) -> None:
    cfg = ckpt.config
    if cfg.num_nextn_predict_layers <= 0 or out.everything:
        return
    first = cfg.num_hidden_layers
    mtp = set(compress(range(len(expected)), (layer is not None and layer >= first for layer in expected.layer_of)))
    if not mtp or mtp & set(positions) or mtp <= out.positions:
        return  # some MTP tensor is stored (check it), or the absent shards that hold it cover it
    layers = ", ".join(cfg.layer_name(n)[:-1] for n in range(first, first + cfg.num_nextn_predict_layers))
    said, why, where = (f"config.json declares num_nextn_predict_layers = {cfg.num_nextn_predict_layers}",
                        "transformers drops that layer on load and never saves it", cfg.layer_name(first)[:-1])
    if ckpt.container == "gguf":  # the file's own key and block names
        key = f"{ckpt.metadata.get('general.architecture')}.nextn_predict_layers"
        layers = ", ".join(sorted({block_prefix(expected.names[p])[:-1] for p in mtp}))  # `blk.61`
        said, why, where = (f"{key} declares {cfg.num_nextn_predict_layers} NextN layer(s)", "The file keeps the "
                            "key without the layer; llama.cpp loads the main layers alone", layers.split(", ")[0])
    out.extra.append(warning(
        "MTP_ABSENT", f"{said}, but no tensor of the multi-token-prediction layer ({layers}) is stored: "
        f"{len(mtp):,} tensors. {why[0].upper()}{why[1:]}; speculative decoding with it is not possible",
        tensor=where, expected=len(mtp), actual=0, covers=len(mtp)))
    out.positions |= mtp


def attribute(findings: list[Finding], ckpt: Checkpoint, cov: Covered) -> list[Finding]:
    """Each unusable shard's root finding, with the count of tensors the index puts there."""
    if not cov.counts and not cov.everything:
        return findings
    done: set[str] = set()
    out = []
    named = ckpt.index.name if ckpt.index is not None else index_name(ckpt.files)  # Mistral's, or transformers'
    for f in findings:
        shard = f.shard
        if shard in cov.counts and shard not in done and f.severity is Severity.ERROR and (
                f.code in ROOT_SHARD_CODES or (f.tensor is None and shard in ckpt.headers)):
            n = cov.counts[shard]
            done.add(shard)
            if f.code != "INDEX_SHARD_ABSENT":  # whose message already says how many
                f = replace(f, message=f"{f.message} ({n:,} tensors {named} lists in it not checked)")
            f = replace(f, covers=n)
        elif f.code == "CHECKPOINT_TOO_LARGE" and cov.counts:
            n = sum(c for s, c in cov.counts.items() if s not in ckpt.headers and s in ckpt.files)
            f = replace(f, covers=n)
        elif cov.everything and f.severity is Severity.ERROR and f.code in ("NO_SAFETENSORS", *ROOT_SHARD_CODES) \
                and "everything" not in done:
            done.add("everything")
            f = replace(f, message=f"{f.message} (with no {named}, the tensors it may hold are unknown: "
                        "none is reported missing)")
        out.append(f)
    return out


UNINDEXED_CODES = frozenset(("SHARD_LOADED_UNINDEXED",))


def fold_unindexed(findings: list[Finding]) -> list[Finding]:
    """Each shard the index does not list covers the findings about the tensors found in it."""
    stray = {f.shard for f in findings if f.code in UNINDEXED_CODES and f.shard}
    if not stray:
        return findings

    def found_in(f: Finding) -> str | None:
        """The stray shard a finding is about (a duplicate names the shard read first as `expected`)."""
        if f.code == "TENSOR_DUPLICATE" and f.expected in stray:
            return str(f.expected)
        return f.shard if f.shard in stray else None

    under = Counter(found_in(f) for f in findings if f.code not in UNINDEXED_CODES)
    out = []
    for f in findings:
        if f.code not in UNINDEXED_CODES and found_in(f) is not None:
            continue
        if f.code in UNINDEXED_CODES:
            n = under[f.shard]
            if n:
                f = replace(f, message=f"{f.message} ({n:,} findings about its tensors covered)", covers=n)
        out.append(f)
    return out


def fold_undescribed(findings: list[Finding], cfg: ModelConfig) -> list[Finding]:
    """Tensors of a part of the release its architecture's description leaves out (DeepSeek-V4.1's `mtp.N.*`)
    are one info finding, not one TENSOR_UNEXPECTED each, nor a scale finding for an FP8 weight of that part
    (its `.scale` unplanned, its `weight_scale_inv` asked for): the part is not checked, so neither are they."""
    kept = findings
    for pattern, what in undescribed(cfg.model_type).items():
        match = re.compile(pattern).match
        mine = [f for f in kept if f.code in UNDESCRIBED_CODES and match(f.tensor or "")]
        stored = sum(f.code in STORED_CODES for f in mine)
        if stored:
            gone = set(map(id, mine))
            first = next(f for f in mine if f.code in STORED_CODES)
            kept = [f for f in kept if id(f) not in gone]
            kept.append(info("TENSORS_UNDESCRIBED", f"{stored:,} tensors of {what} are stored: not checked "
                             "against a layout", tensor=first.tensor, actual=stored, covers=len(mine)))
    return kept


STORED_CODES = frozenset(("TENSOR_UNEXPECTED", "SCALE_UNEXPECTED", "SCALE_ORPHAN"))
"""The findings about a stored tensor the layout has no place for."""
UNDESCRIBED_CODES = STORED_CODES | QUANT_COVERED


MODULE_CODES = frozenset(("DTYPE_MISMATCH", "SHAPE_MISMATCH", "TENSOR_MISSING", "TENSOR_UNEXPECTED")) | QUANT_COVERED


def fold_format_mismatch(findings: list[Finding], expected: ExpectedLayout,
                         positions: list[int | None]) -> list[Finding]:
    """Weights a quantization scheme plans (at least two) stored in one other dtype, and none in a third: the config
    names another format than the files hold, for all its modules or a family of them (attention declared MXFP4,
    stored FP8). One QUANT_FORMAT_MISMATCH per scheme covers the findings of those modules' tensors. A weight
    cast on its own stays its DTYPE_MISMATCH. `positions`: the layout position of each stored tensor."""
    wrong: dict[tuple[str, str, str], list[str]] = {}
    for f in findings:
        e = expected.get(f.tensor) if f.code == "DTYPE_MISMATCH" and f.tensor else None
        if e is not None and e.scheme not in ("", Unquantized.key) and e.logical and isinstance(f.actual, str):
            wrong.setdefault((e.scheme, e.dtype, f.actual), []).append(str(f.tensor))
    if not wrong:
        return findings
    specs, spec_of = expected.specs, expected.spec_of
    planned = Counter((s.scheme, s.dtype) for p in positions if p is not None
                      for s in (specs[spec_of[p]],) if s.logical)  # the weights stored, per scheme
    kinds = Counter((scheme, want) for scheme, want, _ in wrong)
    roots: dict[str, Finding] = {}  # each folded module -> its root
    for (scheme, want, got), names in wrong.items():
        if len(names) < 2 or kinds[scheme, want] > 1:  # one other dtype throughout, or tensors cast one by one
            continue
        words = next(c for c in formats() if c.key == scheme).format_mismatch
        root = error("QUANT_FORMAT_MISMATCH", words(planned[scheme, want], want, len(names), got, names[0]),
                     tensor=names[0], expected=want, actual=got)
        roots.update((n[: n.rindex(".")], root) for n in names)
    if not roots:
        return findings
    covered: Counter[int] = Counter()
    kept = []
    for f in findings:
        name = f.tensor or ""
        owner = roots.get(name[: name.rindex(".")]) if f.code in MODULE_CODES and "." in name else None
        if owner is None:
            kept.append(f)
        else:
            covered[id(owner)] += 1
    firsts = list({id(r): r for r in roots.values()}.values())
    return [replace(r, covers=covered[id(r)]) for r in firsts] + kept


def fold_quantization(findings: list[Finding], expected: ExpectedLayout) -> list[Finding]:
    """With a QUANT_CONFIG or QUANT_UNSUPPORTED error, the per-tensor findings it explains fold into it:
    dtype and scale findings; with QUANT_UNSUPPORTED, anything stored under a Linear module's name."""
    roots = [i for i, f in enumerate(findings)
             if f.code in ("QUANT_CONFIG", "QUANT_UNSUPPORTED") and f.severity is Severity.ERROR]
    if not roots:
        return findings
    unsupported = findings[roots[0]].code == "QUANT_UNSUPPORTED"

    def linear_module(name: str | None) -> bool:
        if name is None or "." not in name:
            return False
        e = expected.get(name[:name.rindex(".")] + ".weight")
        return e is not None and bool(e.scheme)

    def explained(f: Finding) -> bool:
        if f.code in QUANT_COVERED:
            return True
        if unsupported and f.code in ("TENSOR_UNEXPECTED", "DTYPE_MISMATCH", "SHAPE_MISMATCH"):
            return linear_module(f.tensor)
        return f.code == "DTYPE_MISMATCH" and any(str(v).startswith("F8_") for v in (f.expected, f.actual))

    kept = [f for f in findings if not explained(f)]
    folded = len(findings) - len(kept)
    if folded:
        root = findings[roots[0]]
        kept[kept.index(root)] = replace(root, covers=folded, message=f"{root.message}; it explains {folded:,} "
                                         "per-tensor dtype and scale findings, not listed one by one")
    return kept


CONFIG_DIMENSIONS = ("hidden_size", "intermediate_size", "moe_intermediate_size", "q_lora_rank", "kv_lora_rank",
                     "n_routed_experts", "vocab_size", "index_head_dim", "index_n_heads")
"""The config fields that are a tensor dimension as they are: a value that disagrees with the tensors shows as the
same one dimension off in each tensor it sizes."""
SHAPE_CODES = ("SHAPE_MISMATCH", "SCALE_SHAPE")


def fold_config_dimension(findings: list[Finding], ckpt: Checkpoint) -> list[Finding]:
    """A config value the stored tensors contradict (an expert count, an intermediate size, the vocabulary, an
    indexer's heads) is one CONFIG_DISAGREES error naming the key, covering the shape findings it explains: two or
    more tensors off in one dimension only, each storing the same value where the layout put that key's value,
    and, the layout derived again with the key at that value, every tensor whose shape that gives (those it sizes
    through a product too)."""
    shapes = [f for f in findings if f.code in SHAPE_CODES and isinstance(f.expected, list)
              and isinstance(f.actual, list) and len(f.expected) == len(f.actual)]
    groups: dict[tuple[int, int], list[Finding]] = {}
    for f in shapes:
        diffs = {(e, a) for e, a in zip(f.expected, f.actual) if e != a}
        if len(diffs) == 1:
            groups.setdefault(diffs.pop(), []).append(f)
    folded: set[int] = set()
    out: list[Finding] = []
    for (want, got), fs in groups.items():
        if len(fs) < 2 or any(id(f) in folded for f in fs):
            continue
        dims = dict(ckpt.config.dims)  # an architecture's own dimensions (GLM-4.x's head_dim) too
        for key in (k for k in (*CONFIG_DIMENSIONS, *dims) if getattr(ckpt.config, k, dims.get(k)) == want):
            layout = layout_with(ckpt, key, got)
            if layout is None or not all(_fits(layout, f) for f in fs):
                continue
            under = [f for f in shapes if id(f) not in folded and _fits(layout, f)]
            first = fs[0]
            named = config_key(ckpt, key, want)
            out.append(error("CONFIG_DISAGREES", f"{named} is {want:,}, but {len(under):,} tensors it sizes store "
                             f"{got:,} there (first: {first.tensor}, shape {first.actual}): the config and the tensors "
                             "disagree", tensor=named, shard=first.shard, expected=want, actual=got,
                             covers=len(under)))
            folded.update(id(f) for f in under)
            break
    if not out:
        return findings
    return out + [f for f in findings if id(f) not in folded]


def _fits(layout: ExpectedLayout, f: Finding) -> bool:
    e = layout.get(str(f.tensor))
    return e is not None and list(e.shape) == f.actual


def layout_with(ckpt: Checkpoint, field_name: str, value: int, **also: int) -> ExpectedLayout | None:
    """The checkpoint's layout derived again with one config field (or one of its architecture's `dims`) at another
    value (and the fields `also` names with it), in the checkpoint's own spelling (a GGUF set's names); None where
    no layout follows."""
    from kimi_audit.errors import KimiAuditError
    from kimi_audit.model.arch.registry import gguf_architecture
    from kimi_audit.model.dialect import respelled
    from kimi_audit.model.layout import expected_layout

    try:
        dims = dict(ckpt.config.dims)
        changed: dict[str, Any] = ({"dims": tuple(sorted({**dims, field_name: value}.items()))} if field_name in dims
                                   else {field_name: value}) | also
        layout = expected_layout(replace(ckpt.config, **changed))
    except (KimiAuditError, TypeError, ValueError, KeyError, IndexError):  # a value this tree has no layout for
        return None
    if ckpt.container == "gguf":
        arch = gguf_architecture(ckpt.metadata.get("general.architecture"))
        if arch is None or arch.gguf is None:
            return None
        layout = respelled(layout, arch.gguf.rename)
    return layout


def config_key(ckpt: Checkpoint, field_name: str, value: int) -> str:
    """Where a config field is written: config.json's key, or (a GGUF set) the metadata key its dialect writes it
    to with that value."""
    if ckpt.container != "gguf":
        from kimi_audit.constants import CONFIG_FILE
        from kimi_audit.model.arch.mistral_params import PARAMS_FILE, params_key

        if CONFIG_FILE not in ckpt.files and PARAMS_FILE in ckpt.files:
            return f"{PARAMS_FILE} {params_key(field_name) or f'(read as {field_name})'}"
        return f"{CONFIG_FILE} {field_name}"
    from kimi_audit.model.arch.registry import gguf_architecture

    arch = gguf_architecture(ckpt.metadata.get("general.architecture"))
    if arch is None or arch.gguf is None:
        return field_name
    raw = dict(ckpt.config_raw)
    with_value = arch.gguf.metadata({**raw, field_name: value})
    moved = arch.gguf.metadata({**raw, field_name: value + 1})  # the key that follows the field is the field's
    keys = [k for k, v in with_value.items() if v == value and moved.get(k) == value + 1]
    return keys[0] if keys else field_name


EXPERT = re.compile(r"^(.*\.experts\.\d+)\.")


def fold_missing_experts(findings: list[Finding]) -> list[Finding]:
    """The tensors of one routed expert missing together (its gate, up and down weights) are one TENSOR_MISSING for
    the expert, naming what it lacks: one cause, a hole in the expert list, whatever the number of its tensors."""
    groups: dict[str, list[Finding]] = {}
    for f in findings:
        m = EXPERT.match(f.tensor or "") if f.code == "TENSOR_MISSING" else None
        if m is not None:
            groups.setdefault(m.group(1), []).append(f)
    folded = {id(f) for fs in groups.values() if len(fs) > 1 for f in fs}
    if not folded:
        return findings
    out = [f for f in findings if id(f) not in folded]
    for expert, fs in groups.items():
        if len(fs) > 1:
            parts = ", ".join(str(f.tensor)[len(expert) + 1:] for f in fs)
            out.append(error("TENSOR_MISSING", f"{expert}: expert missing, {len(fs)} tensors in no shard ({parts})",
                             tensor=fs[0].tensor, expected=fs[0].expected, covers=len(fs)))
    return out
