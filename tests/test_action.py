"""The GitHub Action (action.yml), its self-test workflow and docs/ci.md's workflow: valid against GitHub's schemas
(check-jsonschema's builtin copies, read offline), and the Action's composite steps run here as the runner runs them.

`run_action` reads action.yml, and for each `run:` step substitutes the `${{ ... }}` expressions the runner would
(`inputs.NAME`, with the input's default when not given; `github.action_path`; `steps.ID.outputs.NAME`;
`steps.ID.outcome`: `substitute` refuses any other form, so the Action cannot come to use one this test does not
model), then runs the script with `bash --noprofile --norc -eo pipefail` (GitHub's `shell: bash`) in a workspace
folder, with GITHUB_OUTPUT and GITHUB_STEP_SUMMARY files and RUNNER_TEMP, and the step's `env:`. One step is not
run: SKIPPED_STEPS names it and why (the install, whose one output is set to this test's own virtualenv)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
ACTION = ROOT / "action.yml"
SELFTEST = ROOT / ".github" / "workflows" / "action-selftest.yml"
BIN = Path(sys.executable).parent
SKIPPED_STEPS = {"install": "kimi-audit is installed in this test's virtualenv already (pip install of the package "
                            "and its dependencies is not what is tested): the step's one output, `bin`, is set to "
                            "that virtualenv's bin folder, which holds kimi-audit and the python it runs on"}
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def substitute(text: str, context: dict[str, Any]) -> str:
    """`${{ expr }}` as GitHub's runner evaluates the forms the Action and workflows use: a property path into the
    context (a missing input or output is the empty string, as GitHub makes it). Any other expression (operators,
    functions, literals) is refused: this substituter does not model it."""
    def value(m: re.Match[str]) -> str:
        expr = m.group(1)
        if not re.fullmatch(r"(inputs\.[A-Za-z_][\w-]*|github\.action_path|steps\.[A-Za-z_][\w-]*\.(outputs\.[\w-]+"
                            r"|outcome))", expr):
            raise AssertionError(f"an expression this test does not model: {expr!r}")
        node: Any = context
        for part in expr.split("."):
            node = node.get(part, "") if isinstance(node, dict) else ""
        return str(node)
    return EXPRESSION.sub(value, text)


def read_outputs(path: Path) -> dict[str, str]:
    """A GITHUB_OUTPUT file: `name=value` lines and the multiline `name<<DELIMITER ... DELIMITER` form."""
    out: dict[str, str] = {}
    lines = iter(path.read_text().splitlines())
    for line in lines:
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, mark = line.split("<<", 1)
            body = []
            for inner in lines:
                if inner == mark:
                    break
                body.append(inner)
            out[name] = "\n".join(body)
        elif line:
            name, _, value = line.partition("=")
            out[name] = value
    return out


def run_script(script: str, env: dict[str, str], where: Path, tmp: Path) -> int:
    """One `shell: bash` step as GitHub runs it: the script in a file, `bash --noprofile --norc -eo pipefail`."""
    path = tmp / f"step-{len(list(tmp.glob('step-*')))}.sh"
    path.write_text(script)
    r = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(path)], cwd=where, env=env,
                       capture_output=True, text=True, timeout=300)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    return r.returncode


def runner_env(where: Path, tmp: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "HF_HOME", "HF_HUB_CACHE",
                                                         "HF_ENDPOINT", "HF_HUB_OFFLINE", "NO_PROXY", "no_proxy")}
    return {**keep, "GITHUB_OUTPUT": str(tmp / "output"), "GITHUB_STEP_SUMMARY": str(tmp / "summary"),
            "RUNNER_TEMP": str(tmp), "GITHUB_WORKSPACE": str(where), "CI": "true", "GITHUB_ACTIONS": "true"}


def run_action(where: Path, inputs: dict[str, str], tmp: Path) -> tuple[int, dict[str, str], str]:
    """action.yml's steps with these inputs, in `where`: (exit status, the Action's outputs, the job summary)."""
    action = yaml.safe_load(ACTION.read_text())
    given = {name: str(inputs.get(name, spec.get("default", ""))) for name, spec in action["inputs"].items()}
    assert set(inputs) <= set(action["inputs"]), set(inputs) - set(action["inputs"])
    tmp.mkdir(parents=True, exist_ok=True)
    summary = tmp / "summary"
    summary.write_text("")
    context: dict[str, Any] = {"inputs": given, "github": {"action_path": str(ROOT)}, "steps": {}}
    code = 0
    for step in action["runs"]["steps"]:
        assert step["shell"] == "bash" and "run" in step, step
        if step.get("id") in SKIPPED_STEPS:
            assert '"${{ github.action_path }}"' in step["run"]  # it installs the Action's own checkout
            context["steps"][step["id"]] = {"outputs": {"bin": str(BIN)}, "outcome": "success"}
            continue
        env = runner_env(where, tmp)
        (tmp / "output").write_text("")
        env.update({k: substitute(str(v), context) for k, v in (step.get("env") or {}).items()})
        code = run_script(substitute(step["run"], context), env, where, tmp)
        if "id" in step:
            context["steps"][step["id"]] = {"outputs": read_outputs(tmp / "output"),
                                            "outcome": "success" if code == 0 else "failure"}
        if code != 0:
            break
    outputs = {name: substitute(spec["value"], context) for name, spec in action["outputs"].items()}
    return code, outputs, summary.read_text()


def kimi_audit(*argv: str, where: Path) -> int:
    return subprocess.run([str(BIN / "kimi-audit"), *argv], cwd=where, capture_output=True, timeout=300).returncode


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's tiny checkpoint, clean (`tiny`) and broken (`broken`: one NaN gain, found by --values)."""
    where = tmp_path_factory.mktemp("workspace")
    assert kimi_audit("demo", "--tiny", "tiny", where=where) == 0
    assert kimi_audit("demo", "--tiny", "broken", "--fault", "nan-gain", where=where) == 1
    return where


# --- the schemas ----------------------------------------------------------------------------------------------------


def check_jsonschema(schema: str, *paths: Path) -> None:
    exe = shutil.which("check-jsonschema", path=str(BIN))
    if exe is None:
        pytest.skip("check-jsonschema is not installed (pip install -e '.[test]')")
    # Offline: the builtin schemas ship inside the package (no proxy answers, so a fetch would fail the run).
    env = {**os.environ, "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": ""}
    r = subprocess.run([exe, "--builtin-schema", schema, *map(str, paths)], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def docs_workflows() -> list[str]:
    """docs/ci.md's workflows (its other yaml block is a .pre-commit-config.yaml: tests/test_precommit.py)."""
    return [b for b in re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "ci.md").read_text(), re.S)
            if "\njobs:" in b]


def test_the_action_and_the_workflows_are_valid(tmp_path: Path) -> None:
    check_jsonschema("vendor.github-actions", ACTION)
    workflows = [SELFTEST]
    for i, text in enumerate(docs_workflows()):
        workflows.append(tmp_path / f"ci-md-{i}.yml")
        workflows[-1].write_text(text)
    assert len(workflows) >= 2
    check_jsonschema("vendor.github-workflows", *workflows)


def test_the_schema_check_rejects_a_broken_action(tmp_path: Path) -> None:
    bad = tmp_path / "action.yml"
    bad.write_text(ACTION.read_text().replace("using: composite", "using: compost"))
    with pytest.raises(AssertionError):
        check_jsonschema("vendor.github-actions", bad)


def uses_of_the_action(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for job in workflow["jobs"].values() for s in job["steps"]
            if s.get("uses") == "./" or "kimi-audit@" in str(s.get("uses", ""))]


@pytest.mark.parametrize("which", ["selftest", "ci.md"])
def test_the_workflows_give_the_action_its_inputs_and_upload_its_sarif(which: str) -> None:
    action = yaml.safe_load(ACTION.read_text())
    texts = [SELFTEST.read_text()] if which == "selftest" else docs_workflows()
    for text in texts:
        workflow = yaml.safe_load(text)
        assert workflow["permissions"]["security-events"] == "write"
        steps = uses_of_the_action(workflow)
        assert steps, text
        for step in steps:
            assert set(step["with"]) <= set(action["inputs"]), set(step["with"]) - set(action["inputs"])
            assert "source" in step["with"]
        uploads = [s for job in workflow["jobs"].values() for s in job["steps"]
                   if str(s.get("uses", "")).startswith("github/codeql-action/upload-sarif@")]
        assert uploads and all(re.fullmatch(r"\$\{\{ steps\.[\w-]+\.outputs\.sarif \}\}", u["with"]["sarif_file"])
                               for u in uploads)
        for m in re.finditer(r"steps\.([\w-]+)\.outputs\.([\w-]+)", text):
            if any(s.get("id") == m.group(1) for s in steps):
                assert m.group(2) in action["outputs"], m.group(0)
    if which == "selftest":
        assert [s["uses"] for s in uses_of_the_action(yaml.safe_load(SELFTEST.read_text()))] == ["./", "./"]
        assert "kimi-audit demo --tiny tiny" in SELFTEST.read_text()


# --- the composite steps, run -----------------------------------------------------------------------------------


def test_a_clean_checkpoint_passes_the_gate(workspace: Path, tmp_path: Path) -> None:
    code, out, summary = run_action(workspace, {"source": "tiny", "values": "true", "expect-params": "6212056",
                                                "sarif": "clean.sarif", "junit": "clean.xml",
                                                "html": "clean.html"}, tmp_path)
    assert code == 0, out
    assert out["verdict"] == "PASS" and out["exit-code"] == "0" and out["parameters"] == "6212056"
    assert out["sarif"] == "clean.sarif" and out["junit"] == "clean.xml" and out["html"] == "clean.html"
    assert out["revision"] == ""
    assert {r["level"] for r in json.loads((workspace / "clean.sarif").read_text())["runs"][0]["results"]} == {"note"}
    assert ET.parse(workspace / "clean.xml").getroot().get("failures") == "0"
    assert (workspace / "clean.html").read_text().startswith("<!DOCTYPE html>")
    assert json.loads(Path(out["json"]).read_text())["result"]["verdict"] == "PASS"  # a temporary file
    assert summary.startswith("## kimi-audit: ✅ PASS") and summary.count("## kimi-audit") == 1


def test_a_broken_checkpoint_fails_the_gate_with_its_outputs_set(workspace: Path, tmp_path: Path) -> None:
    code, out, summary = run_action(workspace, {"source": "broken", "values": "true", "sarif": "broken.sarif",
                                                "junit": "broken.xml", "json": "broken.json"}, tmp_path)
    assert code == 1
    assert out["verdict"] == "FAIL" and out["exit-code"] == "1" and out["parameters"] == "6212056"
    (result,) = [r for r in json.loads((workspace / "broken.sarif").read_text())["runs"][0]["results"]
                 if r["level"] == "error"]
    assert result["ruleId"] == "VALUE_NAN"
    assert ET.parse(workspace / "broken.xml").getroot().get("failures") == "1"
    assert out["json"] == "broken.json" and (workspace / "broken.json").exists()
    assert summary.startswith("## kimi-audit: ❌ FAIL") and "`VALUE_NAN`" in summary


def test_the_action_passes_every_input_through(workspace: Path, tmp_path: Path) -> None:
    """--ignore, one rule a line; --fail-on; --expect-params as a gate; summary: false leaves the summary alone."""
    code, out, summary = run_action(workspace, {"source": "broken", "values": "true", "sarif": "", "junit": "",
                                                "ignore": "VALUE_NAN\nGAIN_ALL_ZERO\n", "summary": "false"},
                                    tmp_path / "a")
    data = json.loads(Path(out["json"]).read_text())
    assert code == 0 and out["verdict"] == "PASS" and summary == "" and out["sarif"] == ""
    assert [f["code"] for f in data["ignored"]] == ["VALUE_NAN"]
    assert "GAIN_ALL_ZERO" in next(f["message"] for f in data["findings"] if f["code"] == "IGNORE_UNUSED")
    code, out, _ = run_action(workspace, {"source": "tiny", "expect-params": "1000", "fail-on": "warning"},
                              tmp_path / "b")
    assert code == 1 and out["verdict"] == "FAIL"
    assert json.loads(Path(out["json"]).read_text())["result"]["fail_on"] == "warning"
    code, out, _ = run_action(workspace, {"source": "tiny", "values": "yes"}, tmp_path / "c")
    assert code == 2 and out["verdict"] == ""  # a malformed input: refused before the audit ran


def test_an_unusable_input_is_exit_2_with_its_reports(workspace: Path, tmp_path: Path) -> None:
    code, out, summary = run_action(workspace, {"source": "no-such-dir", "sarif": "none.sarif",
                                                "junit": "none.xml"}, tmp_path)
    assert code == 2 and out["verdict"] == "ERROR" and out["parameters"] == "" and out["exit-code"] == "2"
    assert json.loads((workspace / "none.sarif").read_text())["runs"][0]["invocations"][0][
        "executionSuccessful"] is False
    assert ET.parse(workspace / "none.xml").getroot().get("errors") == "1"
    assert summary.startswith("## kimi-audit: ❌ the input could not be audited (exit 2)") and "no-such-dir" in summary


def test_the_substituter_refuses_what_it_does_not_model() -> None:
    with pytest.raises(AssertionError):
        substitute("${{ inputs.a && 'x' }}", {"inputs": {"a": "1"}})
    assert substitute("${{ inputs.a-b }}/${{ inputs.none }}", {"inputs": {"a-b": "1"}}) == "1/"
