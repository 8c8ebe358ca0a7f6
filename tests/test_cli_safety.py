"""The command line is safe to run and to script: demo never clobbers a directory and cleans up after a
signal, unusable input is JSON too under --json, a closed stdout pipe ends quietly, help reads as prose."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from kimi_audit.cli import app
from kimi_audit.cli.application import reflow
from kimi_audit.errors import KimiAuditError

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
COMMANDS = tuple(typer.main.get_command(app).commands)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def cli(*args: str, env: dict[str, str] | None = None):
    return runner.invoke(app, list(args), env=env)


def kimi_audit(*args: str) -> list[str]:
    return [sys.executable, "-m", "kimi_audit", *args]


# --- demo: never overwrite, always clean up ------------------------------------------------------------------


def test_demo_refuses_a_directory_that_holds_files(tmp_path):
    target = tmp_path / "checkpoint"
    target.mkdir()
    precious = {"config.json": b'{"precious": true}', "model-1-of-61.safetensors": os.urandom(4096)}
    for name, data in precious.items():
        (target / name).write_bytes(data)
    before = {p.name: p.stat().st_mtime_ns for p in target.iterdir()}
    for extra in ([], ["--json"]):
        r = cli("demo", str(target), *extra)
        assert r.exit_code == 2, r.output
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "not empty" in lines[0] and "--force" in lines[0]
    assert json.loads(r.stdout)["error"]["code"] == "DIRECTORY_NOT_EMPTY"
    assert {p.name: p.read_bytes() for p in target.iterdir()} == precious  # byte-identical, nothing added
    assert {p.name: p.stat().st_mtime_ns for p in target.iterdir()} == before


def test_demo_refuses_a_file_even_with_force(tmp_path):
    target = tmp_path / "a-file"
    target.write_bytes(b"keep")
    r = cli("demo", str(target), "--force")
    assert r.exit_code == 2 and "not a directory" in r.stderr
    assert target.read_bytes() == b"keep"


def test_demo_tiny_force_leaves_other_safetensors_files_alone(tmp_path):
    """--force promises that only the checkpoint's own names are written: a user's other safetensors file in DIR
    (write_tiny once removed every *.safetensors there) keeps its bytes."""
    target = tmp_path / "mine"
    target.mkdir()
    (target / "adapter.safetensors").write_bytes(b"precious")
    r = cli("demo", "--tiny", str(target), "--force")
    assert (target / "adapter.safetensors").read_bytes() == b"precious"
    assert r.exit_code == 1 and "adapter.safetensors" in r.stdout  # the audit that follows sees it beside the set


@pytest.mark.slow
def test_demo_force_writes_only_the_replica_files_and_never_through_a_link(tmp_path):
    """--force replaces the replica's own names and nothing else. A name planted in DIR as a symlink or a hard
    link to a file outside is replaced by a new file (the outside files keep their bytes), and a link planted
    as the fixed temporary name of old, `<shard>.partial`, is never written through."""
    target = tmp_path / "mixed"
    target.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    victims = {name: outside / name for name in ("config", "shard", "linked")}
    for path in victims.values():
        path.write_bytes(b"precious " + path.name.encode())
    (target / "notes.txt").write_text("mine")
    (target / "config.json").symlink_to(victims["config"])
    (target / "model-1-of-61.safetensors").symlink_to(victims["shard"])
    (target / "model-2-of-61.safetensors.partial").symlink_to("notes.txt")
    os.link(victims["linked"], target / "model-3-of-61.safetensors")
    r = cli("demo", str(target), "--force")
    assert r.exit_code == 0, r.output
    assert "1,026,408,232,448" in r.stdout
    assert "60 MoE blocks × 1,536 = 92,160" in r.stdout and "1 dense block × 1,536 = 1,536" in r.stdout
    assert {p.name: p.read_bytes() for p in victims.values()} == {
        p.name: b"precious " + p.name.encode() for p in victims.values()}
    assert (target / "notes.txt").read_text() == "mine"
    assert json.loads((target / "config.json").read_text())["model_type"] == "kimi_k2"
    for name in ("config.json", "model-1-of-61.safetensors", "model-3-of-61.safetensors"):
        path = target / name
        assert not path.is_symlink() and path.stat().st_nlink == 1, name
    names = {p.name for p in target.iterdir()} - {"notes.txt", "config.json", "model.safetensors.index.json",
                                                  "model-2-of-61.safetensors.partial"}
    assert names == {f"model-{i}-of-61.safetensors" for i in range(1, 62)}


def _no_sigint_ignored() -> None:  # a test runner started in the background may pass SIGINT on ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow  # starts a full-scale build (in a subprocess)
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_demo_removes_its_temporary_directory(tmp_path, sig, code):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}
    returncode, err = _signal_once(kimi_audit("demo"), env, lambda: any(tmp.glob("kimi-audit-demo-*")), sig,
                                   "demo never made its temporary directory")
    assert returncode == code, err
    assert b"Traceback" not in err
    assert list(tmp.iterdir()) == []


def _signal_once(argv: list[str], env: dict[str, str], ready: Callable[[], bool], sig: int,
                 never: str) -> tuple[int, bytes]:
    """Run `argv`, send it `sig` once `ready()` holds (at most 60 s: else `never`), and return its exit code and
    stderr (the process killed if it outlives the test)."""
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         preexec_fn=_no_sigint_ignored)
    try:
        deadline = time.monotonic() + 60
        while not ready():
            assert p.poll() is None, p.stderr.read() if p.stderr else ""
            assert time.monotonic() < deadline, never
            time.sleep(0.005)
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, err


@pytest.mark.slow  # starts a full-scale build (in a subprocess)
@pytest.mark.parametrize(("sig", "code", "existed"), [(signal.SIGINT, 130, False), (signal.SIGTERM, 143, True)])
def test_an_interrupted_demo_dir_leaves_none_of_its_files(tmp_path, sig, code, existed):
    """`kimi-audit demo DIR` interrupted while it built left a partial replica in DIR, and the next run refused
    DIR (not empty) without --force. The build takes back what it wrote: a DIR it made is gone, one that was
    there (empty) is empty again, and the same command then runs."""
    target = tmp_path / "replica"
    if existed:
        target.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    returncode, err = _signal_once(kimi_audit("demo", str(target)), env,
                                   lambda: len(list(target.glob("model-*.safetensors"))) >= 3, sig,
                                   "demo never wrote its shards")
    assert returncode == code and b"Traceback" not in err, err
    assert (list(target.iterdir()) == []) if existed else not target.exists()
    r = cli("demo", str(target))
    assert r.exit_code == 0, r.output


def test_an_interrupted_tiny_build_takes_back_only_its_own_files(tmp_path, monkeypatch):
    """The tiny checkpoint interrupted after its first file (Ctrl-C): none of its files stay; a file that was
    in the folder before stays, byte for byte."""
    import kimi_audit.replica.tiny as tiny

    target = tmp_path / "t"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    written = []

    def interrupted(path, data, *args, **kw):
        if written:
            raise KeyboardInterrupt
        written.append(path)
        return write_atomic(path, data, *args, **kw)

    write_atomic = tiny.write_atomic
    monkeypatch.setattr(tiny, "write_atomic", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tiny.build_tiny(target)
    assert written and [p.name for p in target.iterdir()] == ["notes.txt"]
    assert (target / "notes.txt").read_text() == "mine"


# --- unusable input under --json: the error as JSON on stdout -------------------------------------------------


@pytest.mark.parametrize("args", [
    ["audit", "{nope}", "--json"],
    ["audit", "{nope}", "--format", "json"],
    ["params", "{nope}", "--json"],
    ["explain", "{nope}", "q_a_layernorm", "--json"],
    ["diff", "{nope}", "{nope}", "--json"],
    ["rmsnorm", "{nope}", "--json"],
    ["tensor", "{nope}", "model.norm.weight", "--json"],
])
def test_unusable_input_is_a_json_error_on_stdout(tmp_path, args):
    nope = str(tmp_path / "no-such-checkpoint")
    r = cli(*[nope if a == "{nope}" else a for a in args])
    assert r.exit_code == 2, r.output
    doc = json.loads(r.stdout)
    assert doc["exit_code"] == 2 and set(doc) == {"error", "exit_code"}
    assert doc["error"]["code"] == "FILE_MISSING" and "no such file or directory" in doc["error"]["message"]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:")


def test_invalid_config_and_bad_options_have_stable_codes(tiny_copy):
    r = cli("audit", str(tiny_copy), "--json", "--fail-on", "never")
    assert (r.exit_code, json.loads(r.stdout)["error"]["code"]) == (2, "UNUSABLE_INPUT")
    (tiny_copy / "config.json").write_text("{oops")
    r = cli("audit", str(tiny_copy), "--json")
    assert (r.exit_code, json.loads(r.stdout)["error"]["code"]) == (2, "CONFIG_INVALID")
    r = cli("audit", str(tiny_copy))  # no --json: stdout stays empty
    assert r.exit_code == 2 and r.stdout == ""


def _subclasses(cls: type) -> list[type]:
    return [cls, *(s for sub in cls.__subclasses__() for s in _subclasses(sub))]


def test_every_error_class_has_its_own_stable_code():
    import kimi_audit.model.quant.scheme
    import kimi_audit.numerics.dtypes
    import kimi_audit.numerics.tensor_io
    import kimi_audit.sources.hub_errors  # noqa: F401

    codes = {c.__name__: c.code for c in _subclasses(KimiAuditError)}
    assert len(set(codes.values())) == len(codes), codes
    assert all(re.fullmatch(r"[A-Z][A-Z0-9_]*", code) for code in codes.values()), codes
    assert codes["KimiAuditError"] == "UNUSABLE_INPUT" and codes["ConfigError"] == "CONFIG_INVALID"
    assert codes["SourceError"] == "SOURCE_UNREADABLE" and codes["RepoNotFoundError"] == "HUB_REPO_NOT_FOUND"
    assert codes["TensorNotFoundError"] == "TENSOR_NOT_FOUND"  # derived from the name where none is set


# --- a closed stdout pipe --------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [["--json"], []])
def test_a_closed_stdout_pipe_ends_quietly(tiny_dir, fmt):
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will ever read: the first write fails
    try:
        p = subprocess.run(kimi_audit("audit", str(tiny_dir), *fmt), stdout=write_end, stderr=subprocess.PIPE,
                           timeout=120)
    finally:
        os.close(write_end)
    assert (p.returncode, p.stderr) == (141, b"")


def test_head_of_a_pipeline_ends_quietly(tiny_dir):
    p = subprocess.run(["bash", "-c", '"$@" | head -1; echo "status ${PIPESTATUS[0]}" >&2', "sh",
                        *kimi_audit("audit", str(tiny_dir), "--json")], capture_output=True, text=True, timeout=120)
    assert p.stdout == "{\n"
    assert re.fullmatch(r"status (0|141)\n", p.stderr), p.stderr  # nothing else: no traceback, no "ignored"


# --- help: prose, and flags shown as flags ---------------------------------------------------------------------


def _help(*args: str, columns: int) -> str:
    r = cli(*args, "--help", env={"COLUMNS": str(columns)})  # (typer reads TERMINAL_WIDTH once: not that)
    assert r.exit_code == 0, r.output
    return ANSI.sub("", r.stdout)


@pytest.mark.parametrize("columns", [80, 200])
@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_shows_flags_as_flags(command, columns):
    text = _help(*([command] if command else []), columns=columns)
    assert "<bool>" not in text and "--help" in text


def test_top_level_help_lists_each_command_in_one_sentence():
    text = _help(columns=200)
    rows = {m[1]: m[2].strip() for m in re.finditer(r"^│ (\w+) +(.*?)│$", text, re.M) if m[1] in COMMANDS}
    assert set(rows) == set(COMMANDS), text
    for command, row in rows.items():
        assert row.endswith("."), (command, row)
        assert f"│ {command} " in text and f"{row}" in text
    continuation = re.findall(r"^│ {4,}\S.*│$", text[text.index("Commands"):], re.M)
    assert continuation == [], continuation  # each command's short help fits on its one row


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_paragraphs_break_only_where_the_width_runs_out(command):
    columns = 200
    text = _help(*([command] if command else []), columns=columns)
    prose = text.split("╭", 1)[0].splitlines()[2:]  # the description, between the usage line and the panels
    for line, following in itertools.pairwise(prose):
        if line.strip() and following.strip():  # inside a paragraph: a wrap, not a newline from the source
            assert len(line.rstrip()) + 1 + len(following.split()[0]) > columns - 2, (line, following)


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_at_80_columns_leaves_the_descriptions_room(command):
    """At 80 columns typer's six option columns left the descriptions 18-24 (`audit --help` 99 lines, `verify
    --help` 118): the names and value in one column (cli/help.py), each description at least 40 columns wide."""
    text = _help(*([command] if command else []), columns=80)
    panel = re.search(r"^╭─ Options ─+╮$(.*?)^╰", text, re.M | re.S)
    assert panel is not None, text
    rows = [line[2:-2] for line in panel[1].strip("\n").splitlines()]
    start = next(row.index("Show this message") for row in rows if "Show this message" in row)
    assert 80 - 4 - start >= 40, (command, start)  # the description column: where --help's text starts
    assert all(row[start - 1] == " " for row in rows), rows  # every description in that column
    assert max(map(len, text.splitlines())) <= 80
    limits = {"audit": 75, "verify": 65}
    if command in limits:
        assert len(text.splitlines()) <= limits[command], len(text.splitlines())


def test_help_names_what_the_tool_reads():
    """The top-level help said "Audit a Kimi-K2 / DeepseekV3 safetensors checkpoint"; verify's SOURCE left GGUF
    out; its --json schema read `kimi-audit verify/1`."""
    top = " ".join(_help(columns=200).split())
    assert "DeepseekV3 safetensors" not in top and "GGUF" in top
    verify = " ".join(_help("verify", columns=200).split())
    assert "a GGUF file (any part of a split set)" in verify and "(schema: kimi-audit/verify/1)" in verify


def test_help_text_is_not_taken_for_markup():
    assert "`owner/name[@revision]`" in _help("audit", columns=200)
    assert "`owner/name[@revision]`" in _help("diff", columns=200)


def test_reflow_joins_paragraph_lines_and_keeps_verbatim_blocks():
    assert reflow("One\n    two.\n\n    Three\n    four.") == "One two.\n\nThree four."
    assert reflow("A.\n\n\b\nkeep\nthis") == "A.\n\n\b\nkeep\nthis"


def test_json_is_a_flag(tiny_dir):
    r = cli("audit", str(tiny_dir), "--json", "--no-progress")
    assert r.exit_code == 0 and json.loads(r.stdout)["result"]["verdict"] == "PASS"
    r = cli("audit", str(tiny_dir), "--json", "true")
    assert r.exit_code == 2  # a flag takes no value: `true` is an extra argument
    r = cli("params", str(tiny_dir), "--json", "--no-progress")
    assert r.exit_code == 0 and json.loads(r.stdout)


_INTERRUPT_AT_IMPORT = """
import os, runpy, signal, sys

at, log = sys.argv.pop(1), sys.argv.pop(1)


class Interrupt:  # Ctrl-C at the instant the module named `at` is looked for; every import written to `log`
    def find_spec(self, name, path=None, target=None):
        with open(log, "a") as f:
            f.write(name + "\\n")
        if name == at:
            os.kill(os.getpid(), signal.SIGINT)
        return None


sys.meta_path.insert(0, Interrupt())
sys.argv[0] = "kimi_audit"
runpy._run_module_as_main("kimi_audit")  # what `python -m kimi_audit` runs, once the interpreter has started
"""


def _interrupt_python_m_at_import(at: str, tmp_path: Path) -> tuple[int, bytes, list[str]]:
    log = tmp_path / f"imports-{at}.txt"
    r = subprocess.run([sys.executable, "-c", _INTERRUPT_AT_IMPORT, at, str(log), "demo", "--tiny",
                        str(tmp_path / f"t-{at}")], env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_no_sigint_ignored, timeout=120)
    return r.returncode, r.stderr, list(dict.fromkeys(log.read_text().split()))  # runpy looks the package up twice


def test_ctrl_c_while_python_m_loads_the_command_line_is_one_line_exit_130(tmp_path):
    """`python -m kimi_audit` imported typing (~2.4 ms, in kimi_audit/__init__.py) and the command line before
    main() could answer Ctrl-C: a KeyboardInterrupt traceback 1 run in 5 under load (SIGINT 50 ms after the
    spawn). Now the package's root imports only kimi_audit.constants before kimi_audit/__main__.py runs, and
    from its first line on, Ctrl-C at any import before main() answers is one line, exit 130. (Before that, the
    interpreter's own startup and runpy: no code of the package can run there.)"""
    code, err, imports = _interrupt_python_m_at_import("-", tmp_path)  # no interrupt: the imports, in order
    assert code == 0, err
    start = imports.index("kimi_audit")
    main = imports.index("kimi_audit.__main__")
    assert imports[start:main] == ["kimi_audit", "kimi_audit.constants"], imports[start:main]
    answered = imports.index("kimi_audit.cli.application")  # main() imports it inside its own handling
    assert main < answered
    for at in imports[main + 1:answered + 1]:
        code, err, _ = _interrupt_python_m_at_import(at, tmp_path)
        assert code == 130 and err == b"interrupted\n", (at, code, err)


@pytest.mark.parametrize("after", [0.05, 0.25, 0.5])
def test_ctrl_c_while_the_command_line_loads_is_one_line_exit_130(tmp_path, after):
    """SIGINT in the first instant (the app's modules still loading): exit 130 and at most one line, never the
    KeyboardInterrupt traceback. Timed from the end of the interpreter's own startup (`-X importtime`'s line for
    site): timed from the spawn, a loaded machine could still be in site at 50 ms (the .pth files), a traceback
    no code of the package can prevent; the instants right after it are
    test_ctrl_c_while_python_m_loads_the_command_line_is_one_line_exit_130's."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-X", "importtime", *kimi_audit("demo", "--tiny", str(tmp_path / "t"))[1:]],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_no_sigint_ignored)
    assert p.stderr is not None
    for line in p.stderr:
        if line.split()[-1:] == [b"site"]:
            break
    time.sleep(after)
    p.send_signal(signal.SIGINT)
    _, rest = p.communicate(timeout=60)
    err = b"".join(line for line in rest.splitlines(keepends=True) if not line.startswith(b"import time:"))
    assert b"Traceback" not in err and len(err.splitlines()) <= 1, err
    assert p.returncode in (130, 0)  # 0: it finished before the signal
