"""Every example in docs/ and in every command's --help runs here, as README's do (test_readme_tour.py).

- docs/usage.md's command synopsis: each line, its metavariables bound to a folder of real inputs (the tiny
  checkpoint, a replica, a GGUF set, the loopback Hub), each `a|b` alternative run, an optional group of one word
  (`[DIR]`, `[--json]`) kept and a longer one left out, ends with exit 0 (2 for the unusable input it shows, and
  for `--ray` where no Ray cluster answers, with the one line saying how to start or name one);
  every option a line names, in or out of brackets, is one its command takes; the `demo --model` names it lists
  are the command's.
- The other docs' `sh` blocks (ci.md, verify.md) run line by line in their own folder; usage.md's Python blocks
  run as a script; contributing.md's Python blocks (the worked examples) run as one module in
  tests/test_contributing.py, which audits checkpoints written with what they register; ci.md's `yaml` blocks (a
  workflow using the Action, a .pre-commit-config.yaml) are validated and run by tests/test_action.py and
  tests/test_precommit.py.
- Each command's --help: every `kimi-audit ...` example it quotes, and every option value it gives as an
  example ("e.g. 4GiB"), runs.

A doc example that no longer runs as shown fails here. benchmarks.md's block is the benchmark scripts (whole
processes measured for minutes, run by hand: never a timed test) and architecture.md's block is a drawing; both
are named below as not run."""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

from hub_repos import REPLICA_COMMIT, REPLICA_REPO, TINY_REPO
from hub_server import FakeHub
from kimi_audit.cli import app

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NOT_RUN = {"benchmarks.md": "the benchmark scripts, whole processes run by hand", "architecture.md": "a drawing"}
GGUF_PART = "k2gguf/UD-Q2_K_XL/Kimi-K2-Instruct-UD-Q2_K_XL-00001-of-00008.gguf"
runner = CliRunner()
COMMANDS: dict[str, click.Command] = typer.main.get_command(app).commands  # type: ignore[attr-defined]


def fenced(path: Path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", path.read_text(), re.S)


def command_lines(block: str) -> list[tuple[str, str]]:
    """(command, comment) per command of a block: continuation lines joined, a comment-only line added to the
    comment of the command before it."""
    out: list[tuple[str, str]] = []
    for raw in block.replace("\\\n", " ").splitlines():
        command, _, comment = raw.partition("#")
        if command.strip():
            out.append((command.strip(), comment.strip()))
        elif comment and out:
            out[-1] = (out[-1][0], out[-1][1] + " " + comment.strip())
    return out


def invoke(argv: list[str], where: Path) -> tuple[int, str]:
    """The command as `kimi-audit` runs it, in `where`."""
    here = Path.cwd()
    os.chdir(where)
    try:
        r = runner.invoke(app, argv)
    finally:
        os.chdir(here)
    assert r.exception is None or isinstance(r.exception, SystemExit), (argv, r.exception, r.output[-2000:])
    return r.exit_code, r.output


def options_of(command: str) -> set[str]:
    return {o for p in COMMANDS[command].params for o in (*p.opts, *p.secondary_opts)}


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An HF cache of this test's own: the examples download, and the session's cache stays as other tests expect
    it (empty of what they download themselves)."""
    import huggingface_hub.constants as hc

    home = tmp_path / "hf_home"
    for key, value in (("HF_HOME", home), ("HF_HUB_CACHE", home / "hub")):
        monkeypatch.setenv(key, str(value))
        monkeypatch.setattr(hc, key, str(value))


@pytest.fixture
def hub_with(hub: FakeHub) -> Iterator[FakeHub]:
    """The loopback Hub (TINY_REPO), with whatever repositories a test adds taken away again after it."""
    before = set(hub.repos)
    yield hub
    for repo in set(hub.repos) - before:
        hub.repos.pop(repo)


def scene(where: Path, *steps: list[str]) -> Path:
    where.mkdir()
    for argv in steps:
        code, out = invoke(argv, where)
        assert code == 0, (argv, out[-2000:])
    return where


# --- docs/usage.md's synopsis ------------------------------------------------------------------------------------

BIND = {"PATH": "ckpt", "SOURCE": "ckpt", "CONFIG.json": "ckpt/config.json", "BAD": "no-such-dir",
        "PART.gguf": GGUF_PART, "GGUF": "k2gguf", "OWNER/NAME": TINY_REPO, "REPO": TINY_REPO, "A": "ckpt",
        "B": "copy", "COMPONENT": "q_a_layernorm", "CODE": "SCALE_SHARD_SPLIT"}
"""What each metavariable stands for in the synopsis' folder (ckpt: `demo --tiny ckpt`; copy: a copy of it;
k2gguf: the Kimi-K2-Instruct replica as a GGUF split set; the Hub: the tiny repository)."""
BIND_IN = {("audit", "REPO"): "k2gguf", ("tensor", "NAME"): "model.layers.1.mlp.experts.0.gate_proj",
           ("demo", "NAME"): "kimi-k2-base", ("--against", "GGUF"): "q8", ("--against", "SOURCE"): "src",
           ("--expect-params", "SOURCE"): REPLICA_REPO}
"""Where a line's meaning binds a metavariable otherwise: `--include` picks a set of a folder holding GGUF sets;
a GGUF is held against the checkpoint llama.cpp converted it from (tests/data/gguf's Q8_0 split set and its
source, saved again by its generator), whose values --values reads; the release gates are the pinned model's figures,
held by the pinned repository (the full-scale replica at the loopback Hub)."""


def instances(command: str) -> list[list[str]]:
    """The argv lists one synopsis line stands for: in-word optional suffixes (`[@REV]`, `[:GLOB]`) and `...` left
    out, a bracketed group of one word kept (`[--json|--plain]`: each), a longer one left out, metavariables
    bound, `a|b` each run."""
    text = re.sub(r"(?<=\S)\[[^\]\s]*\]", "", command).replace(" ...", "")
    while (m := re.search(r"\[([^\[\]]*)\]", text)) is not None:
        inner = m.group(1)
        text = text[:m.start()] + (inner if " " not in inner.strip() else "") + text[m.end():]
    words = shlex.split(text)[1:]
    name = words[0]
    context = {name, *(w for w in words if w.startswith("--"))}

    def bound(w: str) -> str:
        for c in context:
            if (c, w) in BIND_IN:
                return BIND_IN[(c, w)]
        return BIND.get(w, w)

    choices = [w.split("|") if "|" in w else [w] for w in words]
    return [[bound(w) for w in combo] for combo in itertools.product(*choices)]


def test_the_synopsis_options_are_the_commands(tmp_path: Path) -> None:
    (block, *_) = fenced(DOCS / "usage.md", "sh")
    lines = command_lines(block)
    assert len(lines) >= 25
    for command, _ in lines:
        words = shlex.split(re.sub(r"[\[\]|]", " ", command))
        assert words[0] == "kimi-audit" and words[1] in COMMANDS, command
        named = {w.split("=")[0] for w in words if w.startswith("--")}
        assert named <= options_of(words[1]), (command, named - options_of(words[1]))
    (models,) = [c for k, c in lines if k.startswith("kimi-audit demo --model")]
    listed = set(re.findall(r"[a-z0-9][a-z0-9.-]+(?=[ ,(]|$)", models.split(":", 1)[1]))
    listed -= {"a", "default", "parts", "split", "set", "gguf"}
    from kimi_audit.replica.models import REPLICA_MODELS

    assert listed == set(REPLICA_MODELS), listed ^ set(REPLICA_MODELS)


@pytest.mark.slow
def test_every_synopsis_line_runs(replica_hub: FakeHub, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    where = scene(tmp_path / "usage", ["demo", "--tiny", "ckpt"],
                  ["demo", "k2gguf", "--model", "kimi-k2-instruct-gguf"])
    shutil.copytree(where / "ckpt", where / "copy")
    shutil.copytree(ROOT / "tests" / "data" / "gguf" / "Q8_0", where / "q8")
    sys.path.insert(0, str(ROOT / "tests" / "writers"))
    import gguf_generate

    gguf_generate.save_source(where / "src", "sigmoid")
    (block, *_) = fenced(DOCS / "usage.md", "sh")
    fresh = itertools.count()
    ran = 0
    for command, _ in command_lines(block):
        for argv in instances(command):
            argv = [f"new-{next(fresh)}" if w in ("DIR", "D") else w for w in argv]
            code, out = invoke(argv, where)
            want = 2 if "no-such-dir" in argv or "--ray" in argv else 0
            assert code == want, (command, argv, code, out[-2000:])
            if "--ray" in argv:  # no Ray cluster runs here: the one line that says how to start or name one
                assert "cannot connect to a Ray cluster" in out and "--ray-address local" in out, out
            assert "Traceback" not in out
            ran += 1
    assert ran >= 35


# --- the other docs' command blocks and usage.md's Python -----------------------------------------------------------


def test_every_docs_block_is_run_or_named_as_not_run() -> None:
    run = {"usage.md", "ci.md", "verify.md", "contributing.md"}  # contributing.md: tests/test_contributing.py
    for page in DOCS.glob("*.md"):
        if re.search(r"^```\w*\n", page.read_text(), re.M):
            assert page.name in run | set(NOT_RUN), page.name


def test_ci_md_runs(hub: FakeHub, tiny_dir: Path, tmp_path: Path) -> None:
    """Its `your-org/your-model` is the tiny checkpoint at the loopback Hub, with a pull request (`refs/pr/1`) of its
    own commit. (Its `yaml` blocks, a workflow and a .pre-commit-config.yaml, are checked and run by
    tests/test_action.py and tests/test_precommit.py.)"""
    hub.add_repo("your-org/your-model", tiny_dir)
    try:
        hub.add_pr("your-org/your-model", tiny_dir, 1)
        where = scene(tmp_path / "ci", ["demo", "--tiny", "ckpt"])
        (block,) = fenced(DOCS / "ci.md", "sh")
        for command, _ in command_lines(block):
            code, out = invoke(shlex.split(command)[1:], where)
            assert code == 0 and json.loads((where / "kimi-audit.sarif").read_text())["runs"], (command, out[-2000:])
    finally:
        hub.repos.pop("your-org/your-model", None)


def test_verify_md_runs(hub_with: FakeHub, tiny_dir: Path, tmp_path: Path) -> None:
    """Its `moonshotai/Kimi-K2-Instruct` is the tiny checkpoint at the loopback Hub under that name (every byte is
    read: the full-scale replica's terabyte is not), downloaded first as "the cached snapshot" says."""
    hub_with.add_repo(REPLICA_REPO, tiny_dir, commit=REPLICA_COMMIT)
    where = scene(tmp_path / "verify", ["demo", "--tiny", "ckpt"], ["download", REPLICA_REPO])
    shutil.copytree(where / "ckpt", where / "copy")
    (block,) = fenced(DOCS / "verify.md", "sh")
    lines = command_lines(block)
    assert len(lines) == 5
    for command, comment in lines:
        code, out = invoke(shlex.split(command)[1:], where)
        if "--ray-address ray://" in command:  # no cluster answers here: the one line the comment promises
            assert code == 2 and "cannot connect to a Ray cluster at ray://head:10001" in out, out[-2000:]
            assert "exit 2" in comment
        else:
            assert code == 0, (command, out[-2000:])


@pytest.mark.slow
def test_usage_md_python_runs(replica_hub: FakeHub, tmp_path: Path) -> None:
    """The first block against the pinned repository (the full-scale replica at the loopback Hub) prints what its
    comment says; the second runs in a folder holding a Kimi-K2 config.json, Kimi-K2.6's and the tiny checkpoint as
./ckpt."""
    from importlib import resources

    where = scene(tmp_path / "py", ["demo", "--tiny", "ckpt"])
    data = resources.files("kimi_audit").joinpath("data")
    (where / "config.json").write_text(data.joinpath("kimi-k2-instruct.config.json").read_text())
    (where / "Kimi-K2.6").mkdir()
    (where / "Kimi-K2.6" / "config.json").write_text(data.joinpath("kimi-k2.6.config.json").read_text())
    first, second = fenced(DOCS / "usage.md", "python")
    imports = first[:first.index("\n\n", first.index("import kimi_audit"))]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for script in (first, imports + "\n" + second):
        r = subprocess.run([sys.executable, "-c", script], cwd=where, capture_output=True, text=True, env=env,
                           timeout=300)
        assert r.returncode == 0, (r.stdout[-1500:], r.stderr[-1500:])
        if script is first:
            assert r.stdout.startswith("PASS 1,026,408,232,448\n") and (where / "report.html").exists()


# --- the examples each command's --help gives ---------------------------------------------------------------------


def help_text(command: str) -> str:
    code, out = invoke([command, "--help"], Path.cwd())
    assert code == 0
    return out


@pytest.mark.slow
def test_every_help_example_runs(hub_with: FakeHub, tmp_path: Path) -> None:
    """The `kimi-audit ...` examples quoted in the commands' --help (COLUMNS wide enough that none is cut), each in
    a folder that holds what it names."""
    from importlib import resources

    data = resources.files("kimi_audit").joinpath("data")
    thinking = tmp_path / "thinking"
    thinking.mkdir()
    (thinking / "config.json").write_text(data.joinpath("kimi-k2-thinking.config.json").read_text())
    hub_with.add_repo("moonshotai/Kimi-K2-Thinking", thinking)
    where = scene(tmp_path / "help", ["demo", "--tiny", "ckpt"], ["demo", "k2gguf", "--model", "kimi-k2-instruct-gguf"],
                  ["download", TINY_REPO, "--local-dir", "DIR", "--headers-only"])
    shutil.move(where / "k2gguf" / "UD-Q2_K_XL", where / "UD-Q2_K_XL")
    shutil.copy(where / "ckpt" / "config.json", where / "config.json")
    (where / "Kimi-K2.6").mkdir()
    (where / "Kimi-K2.6" / "config.json").write_text(data.joinpath("kimi-k2.6.config.json").read_text())
    examples = []
    os.environ["COLUMNS"] = "400"
    try:
        for command in COMMANDS:
            examples += re.findall(r"`(kimi-audit [^`]+)`", help_text(command))
    finally:
        del os.environ["COLUMNS"]
    assert len(set(examples)) >= 5, examples
    for example in dict.fromkeys(examples):
        code, out = invoke(shlex.split(example)[1:], where)
        assert code == 0, (example, out[-2000:])


OPTION_EXAMPLES = {"--include": {"audit": ["k2gguf"], "download": [TINY_REPO, "--local-dir", "dl"]},
                   "--max-read": {"diff": ["ckpt", "copy", "--content"]},
                   "--from-embeddings": {"rmsnorm": ["ckpt"]}}
"""The rest of the command line an option's example value runs in (the folder of test_every_help_example_runs's
kind: the tiny checkpoint, a copy, a GGUF set)."""


@pytest.mark.slow
def test_every_option_example_value_runs(hub_with: FakeHub, tmp_path: Path) -> None:
    where = scene(tmp_path / "options", ["demo", "--tiny", "ckpt"],
                  ["demo", "k2gguf", "--model", "kimi-k2-instruct-gguf"])
    shutil.copytree(where / "ckpt", where / "copy")
    found = []
    for name, command in COMMANDS.items():
        for p in command.params:
            for value in re.findall(r"e\.g\. ('[^']+'|[^\s,;)]+)", getattr(p, "help", None) or ""):
                opt = max(p.opts, key=len)
                if not opt.startswith("--"):
                    continue
                assert opt in OPTION_EXAMPLES and name in OPTION_EXAMPLES[opt], (name, opt, value)
                found.append((name, opt, value.strip("'")))
    assert len(found) >= 4, found
    for name, opt, value in found:
        argv = [name, *OPTION_EXAMPLES[opt][name], opt, value]
        code, out = invoke(argv, where)
        assert code == 0, (argv, out[-2000:])
