"""The command line: exit codes, one-line errors, JSON on stdout, the demo."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from kimi_audit.cli import app

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def test_clean_audit_exits_zero_and_prints_the_summary(tiny_dir):
    r = run("audit", str(tiny_dir))
    assert r.exit_code == 0, r.output
    assert "3 MoE blocks × 192 = 576" in r.stdout
    assert "PASS" in r.stdout


def test_json_report_is_stable_and_computed(tiny_dir):
    r = run("audit", str(tiny_dir), "--json", "--no-progress")
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    assert doc["schema"] == "kimi-audit/audit/1"
    assert doc["result"] == {"errors": 0, "warnings": 0, "infos": 0, "fail_on": "error", "exit_code": 0,
                             "verdict": "PASS", "headline": "PASS", "absent_shards": 0, "values_checked": False}
    assert doc["summary"]["tensors"] == 237
    assert [t["line"] for t in doc["q_a_layernorm"]["totals"]] == ["3 MoE blocks × 192 = 576",
                                                                    "1 dense block × 192 = 192"]
    assert len(doc["q_a_layernorm"]["gains"]) == 4


def test_findings_exit_one_with_codes_in_json(tiny_copy):
    (tiny_copy / "model-2-of-3.safetensors").unlink()
    r = run("audit", str(tiny_copy), "--json")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    codes = {f["code"] for f in doc["findings"]}
    assert codes == {"INDEX_SHARD_ABSENT"}  # the absent shard's tensors are its finding's, not one each
    f = next(f for f in doc["findings"] if f["code"] == "INDEX_SHARD_ABSENT")
    assert set(f) == {"code", "severity", "message", "tensor", "shard", "expected", "actual", "covers"}
    assert f["covers"] > 0 and doc["result"]["verdict"] == "PARTIAL"
    assert doc["result"]["headline"] == "PARTIAL: 1 of 3 shards absent" and doc["result"]["absent_shards"] == 1


def test_json_result_follows_fail_on(tiny_copy):
    (tiny_copy / "pytorch_model.bin").write_bytes(b"not inspected")
    lenient = run("audit", str(tiny_copy), "--json")
    strict = run("audit", str(tiny_copy), "--json", "--fail-on", "warning")
    assert (lenient.exit_code, json.loads(lenient.stdout)["result"]["exit_code"]) == (0, 0)
    assert (strict.exit_code, json.loads(strict.stdout)["result"]["exit_code"]) == (1, 1)
    assert json.loads(strict.stdout)["result"]["fail_on"] == "warning"


def test_unusable_input_exits_two_with_one_line(tmp_path):
    for args, needle in [
        (["audit", str(tmp_path / "nope")], "no such file or directory"),
        (["audit", str(tmp_path)], "no config.json"),
    ]:
        r = run(*args)
        assert r.exit_code == 2, r.output
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and needle in lines[0]
        assert "Traceback" not in r.output


def test_invalid_config_exits_two(tiny_copy):
    (tiny_copy / "config.json").write_text("{oops")
    r = run("audit", str(tiny_copy))
    assert r.exit_code == 2 and "config.json is not valid JSON" in r.stderr


def test_module_entry_point_and_help():
    r = subprocess.run([sys.executable, "-m", "kimi_audit", "audit", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0
    assert "--json" in r.stdout and "owner/name" in r.stdout


def test_each_command_is_registered_by_the_module_the_table_names() -> None:
    """main() imports only the invoked command's module (cli.application.COMMAND_MODULES): the table must
    name, for every registered command, the module that registers it, and nothing else."""
    from kimi_audit.cli.application import COMMAND_MODULES

    registered = {(c.name or c.callback.__name__): c.callback.__module__.rsplit(".", 1)[1]
                  for c in app.registered_commands if c.callback is not None}
    assert registered == COMMAND_MODULES


def test_one_command_runs_without_the_other_command_modules(tiny_dir) -> None:
    import subprocess
    import sys

    code = """
import os, sys
def done(c):  # main() ends with os._exit: report what was imported first
    print(sorted(m for m in sys.modules if m.startswith("kimi_audit.cli.")), flush=True)
    raise SystemExit(c)
os._exit = done
sys.argv = ["kimi-audit", "audit", sys.argv[1], "--json", "--no-progress"]
from kimi_audit.cli import main
main()
"""
    out = subprocess.run([sys.executable, "-c", code, str(tiny_dir)], capture_output=True, text=True)
    loaded = out.stdout.strip().splitlines()[-1]
    assert "kimi_audit.cli.audit" in loaded and "kimi_audit.cli.diff" not in loaded and "verify" not in loaded
