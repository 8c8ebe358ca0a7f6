"""The app with every command registered (for `--help`, the tests and `from kimi_audit.cli import app`)."""

from __future__ import annotations

from kimi_audit.cli.application import app, app_for

__all__ = ["app"]

app_for([])  # every command module, each registering its commands on `app`
