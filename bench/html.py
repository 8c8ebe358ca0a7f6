"""Benchmark: `audit --format html` against `audit --json` on the faulty full-scale Kimi-K2 replica, as whole
processes, side by side; and docs/ci.md's screenshot of that page.

    python bench/html.py [--replica DIR] [--repeats 5] [--screenshot docs/html-report.png] [--json]

The faulty replica is the full-scale Kimi-K2-Instruct header replica (replica.build, 61 sparse shards) with
faults injected as a bad writer or a partial download would leave them (FAULTS): one shard absent, and in
another one a norm gain of the wrong shape, a routed expert's weight missing and another's block scale
missing. Built in a temp dir unless --replica names a directory that holds one (the faults are not
injected again).

Both commands run alternately (bench/cli.py's `alternate`: one untimed warm-up each, then A B A B ...;
wall time from Popen to wait4, start-up and exit included); the medians are shown, and their ratio.
Targets (issue 24): the page <= 2 MB and html wall <= 1.2x json wall. Both exit 1 (the faults are errors):
that is expected, not a failure of the run.

--screenshot PNG renders the page with headless Chromium (`chromium`, Debian's package) into PNG: the image
docs/ci.md shows, so that it is made by this script, never by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from cli import ROOT, Cmd, Target, alternate, base_env, table

MB = 1_000_000
FAULTS = {
    "absent": "model.layers.30.mlp.experts.0.gate_proj.weight",
    "shape": "model.layers.5.self_attn.q_a_layernorm.weight",
    "missing": "model.layers.5.mlp.experts.17.down_proj.weight",
    "scale": "model.layers.5.mlp.experts.200.up_proj.weight_scale_inv",
}
"""What is injected: the shard holding `absent` is deleted; in the shard holding the others, `shape` gets
1535 values (of 1536), `missing` and `scale` are left out."""
MAX_PAGE = 2 * MB
MAX_RATIO = 1.2


def shard_holding(shards: dict[str, list], name: str) -> str:  # type: ignore[type-arg]
    return next(s for s, ts in shards.items() if any(t.name == name for t in ts))


def build_faulty(directory: Path) -> Path:
    """The full-scale replica with FAULTS injected (the index still lists what the release holds)."""
    from kimi_audit.replica.build import build_replica, replica_shards, write_shard

    build_replica(directory)
    shards = replica_shards()
    os.remove(directory / shard_holding(shards, FAULTS["absent"]))
    victim = shard_holding(shards, FAULTS["shape"])
    tensors = []
    for t in shards[victim]:
        if t.name in (FAULTS["missing"], FAULTS["scale"]):
            continue
        tensors.append(type(t)(t.name, t.dtype, (1535,)) if t.name == FAULTS["shape"] else t)
    write_shard(directory / (victim + ".new"), tensors, seed=5, fill_small=False)
    os.replace(directory / (victim + ".new"), directory / victim)
    return directory


def screenshot(page: Path, png: Path, width: int = 1280, height: int = 1100) -> None:
    """The page's top (verdict, summary, the model grid) as Chromium draws it, light scheme."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise SystemExit("--screenshot needs a `chromium` binary (apt-get install chromium)")
    png.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={width},{height}",
                    f"--screenshot={png.resolve()}", page.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)
    print(f"screenshot: {png} ({png.stat().st_size / 1000:,.0f} kB)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replica", type=Path, default=None, help="a faulty replica directory (default: build one)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of each command (default 5)")
    ap.add_argument("--screenshot", type=Path, default=None, metavar="PNG", help="also render the page to PNG")
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="kimi-audit-bench-html-") as tmp_name:
        tmp = Path(tmp_name)
        replica = args.replica
        if replica is None or not (replica / "config.json").exists():
            replica = build_faulty(replica or tmp / "kimi-k2-faulty")
        page = tmp / "report.html"
        env = base_env()
        py = sys.executable
        js = Cmd("kimi-audit audit --json", [py, "-m", "kimi_audit", "audit", str(replica), "--json",
                                             "--no-progress"], env)
        html = Cmd("kimi-audit audit --format html -o FILE", [py, "-m", "kimi_audit", "audit", str(replica),
                                                              "--format", "html", "-o", str(page), "--no-progress"],
                   env)
        alternate([js, html], args.repeats, tmp)
        for c in (js, html):  # exit 1 is the verdict on the faults, not a failed run
            c.failures = [f for f in c.failures if not f.startswith("exit 1:")]
        size = page.stat().st_size
        ratio = html.median_wall() / js.median_wall()
        targets = [Target("page <= 2 MB", f"{size / MB:.2f} MB", size <= MAX_PAGE),
                   Target("html wall <= 1.2x json wall", f"{ratio:.2f}x", ratio <= MAX_RATIO)]
        lines = table(f"faulty full-scale replica {replica}: medians of {args.repeats} alternating runs "
                      "(both exit 1: the faults are errors)", [js, html], targets)
        lines.append(f"  ratio html / json, wall: {ratio:.2f}x; CPU: {html.median_cpu() / js.median_cpu():.2f}x; "
                     f"peak RSS: {html.median_rss() / js.median_rss():.2f}x; page {size:,} bytes")
        print("\n".join(lines))
        if args.json:
            print(json.dumps({"page_bytes": size, "ratio_wall": round(ratio, 3),
                              "json_wall": js.median_wall(), "html_wall": html.median_wall(),
                              "targets": {t.text: t.ok for t in targets}}, indent=2))
        if args.screenshot is not None:
            screenshot(page, args.screenshot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
