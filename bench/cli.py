"""Benchmark: the kimi-audit CLI against its peers, as whole processes, in one run.

    python bench/cli.py [--replica DIR] [--repeats 5] [--latency-ms 20]
                        [--only local|version|remote|family|formats|scale|gguf|flood|verify]
                        [--verify-gb 3] [--json]

Every command is a fresh process started with this Python (`sys.executable`); kimi-audit runs as
`python -m kimi_audit ...` (not the console-script wrapper), each peer as a small script written to a
temp dir. The commands of a group run alternately, A B C A B C ..., after one untimed warm-up run of
each (page cache, bytecode, the hub's hashes of its small files); the medians are shown.
  wall: time.perf_counter() around Popen .. os.wait4, start-up and interpreter exit included;
  CPU: user + system time of that process (all its threads), from os.wait4;
  peak RSS: ru_maxrss of that one process, from os.wait4 (MB = 10^6 bytes).
stdout and stderr go to files (nothing to drain, no pipe to fill); a run that exits non-zero is shown.
Every command runs from compiled bytecode, as an installed package does: PYTHONDONTWRITEBYTECODE is dropped and
PYTHONPYCACHEPREFIX points into the temp dir, so the warm-up run writes each module's .pyc there (this checkout's
__pycache__ is left alone). Without it, in a checkout edited while measured (and with PYTHONDONTWRITEBYTECODE set),
every changed module was compiled from source in every timed run: +40-80 ms of a GGUF audit, none of the peers'.

local (the full-scale replica, 61 shards; built in a temp dir unless --replica names one):
  `kimi-audit audit REPLICA --json` against
    the safe_open script: safetensors' safe_open on every shard, each tensor's dtype and shape;
    the hf script: huggingface_hub.get_local_safetensors_metadata(REPLICA);
    the json.loads script: 8 bytes, N bytes and json.loads of each of the 61 headers, kept.
  Targets: audit <= 1.2x the safe_open script's wall and >= 3x faster than the hf script's;
  the audit's peak RSS <= 100 MB.
version: `kimi-audit --version` against `python -c "import typer"`. Target: <= 1.5x.
remote: `kimi-audit audit moonshotai/Kimi-K2-Instruct --json` (the pinned revision) against a 3-line
  huggingface_hub.get_safetensors_metadata script, both on the loopback FakeHub (tests/hub_server.py,
  in its own process so that it takes no CPU from the client) serving the replica with --latency-ms
  per request, each run with an empty HF_HOME; once idle and once with a CPU-bound process
  (`while True: pass`) running beside. The hub counts requests and body bytes of each run; "needed"
  is config.json + index + every shard's 8 + N header bytes.
  Targets, idle and loaded: audit <= 0.5x the hf script's wall; the audit's requests and bytes as
  today: <= 64 requests, <= 1.02x needed (the worst run of each counts).
family: `kimi-audit audit THINKING --json` and `kimi-audit audit K2.6 --json` against `kimi-audit audit
  INSTRUCT --json`, all full-scale replicas (Kimi-K2-Thinking's 62 INT4 shards, 208,276 tensors, and
  Kimi-K2.6's 64 (kimi_k25: vision tower and projector beside the INT4 text model), 208,550 tensors, built in
  a temp dir; Kimi-K2-Instruct's as for local). Targets: Thinking's wall and K2.6's <= 1.6x Instruct's. And
  `kimi-audit audit V4FLASH --json`, the DeepSeek-V4-Flash replica (46 BF16 shards, 35,020 tensors, built in a
  temp dir). Target: <= 1.0x Instruct's. And the Thinking replica as compressed-tensors' own compressor
  (llmcompressor) writes it: every INT4 weight_shape I64, 69,120 of them (build_thinking_i64). Target: <= 1.5x
  Instruct's (its tensor ratio, 1.49).
formats: `kimi-audit audit REPLICA --json` for the replicas of Kimi-K2-Instruct as mlx-lm converts it (MLX affine
  4-bit, 180 shards, its experts stacked), as NVIDIA ModelOpt exports it (NVFP4 with the FP8 KV cache, 61 shards) and
  as AMD Quark exports it (MXFP4 with FP8 attention), each against `kimi-audit audit INSTRUCT --json`.
  Target: each <= 1.2x Instruct's per tensor stored (MLX, its experts stacked: its whole wall).
scale: `kimi-audit audit K3 --json` against the safe_open script on the Kimi K3 replica (`demo --model kimi-k3`:
  its text model, 497,052 tensors with MXFP4 experts, 96 shards, a 60 MB index).
  Targets: audit wall <= 1.1x the safe_open script's, peak RSS <= 1.3x its.
gguf: `kimi-audit audit GGUF --json` on the Kimi-K2 GGUF replica (`demo --model kimi-k2-instruct-gguf`: 8 sparse
  parts, 1,096 tensors, part 1 with a 163,840-token tokenizer and as many merges) against the fastest header read:
  a struct script that walks every part's key-values and tensor infos, keeping the tensors' types, dims and
  offsets; and gguf-py's GGUFReader on every part, for scale. Target: audit wall <= 1.5x the struct script's.
  Then the same audit over the loopback FakeHub (no latency): part 1's requests and bytes (the hub counts them
  per path) against its header. Targets: <= 3 requests, <= 1.3x the header's bytes.
flood: the tiny checkpoint with one more shard of 200,000 one-value F32 tensors the config does not account for
  (a hostile or broken upload: one cause, 200,000 names): `audit --values --json` against `audit --json` on it.
  Target: the values pass (each tensor read and checked) <= 2x the header audit's wall. (Planning the reads
  copied each coalesced read's member list per member: 90 s for this input.)
verify: `kimi-audit verify CKPT --json` against bench/verify.py's parallel sha256 script (imported from it, not
  copied: ProcessPoolExecutor(os.cpu_count()) over the shards, 16 MiB reads through hashlib.sha256) on a real
  (not sparse) FP8 checkpoint of --verify-gb GB written by bench/verify.py's generator in a child process, from
  the page cache (one untimed warm-up run of each). CPU is that of the process and the workers it reaped.
  Target: verify wall <= 1.25x the sha256 script's.
Replicas are built by a child process of this script (--build), so that its own peak RSS stays below the
commands' (Linux starts a child's ru_maxrss at its starter's peak).
It is a benchmark, not a test: nothing is asserted; each target is shown PASS or MISS.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPO = "moonshotai/Kimi-K2-Instruct"
MB = 1_000_000

SAFE_OPEN_SCRIPT = """\
import sys
from pathlib import Path

from safetensors import safe_open

tensors = {}
for shard in sorted(Path(sys.argv[1]).glob("*.safetensors")):
    with safe_open(shard, framework="numpy") as f:
        for name in f.keys():
            s = f.get_slice(name)
            tensors[name] = (s.get_dtype(), s.get_shape())
print(len(tensors))
"""

HF_LOCAL_SCRIPT = """\
import sys

from huggingface_hub import get_local_safetensors_metadata

m = get_local_safetensors_metadata(sys.argv[1])
print(sum(len(f.tensors) for f in m.files_metadata.values()))
"""

JSON_SCRIPT = """\
import json
import sys
from pathlib import Path

headers = []
for shard in sorted(Path(sys.argv[1]).glob("*.safetensors")):
    with open(shard, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        headers.append(json.loads(f.read(n)))
print(sum(len(h) - ("__metadata__" in h) for h in headers))
"""

GGUF_STRUCT_SCRIPT = """\
import struct
import sys
from pathlib import Path

SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
tensors = {}
for part in sorted(Path(sys.argv[1]).rglob("*.gguf")):
    with open(part, "rb") as f:
        buf = f.read(1 << 20)
        pos = 4 + 4
        n_tensors, n_kv = struct.unpack_from("<QQ", buf, pos)
        pos += 16

        def need(n):
            global buf
            if pos + n > len(buf):
                buf += f.read(max(n, len(buf)))

        def string():
            global pos
            need(8)
            (n,) = struct.unpack_from("<Q", buf, pos)
            need(8 + n)
            s = buf[pos + 8:pos + 8 + n]
            pos += 8 + n
            return s

        for _ in range(n_kv):
            string()
            need(4)
            (t,) = struct.unpack_from("<I", buf, pos)
            pos += 4
            if t == 8:
                string()
            elif t == 9:
                need(12)
                item, count = struct.unpack_from("<IQ", buf, pos)
                pos += 12
                if item == 8:
                    for _ in range(count):
                        string()
                else:
                    need(count * SCALAR[item])
                    pos += count * SCALAR[item]
            else:
                pos += SCALAR[t]
        for _ in range(n_tensors):
            name = string()
            need(4)
            (nd,) = struct.unpack_from("<I", buf, pos)
            need(4 + 8 * nd + 12)
            dims = struct.unpack_from(f"<{nd}Q", buf, pos + 4)
            t, off = struct.unpack_from("<IQ", buf, pos + 4 + 8 * nd)
            pos += 4 + 8 * nd + 12
            tensors[name] = (t, dims, off)
print(len(tensors))
"""

GGUF_PY_SCRIPT = """\
import sys
from pathlib import Path

from gguf import GGUFReader

tensors = {}
for part in sorted(Path(sys.argv[1]).rglob("*.gguf")):
    for t in GGUFReader(part).tensors:
        tensors[t.name] = (t.tensor_type, tuple(t.shape))
print(len(tensors))
"""

HF_REMOTE_SCRIPT = """\
import sys
from huggingface_hub import get_safetensors_metadata
m = get_safetensors_metadata(sys.argv[1], revision=sys.argv[2])
print(sum(len(f.tensors) for f in m.files_metadata.values()))
"""


# --- running a process ------------------------------------------------------------------------
@dataclass
class Cmd:
    label: str
    argv: list[str]
    env: dict[str, str] | None = None
    before: Callable[[], None] | None = None  # untimed, before each run
    after: Callable[[], dict[str, int]] | None = None  # untimed, after each run: extra counters
    exit_code: int = 0  # what the command must exit with (the flood's audits FAIL: 1)
    walls: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)  # bytes
    cpu: list[float] = field(default_factory=list)  # user + system s, every thread of the process
    extra: list[dict[str, int]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    prints: str = ""

    def median_wall(self) -> float:
        return statistics.median(self.walls)

    def median_rss(self) -> float:
        return statistics.median(self.rss)

    def median_cpu(self) -> float:
        return statistics.median(self.cpu)

    def extras(self, key: str) -> list[int]:
        return [e[key] for e in self.extra]


def run_once(cmd: Cmd, scratch: Path) -> tuple[float, int, float]:
    """(wall s, peak RSS bytes, CPU s) of one run of `cmd` as a whole process."""
    out_path, err_path = scratch / "stdout", scratch / "stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=cmd.env, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = rc = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    text = out_path.read_bytes()
    cmd.prints = text.decode(errors="replace").strip() if len(text) <= 40 else f"{len(text):,} bytes"
    if rc != cmd.exit_code:
        tail = err_path.read_text(errors="replace").strip().splitlines()[-1:] or ["(no stderr)"]
        cmd.failures.append(f"exit {rc}: {tail[0][:200]}")
    return wall, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime  # ru_maxrss: KiB on Linux


def alternate(cmds: list[Cmd], repeats: int, scratch: Path) -> None:
    """One untimed warm-up run of each, then `repeats` rounds of A B C ...; results kept on each Cmd."""
    for rnd in range(repeats + 1):
        for cmd in cmds:
            if cmd.before is not None:
                cmd.before()
            wall, rss, cpu = run_once(cmd, scratch)
            extra = cmd.after() if cmd.after is not None else {}
            if rnd == 0:
                continue
            cmd.walls.append(wall)
            cmd.rss.append(rss)
            cmd.cpu.append(cpu)
            cmd.extra.append(extra)


# --- the loopback hub in its own process ------------------------------------------------------
def _serve(conn, replica: str, commit: str, latency_s: float) -> None:  # runs in the child process
    sys.path.insert(0, str(ROOT / "tests"))
    from hub_server import FakeHub

    with FakeHub() as hub:
        hub.add_repo(REPO, replica, commit=commit)
        hub.latency_s = latency_s
        conn.send(hub.endpoint)
        while True:
            cmd = conn.recv()
            if cmd == "reset":
                hub.reset_stats()
                conn.send(None)
            elif cmd == "stats":
                s = hub.stats()
                conn.send((s.requests, s.bytes_sent, s.per_path))
            else:
                break


class RemoteHub:
    def __init__(self, replica: Path, commit: str, latency_s: float) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, str(replica), commit, latency_s), daemon=True)
        self._proc.start()
        if not self._conn.poll(60):
            raise RuntimeError("hub process did not start")
        self.endpoint: str = self._conn.recv()

    def reset(self) -> None:
        self._conn.send("reset")
        self._conn.recv()

    def stats(self, needle: str = "") -> dict[str, int]:
        """Requests and body bytes since the last reset; with `needle`, also those of the paths containing it."""
        self._conn.send("stats")
        requests, nbytes, per_path = self._conn.recv()
        out = {"requests": requests, "bytes": nbytes}
        if needle:
            out["part_requests"] = sum(n for path, (n, _) in per_path.items() if needle in path)
            out["part_bytes"] = sum(b for path, (_, b) in per_path.items() if needle in path)
        return out

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self._conn.send("stop")
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)


def needed_bytes(directory: Path) -> int:
    """config.json + index + every shard's 8 + N header bytes: what a header-only audit must read."""
    total = (directory / "config.json").stat().st_size + (directory / "model.safetensors.index.json").stat().st_size
    for shard in directory.glob("*.safetensors"):
        with open(shard, "rb") as f:
            total += 8 + struct.unpack("<Q", f.read(8))[0]
    return total


# --- reporting --------------------------------------------------------------------------------
@dataclass
class Target:
    text: str
    value: str
    ok: bool


def _row(cmd: Cmd, extra_cols: list[tuple[str, Callable[[Cmd], str]]]) -> str:
    cols = "".join(f"{fn(cmd):>16s}" for _, fn in extra_cols)
    runs = " ".join(f"{w * 1000:.0f}" for w in cmd.walls)
    wall, cpu, rss = cmd.median_wall() * 1000, cmd.median_cpu() * 1000, cmd.median_rss() / MB
    return f"  {cmd.label:34s}{wall:10.0f}{cpu:10.0f}{rss:10.1f}{cols}  {cmd.prints:>16s}  [{runs}]"


def table(title: str, cmds: list[Cmd], targets: list[Target],
          extra_cols: list[tuple[str, Callable[[Cmd], str]]] = ()) -> list[str]:
    lines = [title]
    heads = "".join(f"{h:>16s}" for h, _ in extra_cols)
    lines.append(f"  {'':34s}{'wall ms':>10s}{'CPU ms':>10s}{'RSS MB':>10s}{heads}  {'prints':>16s}"
                 "  [each run's wall ms]")
    lines += [_row(c, list(extra_cols)) for c in cmds]
    for c in cmds:
        for f in dict.fromkeys(c.failures):
            lines.append(f"  !! {c.label}: {f}")
    lines += [f"  {'PASS' if t.ok else 'MISS'}  {t.text}: {t.value}" for t in targets]
    return lines


def _json_group(cmds: list[Cmd], targets: list[Target]) -> dict[str, object]:
    return {
        "commands": {
            c.label: {
                "argv": c.argv[1:], "wall_s": c.walls, "median_wall_s": c.median_wall(), "cpu_s": c.cpu,
                "median_cpu_s": c.median_cpu(), "peak_rss_bytes": c.rss,
                "median_peak_rss_bytes": c.median_rss(), "counters": c.extra, "failures": c.failures,
            }
            for c in cmds
        },
        "targets": [{"target": t.text, "value": t.value, "pass": t.ok} for t in targets],
    }


# --- the groups -------------------------------------------------------------------------------
PYCACHE: Path | None = None
"""Where every command's bytecode is cached (PYTHONPYCACHEPREFIX, in the temp dir): set by main()."""


def base_env() -> dict[str, str]:
    env = dict(os.environ)
    for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "PYTHONDONTWRITEBYTECODE"):
        env.pop(k, None)
    env.update(HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
    if PYCACHE is not None:
        env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return env


def script(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text)
    return str(path)


def bench_local(replica: Path, repeats: int, tmp: Path) -> tuple[list[str], dict[str, object]]:
    env = base_env()
    py = sys.executable
    kimi = Cmd("kimi-audit audit --json", [py, "-m", "kimi_audit", "audit", str(replica), "--json"], env)
    safe = Cmd("safe_open script", [py, script(tmp, "safe_open_meta.py", SAFE_OPEN_SCRIPT), str(replica)], env)
    hf = Cmd("hf get_local_safetensors_metadata",
             [py, script(tmp, "hf_local_meta.py", HF_LOCAL_SCRIPT), str(replica)], env)
    js = Cmd("json.loads script", [py, script(tmp, "json_headers.py", JSON_SCRIPT), str(replica)], env)
    cmds = [kimi, safe, hf, js]
    alternate(cmds, repeats, tmp)
    k = kimi.median_wall()
    targets = [
        Target("audit wall <= 1.2x the safe_open script's", f"{k / safe.median_wall():.2f}x",
               k <= 1.2 * safe.median_wall()),
        Target("audit >= 3x faster than the hf script", f"{hf.median_wall() / k:.2f}x", hf.median_wall() >= 3 * k),
        Target("audit peak RSS <= 100 MB", f"{kimi.median_rss() / MB:.1f} MB (max {max(kimi.rss) / MB:.1f})",
               kimi.median_rss() <= 100 * MB),
    ]
    lines = table(f"local, full-scale replica {replica}: medians of {repeats} alternating runs", cmds, targets)
    lines.append(f"  ratios kimi-audit / peer, wall: safe_open {k / safe.median_wall():.2f}x, "
                 f"hf {k / hf.median_wall():.2f}x, json.loads {k / js.median_wall():.2f}x; "
                 f"RSS: safe_open {kimi.median_rss() / safe.median_rss():.2f}x, "
                 f"hf {kimi.median_rss() / hf.median_rss():.2f}x, "
                 f"json.loads {kimi.median_rss() / js.median_rss():.2f}x")
    return lines, _json_group(cmds, targets)


def bench_version(repeats: int, tmp: Path) -> tuple[list[str], dict[str, object]]:
    env = base_env()
    kimi = Cmd("kimi-audit --version", [sys.executable, "-m", "kimi_audit", "--version"], env)
    typer = Cmd('python -c "import typer"', [sys.executable, "-c", "import typer"], env)
    cmds = [kimi, typer]
    alternate(cmds, repeats, tmp)
    r = kimi.median_wall() / typer.median_wall()
    targets = [Target('--version wall <= 1.5x python -c "import typer"', f"{r:.2f}x", r <= 1.5)]
    return table(f"version: medians of {repeats} alternating runs", cmds, targets), _json_group(cmds, targets)


def bench_remote(replica: Path, repeats: int, latency_ms: float, tmp: Path) -> tuple[list[str], dict[str, object]]:
    from kimi_audit.constants import PINNED_REVISION

    need = needed_bytes(replica)
    hf_home = tmp / "hf_home"
    lines: list[str] = []
    out: dict[str, object] = {"needed_bytes": need}
    hub = RemoteHub(replica, PINNED_REVISION, latency_ms / 1000)
    try:
        env = base_env()
        env.update(HF_ENDPOINT=hub.endpoint, HF_HOME=str(hf_home), NO_PROXY="127.0.0.1,localhost",
                   no_proxy="127.0.0.1,localhost")

        def fresh() -> None:  # an empty HF cache for every run, and the hub's counters at 0
            shutil.rmtree(hf_home, ignore_errors=True)
            hf_home.mkdir()
            hub.reset()

        hf_script = script(tmp, "hf_remote_meta.py", HF_REMOTE_SCRIPT)
        cols = [
            ("requests", lambda c: f"{statistics.median(c.extras('requests')):.0f}"),
            ("bytes", lambda c: f"{statistics.median(c.extras('bytes')):,.0f}"),
            ("bytes/needed", lambda c: f"{statistics.median(c.extras('bytes')) / need:.4f}"),
        ]
        for load in ("idle", "loaded"):
            kimi = Cmd("kimi-audit audit REPO --json", [sys.executable, "-m", "kimi_audit", "audit", REPO, "--json"],
                       env, fresh, hub.stats)
            hf = Cmd("hf get_safetensors_metadata", [sys.executable, hf_script, REPO, PINNED_REVISION],
                     env, fresh, hub.stats)
            cmds = [kimi, hf]
            burner = None
            if load == "loaded":
                burner = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
            try:
                alternate(cmds, repeats, tmp)
            finally:
                if burner is not None:
                    burner.kill()
                    burner.wait()
            r = kimi.median_wall() / hf.median_wall()
            req, nb = max(kimi.extras("requests")), max(kimi.extras("bytes"))
            targets = [
                Target("audit wall <= 0.5x the hf script's", f"{r:.2f}x", r <= 0.5),
                Target("audit requests <= 64 (worst run)", f"{req}", req <= 64),
                Target("audit bytes <= 1.02x needed (worst run)", f"{nb:,} = {nb / need:.4f}x", nb <= 1.02 * need),
            ]
            what = "idle" if load == "idle" else "loaded: a CPU-bound process running beside"
            lines += table(f"remote, loopback FakeHub at {latency_ms:g} ms per request, {what}: medians of {repeats} "
                           f"alternating runs; needed {need:,} bytes", cmds, targets, cols)
            k_req, h_req = (statistics.median(c.extras("requests")) for c in cmds)
            k_b, h_b = (statistics.median(c.extras("bytes")) for c in cmds)
            lines.append(f"  ratios kimi-audit / hf: wall {r:.2f}x, RSS {kimi.median_rss() / hf.median_rss():.2f}x, "
                         f"requests {k_req / h_req:.2f}x, bytes {k_b / h_b:.2f}x")
            out[load] = _json_group(cmds, targets)
            if load == "idle":
                lines.append("")
    finally:
        hub.close()
    return lines, out


def ratios(what: str, a: Cmd, b: Cmd) -> str:
    """The line of `a`'s medians over `b`'s: wall, CPU and RSS."""
    return (f"  ratios {what}: wall {a.median_wall() / b.median_wall():.2f}x, "
            f"CPU {a.median_cpu() / b.median_cpu():.2f}x, RSS {a.median_rss() / b.median_rss():.2f}x")


def build_thinking_i64(directory: Path) -> Path:
    """The Kimi-K2-Thinking replica as compressed-tensors' own compressor (llmcompressor) writes it: every INT4
    `weight_shape` I64 (torch.tensor(weight.shape)) where Moonshot's release stores I32; nothing else changed."""
    import dataclasses

    from kimi_audit.constants import CONFIG_FILE
    from kimi_audit.replica.build import replica_model, replica_shards, write_index, write_shard
    from kimi_audit.replica.files import new_file

    model = "kimi-k2-thinking"
    directory.mkdir(parents=True, exist_ok=True)
    with new_file(directory / CONFIG_FILE) as f:
        f.write(replica_model(model).config_bytes())
    weight_map: dict[str, str] = {}
    total = 0
    for seed, (shard, tensors) in enumerate(replica_shards(model=model).items()):
        tensors = [dataclasses.replace(t, dtype="I64") if t.name.endswith(".weight_shape") else t for t in tensors]
        total += write_shard(directory / shard, tensors, seed=seed)
        weight_map.update((t.name, shard) for t in tensors)
    write_index(directory, weight_map, total)
    return directory.resolve()


THINKING_I64 = "kimi-k2-thinking-i64"
"""build_replica's name for build_thinking_i64."""
FLOOD = "flood"
"""build_replica's name for build_flood."""


def build_replica(directory: Path, model: str = "kimi-k2-instruct") -> Path:
    """The replica of `model` written by a child process (`--build`): this process stays small, so that the
    ru_maxrss of the commands it starts (which Linux starts at their starter's peak) is their own."""
    subprocess.run([sys.executable, __file__, "--build", model, str(directory)], check=True, cwd=ROOT,
                   stdin=subprocess.DEVNULL)
    return directory.resolve()


def _build(model: str, directory: Path) -> None:  # the child of build_replica
    if model == FLOOD:
        build_flood(directory)
        return
    if model == THINKING_I64:
        build_thinking_i64(directory)
        return
    from kimi_audit.replica.build import build_replica as build

    build(directory, model=model)


def tensors_of(directory: Path) -> int:
    """The tensors a replica's index lists, counted by a child process: parsing a 10-60 MB index here raised this
    process's peak RSS past the commands', and every command started afterwards inherits it as its ru_maxrss (the
    gguf and verify rows showed this process's 122.6 MB for every command)."""
    counted = subprocess.run([sys.executable, "-c", "import json, sys; print(len(json.load(open(sys.argv[1]))"
                              "['weight_map']))", str(directory / "model.safetensors.index.json")],
                             check=True, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return int(counted.stdout)


def bench_family(replica: Path, repeats: int, tmp: Path) -> tuple[list[str], dict[str, object]]:
    t0 = time.perf_counter()
    thinking = build_replica(tmp / "thinking", model="kimi-k2-thinking").resolve()
    thinking64 = build_replica(tmp / "thinking-i64", model=THINKING_I64)
    v4 = build_replica(tmp / "v4-flash", model="deepseek-v4-flash").resolve()
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    k26 = build_replica(tmp / "k26", model="kimi-k2.6").resolve()
    built_k26 = time.perf_counter() - t0
    env = base_env()
    py = sys.executable
    think = Cmd("audit Kimi-K2-Thinking --json", [py, "-m", "kimi_audit", "audit", str(thinking), "--json"], env)
    think64 = Cmd("audit Thinking, I64 weight_shape", [py, "-m", "kimi_audit", "audit", str(thinking64), "--json"],
                  env)
    k26_cmd = Cmd("audit Kimi-K2.6 --json", [py, "-m", "kimi_audit", "audit", str(k26), "--json"], env)
    inst = Cmd("audit Kimi-K2-Instruct --json", [py, "-m", "kimi_audit", "audit", str(replica), "--json"], env)
    flash = Cmd("audit DeepSeek-V4-Flash --json", [py, "-m", "kimi_audit", "audit", str(v4), "--json"], env)
    cmds = [think64, think, k26_cmd, inst, flash]
    alternate(cmds, repeats, tmp)
    r = think.median_wall() / inst.median_wall()
    r64 = think64.median_wall() / inst.median_wall()
    per = tensors_of(thinking64) / tensors_of(replica)
    r26 = k26_cmd.median_wall() / inst.median_wall()
    r4 = flash.median_wall() / inst.median_wall()
    targets = [Target(f"Thinking with I64 weight_shapes (llmcompressor's) wall <= 1.5x Instruct's (tensor ratio "
                      f"{per:.2f})", f"{r64:.2f}x", r64 <= 1.5),
               Target("Thinking (208,276 tensors) wall <= 1.6x Instruct's (139,644)", f"{r:.2f}x", r <= 1.6),
               Target("Kimi-K2.6 (208,550 tensors, kimi_k25) wall <= 1.6x Instruct's", f"{r26:.2f}x", r26 <= 1.6),
               Target("DeepSeek-V4-Flash (35,020 tensors) wall <= 1.0x Instruct's", f"{r4:.2f}x", r4 <= 1.0)]
    lines = [f"built the Kimi-K2-Thinking and DeepSeek-V4-Flash replicas in {built:.0f} s: {thinking}, {v4}",
             f"built the Kimi-K2.6 replica in {built_k26:.0f} s: {k26}"]
    lines += table(f"family, full-scale replicas: medians of {repeats} alternating runs", cmds, targets)
    lines += [ratios("Thinking I64 / Instruct", think64, inst), ratios("Thinking / Instruct", think, inst),
              ratios("K2.6 / Instruct", k26_cmd, inst),
              ratios("V4-Flash / Instruct", flash, inst)]
    return lines, _json_group(cmds, targets)


FORMAT_REPLICAS = (("MLX 4-bit", "kimi-k2-instruct-mlx-4bit"), ("ModelOpt NVFP4", "kimi-k2-instruct-nvfp4"),
                   ("Quark MXFP4/FP8", "kimi-k2-instruct-mxfp4-attnfp8"))


def bench_formats(replica: Path, repeats: int, tmp: Path) -> tuple[list[str], dict[str, object]]:
    env = base_env()
    py = sys.executable
    lines: list[str] = []
    cmds: list[Cmd] = []
    for label, model in FORMAT_REPLICAS:
        t0 = time.perf_counter()
        built = build_replica(tmp / model, model=model).resolve()
        lines.append(f"built the {label} replica in {time.perf_counter() - t0:.0f} s: {built}")
        cmds.append(Cmd(f"audit Kimi-K2-Instruct {label} --json", [py, "-m", "kimi_audit", "audit", str(built),
                                                                      "--json"], env))
    inst = Cmd("audit Kimi-K2-Instruct --json", [py, "-m", "kimi_audit", "audit", str(replica), "--json"], env)
    cmds.append(inst)
    alternate(cmds, repeats, tmp)
    counts = [tensors_of(tmp / model) for _, model in FORMAT_REPLICAS]
    per_tensor = [c.median_wall() / inst.median_wall() / (n / tensors_of(replica)) for c, n in zip(cmds, counts)]
    # per tensor stored where a format stores more tensors than the original (NVFP4: four per Linear module);
    # MLX stacks its experts (2,558 tensors): its whole wall
    targets = [Target(f"{label} replica wall per tensor stored <= 1.2x the FP8 original's ({n:,} tensors)",
                      f"{c.median_wall() / inst.median_wall():.2f}x wall, {r:.2f}x per tensor", r <= 1.2)
               if n >= tensors_of(replica) * 0.9 else
               Target(f"{label} replica wall <= 1.2x the FP8 original's ({n:,} tensors)",
                      f"{c.median_wall() / inst.median_wall():.2f}x", c.median_wall() <= 1.2 * inst.median_wall())
               for (label, _), c, n, r in zip(FORMAT_REPLICAS, cmds, counts, per_tensor)]
    lines += table(f"formats, full-scale replicas: medians of {repeats} alternating runs", cmds, targets)
    lines += [ratios(f"{label} / FP8 Instruct", c, inst) for (label, _), c in zip(FORMAT_REPLICAS, cmds)]
    return lines, _json_group(cmds, targets)


def bench_gguf(repeats: int, tmp: Path) -> tuple[list[str], dict[str, object]]:
    t0 = time.perf_counter()
    replica = build_replica(tmp / "gguf", model="kimi-k2-instruct-gguf").resolve()
    built = time.perf_counter() - t0
    env = base_env()
    py = sys.executable
    kimi = Cmd("kimi-audit audit --json", [py, "-m", "kimi_audit", "audit", str(replica), "--json"], env)
    peer = Cmd("struct header script", [py, script(tmp, "gguf_struct.py", GGUF_STRUCT_SCRIPT), str(replica)], env)
    cmds = [kimi, peer]
    with contextlib.suppress(ImportError):
        import gguf  # noqa: F401  (llama.cpp's gguf-py: in the test extra)

        cmds.append(Cmd("gguf-py GGUFReader script", [py, script(tmp, "gguf_py.py", GGUF_PY_SCRIPT), str(replica)],
                        env))
    alternate(cmds, repeats, tmp)
    wall = kimi.median_wall() / peer.median_wall()
    remote, part1, header = gguf_remote(replica, repeats, tmp)
    req, nb = max(remote.extras("part_requests")), max(remote.extras("part_bytes"))
    targets = [Target("audit wall <= 1.5x the struct header script's", f"{wall:.2f}x", wall <= 1.5),
               Target("over the Hub, part 1 read in <= 3 requests (worst run)", f"{req}", req <= 3),
               Target(f"over the Hub, part 1's bytes <= 1.3x its {header:,}-byte header (worst run)",
                      f"{nb:,} = {nb / header:.2f}x", nb <= 1.3 * header)]
    lines = [f"built the Kimi-K2 GGUF replica (8 parts) in {built:.0f} s: {replica}"]
    lines += table(f"gguf, {repeats} alternating runs", cmds, targets)
    lines.append(f"  over the loopback Hub (no latency), {part1}: {req} requests, {nb:,} bytes; the whole audit "
                 f"{statistics.median(remote.extras('requests')):.0f} requests, "
                 f"{statistics.median(remote.extras('bytes')):,.0f} bytes, {remote.median_wall() * 1000:.0f} ms")
    lines.append("  ratios kimi-audit / peer, wall: " + ", ".join(
        f"{c.label} {kimi.median_wall() / c.median_wall():.2f}x" for c in cmds[1:]) + "; RSS: " + ", ".join(
        f"{c.label} {kimi.median_rss() / c.median_rss():.2f}x" for c in cmds[1:]))
    return lines, _json_group(cmds, targets)


def gguf_remote(replica: Path, repeats: int, tmp: Path) -> tuple[Cmd, str, int]:
    """`audit REPO --json` of the GGUF replica served by the loopback FakeHub: the requests and bytes of part 1,
    and its header's size (where its data section starts)."""
    from kimi_audit.constants import PINNED_REVISION

    first = sorted(replica.rglob("*.gguf"))[0]
    header = int(subprocess.run([sys.executable, "-c", "import sys; from kimi_audit.format.gguf import read_gguf_part; "
                                 "from kimi_audit.sources import LocalSource; print(read_gguf_part(LocalSource("
                                 "sys.argv[1]), sys.argv[2]).header.data_offset)", str(first.parent), first.name],
                                check=True, capture_output=True, text=True, cwd=ROOT).stdout)
    hub = RemoteHub(replica, PINNED_REVISION, 0.0)
    hf_home = tmp / "hf_home_gguf"
    try:
        env = base_env()
        env.update(HF_ENDPOINT=hub.endpoint, HF_HOME=str(hf_home), NO_PROXY="127.0.0.1,localhost",
                   no_proxy="127.0.0.1,localhost")

        def fresh() -> None:
            shutil.rmtree(hf_home, ignore_errors=True)
            hf_home.mkdir()
            hub.reset()

        cmd = Cmd("kimi-audit audit REPO --json (GGUF)", [sys.executable, "-m", "kimi_audit", "audit", REPO, "--json"],
                  env, fresh, lambda: hub.stats(first.name))
        alternate([cmd], repeats, tmp)
    finally:
        hub.close()
    return cmd, first.name, header


def bench_scale(repeats: int, tmp: Path) -> tuple[list[str], dict[str, object]]:
    name = "kimi-k3"
    t0 = time.perf_counter()
    replica = build_replica(tmp / "k3-scale", model=name).resolve()
    built = time.perf_counter() - t0
    index_mb = (replica / "model.safetensors.index.json").stat().st_size / MB
    env = base_env()
    py = sys.executable
    kimi = Cmd("kimi-audit audit --json", [py, "-m", "kimi_audit", "audit", str(replica), "--json"], env)
    safe = Cmd("safe_open script", [py, script(tmp, "safe_open_meta.py", SAFE_OPEN_SCRIPT), str(replica)], env)
    cmds = [kimi, safe]
    alternate(cmds, repeats, tmp)
    wall, rss = kimi.median_wall() / safe.median_wall(), kimi.median_rss() / safe.median_rss()
    targets = [Target("audit wall <= 1.1x the safe_open script's", f"{wall:.2f}x", wall <= 1.1),
               Target("audit peak RSS <= 1.3x the safe_open script's", f"{rss:.2f}x", rss <= 1.3)]
    lines = [f"built the Kimi K3 replica in {built:.0f} s: {replica} (index {index_mb:.0f} MB)"]
    lines += table(f"scale, {repeats} alternating runs", cmds, targets)
    lines.append(ratios("kimi-audit / safe_open", kimi, safe))
    return lines, _json_group(cmds, targets)


FLOOD_TENSORS = 200_000


def build_flood(directory: Path, n: int = FLOOD_TENSORS) -> Path:
    """The tiny checkpoint and a shard of `n` one-value F32 tensors no layout names, listed in its index."""
    import numpy as np

    from kimi_audit.replica.tiny import safetensors_bytes, tiny_shards, write_tiny

    d = write_tiny(directory, tiny_shards())
    extra = {f"model.layers.0.self_attn.extra_{i}": np.ones((1,), np.float32) for i in range(n)}
    (d / "model-extra.safetensors").write_bytes(safetensors_bytes(extra))
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"].update(dict.fromkeys(extra, "model-extra.safetensors"))
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return d.resolve()


def bench_flood(repeats: int, tmp: Path) -> tuple[list[str], dict[str, object]]:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--build", FLOOD, str(tmp / "flood")], check=True, cwd=ROOT,
                   stdin=subprocess.DEVNULL)
    ckpt = (tmp / "flood").resolve()
    built = time.perf_counter() - t0
    env = base_env()
    py = sys.executable
    header = Cmd("kimi-audit audit --json", [py, "-m", "kimi_audit", "audit", str(ckpt), "--json"], env,
                 exit_code=1)
    values = Cmd("kimi-audit audit --values --json", [py, "-m", "kimi_audit", "audit", str(ckpt), "--values",
                                                      "--json"], env, exit_code=1)
    cmds = [values, header]
    alternate(cmds, repeats, tmp)
    wall = values.median_wall() / header.median_wall()
    targets = [Target("audit --values wall <= 2x the header audit's", f"{wall:.2f}x", wall <= 2.0)]
    lines = [f"built the tiny checkpoint with {FLOOD_TENSORS:,} one-value tensors it does not account for in "
             f"{built:.0f} s: {ckpt}"]
    lines += table(f"flood, {repeats} alternating runs", cmds, targets)
    lines.append(ratios("--values / header audit", values, header))
    return lines, _json_group(cmds, targets)


def bench_verify(repeats: int, size_gb: float, tmp: Path) -> tuple[list[str], dict[str, object]]:
    """verify against bench/verify.py's sha256 script, on the checkpoint its generator writes."""
    import verify as verify_bench  # bench/verify.py: this script's own folder is sys.path[0]

    ckpt = tmp / "verify-ckpt"
    t0 = time.perf_counter()
    gen = subprocess.run([sys.executable, verify_bench.__file__, "--generate-into", str(ckpt), "--size-gb",
                          str(size_gb)], stdin=subprocess.DEVNULL, capture_output=True, text=True, cwd=ROOT)
    if gen.returncode:
        raise RuntimeError(f"bench/verify.py's generator failed: {gen.stderr[-500:]}")
    layers, experts = map(int, gen.stdout.split())
    built = time.perf_counter() - t0
    nbytes = sum(f.stat().st_size for f in ckpt.glob("*.safetensors"))
    env = base_env()
    py = sys.executable
    kimi = Cmd("kimi-audit verify --json", [py, "-m", "kimi_audit", "verify", str(ckpt), "--json"], env)
    sha = Cmd("parallel sha256 script", [py, script(tmp, "sha256_files.py", verify_bench.SHA256_SCRIPT), str(ckpt)],
              env)
    cmds = [kimi, sha]
    alternate(cmds, repeats, tmp)
    shutil.rmtree(ckpt, ignore_errors=True)
    wall = kimi.median_wall() / sha.median_wall()
    targets = [Target("verify wall <= 1.25x the parallel sha256 script's", f"{wall:.2f}x", wall <= 1.25)]
    lines = [f"generated the FP8 checkpoint ({layers} layers, {experts} routed experts, {nbytes / 1e9:.2f} GB of "
             f"shards) in {built:.0f} s with bench/verify.py; warm page cache"]
    lines += table(f"verify, {repeats} alternating runs", cmds, targets)
    lines.append(ratios("verify / sha256", kimi, sha) + f"; verify {nbytes / kimi.median_wall() / MB:,.0f} MB/s")
    return lines, _json_group(cmds, targets)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replica", type=Path, default=None, help="an existing replica directory (default: build one)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of each command (default 5)")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="the hub's latency per request (default 20)")
    ap.add_argument("--only", action="append",
                    choices=("local", "version", "remote", "family", "formats", "scale", "gguf", "flood", "verify"),
                    help="run only this part (repeatable; default: all)")
    ap.add_argument("--verify-gb", type=float, default=3.0, help="verify's generated checkpoint, GB (default 3)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    ap.add_argument("--build", nargs=2, metavar=("MODEL", "DIR"), help=argparse.SUPPRESS)  # build_replica's child
    args = ap.parse_args()
    if args.build:
        sys.path.insert(0, str(ROOT))
        _build(args.build[0], Path(args.build[1]))
        return 0
    parts = args.only or ["local", "version", "remote", "family", "formats", "scale", "gguf", "flood", "verify"]
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")

    sys.path.insert(0, str(ROOT))
    lines: list[str] = []
    results: dict[str, object] = {"python": sys.executable, "repeats": args.repeats}
    global PYCACHE
    with tempfile.TemporaryDirectory(prefix="kimi-audit-bench-cli-") as tmp_name:
        tmp = Path(tmp_name)
        PYCACHE = tmp / "pycache"
        replica = args.replica
        if replica is None and (set(parts) & {"local", "remote", "family", "formats"}):
            t0 = time.perf_counter()
            replica = build_replica(tmp / "replica")
            lines.append(f"built the replica in {time.perf_counter() - t0:.0f} s: {replica}")
        if replica is not None:
            replica = replica.resolve()
        lines.append(f"whole processes with {sys.executable}; wall = Popen .. os.wait4; CPU = user + system "
                     "and RSS = ru_maxrss of that process, from os.wait4")
        if "local" in parts:
            lines.append("")
            text, results["local"] = bench_local(replica, args.repeats, tmp)
            lines += text
        if "version" in parts:
            lines.append("")
            text, results["version"] = bench_version(args.repeats, tmp)
            lines += text
        if "remote" in parts:
            lines.append("")
            text, results["remote"] = bench_remote(replica, args.repeats, args.latency_ms, tmp)
            lines += text
        if "family" in parts:
            lines.append("")
            text, results["family"] = bench_family(replica, args.repeats, tmp)
            lines += text
        if "formats" in parts:
            lines.append("")
            text, results["formats"] = bench_formats(replica, args.repeats, tmp)
            lines += text
        if "scale" in parts:
            lines.append("")
            text, results["scale"] = bench_scale(args.repeats, tmp)
            lines += text
        if "gguf" in parts:
            lines.append("")
            text, results["gguf"] = bench_gguf(args.repeats, tmp)
            lines += text
        if "flood" in parts:
            lines.append("")
            text, results["flood"] = bench_flood(args.repeats, tmp)
            lines += text
        if "verify" in parts:
            lines.append("")
            text, results["verify"] = bench_verify(args.repeats, args.verify_gb, tmp)
            lines += text
    print(json.dumps(results, indent=2) if args.json else "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
