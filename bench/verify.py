"""Benchmark: `kimi-audit verify` on a real FP8 checkpoint against a plain parallel sha256 script, in one run.

    python bench/verify.py [--size-gb 3] [--dir DIR] [--keep] [--repeats 3] [--cold] [--shard-mb 400]

The checkpoint: a real (not sparse) Kimi-K2-style FP8 checkpoint of about --size-gb GB (10^9 bytes) in a
temp dir (or --dir DIR; generation is skipped when DIR already holds a config.json). Kimi-K2's dimensions
(hidden 7168, moe_intermediate 2048, q_lora_rank 1536, kv_lora_rank 512, 64 heads of qk_nope 128, qk_rope
64, v_head 128, dense intermediate 18432) with the counts cut down: vocab 16384, the first layer dense, the
number of layers and of routed experts chosen for the size (3 GB: 4 layers, 12 experts). config.json is
the shipped Kimi-K2-Instruct config with those counts overridden; the tensors are exactly
kimi_audit.model.layout.expected_layout(config) without the optional rotary buffers, written shard by
shard (about --shard-mb each, `model-0000i-of-0000n.safetensors`) with safetensors.numpy.save_file, plus
model.safetensors.index.json (weight_map, metadata.total_size). Values as DeepSeek's FP8 cast makes them:
each 128x128 block of a weight quantized from normals with scale = amax / 448 (F8_E4M3 via
ml_dtypes.float8_e4m3fn, never a NaN code; F32 weight_scale_inv), the blocks' magnitudes varied so that
their scales differ; BF16 embeddings, lm_head, router weights and norm gains, F32 router biases. Normals
are drawn for a pool of 128-row bands once; each block row of a weight is a (band, column offset) pick
from it, so generating GBs takes seconds. `kimi-audit audit DIR --json` is run once on it (untimed) and
must exit 0.

The commands, each a fresh process of this Python (sys.executable):
  verify  `python -m kimi_audit verify DIR --json` (stdout to a file; exit 0 expected): the value scan;
  sha256  a plain parallel hashlib script written to a temp file: ProcessPoolExecutor(os.cpu_count())
          over the .safetensors files, each streamed in 16 MiB chunks (readinto a reused buffer) through
          hashlib.sha256, printing digest and file.
They run alternately (verify, sha256, verify, sha256, ...) --repeats times each after one untimed
warm-up run of each, so that both read the files from the page cache (the checkpoint must fit in RAM);
with --cold, `sync; echo 3 > /proc/sys/vm/drop_caches` before every run instead (root only).
  wall: time.perf_counter() around Popen .. os.wait4 (start-up and exit included);
  parent peak RSS: ru_maxrss of the process started, from os.wait4 (Linux starts a child's ru_maxrss at
          its starter's peak: the checkpoint is generated in a child process so that this one stays small);
  tree peak RSS: the largest sum of VmRSS over the process and all its descendants (a sampler thread
          reads /proc/PID/task/*/children and /proc/PID/status every 50 ms; shared pages count once per
          process, so it is an upper bound), with its anonymous part (RssAnon) beside;
  largest process: the largest VmHWM (a process's own peak RSS) of any process of the tree sampled.
Medians are shown (MB = 10^6 bytes). Targets: verify's wall <= 1.1x the sha256 script's; verify's
peak RSS (the tree's, which is the parent's for a single process) <= 300 MB. It is a benchmark, not a
test: nothing is asserted; each target is PASS or MISS. While the verify command does not exist
(`python -m kimi_audit verify --help` fails) only the sha256 script is measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MB = 1_000_000
GB = 1_000_000_000
BLOCK = 128
FP8_MAX = 448.0
VOCAB = 16384
MAX_EXPERTS = 16
POOL_BANDS = 32
SAMPLE_S = 0.05
WALL_TARGET = 1.1
RSS_TARGET_MB = 300
VERIFY = ["-m", "kimi_audit", "verify"]

SHA256_SCRIPT = """\
import hashlib
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

CHUNK = 16 << 20


def digest(path):
    h = hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return path, h.hexdigest()


if __name__ == "__main__":
    files = sorted(Path(sys.argv[1]).glob("*.safetensors"))
    with ProcessPoolExecutor(os.cpu_count()) as ex:
        for path, d in ex.map(digest, files):
            print(d, path.name)
"""


# ----------------------------------------------------------------------------------------------- generator

def kimi_config(layers: int, experts: int) -> dict:
    from kimi_audit.model.config import pinned_config_bytes

    cfg = json.loads(pinned_config_bytes())
    cfg.update(num_hidden_layers=layers, n_routed_experts=experts, num_experts_per_tok=min(8, experts),
               vocab_size=VOCAB, first_k_dense_replace=1, num_nextn_predict_layers=0)
    return cfg


def layout_of(cfg: dict) -> list:
    from kimi_audit.model.config import model_config_from_dict
    from kimi_audit.model.kinds import BUFFER
    from kimi_audit.model.layout import expected_layout

    return [t for t in expected_layout(model_config_from_dict(cfg)).values() if t.kind != BUFFER]


def payload(layers: int, experts: int) -> int:
    return sum(t.nbytes for t in layout_of(kimi_config(layers, experts)))


def choose_counts(target: int) -> tuple[int, int]:
    """The fewest layers (at least 2, the first dense) whose 1..16 experts can reach `target` bytes, and
    the number of experts that comes closest to it."""
    for layers in range(2, 62):
        base, one = payload(layers, 1), payload(layers, 2)
        per_expert = one - base
        if base + (MAX_EXPERTS - 1) * per_expert >= target or layers == 61:
            experts = 1 + round((target - base) / per_expert)
            return layers, max(1, min(MAX_EXPERTS, experts))
    raise AssertionError


class ValueMaker:
    """Realistic values for every tensor of the layout, made fast (see the module docstring)."""

    def __init__(self, seed: int, width: int):
        import ml_dtypes
        import numpy as np

        self.np, self.fp8, self.bf16 = np, ml_dtypes.float8_e4m3fn, ml_dtypes.bfloat16
        self.rng = np.random.default_rng(seed)
        self.width = width
        self.bands = np.empty((POOL_BANDS, BLOCK, width), dtype=self.fp8)
        self.band_amax = np.empty((POOL_BANDS, width // BLOCK), dtype=np.float64)
        for k in range(POOL_BANDS):  # one band at a time: ~9 MB of float32 normals
            x = self.rng.standard_normal((BLOCK, width), dtype=np.float32)
            codes, amax = self.quantize(x)
            self.bands[k], self.band_amax[k] = codes, amax[0]
        rows = self.rng.standard_normal((4096, 7168), dtype=np.float32)
        self.bf16_rows = rows.astype(self.bf16)  # a pool of BF16 rows of unit normals

    def quantize(self, x):
        """DeepSeek's per-block cast of float32 x: (codes, amax per block); partial blocks padded."""
        np = self.np
        out, inp = x.shape
        nbr, nbc = math.ceil(out / BLOCK), math.ceil(inp / BLOCK)
        pad = np.zeros((nbr * BLOCK, nbc * BLOCK), dtype=np.float32)
        pad[:out, :inp] = x
        blocks = pad.reshape(nbr, BLOCK, nbc, BLOCK)
        amax = np.abs(blocks).max(axis=(1, 3)).astype(np.float64)
        amax[amax == 0] = 1.0
        scale = (amax / FP8_MAX).astype(np.float32)
        codes = (blocks / scale[:, None, :, None]).astype(self.fp8).reshape(nbr * BLOCK, nbc * BLOCK)
        return np.ascontiguousarray(codes[:out, :inp]), amax

    def fp8_weight(self, shape: tuple[int, int], sigma: float):
        """(F8_E4M3 weight, F32 weight_scale_inv) of sigma x normals, block magnitudes varied ~ e^N(0, 0.3)."""
        np = self.np
        out, inp = shape
        nbr, nbc = math.ceil(out / BLOCK), math.ceil(inp / BLOCK)
        mag = sigma * np.exp(self.rng.normal(0.0, 0.3, (nbr, nbc)))
        if inp % BLOCK or inp > self.width:  # not from the pool: quantize fresh normals
            codes, amax = self.quantize(self.rng.standard_normal(shape, dtype=np.float32))
            return codes, (mag * amax / FP8_MAX).astype(np.float32)
        w = np.empty(shape, dtype=self.fp8)
        amax = np.empty((nbr, nbc), dtype=np.float64)
        picks = self.rng.integers(0, POOL_BANDS, nbr)
        offsets = self.rng.integers(0, (self.width - inp) // BLOCK + 1, nbr)
        for r in range(nbr):
            lo, hi = r * BLOCK, min(out, (r + 1) * BLOCK)
            k, c = picks[r], offsets[r]
            if hi - lo == BLOCK:
                w[lo:hi] = self.bands[k, :, c * BLOCK:c * BLOCK + inp]
                amax[r] = self.band_amax[k, c:c + nbc]
            else:  # a partial last block row (kv_a_proj_with_mqa's 576 rows): its own amax
                w[lo:hi], part = self.quantize(self.rng.standard_normal((hi - lo, inp), dtype=np.float32))
                amax[r] = part[0]
        return w, (mag * amax / FP8_MAX).astype(np.float32)

    def bf16_matrix(self, shape: tuple[int, int], sigma: float):
        np = self.np
        out, inp = shape
        if inp != self.bf16_rows.shape[1]:
            return (sigma * self.rng.standard_normal(shape, dtype=np.float32)).astype(self.bf16)
        m = np.empty(shape, dtype=self.bf16)
        for lo in range(0, out, 2048):  # ~60 MB of float32 at a time
            rows = self.bf16_rows[self.rng.integers(0, len(self.bf16_rows), min(2048, out - lo))]
            m[lo:lo + len(rows)] = rows.astype(np.float32) * np.float32(sigma)
        return m

    def small(self, t):
        np = self.np
        if t.name.endswith("e_score_correction_bias"):
            return self.rng.normal(0.0, 0.02, t.shape).astype(np.float32)
        if t.name.endswith("layernorm.weight") or t.name == "model.norm.weight":
            return (1.0 + self.rng.normal(0.0, 0.05, t.shape)).astype(self.bf16)
        raise ValueError(f"no values for {t.name} {t.dtype} {t.shape}")


def shard_plan(tensors: list, shard_bytes: int) -> list[list]:
    """Tensors in checkpoint order, packed greedily into shards of about shard_bytes."""
    shards: list[list] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return shards


def generate(directory: Path, target: int, shard_bytes: int, seed: int = 0) -> tuple[int, int]:
    from safetensors.numpy import save_file

    layers, experts = choose_counts(target)
    cfg = kimi_config(layers, experts)
    tensors = layout_of(cfg)
    directory.mkdir(parents=True, exist_ok=True)
    maker = ValueMaker(seed, max(t.shape[1] for t in tensors if t.dtype == "F8_E4M3"))
    scales = {t.name for t in tensors if t.name.endswith("_scale_inv")}
    plan = shard_plan(tensors, shard_bytes)
    weight_map: dict[str, str] = {}
    total = 0
    for i, group in enumerate(plan, 1):
        name = f"model-{i:05d}-of-{len(plan):05d}.safetensors"
        arrays = {}
        for t in group:
            if t.name in scales:
                continue  # made with its weight
            if t.dtype == "F8_E4M3":
                arrays[t.name], arrays[t.name + "_scale_inv"] = maker.fp8_weight(t.shape, 0.02)
            elif t.dtype == "BF16" and len(t.shape) == 2:
                arrays[t.name] = maker.bf16_matrix(t.shape, 0.02)
            else:
                arrays[t.name] = maker.small(t)
        for t in group:  # a scale in another shard than its weight is not expected (they are adjacent)
            if t.name not in arrays:
                raise AssertionError(f"{t.name} split from its weight")
            a = arrays[t.name]
            if tuple(a.shape) != t.shape or a.nbytes != t.nbytes:
                raise AssertionError(f"{t.name}: made {a.shape} {a.dtype}, expected {t.shape} {t.dtype}")
        save_file(arrays, directory / name, metadata={"format": "pt"})
        total += sum(a.nbytes for a in arrays.values())
        weight_map.update(dict.fromkeys(arrays, name))
        del arrays
    (directory / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return layers, experts


# ------------------------------------------------------------------------------------------------ measuring

def _status(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon"):
                    out[key] = int(rest.split()[0]) * 1024
    except (FileNotFoundError, ProcessLookupError, ValueError):
        pass
    return out


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            pass
    return pids


@dataclass
class Sample:
    wall: float
    rc: int
    parent_rss: int
    tree_rss: int
    tree_anon: int
    largest: int
    processes: int


class Sampler(threading.Thread):
    """The peak total RSS of a process tree, sampled every SAMPLE_S."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.stop = pid, threading.Event()
        self.rss = self.anon = self.largest = 0
        self.seen: set[int] = set()

    def run(self) -> None:
        while True:
            rss = anon = 0
            for p in _tree(self.pid):
                s = _status(p)
                if s:
                    self.seen.add(p)
                rss += s.get("VmRSS", 0)
                anon += s.get("RssAnon", 0)
                self.largest = max(self.largest, s.get("VmHWM", 0))
            self.rss, self.anon = max(self.rss, rss), max(self.anon, anon)
            if self.stop.wait(SAMPLE_S):
                return


@dataclass
class Cmd:
    label: str
    argv: list[str]
    samples: list[Sample] = field(default_factory=list)

    def median(self, key: str) -> float:
        return statistics.median(getattr(s, key) for s in self.samples)


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def run_once(cmd: Cmd, scratch: Path, cold: bool) -> Sample:
    if cold:
        drop_caches()
    with open(scratch / f"{cmd.label}.out", "wb") as out, open(scratch / f"{cmd.label}.err", "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=ROOT)
        sampler = Sampler(proc.pid)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        sampler.stop.set()
        sampler.join()
    proc.returncode = rc = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    parent = usage.ru_maxrss * 1024
    return Sample(wall, rc, parent, max(sampler.rss, parent), sampler.anon, max(sampler.largest, parent),
                  len(sampler.seen))


def verify_available() -> bool:
    r = subprocess.run([sys.executable, *VERIFY, "--help"], cwd=ROOT,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return r.returncode == 0


def verdict(path: Path) -> str:
    """The report's `result` object (as the audit's JSON has it), else its line naming a verdict."""
    text = path.read_text(errors="replace")
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("result"), dict):
        return json.dumps(doc["result"])[:300]
    if isinstance(doc, dict) and "verdict" in doc:
        return json.dumps({"verdict": doc["verdict"]})[:300]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    named = [ln for ln in lines if '"verdict"' in ln]
    tail = named[-1] if named else lines[-1] if lines else "(no output)"
    return tail[:300] + ("" if doc is not None else "  [not JSON]")


def mb(n: float) -> str:
    return f"{n / MB:,.0f} MB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=3.0, help="checkpoint size to generate (10^9 bytes)")
    ap.add_argument("--shard-mb", type=int, default=400, help="about this many MB per shard")
    ap.add_argument("--dir", type=Path, help="use DIR if it holds a config.json, else generate into it; kept")
    ap.add_argument("--keep", action="store_true", help="keep the generated temp checkpoint")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="drop the page cache before each run (root)")
    ap.add_argument("--generate-into", type=Path, help=argparse.SUPPRESS)  # the generator's child process
    args = ap.parse_args()
    if args.generate_into is not None:
        print(*generate(args.generate_into, int(args.size_gb * GB), args.shard_mb * MB))
        return

    if args.cold and not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        print("--cold: /proc/sys/vm/drop_caches is not writable; running warm")
        args.cold = False
    scratch = Path(tempfile.mkdtemp(prefix="kimi-verify-bench-"))
    ckpt = args.dir if args.dir is not None else Path(tempfile.mkdtemp(prefix="kimi-verify-ckpt-"))
    try:
        if (ckpt / "config.json").exists():
            cfg = json.loads((ckpt / "config.json").read_text())
            print(f"checkpoint: {ckpt} (existing; {cfg.get('num_hidden_layers')} layers, "
                  f"{cfg.get('n_routed_experts')} routed experts)")
        else:
            # In a child process: on Linux a process's ru_maxrss starts at its starter's peak, so this one
            # must stay small for the measured commands' figures to be theirs.
            t0 = time.perf_counter()
            gen = subprocess.run([sys.executable, __file__, "--generate-into", str(ckpt), "--size-gb",
                                  str(args.size_gb), "--shard-mb", str(args.shard_mb)],
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True)
            if gen.returncode:
                sys.exit(f"generation failed:\n{gen.stderr}")
            layers, experts = map(int, gen.stdout.split())
            print(f"checkpoint: {ckpt} generated in {time.perf_counter() - t0:.1f} s "
                  f"({layers} layers, first dense; {experts} routed experts; vocab {VOCAB})")
        files = sorted(ckpt.glob("*.safetensors"))
        nbytes = sum(f.stat().st_size for f in files)
        print(f"  {len(files)} shards, {nbytes:,} bytes ({nbytes / GB:.2f} GB) of .safetensors")
        audit = subprocess.run([sys.executable, "-m", "kimi_audit", "audit", str(ckpt), "--json"], cwd=ROOT,
                               stdin=subprocess.DEVNULL, capture_output=True)
        print(f"  `kimi-audit audit --json`: exit {audit.returncode}"
              + ("" if audit.returncode == 0 else f"  {audit.stderr.decode(errors='replace')[-300:]}"))

        sha_script = scratch / "sha256_files.py"
        sha_script.write_text(SHA256_SCRIPT)
        cmds = [Cmd("sha256", [sys.executable, str(sha_script), str(ckpt)])]
        have_verify = verify_available()
        if have_verify:
            cmds.insert(0, Cmd("verify", [sys.executable, *VERIFY, str(ckpt), "--json"]))
        else:
            print("verify: not available yet (`python -m kimi_audit verify --help` fails); sha256 script only")

        with open("/proc/meminfo") as f:
            avail = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))
        cache = ("page cache dropped before every run (--cold)" if args.cold else
                 "warm page cache: one untimed warm-up run of each, then alternating runs")
        print(f"  {cache}; MemAvailable {avail / GB:.1f} GB; {os.cpu_count()} CPUs; "
              f"load average {os.getloadavg()[0]:.2f} before")
        for c in cmds:
            run_once(c, scratch, args.cold)
        for _ in range(args.repeats):
            for c in cmds:
                c.samples.append(run_once(c, scratch, args.cold))
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(f"  load average {os.getloadavg()[0]:.2f} after; medians of {args.repeats} runs (MB = 10^6 bytes); "
              f"this process's peak RSS {mb(own)} (a child's ru_maxrss starts at it)")
        print()
        print(f"{'':8} {'wall':>8} {'bytes/s':>11} {'parent RSS':>11} {'tree RSS':>10} {'tree anon':>10} "
              f"{'largest':>9} {'procs':>6}  exit codes")
        for c in cmds:
            wall = c.median("wall")
            print(f"{c.label:8} {wall:7.2f}s {nbytes / wall / MB:7,.0f} MB/s {mb(c.median('parent_rss')):>11} "
                  f"{mb(c.median('tree_rss')):>10} {mb(c.median('tree_anon')):>10} {mb(c.median('largest')):>9} "
                  f"{max(s.processes for s in c.samples):>6}  {[s.rc for s in c.samples]}")
        print()
        sha = cmds[-1]
        if sha.samples and any(s.rc for s in sha.samples):
            print(f"sha256 script exited non-zero: {(scratch / 'sha256.err').read_text()[-500:]}")
        if not have_verify:
            print("verify: not available yet")
            return
        ver = cmds[0]
        ratio = ver.median("wall") / sha.median("wall")
        peak = max(s.tree_rss for s in ver.samples)
        print(f"verify / sha256 wall: {ratio:.2f}x (target <= {WALL_TARGET}x): "
              f"{'PASS' if ratio <= WALL_TARGET else 'MISS'}")
        print(f"verify peak RSS, whole tree, worst run: {mb(peak)} (target <= {RSS_TARGET_MB} MB): "
              f"{'PASS' if peak <= RSS_TARGET_MB * MB else 'MISS'}")
        rcs = [s.rc for s in ver.samples]
        print(f"verify exit codes: {rcs} ({'all 0, as expected' if not any(rcs) else 'expected 0'})")
        print(f"verify verdict: {verdict(scratch / 'verify.out')}")
        if any(rcs):
            print(f"verify stderr: {(scratch / 'verify.err').read_text(errors='replace')[-500:]}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if args.dir is None and not args.keep:
            shutil.rmtree(ckpt, ignore_errors=True)
        elif args.dir is None:
            print(f"kept: {ckpt} (reuse with --dir)")


if __name__ == "__main__":
    main()
