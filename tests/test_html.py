"""`--format html`: one self-contained page that parses as HTML5 (html5lib, strict) with well-formed inline
SVG, escapes hostile tensor names, and whose model grid marks exactly the cells of the injected faults;
rendered by headless Chromium when a `chromium` binary is present."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import html5lib
import numpy as np
import pytest
from typer.testing import CliRunner

from kimi_audit.checks.audit import audit_source
from kimi_audit.cli import app
from kimi_audit.replica.build import replica_shards, write_shard
from kimi_audit.report.html import render_html
from kimi_audit.sources import LocalSource
from tiny_checkpoint import TINY_CONFIG, tiny_shards, write_tiny

runner = CliRunner()
S1, S2, S3 = (f"model-{i}-of-3.safetensors" for i in (1, 2, 3))
SVG = "{http://www.w3.org/2000/svg}"
OUTSIDE = "outside the layers"
LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)\.[^.]+$")
EXPERT = re.compile(r"model\.layers\.(\d+)\.(mlp\.experts)\.(\d+)\.")


def strict_parse(page: str) -> None:
    html5lib.HTMLParser(strict=True, namespaceHTMLElements=False).parse(page)


def svgs(page: str) -> list[ET.Element]:
    return [ET.fromstring(s) for s in re.findall(r"<svg\b.*?</svg>", page, re.S)]


def marked(page: str) -> dict[tuple[str, str, int], str]:
    """data-cell -> class of every marked cell of every SVG on the page."""
    out = {}
    for svg in svgs(page):
        for r in svg.iter(f"{SVG}rect"):
            if "data-cell" in r.attrib:
                row, col, i = r.attrib["data-cell"].split("|")
                out[row, col, int(i)] = r.attrib["class"]
    return out


def cell_of(name: str) -> tuple[str, str, int]:
    """The grid cell of a tensor name, read by these regexes (independently of report.grid)."""
    if m := EXPERT.match(name):
        return m[1], m[2], int(m[3])
    if m := LAYER.match(name):
        return m[1], m[2], -1
    return OUTSIDE, name.rpartition(".")[0], -1


def html_of(directory: Path) -> str:
    return render_html(audit_source(LocalSource(directory)))


def test_clean_page_is_html5_with_wellformed_svg_and_no_network(tiny_dir: Path) -> None:
    page = html_of(tiny_dir)
    strict_parse(page)
    drawn = svgs(page)
    assert len(drawn) >= 3  # the grid, the tensors outside the layers, the parameter bars
    assert marked(page) == {}
    assert "<script" not in page.lower() and "<link" not in page.lower() and " src=" not in page
    assert set(re.findall(r"https?://[^\s\"'<>)]+", page)) == {"http://www.w3.org/2000/svg"}  # a namespace only
    assert "prefers-color-scheme:dark" in page and "@media print" in page
    assert 'class="verdict pass">PASS<' in page


def faulty_tiny(directory: Path) -> tuple[Path, dict[tuple[str, str, int], str]]:
    """The tiny checkpoint with a missing norm gain (layer 1), an expert weight of the wrong shape (layer 2,
    expert 3) and its third shard absent (layer 3, the final norm, the head); the cells each should mark."""
    shards = tiny_shards()
    gone = "model.layers.1.self_attn.kv_a_layernorm.weight"
    bent = "model.layers.2.mlp.experts.3.gate_proj.weight"
    del shards[S2][gone]
    shards[S2][bent] = np.ascontiguousarray(shards[S2][bent][:-1])
    lost = list(shards[S3])
    write_tiny(directory, shards)
    os.remove(directory / S3)
    want = {cell_of(gone): "e", cell_of(bent): "e"}
    want.update((cell_of(n), "abs") for n in lost)
    return directory, want


def test_grid_marks_exactly_the_injected_faults(tmp_path: Path) -> None:
    d, want = faulty_tiny(tmp_path / "ckpt")
    page = html_of(d)
    strict_parse(page)
    assert marked(page) == want
    assert ("3", "mlp.experts", 7) in want and (OUTSIDE, "lm_head", -1) in want  # the absent shard's cells
    assert 'class="verdict fail">FAIL (1 of 3 shards absent)<' in page  # faults in what is present: not PARTIAL


HOSTILE = ('model.layers.1.mlp.<script>alert(1)</script>.weight', 'x"><img src=y onerror=alert(2)>.weight',
           "evil.\x1b[2J\x00\u202e\ufffe.weight")


def test_hostile_tensor_names_are_escaped(tmp_path: Path) -> None:
    shards = tiny_shards()
    for name in HOSTILE:
        shards[S1][name] = np.zeros((2,), dtype=np.float32)
    d = write_tiny(tmp_path / "ckpt", shards)
    report = audit_source(LocalSource(d))
    assert {f.tensor for f in report.findings} >= set(HOSTILE)  # each named by a finding
    page = render_html(report)
    strict_parse(page)
    svgs(page)  # XML forbids the control characters: they are written as visible escapes
    doc = html5lib.parse(page, namespaceHTMLElements=False)
    assert not doc.findall(".//script") and not doc.findall(".//img")
    assert "<script>alert" not in page and "<img" not in page and "\x1b" not in page and "\u202e" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "\\x1b[2J\\x00\\u202e\\ufffe" in page


def test_cli_audit_html_keeps_the_exit_code(tmp_path: Path) -> None:
    d, _ = faulty_tiny(tmp_path / "ckpt")
    out = tmp_path / "report.html"
    r = runner.invoke(app, ["audit", str(d), "--no-progress", "--format", "html", "-o", str(out)])
    assert r.exit_code == 1 and r.stdout == ""
    strict_parse(out.read_text())


def test_cli_verify_html_draws_weight_health(tmp_path: Path) -> None:
    shards = tiny_shards()
    name = "model.layers.2.mlp.experts.5.up_proj.weight"
    shards[S2][name].view(np.uint8)[3, 4] = 0x7F  # an FP8 NaN code
    d = write_tiny(tmp_path / "ckpt", shards)
    out = tmp_path / "verify.html"
    r = runner.invoke(app, ["verify", str(d), "--no-progress", "-j", "1", "--format", "html", "-o", str(out)])
    assert r.exit_code == 1, r.output
    page = out.read_text()
    strict_parse(page)
    assert marked(page) == {("2", "mlp.experts", 5): "e"}
    assert "FP8_NAN per layer (values)" in page and "FP8_NAN per expert (values)" in page
    assert "layer 2: 1" in page and "expert 5: 1" in page  # the small multiples' bars, by their titles
    files = re.findall(r'class="i"><title>([^<:]+): unreferenced', page)  # hashed, no reference to compare with
    assert sorted(files) == sorted(p.name for p in d.iterdir())
    bad = runner.invoke(app, ["verify", str(d), "--no-progress", "--json", "--format", "html"])
    assert bad.exit_code == 2 and "contradicts" in bad.output


@pytest.mark.slow
def test_full_scale_faulty_replica_page(replica_copy: Path) -> None:
    """Kimi-K2 (61 layers x 384 experts) with a shard absent and three faults in another: the page stays
    under 2 MB, and marks the faults' cells and every cell of the absent shard, nothing else."""
    shards = replica_shards()
    absent = next(s for s, ts in shards.items() if any(t.name.startswith("model.layers.30.mlp.experts.") for t in ts))
    os.remove(replica_copy / absent)
    victim = next(s for s, ts in shards.items() if any(t.name == "model.layers.5.mlp.experts.17.down_proj.weight"
                                                       for t in ts))
    gone = {"model.layers.5.mlp.experts.17.down_proj.weight", "model.layers.5.mlp.experts.200.up_proj.weight"}
    gone &= {t.name for t in shards[victim]}
    write_shard(replica_copy / (victim + ".new"), [t for t in shards[victim] if t.name not in gone], seed=5,
                fill_small=False)
    os.replace(replica_copy / (victim + ".new"), replica_copy / victim)
    page = html_of(replica_copy)
    assert len(page.encode()) <= 2_000_000
    strict_parse(page)
    want = {cell_of(t.name): "abs" for t in shards[absent]}
    want.update((cell_of(n), "e") for n in gone)
    got = marked(page)
    assert {k: v for k, v in got.items() if v != "i"} == want
    assert not any(v == "i" for v in got.values())  # the release's inv_freq [56] is expected: no info


def png_pixels_vary(png: bytes) -> bool:
    """Not a blank image: the decompressed scanlines hold many byte values, none taking nearly all."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, data = 8, b""
    while pos < len(png):
        (n,) = struct.unpack(">I", png[pos:pos + 4])
        if png[pos + 4:pos + 8] == b"IDAT":
            data += png[pos + 8:pos + 8 + n]
        pos += 12 + n
    raw = zlib.decompress(data)
    counts = np.bincount(np.frombuffer(raw, dtype=np.uint8), minlength=256)
    return int((counts > 0).sum()) > 32 and counts.max() < 0.97 * len(raw)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="no `chromium` binary: the page is not rendered by a browser here "
                    "(apt-get install chromium to run this test)")
def test_chromium_renders_the_page(tmp_path: Path) -> None:
    d, _ = faulty_tiny(tmp_path / "ckpt")
    page = tmp_path / "report.html"
    page.write_text(html_of(d), encoding="utf-8")
    png = tmp_path / "shot.png"
    assert CHROMIUM is not None
    run = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                          "--enable-logging=stderr", "--v=0", f"--user-data-dir={tmp_path / 'profile'}",
                          "--window-size=1000,900", f"--screenshot={png}", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line or "net::ERR" in line]
    assert console == []
    assert png_pixels_vary(png.read_bytes())


def test_tiny_config_is_the_one_drawn(tiny_dir: Path) -> None:
    """The grid's rows and strips come from the layout: 4 layers, 8 experts a MoE layer, none in the dense one."""
    page = html_of(tiny_dir)
    assert f"mlp.experts ×{TINY_CONFIG['n_routed_experts']}" in page
    for layer in range(1, TINY_CONFIG["num_hidden_layers"]):
        assert f"layer {layer} · mlp.experts.{{0-7}}: 8 cells" in page
    assert "layer 0 · mlp.experts" not in page


def test_parameters_per_component_derived_and_found(tiny_dir: Path, tmp_path: Path) -> None:
    """The bars' figures (checks.stats ComponentRow): derived = found on a clean checkpoint, summing to the
    parameter total; a missing gain is found short by exactly its width in its own component."""
    clean = audit_source(LocalSource(tiny_dir)).stats
    assert clean.components and all(c.derived == c.found for c in clean.components)
    assert sum(c.found for c in clean.components) == clean.parameters
    shards = tiny_shards()
    del shards[S2]["model.layers.1.self_attn.kv_a_layernorm.weight"]
    stats = audit_source(LocalSource(write_tiny(tmp_path / "ckpt", shards))).stats
    short = {(c.block, c.component): c.derived - c.found for c in stats.components if c.derived != c.found}
    assert short == {("moe", "self_attn.kv_a_layernorm.weight"): TINY_CONFIG["kv_lora_rank"]}
    assert sum(c.found for c in stats.components) == stats.parameters


def test_api_to_html(tiny_dir: Path) -> None:
    import kimi_audit

    page = kimi_audit.audit(str(tiny_dir)).to_html()
    strict_parse(page)
    assert page == html_of(tiny_dir)


def test_a_finding_on_a_whole_layer_marks_its_row(tmp_path: Path) -> None:
    """MTP_ABSENT names the layer (`model.layers.4`), not a tensor: every cell of that row, and no other."""
    config = {**TINY_CONFIG, "num_nextn_predict_layers": 1}
    d = write_tiny(tmp_path / "ckpt", tiny_shards(), config)
    report = audit_source(LocalSource(d))
    assert [f.code for f in report.findings] == ["MTP_ABSENT"]
    page = render_html(report)
    strict_parse(page)
    got = marked(page)
    assert {k[0] for k in got} == {"4"} and set(got.values()) == {"w"}
    assert len(got) == 15 - 1 + 8 + 6  # the MoE layer's parts (the experts as 8 cells) and the MTP head's 6


def test_params_html_draws_the_accounting_tree(tmp_path: Path) -> None:
    shards = tiny_shards()
    del shards[S2]["model.layers.1.self_attn.kv_a_layernorm.weight"]
    d = write_tiny(tmp_path / "ckpt", shards)
    out = tmp_path / "params.html"
    r = runner.invoke(app, ["params", str(d), "--no-progress", "--format", "html", "-o", str(out)])
    assert r.exit_code == 1 and r.stdout == ""  # a node mismatches, as the table says
    page = out.read_text()
    strict_parse(page)
    svgs(page)
    assert 'class="verdict fail">MISMATCH<' in page
    assert "Key-value latent RMSNorm (kv_a_layernorm): found 192" in page  # 3 MoE blocks x 96, one missing
    table = runner.invoke(app, ["params", str(d), "--no-progress", "-o", str(tmp_path / "params.txt")])
    assert table.exit_code == 1 and "kv_a_layernorm" in (tmp_path / "params.txt").read_text()


def test_long_names_are_clipped(tmp_path: Path) -> None:
    """A 100,000-character tensor name costs the page a few hundred characters, as in the JSON report."""
    shards = tiny_shards()
    name = "model.layers.1." + "a" * 100_000 + ".weight"
    shards[S1][name] = np.zeros((2,), dtype=np.float32)
    d = write_tiny(tmp_path / "ckpt", shards)
    page = html_of(d)
    strict_parse(page)
    assert "a" * 150 in page and "a" * 401 not in page  # named, clipped
    assert len(page) < len(html_of(write_tiny(tmp_path / "clean", tiny_shards()))) + 5_000


def multiples(page: str) -> dict[str, dict[str, str]]:
    """Small multiple's title -> {layer / expert label: class} of its drawn bars (read off their <title>s)."""
    out: dict[str, dict[str, str]] = {}
    for svg in svgs(page):
        head = svg.find(f"{SVG}text")
        if head is None or head.text is None:
            continue
        bars = out.setdefault(head.text, {})
        for r in svg.iter(f"{SVG}rect"):
            t = r.find(f"{SVG}title")
            if t is not None and t.text and (m := re.match(r"(?:layer|expert) (\w+):", t.text)):
                bars[m[1]] = r.attrib["class"]
    return out


def test_verify_html_draws_saturation_share_and_scale_range_per_layer_and_expert(tmp_path: Path) -> None:
    """±448 values planted in layer 2's expert 5 and a huge scale in layer 3's expert 1: the saturation share
    and scale range small multiples mark exactly those layers and experts; the JSON holds the same figures."""
    shards = tiny_shards()
    sat = "model.layers.2.mlp.experts.5.up_proj.weight"
    shards[S2][sat].view(np.uint8)[:] = 0x7E  # every value +448
    big = "model.layers.3.mlp.experts.1.gate_proj.weight_scale_inv"
    shards[S3][big][0, 0] = np.float32(1e30)
    d = write_tiny(tmp_path / "ckpt", shards)
    out = tmp_path / "verify.html"
    r = runner.invoke(app, ["verify", str(d), "--no-progress", "-j", "1", "--format", "html", "-o", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    strict_parse(page)
    drawn = multiples(page)
    flagged = {title: {k for k, c in bars.items() if c != "ok"} for title, bars in drawn.items()}
    assert flagged["±448 share per layer"] == {"2"} and flagged["±448 share per expert"] == {"5"}
    assert flagged["scale range per layer"] == {"3"} and flagged["scale range per expert"] == {"1"}
    assert set(drawn["±448 share per layer"]) == {"0", "1", "2", "3"}
    assert set(drawn["scale range per expert"]) == {str(i) for i in range(8)}
    assert re.search(r"<title>layer 2: [\d,]+ of [\d,]+ FP8 values at ±448", page)
    assert "<title>expert 1: scales " in page and re.search(r"<title>layer 3: scales \S+ to 1e\+30</title>", page)
    doc = json.loads(runner.invoke(app, ["verify", str(d), "--no-progress", "-j", "1", "--json"]).stdout)
    layers = {c["layer"]: c for c in doc["weight_health"]["layers"]}
    experts = {c["expert"]: c for c in doc["weight_health"]["experts"]}
    huge = float(np.float32(1e30))
    assert layers["3"]["scale_max"] == huge and experts[1]["scale_max"] == huge
    assert all(c["scale_max"] < 1 for k, c in layers.items() if k != "3")
    n = shards[S2][sat].size
    assert layers["2"]["saturated"] >= n and experts[5]["saturated"] >= n
    assert all(c["saturated"] < n // 100 for k, c in layers.items() if k != "2")
    assert len(doc["weight_health"]["experts"]) == 8


def labels_that_collide(page: str) -> list[str]:
    """Each drawing's unrotated labels, measured at the page's label width (svg.CHAR_W a character): any that
    leaves its drawing, or that overprints another on the same line."""
    from kimi_audit.report.svg import CHAR_W

    bad = []
    for svg in re.findall(r"<svg [^>]*>.*?</svg>", page, re.S):
        width = float(re.search(r'width="([\d.]+)"', svg)[1])
        boxes = []
        for x, y, anchor, rest, label in re.findall(
                r'<text x="([-\d.]+)" y="([-\d.]+)" text-anchor="(\w+)"([^>]*)>([^<]*)</text>', svg):
            if "rotate" in rest:
                continue
            n = CHAR_W * len(html.unescape(label))
            left = float(x) - (n if anchor == "end" else n / 2 if anchor == "middle" else 0)
            boxes.append((float(y), left, left + n, label))
            if left < -0.5 or left + n > width + 0.5:
                bad.append(f"{label!r} leaves its drawing ({left:.0f}..{left + n:.0f} of {width:g})")
        for i, (y, a, b, label) in enumerate(boxes):
            bad += [f"{label!r} overprints {o!r}" for y2, c, d, o in boxes[i + 1:] if abs(y - y2) < 9 and a < d
                    and c < b]
    return bad


def test_labels_neither_overprint_nor_leave_their_drawings(tmp_path: Path, tiny_dir: Path) -> None:
    """Issue 42 (9): the verify page's "1e-4" axis label overprinted its title; the audit grid cut
    "mlp.experts ×8" to "mlp.ex". Every label of both pages fits its drawing and overprints no other."""
    out = tmp_path / "verify.html"
    r = runner.invoke(app, ["verify", str(tiny_dir), "--no-progress", "-j", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert labels_that_collide(out.read_text()) == []
    assert labels_that_collide(html_of(tiny_dir)) == []


# --- the newcomer's pages, round three ------------------------------------------------------------------------


def test_bar_labels_end_before_their_bars() -> None:
    """params' long labels ("Joint key-value down-projection (kv_a_proj_with_mqa)" at depth 3) ran into the bars
    drawn from x = 250: the labels' column is as wide as the longest label."""
    from kimi_audit.report.svg import LABEL_CHAR_W, bars_svg

    title = "Joint key-value down-projection (kv_a_proj_with_mqa) and some more words"
    svg = ET.fromstring(bars_svg([(0, "model", 10, 10, False), (3, title, 5, 5, False)], 10))
    label = next(t for t in svg.iter(f"{SVG}text") if t.text == title)
    bar_x = min(float(r.attrib["x"]) for r in svg.iter(f"{SVG}rect"))
    assert float(label.attrib["x"]) + LABEL_CHAR_W * len(title) < bar_x


def test_verify_page_lists_every_file_with_size_hash_and_status(tmp_path: Path, tiny_dir: Path) -> None:
    """The verify page showed the files and their sha256 only as hover tooltips: a visible table now."""
    out = tmp_path / "verify.html"
    r = runner.invoke(app, ["verify", str(tiny_dir), "--no-progress", "-j", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    strict_parse(page)
    files = {f["name"]: f for f in json.loads(runner.invoke(app, ["verify", str(tiny_dir), "--no-progress", "-j",
                                                                   "1", "--json"]).stdout)["files"]}
    rows = re.findall(r"<tr><td><code>(.*?)</code></td><td class=\"n\">([\d,]+)</td><td><code class=\"hash\">"
                      r"([0-9a-f]{64})</code></td><td[^>]*>(\w+)", page)
    assert {name.replace("<wbr>", ""): (int(size.replace(",", "")), sha, status) for name, size, sha, status in rows} \
        == {n: (f["size"], f["sha256"], f["status"]) for n, f in files.items()}


def test_log_axis_ends_read_differently() -> None:
    """Both ends of a scale-range axis read `1e-4` (log10 rounded to a whole decade) for scales 2.5e-4 to 5e-5."""
    import math

    from kimi_audit.report.html_verify import axis_ticks

    top, bottom = axis_ticks(math.log10(5e-5), math.log10(2.5e-4))
    assert top != bottom and float(top) == pytest.approx(2.5e-4) and float(bottom) == pytest.approx(5e-5)


def test_names_wrap_at_dots_not_mid_word(tiny_dir: Path, tmp_path: Path) -> None:
    """`code{word-break:break-all}` broke `model.layers.2.self_attn.q_a_layernorm.weight` anywhere: the names
    carry break opportunities after `.`, `/`, `-` and break nowhere else (but a hash)."""
    shards = tiny_shards()
    name = "model.layers.2.self_attn.q_a_layernorm.weight"
    shards[S2][name] = np.ones(7, dtype=shards[S2][name].dtype)  # SHAPE_MISMATCH, named in the findings
    page = html_of(write_tiny(tmp_path / "nan", shards))
    assert "model.<wbr>layers.<wbr>2.<wbr>self_attn.<wbr>q_a_layernorm.<wbr>weight" in page
    style = page[page.index("<style>"):page.index("</style>")]
    assert [s.strip() for s in re.findall(r"([^{}]+)\{[^}]*word-break:break-all", style)] == ["code.hash"]


def test_the_grid_fits_the_page_width() -> None:
    """Kimi-K2's 384-expert strip (1,152 px of cells, ~1,500 px with the other columns) was clipped at the page's
    1,400 px: every drawing scales down to its box."""
    from kimi_audit.report.html import STYLE

    assert ".scroll svg{max-width:100%;height:auto}" in STYLE


def test_a_pass_page_paints_no_cell_for_an_info_finding(tmp_path: Path) -> None:
    """A PASS page painted the `rotary_emb` column (info BUFFER_SHAPE on every layer): info findings are listed,
    not drawn."""
    shards = tiny_shards()
    for shard in shards.values():
        for name in [n for n in shard if n.endswith("rotary_emb.inv_freq")]:
            shard[name] = np.ones(5, dtype=shard[name].dtype)
    report = audit_source(LocalSource(write_tiny(tmp_path / "t", shards)))
    assert report.errors == report.warnings == 0 and any(f.code == "BUFFER_SHAPE" for f in report.findings)
    page = render_html(report)
    assert marked(page) == {} and "BUFFER_SHAPE" in page and 'class="verdict pass"' in page


def test_every_page_shows_the_dtype_table(tiny_dir: Path, tmp_path: Path) -> None:
    """The terminal's `Tensors by class and dtype` (F8_E4M3, the GGUF types) was on no page."""
    page = html_of(tiny_dir)
    assert "Tensors by class and dtype" in page and "<code>F8_E4M3</code>" in page
    gguf = Path(__file__).parent / "data" / "gguf" / "tiny-Q2_K.gguf"
    from kimi_audit.sources import open_source

    assert "<code>Q2_K</code>" in render_html(audit_source(open_source(str(gguf))))
    out = tmp_path / "verify.html"
    runner.invoke(app, ["verify", str(tiny_dir), "--no-progress", "-j", "1", "-o", str(out)])
    assert "Tensors by class and dtype" in out.read_text() and "<code>F8_E4M3</code>" in out.read_text()
