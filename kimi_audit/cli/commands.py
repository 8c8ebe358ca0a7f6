"""The app with every command registered: importing a command module registers its commands on `app`."""

from __future__ import annotations

from kimi_audit.cli import audit, diff, hub, numerics, params, verify  # noqa: F401  (each registers its commands)
from kimi_audit.cli.application import app

__all__ = ["app"]
