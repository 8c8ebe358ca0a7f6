"""Diagnosis: where the time and memory of `kimi-audit audit REPLICA --json` go, phase by phase.

    python bench/audit_local.py [REPLICA_DIR] [--repeats 5]

bench/cli.py measures the whole process against its peers; this splits that one process up. A child
process does what the audit command does, with a time.perf_counter() stamp (CLOCK_MONOTONIC,
comparable across processes on Linux) and its ru_maxrss after each phase:
  start-up        Popen until the child's first line runs (interpreter, site, venv .pth files);
  import the CLI  `import kimi_audit.cli`, as `python -m kimi_audit` does (the Typer app, every command);
  import audit    what the audit command imports lazily (open_source, load, checks, render);
  load            load_checkpoint(open_source(REPLICA)): config, index, the 61 headers, strict parse;
  checks          audit_checkpoint: the layout, index and quantization checks, the statistics;
  render          the JSON report, written to stdout;
  exit            the child's last stamp until os.wait4 returns (interpreter teardown).
It runs alternately with the real `python -m kimi_audit audit REPLICA --json`, so that the sum of the
phases can be held against the command (Typer's argument parsing, rich and the gates are the
difference). Medians of --repeats runs after one warm-up; nothing is asserted.
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MB = 1_000_000

PHASES_CHILD = """\
import time
t0 = time.perf_counter()
import resource
import sys
stamps = [("start", t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)]

def mark(name):
    stamps.append((name, time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))

import kimi_audit.cli  # noqa: E402,F401
mark("import the CLI")
from kimi_audit.checks.audit import audit_checkpoint  # noqa: E402
from kimi_audit.cli.ci import render  # noqa: E402
from kimi_audit.findings import Severity  # noqa: E402
from kimi_audit.model.checkpoint import load_checkpoint  # noqa: E402
from kimi_audit.report import json_report  # noqa: E402,F401
from kimi_audit.sources.resolve import open_source  # noqa: E402
mark("import audit")
ckpt = load_checkpoint(open_source(sys.argv[1]))
mark("load")
report = audit_checkpoint(ckpt)
mark("checks")
sys.stdout.write(render(report, "json", Severity.ERROR, 0.0))
sys.stdout.flush()
mark("render")
sys.stderr.write(repr(stamps))
"""


def run(argv: list[str], scratch: Path) -> tuple[float, float, int, str]:
    """(perf_counter before Popen, after os.wait4, peak RSS bytes, stderr) of one whole process."""
    with open(scratch / "out", "wb") as out, open(scratch / "err", "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        t1 = time.perf_counter()
    proc.returncode = rc = os.waitstatus_to_exitcode(status)
    err_text = (scratch / "err").read_text(errors="replace")
    if rc != 0:
        raise SystemExit(f"{' '.join(argv[1:])}: exit {rc}\n{err_text[-2000:]}")
    return t0, t1, usage.ru_maxrss * 1024, err_text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("replica", nargs="?", type=Path, help="an existing replica (default: build one in a temp dir)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kimi-audit-bench-phases-") as tmp_name:
        tmp = Path(tmp_name)
        replica = args.replica
        if replica is None:
            sys.path.insert(0, str(ROOT))
            from kimi_audit.replica.build import build_replica

            replica = build_replica(tmp / "replica")
        replica = str(replica.resolve())
        child = tmp / "phases.py"
        child.write_text(PHASES_CHILD)
        phases: dict[str, list[float]] = {}
        rss_after: dict[str, list[int]] = {}
        whole_phases: list[float] = []
        whole_cli: list[float] = []
        rss_phases: list[int] = []
        rss_cli: list[int] = []
        for rnd in range(args.repeats + 1):
            t0, t1, rss, err = run([sys.executable, str(child), replica], tmp)
            c0, c1, crss, _ = run([sys.executable, "-m", "kimi_audit", "audit", replica, "--json"], tmp)
            if rnd == 0:
                continue  # warm-up
            stamps = ast.literal_eval(err.strip().splitlines()[-1])
            prev = t0
            for name, t, maxrss in stamps:
                name = "start-up" if name == "start" else name
                phases.setdefault(name, []).append(t - prev)
                rss_after.setdefault(name, []).append(maxrss * 1024)
                prev = t
            phases.setdefault("exit", []).append(t1 - prev)
            rss_after.setdefault("exit", []).append(rss)
            whole_phases.append(t1 - t0)
            whole_cli.append(c1 - c0)
            rss_phases.append(rss)
            rss_cli.append(crss)

    med = statistics.median
    total = med(whole_phases)
    print(f"kimi-audit audit {replica} --json, split into phases: medians of {args.repeats} runs "
          f"(each alternating with the real command)")
    print(f"  {'phase':18s}{'wall ms':>10s}{'share':>8s}{'peak RSS MB after':>20s}")
    for name, walls in phases.items():
        print(f"  {name:18s}{med(walls) * 1000:10.0f}{med(walls) / total:8.0%}{med(rss_after[name]) / MB:20.1f}")
    print(f"  {'all phases':18s}{total * 1000:10.0f}{'':8s}{med(rss_phases) / MB:20.1f}")
    print(f"  {'the real command':18s}{med(whole_cli) * 1000:10.0f}{'':8s}{med(rss_cli) / MB:20.1f}"
          f"   (python -m kimi_audit audit REPLICA --json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
