"""Benchmark: kimi-audit's remote header audit vs huggingface_hub's get_safetensors_metadata.

    python bench/audit_remote.py [--latency-ms 20] [--replica DIR]

Both run the real huggingface_hub client against the loopback FakeHub (tests/hub_server.py) serving
the full-scale Kimi-K2-Instruct replica, with an injected per-request latency. The hub runs in its
own process (so its work does not compete with the client's for the GIL) and counts requests and
body bytes. "needed" = config.json + index + every shard's 8 + N header bytes.

kimi-audit's figure is the whole audit (resolve, config, index, 61 headers, parse, every check), with its
header worker process (the default) and in one process (KIMI_AUDIT_HEADER_WORKER=0);
huggingface_hub's is metadata retrieval only. Target: fewer bytes and requests, <= half the wall time.
"the load" is load_checkpoint: fetch, strict parse, and each shard aligned with the layout as it is
parsed; "the checks after it" add the shards' alignments up (audit_checkpoint).
"client CPU" is the user + system time of the client's processes (every thread, and kimi-audit's header
worker process; the hub runs apart): a wall time close to it means the client was bound by its CPU.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing as mp
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="kimi-audit-bench-hf-")
os.environ.pop("HF_TOKEN", None)

REPO = "moonshotai/Kimi-K2-Instruct"


def _serve(conn, replica: str, commit: str, latency_s: float) -> None:  # runs in the child process
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
                conn.send((s.requests, s.bytes_sent))
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

    def stats(self) -> tuple[int, int]:
        self._conn.send("stats")
        return self._conn.recv()

    def close(self) -> None:
        try:
            self._conn.send("stop")
        except (BrokenPipeError, OSError):
            pass
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.terminate()


def _cpu_s() -> float:
    """This process's CPU time and that of its children once they have ended (kimi-audit's header
    worker; not the hub, which runs until the end)."""
    return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--replica", type=Path, default=None, help="an existing replica directory (default: build one)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each (best is shown; default 3)")
    args = ap.parse_args()

    from hub_fixtures import needed_bytes

    from kimi_audit.constants import PINNED_REVISION
    from kimi_audit.model.replica import build_replica

    tmp = None
    replica = args.replica
    if replica is None:
        tmp = tempfile.TemporaryDirectory(prefix="kimi-audit-bench-replica-")
        replica = build_replica(Path(tmp.name) / "kimi-k2")
    need = needed_bytes(replica)

    hub = RemoteHub(replica, PINNED_REVISION, args.latency_ms / 1000)
    try:
        from huggingface_hub import HfApi

        from kimi_audit.checks.audit import audit_checkpoint
        from kimi_audit.model.checkpoint import load_checkpoint
        from kimi_audit.model.header_worker import DISABLE_ENV
        from kimi_audit.sources.hub import HubSource

        def kimi_trial(worker: bool = True) -> tuple[float, float, int, int, int, int, float]:
            if worker:
                os.environ.pop(DISABLE_ENV, None)
            else:
                os.environ[DISABLE_ENV] = "0"
            gc.collect()
            hub.reset()
            c0 = _cpu_s()
            t0 = time.perf_counter()
            ckpt = load_checkpoint(HubSource(REPO, endpoint=hub.endpoint))
            t1 = time.perf_counter()
            report = audit_checkpoint(ckpt)
            t2 = time.perf_counter()
            cpu = _cpu_s() - c0
            req, nbytes = hub.stats()
            tensors = sum(h.tensor_count for h in ckpt.headers.values())
            return t2 - t0, t1 - t0, req, nbytes, tensors, report.errors, cpu

        def hf_trial() -> tuple[float, int, int, int, float]:
            # A fresh HF cache each time: the index must be downloaded, as kimi-audit downloads it.
            cache = Path(os.environ["HF_HOME"]) / "hub"
            shutil.rmtree(cache, ignore_errors=True)
            gc.collect()
            hub.reset()
            c0 = _cpu_s()
            t0 = time.perf_counter()
            meta = HfApi(endpoint=hub.endpoint).get_safetensors_metadata(REPO, revision=PINNED_REVISION)
            wall = time.perf_counter() - t0
            cpu = _cpu_s() - c0
            req, nbytes = hub.stats()
            return wall, req, nbytes, sum(len(f.tensors) for f in meta.files_metadata.values()), cpu

        # Untimed warm-up: the hub hashes small files on its first listing, the OS caches the shards'
        # first pages, both clients open their connection pools.
        kimi_trial()
        kimi_trial(worker=False)
        hf_trial()
        ka_runs, one_runs, hf_runs = [], [], []
        trials = [lambda: ka_runs.append(kimi_trial()), lambda: one_runs.append(kimi_trial(worker=False)),
                  lambda: hf_runs.append(hf_trial())]
        for i in range(args.repeats):  # rotate the order so that none always runs first or last
            for k in range(3):
                trials[(i + k) % 3]()
        os.environ.pop(DISABLE_ENV, None)
        ka_wall, ka_load, ka_req, ka_bytes, ka_tensors, ka_errors, ka_cpu = min(ka_runs)
        one_wall, one_load, one_req, one_bytes, _, _, one_cpu = min(one_runs)
        hf_wall, hf_req, hf_bytes, hf_tensors, hf_cpu = min(hf_runs)
    finally:
        hub.close()
        if tmp is not None:
            tmp.cleanup()

    print(f"loopback FakeHub, {args.latency_ms:g} ms per request, full-scale replica; needed {need:,} bytes; "
          f"best of {args.repeats} runs each (all walls, kimi-audit: {', '.join(f'{r[0]:.2f}' for r in ka_runs)}; "
          f"in one process: {', '.join(f'{r[0]:.2f}' for r in one_runs)}; hf: {', '.join(f'{r[0]:.2f}' for r in hf_runs)})")
    print(f"{'':34s}{'wall s':>8s}{'requests':>10s}{'bytes':>14s}{'bytes/needed':>14s}{'client CPU s':>14s}")
    print(f"{'kimi-audit audit, whole':34s}{ka_wall:8.2f}{ka_req:10d}{ka_bytes:14,d}{ka_bytes / need:14.4f}{ka_cpu:14.2f}")
    print(f"{'  of which the load':34s}{ka_load:8.2f}")
    print(f"{'  of which the checks after it':34s}{ka_wall - ka_load:8.2f}")
    print(f"{'kimi-audit, in one process':34s}{one_wall:8.2f}{one_req:10d}{one_bytes:14,d}{one_bytes / need:14.4f}{one_cpu:14.2f}")
    print(f"{'  of which the load':34s}{one_load:8.2f}")
    print(f"{'hf get_safetensors_metadata':34s}{hf_wall:8.2f}{hf_req:10d}{hf_bytes:14,d}{hf_bytes / need:14.4f}{hf_cpu:14.2f}")
    print(
        f"ratios kimi-audit / hf: wall {ka_wall / hf_wall:.2f}x (the load {ka_load / hf_wall:.2f}x), "
        f"client CPU {ka_cpu / hf_cpu:.2f}x, requests {ka_req / hf_req:.2f}x, bytes {ka_bytes / hf_bytes:.2f}x; tensors {ka_tensors:,} vs {hf_tensors:,}; "
        f"audit errors {ka_errors}; header worker: whole audit {ka_wall / one_wall:.2f}x the one-process wall"
    )
    fewer = ka_req < hf_req and ka_bytes < hf_bytes and ka_bytes <= 1.02 * need
    print(f"fewer requests and bytes, <= 1.02x needed: {'met' if fewer else 'NOT met'}; "
          f"whole audit <= half hf's wall time: {'met' if ka_wall <= hf_wall / 2 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
