"""The Typer app and what every command shares: consoles, error handling, progress.

Each command is a thin shell: parse options, open a source, call the core, render. Errors that make
the input unusable are KimiAuditError: one line on stderr, exit code 2. Findings exit 1.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kimi_audit import __version__
from kimi_audit.errors import KimiAuditError

app = typer.Typer(
    name="kimi-audit",
    help=(
        "Audit a Kimi-K2 / DeepseekV3 safetensors checkpoint from its headers: every tensor present, "
        "with the right shape, dtype and FP8 scale, before you move a terabyte.\n\n"
        "Exit codes: 0 clean, 1 findings of error severity, 2 unusable input."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="rich",
)

stdout = Console()
stderr = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Turn KimiAuditError into a one-line message and exit code 2 (never a traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KimiAuditError as e:
            # The message may quote hostile names: no markup from it, and one line whatever it holds.
            stderr.print(f"[bold red]error:[/bold red] {escape(one_line(str(e)))}", highlight=False, soft_wrap=True)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            stderr.print("interrupted")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def one_line(text: str) -> str:
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


@contextmanager
def shard_progress(description: str, enabled: bool = True) -> Iterator[Callable[[str, int, int], None] | None]:
    """A progress bar on stderr (stdout stays clean for --json)."""
    if not enabled or not stderr.is_terminal:
        yield None
        return
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[shard]}"), console=stderr, transient=True,
    ) as progress:
        task = progress.add_task(description, total=None, shard="")

        def update(shard: str, done: int, total: int) -> None:
            progress.update(task, completed=done, total=total, shard=shard)

        yield update


def version_callback(value: bool) -> None:
    if value:
        stdout.print(f"kimi-audit {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=version_callback, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    pass
