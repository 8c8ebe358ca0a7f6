"""The Typer app and what every command shares: consoles, error handling, progress.

Each command is a thin shell: parse options, open a source, call the core, render. Errors that make
the input unusable are KimiAuditError: one line on stderr (and, under --json, a JSON error on stdout),
exit code 2. Findings exit 1. A closed stdout pipe exits 141, quietly; a stdout that cannot be written
(closed with `>&-`, a full disk, `/dev/full`) exits 120 with one line on stderr, as Python itself exits when
it cannot flush stdout.
"""

from __future__ import annotations

import errno
import functools
import importlib
import inspect
import io
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from kimi_audit.cli.coercion import plain_coercion
from kimi_audit.cli.help import compact, compact_help
from kimi_audit.constants import VERSION
from kimi_audit.errors import KimiAuditError
from kimi_audit.text import clip, printable

# What a process killed by SIGPIPE reports in a shell (`git log | head -1` does the same).
EXIT_BROKEN_PIPE = 141
# What Python exits with when it cannot flush stdout at exit (`python -c 'print(1)' > /dev/full`).
EXIT_STDOUT_FAILED = 120


class StdoutError(OSError):
    """stdout cannot be written (closed, full, an I/O error): not the reader going away (BrokenPipeError)."""


class _StdoutFile(io.FileIO):
    """File descriptor 1, whose write errors other than a broken pipe are StdoutError."""

    def write(self, b: ReadableBuffer, /) -> int:
        try:
            return super().write(b)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise StdoutError(e.errno, f"cannot write to stdout: {e.strerror or e}") from None


class _ClosedStdout(io.TextIOBase):
    """sys.stdout when file descriptor 1 is closed (`>&-`; Python sets sys.stdout to None)."""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        raise StdoutError(errno.EBADF, "cannot write to stdout: it is closed")


def checked_stdout() -> None:
    """Replace sys.stdout (in the command line's own process) by one whose write failures are StdoutError,
    so that main() can tell them from any other error: same encoding, errors and line buffering."""
    old = sys.stdout
    try:
        raw = _StdoutFile(1, "w", closefd=False)
    except (OSError, ValueError):
        sys.stdout = _ClosedStdout()
        return
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(raw), encoding=getattr(old, "encoding", None) or "utf-8",
                                  errors=getattr(old, "errors", None) or "strict",
                                  line_buffering=bool(getattr(old, "line_buffering", False)))


def reflow(text: str | None) -> str | None:
    """Join the lines of each paragraph (a paragraph starting with \\b is kept as written).

    Typer's rich help keeps single line breaks of a docstring, so a paragraph wrapped at the source's
    width would show broken mid-sentence at any other terminal width.
    """
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(line.strip() for line in p.splitlines())
                       for p in paragraphs)


def plain_flags(params: list[Any]) -> list[Any]:
    """Show boolean flags without a value placeholder (typer 0.29 prints `--json <bool>`, yet takes no value),
    and arguments in the usage line as `SOURCE` / `[SOURCE]` (typer 0.29 prints a required one `{source}`)."""
    for p in params:
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""
        if callable(getattr(p, "_usage_display_name", None)) and "_usage_display_name" not in vars(p):
            p._usage_display_name = _usage_name(p)
    return params


def _usage_name(param: Any) -> Callable[[], str]:
    def name() -> str:
        shown = str(param.metavar or param.display_name_raw).upper()
        shown = shown if param.required else f"[{shown}]"
        return shown + ("..." if param.nargs != 1 else "")

    return name


class HelpGroup(TyperGroup):
    """Typer's group, with every command's help read as sentences and its flags shown as flags.

    Help texts are plain prose: their paragraphs are reflowed and anything that looks like rich markup
    (`owner/name[@revision]`) is escaped, once, when typer builds the group; str, bool and Path parameters are
    coerced without typer's pydantic adapters (cli/coercion.py). (Click's types are `Any` here: typer 0.29 vendors
    its own click, older typers use click's.)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for cmd in (self, *self.commands.values()):
            cmd.help, cmd.short_help = _prose(cmd.help), _prose(cmd.short_help)
            plain_coercion(cmd.params)  # str, bool and Path values without pydantic (cli/coercion.py)
            for param in plain_flags(cmd.params):
                if getattr(param, "help", None):
                    param.help = escape(param.help)
            if cmd is not self:  # options in two columns, readable at 80 (cli/help.py)
                cmd.format_help = compact(cmd.format_help)  # type: ignore[method-assign,assignment]

    def format_help(self, ctx: Any, formatter: Any) -> None:
        with compact_help():
            super().format_help(ctx, formatter)

    def get_params(self, ctx: Any) -> list[Any]:
        params = plain_flags(super().get_params(ctx))
        plain_coercion(params)
        return params

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None and (help_option := cmd.get_help_option(ctx)) is not None:
            plain_coercion(plain_flags([help_option]))
        return cmd


def _prose(text: str | None) -> str | None:
    return escape(reflowed) if (reflowed := reflow(text)) else reflowed


app = typer.Typer(
    cls=HelpGroup,
    name="kimi-audit",
    help=(
        "Audit a Kimi-K2 checkpoint, or any of its lineage (DeepSeek-V3/V4, Kimi, GLM-5, Mistral's MLA models), "
        "as safetensors or llama.cpp GGUF, from its headers: every tensor present, with the right shape, dtype "
        "and scale, before you move a terabyte.\n\n"
        "Exit codes: 0 clean, 1 findings of error severity, 2 unusable input, 3 inconclusive (config.json names "
        "no architecture kimi-audit describes), 130 interrupted."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="rich",
)

class StdoutConsole(Console):
    """The console on stdout: a reader that went away ends the command with 141, as in main() (rich says 1)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        silence_stdout()
        raise SystemExit(EXIT_BROKEN_PIPE)


stdout = StdoutConsole()
stderr = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Turn KimiAuditError into a one-line message and exit code 2 (never a traceback).

    A command asked for JSON (`--json`, `--format json`) also gets the error as JSON on stdout:
    `{"error": {"code": ..., "message": ...}, "exit_code": 2}`. A reader that closes stdout early
    (`| head -1`) ends the command quietly with exit code 141.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            try:
                return fn(*args, **kwargs)
            finally:
                sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        except KimiAuditError as e:
            # The message may quote hostile names: no markup from it, and one line whatever it holds.
            line = escape(printable(clip(str(e))))
            stderr.print(f"[bold red]error:[/bold red] {line}", highlight=False, soft_wrap=True)
            if kwargs.get("as_json") or kwargs.get("fmt") == "json":
                error = {"error": {"code": e.code, "message": clip(str(e))}, "exit_code": e.exit_code}
                try:
                    sys.stdout.write(json.dumps(error) + "\n")
                    sys.stdout.flush()
                except BrokenPipeError:
                    stdout_closed()
            raise typer.Exit(e.exit_code) from None
        except BrokenPipeError:
            stdout_closed()
        except KeyboardInterrupt:
            stderr.print("interrupted")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def stdout_closed() -> NoReturn:
    """The reader of stdout went away: end the command quietly, exit code 141."""
    silence_stdout()
    raise typer.Exit(EXIT_BROKEN_PIPE)


def silence_stdout() -> None:
    """Send what is still buffered for a closed stdout to /dev/null (as the Python docs advise for SIGPIPE),
    so the interpreter's last flush raises nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real file descriptor behind stdout (a test runner's capture)
        pass


@contextmanager
def sigterm_exits() -> Iterator[None]:
    """Within the block, SIGTERM raises SystemExit(143), so `with` blocks (temporary directories) clean up.

    SIGINT already raises KeyboardInterrupt (exit 130). Outside the main thread nothing changes.
    """

    def terminate(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    with signal_handled(signal.SIGTERM, terminate):
        yield


@contextmanager
def signal_handled(signum: int, handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """Within the block `handler` takes `signum`; after it the previous disposition is back, unless the handler
    has set another meanwhile (that one stays). Outside the main thread nothing changes."""
    try:
        previous = signal.signal(signum, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        if signal.getsignal(signum) is handler:
            signal.signal(signum, previous)


@contextmanager
def shard_progress(description: str, enabled: bool = True) -> Iterator[Callable[[str, int, int], None] | None]:
    """A progress bar on stderr (stdout stays clean for --json)."""
    if not enabled or not stderr.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[shard]}"), console=stderr, transient=True,
    ) as progress:
        task = progress.add_task(description, total=None, shard="")

        def update(shard: str, done: int, total: int) -> None:
            progress.update(task, completed=done, total=total, shard=shard)

        yield update


@contextmanager
def byte_progress(description: str, enabled: bool = True) -> Iterator[Callable[[int, int], None] | None]:
    """A bytes bar on stderr (bytes done / total, speed, time left), only when stderr is a terminal."""
    if not enabled or not stderr.is_terminal:
        yield None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=stderr, transient=True,
    ) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def version_callback(value: bool) -> None:
    if value:
        stdout.print(f"kimi-audit {VERSION}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=version_callback, is_eager=True,
                                 help="Print the version and exit."),
    verbose: bool = typer.Option(False, "-v", "--verbose",
                                 help="Show huggingface_hub's retry logs (each failed attempt, each wait) on stderr."),
) -> None:
    from kimi_audit.sources.hub_network import show_retry_logs

    show_retry_logs(verbose)


COMMAND_MODULES = {
    "audit": "audit", "demo": "audit", "rmsnorm": "numerics", "tensor": "numerics", "download": "hub",
    "params": "params", "explain": "params", "diff": "diff", "verify": "verify", "layout": "layout",
    "precommit": "precommit",
}
"""The module (kimi_audit.cli.*) that registers each command; tests/test_cli.py holds it to the registrations."""


def app_for(argv: list[str]) -> typer.Typer:
    """`app` with the command `argv[0]` names registered, or with every command when argv names none first
    (`--help`, `-v audit ...`): a run of one command imports no other command's module (each pulls in its
    own stages: `diff` the accounting, `verify` the scan)."""
    module = COMMAND_MODULES.get(argv[0]) if argv else None
    for name in [module] if module else sorted(set(COMMAND_MODULES.values())):
        importlib.import_module(f"kimi_audit.cli.{name}")
    return app
