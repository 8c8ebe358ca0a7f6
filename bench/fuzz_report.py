"""Fuzz report: how many hostile inputs of each class the header reader was fed, and what it said.

    python bench/fuzz_report.py [--per-class N] [--seed0 S] [--no-library] [--ten-million]

For every mutation class of tests/header_mutations.py, N inputs (reproducible from class and seed):
rejected (an error finding), accepted (no error finding) and crashed (any exception: must be 0),
and, unless --no-library, the verdict of the safetensors library (safe_open) next to it: agreements,
documented stricter rules (kimi-audit refuses, the library accepts: duplicate keys, f64::MAX in
ignored fields) and lenient disagreements (kimi-audit accepts what the library refuses: must be 0).
The largest tracemalloc peak while parsing (KiB) and the largest input are shown for the first 20
inputs of each class.

--ten-million: a checkpoint directory with 10 million tensor names over 10 shards of 1,000,000
(68 MB headers each, under the 100 MB limit); reports what load_checkpoint reads, its findings, wall
time and peak RSS (the shards' headers together are capped at MAX_TOTAL_HEADER_BYTES).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import struct
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from header_mutations import CLASSES, generate, library_verdict  # noqa: E402
from kimi_audit.findings import Severity  # noqa: E402
from kimi_audit.format.header import parse_shard_prefix  # noqa: E402

STRICTER = ("HEADER_DUPLICATE_KEY", "F64_MAX_IN_IGNORED_FIELD")


def rules(h) -> set[str]:
    return {("F64_MAX_IN_IGNORED_FIELD" if "rounds to its largest" in f.message else f.code)
            for f in h.findings if f.severity is Severity.ERROR}


def fuzz(per_class: int, seed0: int, library: bool) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="kimi-fuzz-report-"))
    path = tmp / "f.safetensors"
    rows = []
    totals = collections.Counter()
    crashes: list[tuple[str, int, str]] = []
    t0 = time.perf_counter()
    for cls in CLASSES:
        c = collections.Counter()
        worst = 0.0
        biggest = 0
        for seed in range(seed0, seed0 + per_class):
            data = generate(cls, seed)
            c["tried"] += 1
            try:
                sample = seed - seed0 < 20
                if sample:
                    tracemalloc.start()
                h = parse_shard_prefix(data, shard="f.safetensors", file_size=len(data))
                if sample:
                    worst = max(worst, tracemalloc.get_traced_memory()[1] / 1024)
                    biggest = max(biggest, len(data))
                    tracemalloc.stop()
            except Exception as e:  # any exception at all: counting crashes is the point
                if tracemalloc.is_tracing():
                    tracemalloc.stop()
                c["crashed"] += 1
                crashes.append((cls, seed, f"{type(e).__name__}: {e}"[:200]))
                continue
            k_ok = h.ok
            c["accepted" if k_ok else "rejected"] += 1
            if library:
                path.write_bytes(data)
                l_ok = library_verdict(str(path))[0]
                if k_ok == l_ok:
                    c["agree"] += 1
                elif not k_ok and rules(h) <= set(STRICTER):
                    c["stricter"] += 1
                else:
                    c["lenient" if k_ok else "other"] += 1
        c["peak_per_byte"] = 0  # not summed
        totals.update(c)
        rows.append((cls, c, worst, biggest))
    elapsed = time.perf_counter() - t0

    head = f"{'class':18s} {'tried':>7s} {'rejected':>9s} {'accepted':>9s} {'crashed':>8s}"
    if library:
        head += f" {'agree':>7s} {'stricter':>9s} {'lenient':>8s}"
    head += f" {'peak KiB':>9s} {'of input':>9s}"
    print(head)
    print("-" * len(head))
    for cls, c, worst, biggest in [*rows, ("total", totals, max(r[2] for r in rows), max(r[3] for r in rows))]:
        line = f"{cls:18s} {c['tried']:7,d} {c['rejected']:9,d} {c['accepted']:9,d} {c['crashed']:8,d}"
        if library:
            line += f" {c['agree']:7,d} {c['stricter']:9,d} {c['lenient'] + c['other']:8,d}"
        line += f" {worst:9.0f} {biggest / 1024:7.0f}Ki"
        print(line)
    print(f"\n{totals['tried']:,} inputs in {elapsed:.1f} s; crashed: {totals['crashed']}"
          + (f"; library disagreements: {totals['stricter']:,} documented stricter "
             f"({', '.join(STRICTER)}), {totals['lenient'] + totals['other']} other" if library else ""))
    for cls, seed, msg in crashes[:20]:
        print(f"CRASH {cls} seed={seed}: {msg}")
    return 1 if totals["crashed"] or totals["lenient"] or totals["other"] else 0


def ten_million() -> None:
    from kimi_audit.model import checkpoint
    from kimi_audit.model.checkpoint import load_checkpoint
    from kimi_audit.sources.local import LocalSource

    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_checkpoint import TINY_CONFIG

    d = Path(tempfile.mkdtemp(prefix="kimi-ten-million-"))
    (d / "config.json").write_text(json.dumps(TINY_CONFIG))
    per, shards = 1_000_000, 10
    t = time.perf_counter()
    for s in range(shards):
        base = s * per
        raw = ("{" + ",".join(f'"t{base + i}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{i + 1}]}}'
                               for i in range(per)) + "}").encode()
        with open(d / f"model-{s + 1}-of-{shards}.safetensors", "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + per)
    print(f"\nten million names: {shards} shards x {per:,} tensors, {len(raw) / 1e6:.0f} MB header each, "
          f"written in {time.perf_counter() - t:.0f} s")
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t = time.perf_counter()
    ckpt = load_checkpoint(LocalSource(d))
    wall = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tensors = sum(h.tensor_count for h in ckpt.headers.values())
    codes = collections.Counter(f.code for f in ckpt.findings)
    print(f"load_checkpoint: {len(ckpt.headers)} shards parsed ({tensors:,} tensors), {wall:.1f} s, "
          f"peak RSS {peak / 1e6:,.0f} MB (before: {rss0 / 1e6:,.0f} MB); cap {checkpoint.MAX_TOTAL_HEADER_BYTES:,} B")
    print(f"findings: {dict(codes)}")
    for f in ckpt.findings:
        if f.code == "CHECKPOINT_TOO_LARGE":
            print(f"  {f.message}")
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-class", type=int, default=2000)
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--no-library", action="store_true")
    ap.add_argument("--ten-million", action="store_true")
    args = ap.parse_args()
    rc = fuzz(args.per_class, args.seed0, not args.no_library)
    if args.ten_million:
        ten_million()
    sys.exit(rc)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    main()
