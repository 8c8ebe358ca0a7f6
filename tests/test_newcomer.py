"""A newcomer's first hour (issue 32): the output format follows --output's extension, a contradiction is one
error line, and the accounting names each part once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kimi_audit.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("name", "start"), [("report.html", "<!DOCTYPE html>"), ("report.json", "{"),
                                             ("report.sarif", "{"), ("report.xml", "<?xml"),
                                             ("report.md", "#")])
def test_the_output_extension_chooses_the_format(tiny_dir: Path, tmp_path: Path, name: str, start: str) -> None:
    """`audit DIR -o report.html` wrote the text table into the .html file, exit 0."""
    out = tmp_path / name
    r = runner.invoke(app, ["audit", str(tiny_dir), "-o", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert out.read_text().lstrip().startswith(start)
    if name.endswith(".json"):
        assert json.loads(out.read_text())["result"]["verdict"] == "PASS"


def test_a_format_the_extension_contradicts_is_one_error_line(tiny_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    r = runner.invoke(app, ["audit", str(tiny_dir), "-o", str(out), "--format", "markdown", "--no-progress"])
    assert r.exit_code == 2 and "contradicts --format markdown" in r.output and not out.exists()


def test_params_names_the_output_head_once(tiny_dir: Path) -> None:
    r = runner.invoke(app, ["params", str(tiny_dir), "--no-progress"])
    assert r.exit_code == 0 and "Output head" in r.output and "(lm_head) (lm_head)" not in r.output


@pytest.mark.parametrize("argv", [["--layer", "3", "--all"], ["--input", "x.npy", "--seed", "3"],
                                  ["--from-embeddings", "1,2", "--tokens", "4"]])
def test_conflicting_rmsnorm_options_are_one_error_line(tiny_dir: Path, argv: list[str]) -> None:
    """`rmsnorm --layer 3 --all` and `--input x.npy --seed 3` silently ignored one of the two options."""
    r = runner.invoke(app, ["rmsnorm", str(tiny_dir), *argv])
    assert r.exit_code == 2 and ("exclusive" in r.output or "random input" in r.output), r.output


def test_verify_stream_of_a_local_directory_says_so(tiny_dir: Path) -> None:
    """`verify LOCAL_DIR --stream` took the directory for a Hub repo and failed on the network."""
    r = runner.invoke(app, ["verify", str(tiny_dir), "--stream", "--no-progress"])
    assert r.exit_code == 2 and "is a local directory" in r.output, r.output


def test_demo_tiny_is_a_real_checkpoint_every_command_works_on(tmp_path: Path) -> None:
    """`demo --tiny DIR`: a few MB with real values, audited with --values; then verify, diff --content, tensor
    --dequant and rmsnorm run on its bytes offline (the only route to them was a test helper)."""
    d = tmp_path / "tiny"
    r = runner.invoke(app, ["demo", "--tiny", str(d), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["result"]["verdict"] == "PASS"
    assert sum(f.stat().st_size for f in d.iterdir()) < 8 << 20
    assert runner.invoke(app, ["verify", str(d), "--no-progress", "-j", "1"]).exit_code == 0
    r = runner.invoke(app, ["tensor", str(d), "model.layers.1.mlp.experts.0.gate_proj", "--dequant", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["dequantized"]["max"] > 0
    assert runner.invoke(app, ["rmsnorm", str(d), "--all", "--json"]).exit_code == 0
    other = tmp_path / "broken"
    assert runner.invoke(app, ["demo", "--tiny", str(other), "--fault", "nan-gain"]).exit_code == 1
    r = runner.invoke(app, ["diff", str(d), str(other), "--content", "--json", "--no-progress"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and [x["tensor"] for x in doc["content"]["differing"]] == [
        "model.layers.2.self_attn.q_a_layernorm.weight"]


@pytest.mark.parametrize(("fault", "code"), [("nan-gain", "VALUE_NAN"), ("missing-scale", "SCALE_MISSING"),
                                             ("wrong-shape", "SHAPE_MISMATCH")])
def test_demo_tiny_faults_show_what_a_broken_checkpoint_looks_like(tmp_path: Path, fault: str, code: str) -> None:
    r = runner.invoke(app, ["demo", "--tiny", str(tmp_path / "t"), "--fault", fault, "--json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and code in {f["code"] for f in doc["findings"]}, doc["findings"]


@pytest.mark.parametrize("argv", [["--fault", "nan-gain"], ["--tiny", "--fault", "nope"],
                                  ["--tiny", "--model", "deepseek-v3"]])
def test_demo_option_conflicts_are_one_error_line(tmp_path: Path, argv: list[str]) -> None:
    r = runner.invoke(app, ["demo", str(tmp_path / "x"), *argv])
    assert r.exit_code == 2 and not (tmp_path / "x").exists(), r.output


def test_demo_in_a_temporary_directory_does_not_say_it_keeps_it() -> None:
    """`demo` with no DIRECTORY printed "written to" a temporary directory it had already removed."""
    r = runner.invoke(app, ["demo", "--tiny"])
    assert r.exit_code == 0 and "removed when the demo ends" in r.output


def test_off_a_terminal_each_finding_is_one_line_and_names_never_wrap(tmp_path: Path) -> None:
    """Off a terminal, tables wrapped tensor and file names mid-word (`model.layers.2.` / `mlp.experts.2.g…`),
    so logs could not be grepped: each finding group is now one line, its name whole, at any width."""
    d = tmp_path / "t"
    runner.invoke(app, ["demo", "--tiny", str(d), "--fault", "missing-scale"])
    name = "model.layers.1.mlp.experts.3.up_proj.weight_scale_inv"
    for argv in ([], ["--plain"]):
        r = runner.invoke(app, ["audit", str(d), "--no-progress", *argv], env={"COLUMNS": "40"})
        line = next(x for x in r.output.splitlines() if "SCALE_MISSING" in x)
        assert name in line and r.exit_code == 1, r.output


def test_a_verify_page_of_data_not_present_claims_no_health(tmp_path: Path) -> None:
    """`verify --format html` of a copy whose data is not present showed FAIL but also "No NaN codes ... found"
    and an all-green grid: nothing was scanned. It says so now, and the grid marks the cells not read."""
    import os

    d = tmp_path / "t"
    runner.invoke(app, ["demo", "--tiny", str(d)])
    for shard in d.glob("*.safetensors"):  # header kept, data punched out (a header-only copy)
        header_end = 8 + int.from_bytes(shard.read_bytes()[:8], "little")
        size = shard.stat().st_size
        os.truncate(shard, header_end)
        os.truncate(shard, size)
    page = tmp_path / "v.html"
    r = runner.invoke(app, ["verify", str(d), "-o", str(page), "--no-progress", "-j", "1"])
    html = page.read_text()
    assert r.exit_code == 1 and "No NaN codes" not in html
    assert "No value was scanned" in html or "not scanned" in html


def test_one_shard_beside_its_index_names_its_checkpoint(tmp_path: Path) -> None:
    """`audit DIR/model-2-of-3.safetensors` reported 53 TENSOR_MISSING lines (every other shard's tensors) and a
    note to pass the directory, while a GGUF part names its set. A shard beside its index names its checkpoint,
    as config.json and the index do: the same report as the directory's."""
    d = tmp_path / "t"
    runner.invoke(app, ["demo", "--tiny", str(d)])
    whole = runner.invoke(app, ["audit", str(d), "--json", "--no-progress"])
    r = runner.invoke(app, ["audit", str(d / "model-2-of-3.safetensors"), "--json", "--no-progress"])
    assert r.exit_code == 0 and "TENSOR_MISSING" not in r.stdout, r.output
    one, all_ = json.loads(r.stdout), json.loads(whole.stdout)
    assert one["result"] == all_["result"] and one["findings"] == all_["findings"]
    assert one["source"] == str(d / "model-2-of-3.safetensors")
    r = runner.invoke(app, ["audit", str(d / "model-2-of-3.safetensors"), "--no-progress"])
    assert r.exit_code == 0 and "one shard of" not in r.output and "TENSOR_MISSING" not in r.output


def test_grouped_names_keep_their_zero_padding() -> None:
    """verify grouped `model-00001-of-000046…` as `model-{1-46}-of-46`, names no file holds."""
    from kimi_audit.model.accounting.tree import collapse

    assert collapse([f"model-{i:05d}-of-000046.safetensors" for i in (*range(1, 5), 9, 10)]) == [
        "model-{00001-00004,00009-00010}-of-000046.safetensors"]
    assert collapse([f"model.layers.{i}.mlp.gate.weight" for i in range(1, 61)]) == [
        "model.layers.{1-60}.mlp.gate.weight"]


def test_verify_ray_without_a_cluster_names_the_tools_own_options(tmp_path: Path, ray_alone: None) -> None:
    """`verify --ray` without a cluster repeated Ray's advice to pass `--address`; the option is --ray-address.
    Run in this process, with Ray's look for a cluster on the host hidden (no Ray process found, its own
    RAY_TMPDIR): a subprocess found the Ray another test ran beside it and got LocalRayletDiedError."""
    d = tmp_path / "t"
    runner.invoke(app, ["demo", "--tiny", str(d)])
    r = runner.invoke(app, ["verify", str(d), "--ray", "--no-progress"])
    assert r.exit_code == 2 and "--ray-address" in r.stderr and "--address" not in r.stderr.replace(
        "--ray-address", ""), r.stderr


def test_usage_lines_name_arguments_in_capitals_without_braces():
    """typer 0.29 prints a required argument `{source}`; the usage line says `SOURCE` (optional: `[SOURCE]`)."""
    from typer.main import get_command

    from kimi_audit.cli import app

    group = get_command(app)
    for name in group.commands:  # type: ignore[attr-defined]
        out = runner.invoke(app, [name, "--help"], env={"COLUMNS": "200"}).output
        usage = next(line for line in out.splitlines() if "Usage:" in line).split()
        assert usage[:3] == ["Usage:", "kimi-audit", name], usage
        arguments = [w.strip("[].") for w in usage[3:]]
        assert all(w.isupper() for w in arguments), usage  # OPTIONS, SOURCE, [DIRECTORY] ...; never {source}
    assert "[OPTIONS] SOURCE COMPONENT" in runner.invoke(app, ["explain", "--help"]).output


def test_round_two_stale_words() -> None:
    """Issue 42 (10): the words the tool prints agree with the tool. usage.md's `demo --model` list names every
    replica; `--help` lists every exit code; the demo's size is GiB (the payload computed from its layout)."""
    from kimi_audit.replica.models import REPLICA_MODELS

    usage = (Path(__file__).parents[1] / "docs" / "usage.md").read_text()
    block = usage[usage.index("demo --model NAME"):usage.index("kimi-audit audit PART.gguf")]
    assert [m for m in REPLICA_MODELS if m not in block] == []
    top = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "300"})
    assert "3 inconclusive" in top.stdout and "130 interrupted" in top.stdout
    demo = CliRunner().invoke(app, ["demo", "--help"], env={"COLUMNS": "300"})
    from kimi_audit import layout

    payload = sum(t.nbytes for t in layout(json.loads(REPLICA_MODELS["kimi-k2-instruct"].config_bytes())).values())
    assert f"{round(payload / 2**30)} GiB" in demo.stdout and " GB" not in demo.stdout


@pytest.mark.parametrize("command", ["params", "verify"])
@pytest.mark.parametrize("name", ["r.md", "r.xml", "r.sarif"])
def test_an_output_extension_the_command_does_not_write_is_one_error_line(tiny_dir: Path, tmp_path: Path,
                                                                            command: str, name: str) -> None:
    """Issue 42 (5): one rule for every command that writes a report: `params -o p.md` wrote a text table."""
    out = tmp_path / name
    r = CliRunner().invoke(app, [command, str(tiny_dir), "-o", str(out)])
    assert r.exit_code == 2 and "--output" in r.output and len(r.output.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("argv", [["params"], ["explain", "X", "q_a_layernorm"]])
def test_params_and_explain_on_an_architecture_not_described_say_why(tmp_path: Path, argv: list[str]) -> None:
    """Issue 42 (4): a tree of zeros and "MISMATCH derived 0" was printed; now the reason, once, exit 3."""
    import numpy as np
    from safetensors.numpy import save_file

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    save_file({"model.embed_tokens.weight": np.zeros((8, 4), np.float32)}, str(tmp_path / "model.safetensors"))
    args = [a if a != "X" else str(tmp_path) for a in argv]
    r = CliRunner().invoke(app, [*args, *([] if len(args) > 1 else [str(tmp_path)]), "--no-progress"])
    assert r.exit_code == 3 and "'llama'" in r.output and "no parameter tree" in r.output
    assert "0 × 0" not in r.output and "MISMATCH" not in r.output and len(r.output.strip().splitlines()) == 1


def test_the_layout_help_and_usage_dialect_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 42 (2): `layout --help` and docs/usage.md suggested `--dialect transformers` on Kimi-K2, which has
    none (exit 2). Their examples, run as written on the release they name (its config.json from kimi_audit/data)."""
    import kimi_audit
    from kimi_audit.replica.models import REPLICA_MODELS

    (tmp_path / "Kimi-K2.6").mkdir()
    (tmp_path / "Kimi-K2.6" / "config.json").write_bytes(REPLICA_MODELS["kimi-k2.6"].config_bytes())
    monkeypatch.chdir(tmp_path)
    help_text = CliRunner().invoke(app, ["layout", "--help"], env={"COLUMNS": "300"}).stdout
    assert "`kimi-audit layout ./Kimi-K2.6 --dialect transformers`" in help_text
    r = CliRunner().invoke(app, ["layout", "./Kimi-K2.6", "--dialect", "transformers"])
    assert r.exit_code == 0 and "language_model.model.blocks.1." in r.stdout
    usage = (Path(__file__).parents[1] / "docs" / "usage.md").read_text()
    line = next(x for x in usage.splitlines() if "dialect=" in x)
    hf = eval(line.split("=", 1)[1].split("#")[0].strip(), {"kimi_audit": kimi_audit})  # the line as written
    assert any(n.startswith("language_model.model.blocks.") for n in hf)
    r = CliRunner().invoke(app, ["layout", str(tmp_path / "Kimi-K2.6"), "--dialect", "nope"])
    assert r.exit_code == 2 and "its dialects: transformers" in r.output


@pytest.mark.parametrize("name", ["x.html", "x.md"])
def test_a_page_says_whether_values_were_read(tiny_dir: Path, tmp_path: Path, name: str) -> None:
    """Issue 42 (7): a green page without --values said nothing of the values it did not read."""
    pages = []
    for extra in ([], ["--values"]):
        out = tmp_path / extra[0].strip("-") / name if extra else tmp_path / name
        out.parent.mkdir(exist_ok=True)
        r = CliRunner().invoke(app, ["audit", str(tiny_dir), "--no-progress", "-o", str(out), *extra])
        assert r.exit_code == 0, r.output
        pages.append(out.read_text())
    assert "values not read" in pages[0] and "values read (--values)" in pages[1]
    assert "values not read" not in pages[1]


def test_every_error_code_is_listed_in_the_reference() -> None:
    """Issue 42 (10): the JSON error codes called stable were listed nowhere. Every KimiAuditError class's code
    is a row of docs/reference.md's "Error codes" table, and every row is a class's code."""
    import importlib
    import pkgutil
    import re

    import kimi_audit
    from kimi_audit.errors import KimiAuditError

    for m in pkgutil.walk_packages(kimi_audit.__path__, "kimi_audit."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)
    codes = {KimiAuditError.code}
    todo = [KimiAuditError]
    while todo:
        for sub in todo.pop().__subclasses__():
            codes.add(sub.code)
            todo.append(sub)
    ref = (Path(__file__).parents[1] / "docs" / "reference.md").read_text()
    section = ref[ref.index("## Error codes"):]
    section = section[:section.index("\n## ")]
    assert set(re.findall(r"^\| ([A-Z_]+) \|", section, re.M)) == codes


@pytest.mark.parametrize("command", ["audit", "demo", "diff", "download", "layout", "rmsnorm", "tensor", "params",
                                     "explain", "verify"])
def test_help_at_80_columns_cuts_none_of_its_words(command: str) -> None:
    """Issue 42 (10): `verify --help` at 80 columns cut its own text with "…"."""
    r = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert r.exit_code == 0 and "…" not in r.stdout


def test_verify_without_a_reference_does_not_show_a_plain_pass(tiny_dir: Path, tmp_path: Path) -> None:
    """Issue 42 (7): verify with no Hub hashes and no manifest showed a green PASS; "hashes computed, not
    compared" was an info line. The headline says what the PASS covers; with a manifest it is a plain PASS."""
    page = tmp_path / "v.html"
    r = CliRunner().invoke(app, ["verify", str(tiny_dir), "--no-progress", "-j", "1", "-o", str(page),
                                 "--write-manifest", str(tmp_path / "m.json")])
    assert r.exit_code == 0, r.output
    assert 'class="verdict partial">PASS (values; hashes computed, not compared: no reference)<' in page.read_text()
    r = CliRunner().invoke(app, ["verify", str(tiny_dir), "--no-progress", "-j", "1", "--manifest",
                                 str(tmp_path / "m.json")], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and r.stdout.strip().splitlines()[-1].startswith("PASS  ")


def test_off_a_terminal_params_and_verify_print_one_line_per_row(tiny_dir: Path) -> None:
    """Issue 42 (8): verify and params wrapped file names and sha256s inside table cells off a terminal; now a
    row is a line: each file with its whole sha256, each tree node and table row whole, at 60 columns."""
    import hashlib

    r = CliRunner().invoke(app, ["verify", str(tiny_dir), "--no-progress", "-j", "1"], env={"COLUMNS": "60"})
    assert r.exit_code == 0, r.output
    for f in sorted(p for p in tiny_dir.iterdir() if p.is_file()):
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        assert any(line.startswith(f"{f.name}  ") and digest in line for line in r.stdout.splitlines())
    r = CliRunner().invoke(app, ["params", str(tiny_dir), "--no-progress"], env={"COLUMNS": "60"})
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert any("model.layers.{1-3}.mlp.experts.{0-7}.gate_proj.weight_scale_inv" in line for line in lines)
    assert any("Joint key-value down-projection (kv_a_proj_with_mqa)" in line for line in lines)


def test_on_a_narrow_terminal_finding_codes_stay_whole(tmp_path: Path) -> None:
    """Issue 42 (8): at 60 columns on a terminal, `VALUES_CHECKED` broke into `VALUES_CHE` / `CKED`."""
    import io

    from rich.console import Console

    import kimi_audit
    from kimi_audit.report.table import render_table
    from tiny_checkpoint import build_tiny

    report = kimi_audit.audit(build_tiny(tmp_path / "ckpt"), values=True).audit
    buf = io.StringIO()
    render_table(report, Console(file=buf, width=60, force_terminal=True, color_system=None), plain=False)
    assert "VALUES_CHECKED" in buf.getvalue()


def test_a_page_claims_no_layout_or_index_check_it_did_not_make(tmp_path: Path, tiny_dir: Path) -> None:
    """The "checked" line of a page names the layout only where one was derived, the index only where there is
    one: an undescribed architecture in one file claims neither."""
    import numpy as np
    from safetensors.numpy import save_file

    import kimi_audit

    assert "against the layout, index;" in kimi_audit.audit(tiny_dir).audit.coverage()
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    save_file({"model.embed_tokens.weight": np.zeros((8, 4), np.float32)}, str(tmp_path / "model.safetensors"))
    assert kimi_audit.audit(tmp_path).audit.coverage().startswith("headers; values not read")


@pytest.mark.parametrize(("torch_dtype", "dtype", "version", "mismatches"), [
    ("float16", "bfloat16", "4.51.3", False),   # AutoAWQ under transformers 4.51 over a config transformers 5 wrote
    ("bfloat16", "float16", "5.0.0", False),    # transformers 5 wrote last: its `dtype` decides
    ("float16", "bfloat16", "5.1.0", True),     # ... and a stale `torch_dtype` does not
])
def test_a_config_with_both_dtype_keys_is_read_as_its_last_writer_wrote_it(tmp_path: Path, torch_dtype: str,
                                                                           dtype: str, version: str,
                                                                           mismatches: bool) -> None:
    """config.json with `torch_dtype: float16` and `dtype: bfloat16` (AutoAWQ under transformers 4.51 saving a
    model whose config transformers 5 wrote; its tensors F16): 17 DTYPE_MISMATCH errors on a clean checkpoint.
    The key the last writer wrote decides: transformers >= 5 writes `dtype`, older ones `torch_dtype`."""
    import ml_dtypes
    import numpy as np

    from kimi_audit.replica.tiny import TINY_CONFIG, tiny_shards, write_tiny

    shards = {shard: {k: (v.astype(np.float16) if v.dtype == ml_dtypes.bfloat16 else v) for k, v in members.items()}
              for shard, members in tiny_shards().items()}
    config = {**TINY_CONFIG, "torch_dtype": torch_dtype, "dtype": dtype, "transformers_version": version}
    d = write_tiny(tmp_path / "f16", shards, config)
    doc = json.loads(runner.invoke(app, ["audit", str(d), "--json", "--no-progress"]).stdout)
    codes = [f["code"] for f in doc["findings"]]
    assert ("DTYPE_MISMATCH" in codes) is mismatches, codes
    if not mismatches:
        assert doc["result"]["verdict"] == "PASS", codes
