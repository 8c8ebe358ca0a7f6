"""Local header audit of the full-scale Kimi-K2 replica, side by side with two baselines, in one run.

    python bench/audit_local.py [REPLICA_DIR] [--repeat N]

Baselines on the same 61 shards (page cache warm for all, runs interleaved, best of N each):
  (a) bare json.loads of every header (read 8 bytes, read N, json.loads), results kept in a list
      as any reader must keep them -- and, for reference, the same with each result dropped at once;
  (b) huggingface_hub.get_local_safetensors_metadata(dir).
kimi-audit is timed twice: the header audit (the same work as (b): index.json and every shard header
read, every format rule of the strict reader checked) and the full audit (plus config.json, the
expected layout derived from it, every check and the statistics: kimi_audit.audit.audit_source).
Peak RSS is measured in a fresh child process running the full audit.
Targets (issue 2): header audit <= 1.5x (a), >= 2.5x faster than (b), peak RSS <= 200 MB.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def bare_json(directory: Path, keep: bool) -> int:
    kept = []
    for shard in sorted(directory.glob("*.safetensors")):
        with open(shard, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            obj = json.loads(f.read(n))
        if keep:
            kept.append(obj)
    return len(kept)


def hf_local(directory: Path) -> int:
    from huggingface_hub import get_local_safetensors_metadata

    return len(get_local_safetensors_metadata(directory).weight_map)


def header_audit(directory: Path) -> int:
    """What (b) does, strictly: the index and every shard header, read and validated."""
    from kimi_audit.model.checkpoint import load_index, read_headers, shards_to_read
    from kimi_audit.gcpause import gc_paused
    from kimi_audit.sources import LocalSource

    src = LocalSource(directory)
    with gc_paused():
        files = src.list_files()
        index, _ = load_index(src, files)
        shards, _ = shards_to_read(files, index)
        headers, _ = read_headers(src, shards, index)
    return len(headers)


def full_audit(directory: Path) -> int:
    from kimi_audit.checks.audit import audit_source
    from kimi_audit.sources import LocalSource

    r = audit_source(LocalSource(directory))
    assert r.errors == 0 and r.stats.parameters == 1_026_408_232_448, "replica did not audit clean"
    return r.stats.tensors


RSS_CHILD = """
import resource, sys
from kimi_audit.checks.audit import audit_source
from kimi_audit.sources import LocalSource
r = audit_source(LocalSource(sys.argv[1]))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, r.stats.tensors)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("replica", nargs="?", type=Path, help="an existing replica (default: build one in a temp dir)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kimi-bench-") as tmp:
        directory = args.replica
        if directory is None:
            from kimi_audit.model.replica import build_replica

            directory = build_replica(Path(tmp) / "replica", fill_small=False)
        cases = {
            "json.loads, kept": lambda: bare_json(directory, True),
            "json.loads, dropped": lambda: bare_json(directory, False),
            "hf get_local_safetensors_metadata": lambda: hf_local(directory),
            "kimi-audit header audit": lambda: header_audit(directory),
            "kimi-audit full audit": lambda: full_audit(directory),
        }
        for fn in cases.values():  # warm the page cache and imports
            fn()
        best = {k: float("inf") for k in cases}
        for _ in range(args.repeat):
            for name, fn in cases.items():
                t = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t)
        out = subprocess.run([sys.executable, "-c", RSS_CHILD, str(directory)], capture_output=True, text=True,
                             check=True).stdout.split()
        rss_mb = int(out[0]) / 1024

    print(f"full-scale replica: 61 shards, {out[1]} tensors; best of {args.repeat} runs each")
    for name, t in best.items():
        print(f"  {name:38s} {t * 1000:8.1f} ms")
    h, f = best["kimi-audit header audit"], best["kimi-audit full audit"]
    a_kept, a_drop, b = best["json.loads, kept"], best["json.loads, dropped"], best["hf get_local_safetensors_metadata"]
    print(f"header audit / (a) json.loads kept    = {h / a_kept:5.2f}x   (target <= 1.5x)")
    print(f"header audit / (a) json.loads dropped = {h / a_drop:5.2f}x")
    print(f"(b) hf / header audit                 = {b / h:5.2f}x faster (target >= 2.5x)")
    print(f"full audit / (a) kept = {f / a_kept:5.2f}x; (b) hf / full audit = {b / f:5.2f}x faster")
    print(f"peak RSS, full audit in a fresh process: {rss_mb:.0f} MB (target <= 200 MB)")


if __name__ == "__main__":
    main()
