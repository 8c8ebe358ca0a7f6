"""GGUF split sets: which files are one model, and whether the set is whole and consistent.

llama.cpp's converter (`--split-max-tensors`/`--split-max-size`) and `llama-gguf-split` name the parts
`NAME-%05d-of-%05d.gguf` (llama.cpp's `llama_split_path`) and write `split.no` (u16, from 0), `split.count` (u16)
and `split.tensors.count` (i32, the whole set's) into every part; llama.cpp's loader opens part 1, derives the
others' names from it, and fails when one is missing or when the tensors found are not `split.tensors.count`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from kimi_audit.constants import GGUF_SUFFIX
from kimi_audit.findings import Finding, error, warning
from kimi_audit.format.gguf import GgufPart
from kimi_audit.format.gguf_keys import SPLIT_KEYS, mistyped
from kimi_audit.sources.selected import SPLIT_NAME

SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"


def set_key(name: str) -> str:
    """The set a GGUF file belongs to: its path without the `-NNNNN-of-NNNNN.gguf` of a split part."""
    m = SPLIT_NAME.match(name)
    return m.group("stem") if m else name[: -len(GGUF_SUFFIX)]


def gguf_sets(files: Iterable[str]) -> dict[str, list[str]]:
    """Set key -> its files (natural order), for every .gguf file (what each holds is its metadata's to say:
    `not_a_model`)."""
    out: dict[str, list[str]] = {}
    for f in sorted(files):
        if f.endswith(GGUF_SUFFIX):
            out.setdefault(set_key(f), []).append(f)
    return out


IMATRIX, MMPROJ = "imatrix", "mmproj"
NOT_MODELS = {IMATRIX: "an importance matrix (llama-imatrix's output, read by llama-quantize --imatrix)",
              MMPROJ: "a multimodal projector (mmproj, read by llama.cpp's mtmd beside its model)"}


IMATRIX_KEYS = ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")
IMATRIX_TENSORS = (".in_sum2", ".counts")
CLIP = "clip"


def not_a_model(kv: Mapping[str, Any], tensors: Iterable[str] = ()) -> str | None:
    """IMATRIX or MMPROJ for llama.cpp's GGUF files that are not a model, decided as llama.cpp decides (not by the
    file's name, nor by `general.type`, which no loader reads); None for anything else.

    A model is what llama.cpp's loader opens by `general.architecture`: any architecture but `clip`, which it
    refuses ("CLIP cannot be used as main model, use it with --mmproj instead", src/llama.cpp lines 352-353).
    An mmproj is `clip` (conversion/base.py MmprojModel; gguf-py MODEL_ARCH.MMPROJ), or a file with no
    architecture whose `clip.*` keys tools/mtmd/clip.cpp reads (clip_model_loader never reads the architecture).
    An imatrix has no architecture and what common/imatrix-loader.cpp common_imatrix_load reads, the
    `imatrix.datasets`/`chunk_count`/`chunk_size` keys or `NAME.in_sum2`/`NAME.counts` tensors
    (tools/imatrix/imatrix.cpp IMatrixCollector::save_imatrix writes both); a file whose every tensor is one of
    those is an imatrix whatever architecture it claims (no model holds only them)."""
    arch = kv.get("general.architecture")
    names = list(tensors)
    if names and all(n.endswith(IMATRIX_TENSORS) for n in names):
        return IMATRIX
    if arch == CLIP:
        return MMPROJ
    if arch is not None:
        return None
    if any(k in kv for k in IMATRIX_KEYS) or any(n.endswith(IMATRIX_TENSORS) for n in names):
        return IMATRIX
    if any(k.startswith(CLIP + ".") for k in kv):
        return MMPROJ
    return None


def part_number(name: str) -> tuple[int, int] | None:
    """(part number from 1, part count) as the file name says, or None for an unsplit name."""
    m = SPLIT_NAME.match(name)
    return (int(m.group("no")), int(m.group("count"))) if m else None


def split_findings(parts: dict[str, GgufPart]) -> list[Finding]:
    """The set whole and consistent: every part's split keys present and agreeing with its name and each other,
    no part missing or twice, and the tensors of all parts `split.tensors.count`."""
    out: list[Finding] = []
    readable = {n: p for n, p in parts.items() if p.header.ok or p.header.tensor_count}
    if not readable:
        return out
    counts: dict[str, int] = {}
    numbers: dict[int, str] = {}
    declared: dict[str, int] = {}
    for name, part in readable.items():
        kv = part.kv
        wrong = mistyped(kv, part.types, SPLIT_KEYS)
        for key, have, want in wrong:
            out.append(error("GGUF_KEY_TYPE", f"{name}: {key} is stored as {have}, but llama.cpp reads it as {want}: "
                             "its loader stops at this key", tensor=key, shard=name, expected=want, actual=have))
        by_name = part_number(name)
        if wrong:
            _present(by_name, name, numbers, counts)
            continue
        no, count, total = kv.get(SPLIT_NO), kv.get(SPLIT_COUNT), kv.get(SPLIT_TENSORS)
        if count is None:
            if by_name is not None and by_name[1] > 1:
                whole = ("llama.cpp loads it as a whole model, no part of a set" if by_name[0] == 1 else
                         "not a part llama.cpp can load as one")
                out.append(error("GGUF_SPLIT_INVALID", f"{name} is named part {by_name[0]} of {by_name[1]} but holds "
                                 f"no split.count: {whole}; its name says otherwise", shard=name))
            counts[name], numbers[0] = 1, name
            continue
        if not (type(no) is int and type(count) is int and type(total) is int):
            absent = [k for k, v in ((SPLIT_NO, no), (SPLIT_TENSORS, total)) if v is None]
            out.append(error("GGUF_SPLIT_INVALID", f"{name}: " + (
                f"no {' and no '.join(absent)}: llama.cpp cannot load the set" if absent else
                f"split.no, split.count and split.tensors.count must all be integers (read {no!r}, {count!r}, "
                f"{total!r})"), shard=name))
            _present(by_name, name, numbers, counts)  # here all the same: its own finding, not a missing part
            continue
        if by_name is not None and (by_name[0] != no + 1 or by_name[1] != count):
            out.append(error("GGUF_SPLIT_INVALID", f"{name}: its name says part {by_name[0]} of {by_name[1]}, its "
                             f"metadata part {no + 1} of {count}: renamed, or swapped in from another set",
                             shard=name, expected=f"{by_name[0]}/{by_name[1]}", actual=f"{no + 1}/{count}"))
        if no in numbers:
            out.append(error("GGUF_SPLIT_INVALID", f"{name} and {numbers[no]} are both part {no + 1}", shard=name))
        numbers.setdefault(no, name)
        counts[name] = count
        declared[name] = total
    if len(set(counts.values())) > 1:
        out.append(error("GGUF_SPLIT_INVALID", "the parts disagree on how many parts the set has: " + ", ".join(
            f"{n}: {c}" for n, c in counts.items()), shard=next(iter(counts)), actual=len(set(counts.values()))))
        return out
    count = next(iter(counts.values()), 1)
    for no in range(count):
        if no not in numbers:
            first = next(iter(readable))
            m = SPLIT_NAME.match(first)
            missing = f"{m.group('stem')}-{no + 1:05d}-of-{count:05d}.gguf" if m else f"part {no + 1}"
            out.append(error("GGUF_PART_MISSING", f"part {no + 1} of {count} ({missing}) is not in the set: llama.cpp "
                             "cannot load it", shard=missing, expected=count, actual=len(numbers)))
    found = sum(p.header.tensor_count for p in readable.values())
    for name, total in declared.items():
        if total != found and len(numbers) == count:
            out.append(error("GGUF_SPLIT_COUNT", f"{name}: split.tensors.count says {total:,} tensors, the "
                             f"{count} parts hold {found:,} (a stale count after a repack: llama.cpp refuses it)",
                             shard=name, expected=total, actual=found))
            break
    return out


LAYER = re.compile(r"^blk\.\d+\.")


def mixed_quant_findings(parts: dict[str, GgufPart]) -> list[Finding]:
    """A part whose tensors are stored in other ggml types than the same roles in every other part (each layer's
    `ffn_gate_exps.weight`, `attn_q_b.weight`, ...): a part taken from another quant of the same model (part 2 of
    an IQ2_XXS set from the Q2_K set). One warning naming the part: dynamic quants (unsloth's UD, llama-quantize's
    own mixes) vary types by layer on purpose, so a type that differs is not wrong in itself; only a part none of
    whose shared roles keeps any type the other parts use is called out."""
    roles: dict[str, dict[str, set[str]]] = {}  # part -> role -> ggml types
    for name, part in parts.items():
        cols = part.header.columns
        for tensor, dtype in zip(cols.names, cols.dtypes):
            roles.setdefault(name, {}).setdefault(LAYER.sub("", tensor), set()).add(dtype)
    if len(roles) < 2:
        return []
    out: list[Finding] = []
    for name, mine in roles.items():
        others: dict[str, set[str]] = {}
        for other, theirs in roles.items():
            if other != name:
                for role, types in theirs.items():
                    others.setdefault(role, set()).update(types)
        shared = [r for r in mine if r in others and not (mine[r] <= {"F32", "F16", "BF16"})]
        if len(shared) >= 2 and all(not (mine[r] & others[r]) for r in shared):
            ours = sorted({t for r in shared for t in mine[r]})
            used = sorted({t for r in shared for t in others[r]})
            out.append(warning("GGUF_QUANT_MIXED", f"{name} stores its {len(shared)} weight roles it shares with the "
                               f"other parts as {'/'.join(ours)}, none in the types the other parts use for them "
                               f"({'/'.join(used)}): a part from another quant of the model? (dynamic quants vary "
                               "types by layer on purpose; re-download this part from the set it belongs to)",
                               shard=name, expected="/".join(used), actual="/".join(ours), covers=len(shared)))
    return out


def _present(by_name: tuple[int, int] | None, name: str, numbers: dict[int, str], counts: dict[str, int]) -> None:
    """A part whose split keys cannot be read still stands in the set where its name puts it (its keys' finding
    says what is wrong with it; it is not also a missing part)."""
    if by_name is not None:
        numbers.setdefault(by_name[0] - 1, name)
        counts[name] = by_name[1]
