"""`verify`'s findings from the files' results: hashes against references, listings, weight health.

Codes (docs/reference.md, report/rules.py): FILE_HASH_MISMATCH, TENSOR_HASH_MISMATCH, FILE_ABSENT, FILE_UNLISTED,
MANIFEST_REVISION, NO_REFERENCE; FP8_NAN, FP8_SATURATED, BLOCK_ALL_ZERO, VALUE_NAN, VALUE_INF,
SCALE_NOT_POSITIVE, GGUF_TYPE_UNKNOWN (a GGUF tensor in a type llama.cpp's check refuses); DATA_NOT_PRESENT (an
error here: bytes that are not there fail a verification) and SHARD_UNREADABLE (a file that could not be read
whole), FILE_CHANGED (appended, written, cut or replaced while it was read), CACHE_FILE_NOT_BLOB (an HF cache
snapshot's file that is no blob link).
"""

from __future__ import annotations

from collections.abc import Iterable

from kimi_audit.findings import Finding, error, info, warning
from kimi_audit.format.gguf_types import GGML_BY_NAME
from kimi_audit.numerics.grid import scale_grid
from kimi_audit.verify.read import FileResult, Health
from kimi_audit.verify.references import MANIFEST, Reference

MAX_PER_CODE = 50
"""Tensor findings listed one by one per code; the rest are summed up in one."""
MAX_TENSORS_NAMED = 5
"""Differing tensors named in a FILE_HASH_MISMATCH message (all of them get a TENSOR_HASH_MISMATCH)."""

WHAT = {
    "FP8_NAN": "FP8 NaN codes (0x7F/0xFF)",
    "VALUE_NAN": "NaN",
    "VALUE_INF": "±Inf",
    "SCALE_NOT_POSITIVE": "scales ≤ 0",
}


def file_findings(r: FileResult, refs: tuple[Reference, ...], differ: dict[str, list[str]]) -> list[Finding]:
    """Read errors, holes, and a sha256 that differs from a reference (`differ`: file -> the tensors whose
    digests differ from the manifest's, when a second pass found them)."""
    out: list[Finding] = []
    if r.error is not None:
        out.append(error("SHARD_UNREADABLE", f"{r.name}: could not be read whole: {r.error}", shard=r.name))
    if r.changed is not None:
        out.append(error("FILE_CHANGED", f"{r.name}: changed while verify read it ({r.changed}): its sha256 is "
                         "of no one state of the file; verify it again when nothing writes to it", shard=r.name))
    if r.holes:
        holed = sum(h1 - h0 for h0, h1 in r.holes)
        out.append(error(
            "DATA_NOT_PRESENT", f"{r.name}: {holed:,} of {r.size:,} bytes are sparse holes ({len(r.holes):,} "
            f"range{'s' if len(r.holes) > 1 else ''}, the first at byte {r.holes[0][0]:,}): the data is not "
            f"present (a header-only or partial copy); {len(r.not_present):,} tensors not checked, the file's "
            "sha256 not computed", shard=r.name, actual=holed, expected=0, covers=len(r.not_present)))
    if r.sha256 is None:
        return out
    for ref in refs:
        want = ref.digests.get(r.name)
        if want is None or want == r.sha256:
            continue
        named = ""
        if ref.kind == MANIFEST and r.name in differ:
            d = differ[r.name]
            shown = ", ".join(d[:MAX_TENSORS_NAMED]) + (", ..." if len(d) > MAX_TENSORS_NAMED else "")
            named = (f"; {len(d):,} tensor{'s differ' if len(d) != 1 else ' differs'}: {shown}" if d
                     else "; every tensor matches: the header or padding differs")
        out.append(error("FILE_HASH_MISMATCH", f"{r.name}: sha256 {r.sha256} differs from {ref.where} "
                         f"({want}){named}", shard=r.name, expected=want, actual=r.sha256))
    return out


def tensor_mismatches(name: str, ref: Reference, again: FileResult | None) -> tuple[list[str], list[Finding]]:
    """The tensors of a mismatching file whose sha256 differs from the manifest's (read in a second pass),
    and one TENSOR_HASH_MISMATCH for each (MAX_PER_CODE, then a summary)."""
    want = ref.tensors.get(name)
    if not want or again is None or again.sha256 is None:
        return [], []
    got = again.tensor_sha256
    differ = sorted(t for t in set(want) | set(got) if want.get(t) != got.get(t))
    out = [error("TENSOR_HASH_MISMATCH", f"{t}: sha256 {got.get(t) or '(no such tensor)'} in {name} differs from "
                 f"{ref.where} ({want.get(t) or 'not listed'})", tensor=t, shard=name,
                 expected=want.get(t), actual=got.get(t)) for t in differ[:MAX_PER_CODE]]
    if len(differ) > MAX_PER_CODE:
        out.append(error("TENSOR_HASH_MISMATCH", f"... and {len(differ) - MAX_PER_CODE:,} more tensors of {name} "
                         f"differ ({len(differ):,} in all)", shard=name, actual=len(differ)))
    return differ, out


def listing_findings(ref: Reference, present: set[str], revision: str | None,
                     ignore_unlisted: bool = False) -> list[Finding]:
    """Files listed and absent (errors), files present and unlisted: an error against a manifest (it does not
    cover the checkpoint: model_signing's verify fails so; a manifest listing nothing covers nothing), unless
    `ignore_unlisted`; a warning against the Hub's listing (a stray local file)."""
    out: list[Finding] = []
    if ref.kind == MANIFEST and ref.revision and revision and ref.revision != revision:
        out.append(error("MANIFEST_REVISION", f"{ref.where} is of revision {ref.revision}, the checkpoint is "
                         f"{revision}", expected=ref.revision, actual=revision))
    if ref.listing is None:
        return out
    for name in sorted(ref.listing - present):
        out.append(error("FILE_ABSENT", f"{name}: listed by {ref.where}, not in the checkpoint", shard=name,
                         expected=ref.digests.get(name)))
    unlisted = sorted(present - ref.listing)
    make = error if ref.kind == MANIFEST and not ignore_unlisted else warning
    for name in unlisted[:MAX_PER_CODE]:
        out.append(make("FILE_UNLISTED", f"{name}: in the checkpoint, not listed by {ref.where}", shard=name))
    if len(unlisted) > MAX_PER_CODE:
        out.append(make("FILE_UNLISTED", f"... and {len(unlisted) - MAX_PER_CODE:,} more files not listed by "
                        f"{ref.where} ({len(unlisted):,} in all)", actual=len(unlisted)))
    return out


def cache_findings(not_blobs: list[str]) -> list[Finding]:
    """A file of an HF cache snapshot that is not a link to one of its blobs: the cache never writes one, so
    its bytes are not those the cache stored (replaced or tampered)."""
    out = [error("CACHE_FILE_NOT_BLOB", f"{name}: a regular file in an HF cache snapshot, not a link to one of its "
                 "blobs: not the bytes the cache stored (replaced or tampered); download it again", shard=name)
           for name in not_blobs[:MAX_PER_CODE]]
    if len(not_blobs) > MAX_PER_CODE:
        out.append(error("CACHE_FILE_NOT_BLOB", f"... and {len(not_blobs) - MAX_PER_CODE:,} more files of the "
                         f"snapshot that are not blob links ({len(not_blobs):,} in all)", actual=len(not_blobs)))
    return out


def unreferenced_finding(names: list[str]) -> list[Finding]:
    if not names:
        return []
    return [info("NO_REFERENCE", f"{len(names):,} file{'s' if len(names) > 1 else ''} hashed with no reference "
                 f"sha256 to compare with (the first: {names[0]}); only their headers and values were checked",
                 actual=len(names), covers=0)]


def health_findings(results: Iterable[FileResult]) -> list[Finding]:
    """One finding per tensor and check that fired (MAX_PER_CODE a code, then a summary), and one FP8_SATURATED
    info for the whole checkpoint."""
    listed: dict[str, list[Finding]] = {}
    totals: dict[str, int] = {}
    saturated = saturated_tensors = 0
    for r in results:
        saturated += r.saturated
        saturated_tensors += r.saturated_tensors
        for h in r.health:
            totals[h.code] = totals.get(h.code, 0) + 1
            lst = listed.setdefault(h.code, [])
            if len(lst) < MAX_PER_CODE:
                lst.append(_health(r.name, h))
    out: list[Finding] = []
    for code, lst in listed.items():
        out += lst
        if totals[code] > len(lst):
            out.append(error(code, f"... and {totals[code] - len(lst):,} more tensors with {code} "
                             f"({totals[code]:,} in all)", actual=totals[code]))
    if saturated:
        out.append(info("FP8_SATURATED", f"{saturated:,} FP8 values at ±448 (the largest E4M3 value) in "
                        f"{saturated_tensors:,} tensors: block quantization puts each block's maximum there",
                        actual=saturated))
    return out


def _health(shard: str, h: Health) -> Finding:
    numel = 1
    for d in h.shape:
        numel *= d
    where = f"the first at element {h.first:,}"
    if h.code == "BLOCK_ALL_ZERO" and len(h.shape) == 2 and h.block is not None:
        row, col = divmod(h.first, h.shape[1])
        b0, b1 = h.block
        rows, cols = scale_grid(h.shape, h.block)
        blocks = rows * cols
        what = f"{h.count:,} of {blocks:,} {b0}×{b1} blocks are all zeros"
        where = f"the first is block ({row // b0}, {col // b1}), at element {h.first:,}"
    elif h.ggml is not None:
        t = GGML_BY_NAME[h.ggml]
        if t.scales is None:
            return error(h.code, f"{h.tensor}: ggml type {h.ggml}, which llama.cpp's --check-tensors refuses as an "
                         "invalid type (no stored weight has it)", tensor=h.tensor, shard=shard, actual=h.ggml)
        fields = ", ".join(f[0] for f in t.scales)
        what = (f"{h.count:,} of {numel // t.block * len(t.scales):,} {h.ggml} block scales ({fields}) are "
                f"{WHAT.get(h.code, h.code)}")
        where = f"the first in block {h.first // t.block:,}, at element {h.first:,}"
    else:
        what = f"{h.count:,} of {numel:,} values are {WHAT.get(h.code, h.code)}"
    return error(h.code, f"{h.tensor}: {what} ({where})", tensor=h.tensor, shard=shard, actual=h.count,
                 expected=h.first)
