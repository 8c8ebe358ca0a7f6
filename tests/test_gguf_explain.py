"""`explain` on a GGUF speaks the file's language: one instance's tensors in its GGUF names and the ggml types
stored (issue 47, item 7), where it once listed `self_attn.q_b_proj.weight  GGML [...]` beside `blk.N.attn_q_b`."""

from __future__ import annotations

import shutil
from pathlib import Path

from typer.testing import CliRunner

from kimi_audit.cli import app

Q2K = Path(__file__).resolve().parent / "data" / "gguf" / "tiny-Q2_K.gguf"


def card(tmp_path: Path, component: str) -> str:
    shutil.copy(Q2K, tmp_path / Q2K.name)
    r = CliRunner().invoke(app, ["explain", str(tmp_path), component, "--no-progress"])
    assert r.exit_code == 0, r.output
    return r.stdout


def test_a_gguf_card_lists_its_tensors_as_stored(tmp_path: Path) -> None:
    out = card(tmp_path, "blk.1.attn_q_b.weight")
    stored = out[out.index("Stored as"):]
    assert "attn_q_b.weight  Q2_K [192, 256]" in stored
    assert "GGML" not in stored and "q_b_proj" not in stored


def test_stacked_experts_are_listed_as_the_file_stacks_them(tmp_path: Path) -> None:
    stored = card(tmp_path, "experts.gate_proj")
    assert "ffn_gate_exps.weight  Q2_K [4, 256, 256]" in stored and "GGML" not in stored


def test_a_gguf_page_uses_the_files_names_only(tmp_path: Path) -> None:
    """The HTML page of a GGUF audit draws its parameter bars under the file's component names (checks.stats
    `components`), as its tensor grid names them: no `self_attn.q_b_proj` beside `blk.N.attn_q_b` on one page."""
    import html
    import re

    shutil.copy(Q2K, tmp_path / Q2K.name)
    page = tmp_path / "page.html"
    r = CliRunner().invoke(app, ["audit", str(tmp_path), "-o", str(page), "--no-progress"])
    assert r.exit_code == 0, r.output
    text = html.unescape(re.sub(r"<[^>]+>", " ", page.read_text()))
    assert "attn_q_b" in text and "token_embd" in text
    assert not [w for w in ("self_attn", "q_b_proj", "embed_tokens", "mlp.experts") if w in text]
