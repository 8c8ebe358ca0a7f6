"""Benchmark: `kimi-audit audit GGUF --against SRC --values` on a multi-GB tensor, as a whole process, beside a
plain gguf-py read of the same tensor.

    python bench/against_memory.py [--experts 32] [--repeats 3] [--before REV] [--keep DIR]

The pair (tests/sparse_pair.py, built in a temp dir unless --keep names one): a GGUF part holding one F32
stacked-experts tensor, `blk.1.ffn_gate_exps.weight` [E, 4096, 8192] (E = 32: 4 GiB), its data a sparse hole,
and its source, E FP8 expert weights [4096, 8192] with their 128x128 scales, written zeros (E = 32: 1 GiB).
Commands, each a fresh process started with this Python, run alternately after one untimed warm-up each:
  kimi-audit: `python -m kimi_audit audit GGUF --against SRC --values --json`;
  gguf-py:    GGUFReader on the part, the tensor's bytes hashed (sha256) through its memmap: one plain read;
  before:     with --before REV, kimi-audit at that git revision (its kimi_audit/ extracted to a temp dir).
  Each runs in the temp dir (not the checkout: `-m` puts the working directory first on sys.path).
  wall: time.perf_counter() around Popen .. os.wait4; peak RSS: ru_maxrss of that process, from os.wait4
  (MB = 10^6 bytes). Medians shown.
Target: the audit's peak RSS <= 512 MB whatever the tensor's size (a real Kimi-K2 Q8_0 stacked-experts tensor
is ~5.6 GB, its float32 source ~22 GB). A benchmark, not a test: the target is shown PASS or MISS.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MB = 1_000_000
TARGET_RSS = 512 * MB

GGUF_PY_SCRIPT = """\
import hashlib
import sys

from gguf import GGUFReader

t = next(t for t in GGUFReader(sys.argv[1]).tensors if t.name == sys.argv[2])
print(hashlib.sha256(t.data).hexdigest()[:16])
"""


def run_once(argv: list[str], env: dict[str, str], scratch: Path) -> tuple[float, int, int]:
    """(wall s, peak RSS bytes, exit code) of one whole process."""
    with open(scratch / "stdout", "wb") as out, open(scratch / "stderr", "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=scratch)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = rc = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss * 1024, rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, default=32, help="experts of 4096 x 8192 (32: a 4 GiB F32 tensor)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before", metavar="REV", help="also run kimi-audit as of this git revision")
    ap.add_argument("--keep", type=Path, help="build the pair in this folder and keep it")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    import sparse_pair

    with tempfile.TemporaryDirectory(prefix="against-bench-") as tmp:
        scratch = Path(tmp)
        folder = args.keep or scratch / "pair"
        t0 = time.perf_counter()
        gguf, src = sparse_pair.build(folder, args.experts)
        source_mb = (src / "model.safetensors").stat().st_size / MB
        print(f"pair: {gguf.stat().st_size / MB:,.0f} MB GGUF part (sparse), {source_mb:,.0f} MB FP8 source, built in "
              f"{time.perf_counter() - t0:.1f} s")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        audit = ["-m", "kimi_audit", "audit", str(gguf), "--against", str(src), "--values", "--no-progress", "--json"]
        cmds: dict[str, tuple[list[str], dict[str, str]]] = {"kimi-audit": ([sys.executable, *audit], env)}
        (scratch / "gguf_py.py").write_text(GGUF_PY_SCRIPT)
        cmds["gguf-py read"] = ([sys.executable, str(scratch / "gguf_py.py"), str(gguf), sparse_pair.GGUF_TENSOR],
                                env)
        if args.before:
            old = scratch / "before"
            old.mkdir()
            archive = subprocess.run(["git", "archive", args.before, "kimi_audit"], cwd=ROOT, check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
            cmds[f"kimi-audit {args.before}"] = ([sys.executable, *audit], {**os.environ, "PYTHONPATH": str(old)})
        results: dict[str, list[tuple[float, int, int]]] = {name: [] for name in cmds}
        for rnd in range(args.repeats + 1):
            for name, (argv, e) in cmds.items():
                got = run_once(argv, e, scratch)
                if rnd:
                    results[name].append(got)
        base_wall = statistics.median(r[0] for r in results["kimi-audit"])
        base_rss = statistics.median(r[1] for r in results["kimi-audit"])
        print(f"medians of {args.repeats} alternating runs; wall = Popen .. os.wait4, RSS = ru_maxrss of the process")
        for name, runs in results.items():
            wall, rss = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            codes = sorted({r[2] for r in runs})
            print(f"  {name:<24} {wall * 1000:>9,.0f} ms  {rss / MB:>8,.0f} MB  exit {codes}  "
                  f"(kimi-audit is {base_wall / wall:.2f}x its wall, {base_rss / rss:.2f}x its RSS)")
        verdict = "PASS" if base_rss <= TARGET_RSS else "MISS"
        print(f"target: kimi-audit peak RSS <= {TARGET_RSS / MB:,.0f} MB: {base_rss / MB:,.0f} MB, {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
