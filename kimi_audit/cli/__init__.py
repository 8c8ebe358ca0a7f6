"""The `kimi-audit` command line: the Typer app (application.py) and one module per command group.

Each command is a thin shell: parse options, open a source, call the core, render. Errors that make the
input unusable are KimiAuditError: one line on stderr, exit code 2. Findings exit 1. `app` (every
command registered, commands.py) loads on first use, so `kimi-audit --version` answers without loading
Typer, rich or any stage; no command module imports this package back.
"""

from __future__ import annotations

import gc
import os
import sys

from kimi_audit.constants import VERSION

TYPE_CHECKING = False  # typing is not imported before main() answers Ctrl-C (kimi_audit/__main__.py)
if TYPE_CHECKING:
    from typing import Any

    from kimi_audit.cli.commands import app

__all__ = ["app", "main"]

GC_THRESHOLD = 50_000
"""Net container allocations between two young collections in the command line's own process (Python's
default: 700). A header audit of Kimi-K2 builds a few hundred thousand long-lived objects and no cycle:
at the default the collector runs ~190 times during it, rescanning what survived, ~30-45 ms of a ~400 ms
audit (timed with gc.callbacks). Whole process, `audit REPLICA --json` on the full-scale replica, medians
of 25 alternating runs on a loaded 2-core machine: 647 ms CPU / 1,275 ms wall at the default, 599 ms /
1,198 ms with this threshold (601 ms / 1,167 ms with the former gc pause inside the library). Cycles are
still collected, only less often."""


def __getattr__(name: str) -> Any:
    if name == "app":
        from kimi_audit.cli.commands import app

        return app
    raise AttributeError(f"module 'kimi_audit.cli' has no attribute {name!r}")


def main() -> None:
    """Run the app; a reader that closed stdout (`| head -1`) ends it quietly, exit code 141; a stdout that
    cannot be written (closed with `>&-`, `/dev/full`, an I/O error) ends it with one line on stderr, exit
    code 120 (Python's own when it cannot flush stdout), never a traceback.

    Once the command has finished and its output is flushed, the process ends without tearing the
    interpreter down: freeing an audit's few hundred thousand objects one by one took ~0.1 s of a
    1 s audit (bench/audit_local.py, phase "exit"), and the operating system reclaims them at once.
    Nothing is left to run by then: temporary directories are removed by the commands themselves.

    The one process-wide setting: the cycle collector's first threshold is raised to GC_THRESHOLD for
    this process (the library itself never touches the collector).
    """
    if sys.argv[1:] == ["--version"]:  # the whole answer: no need for the app
        print(f"kimi-audit {VERSION}")
        sys.stdout.flush()
        os._exit(0)
    answer_ctrl_c_while_loading()
    try:
        _main()
    except KeyboardInterrupt:  # Ctrl-C from the first instant (while the app's modules load): one line
        print("interrupted", file=sys.stderr, flush=True)
        os._exit(EXIT_INTERRUPTED)


def _interrupted_while_loading(signum: int, frame: object) -> None:
    os.write(2, b"interrupted\n")
    os._exit(EXIT_INTERRUPTED)


def answer_ctrl_c_while_loading() -> None:
    """Until the command runs, Ctrl-C ends the process at once with one line, exit 130, from a signal handler: a
    KeyboardInterrupt raised while modules load can land in importlib's own weakref callbacks, where Python prints
    "Exception ignored in ... _get_module_lock" with a traceback and carries on. The command line's own setting
    (the library never touches it); the command itself runs with Python's default handler again (_main)."""
    import signal

    signal.signal(signal.SIGINT, _interrupted_while_loading)


EXIT_INTERRUPTED = 130
"""128 + SIGINT, the shell's code for a command Ctrl-C ended."""


def _main() -> None:
    gc.set_threshold(GC_THRESHOLD)
    from kimi_audit.cli.application import (
        EXIT_BROKEN_PIPE,
        EXIT_STDOUT_FAILED,
        StdoutError,
        app_for,
        checked_stdout,
        silence_stdout,
    )

    checked_stdout()
    app = app_for(sys.argv[1:])  # only the invoked command's module (all of them for --help)
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)  # the command answers Ctrl-C itself from here

    code: int | str | None = 0
    try:
        try:
            app()
        except SystemExit as e:
            code = e.code
        finally:
            sys.stdout.flush()  # here, not in the interpreter's last flush, where it could only be ignored
            sys.stderr.flush()
    except BrokenPipeError:
        silence_stdout()
        code = EXIT_BROKEN_PIPE
    except StdoutError as e:
        print(f"error: {e.strerror}", file=sys.stderr, flush=True)
        code = EXIT_STDOUT_FAILED
    if isinstance(code, str):  # sys.exit("message") prints the message, as the interpreter would
        print(code, file=sys.stderr, flush=True)
        code = 1
    os._exit(code or 0)
