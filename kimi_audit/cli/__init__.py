"""The `kimi-audit` command line: the Typer app (app.py) and one module per command group.

Each command is a thin shell: parse options, open a source, call the core, render. Errors that make the
input unusable are KimiAuditError: one line on stderr, exit code 2. Findings exit 1. Importing this
package registers every command on `app`; no command module imports this package back.
"""

from __future__ import annotations

import sys

from kimi_audit.cli import audit, diff, hub, numerics, params  # noqa: F401  (each registers its commands)
from kimi_audit.cli.app import EXIT_BROKEN_PIPE, app, silence_stdout

__all__ = ["app", "main"]


def main() -> None:
    """Run the app; a reader that closed stdout (`| head -1`) ends it quietly, exit code 141."""
    try:
        try:
            app()
        finally:
            sys.stdout.flush()  # here, not in the interpreter's last flush, where it could only be ignored
    except BrokenPipeError:
        silence_stdout()
        sys.exit(EXIT_BROKEN_PIPE)
