"""--help's option panels, readable at 80 columns: each option's names and value in one column, its text beside.

Typer (0.29) lays an options panel out in six columns (required, long and short names, the negative flag's two,
the value's type) and leaves the description what remains: 18 to 24 columns at 80 (99 lines for `audit
--help`, 118 for `verify --help`). Here a panel has two: the names and value (`--format, -f FORMAT`,
`--progress / --no-progress`) in at most NAMES_WIDTH columns, wrapped where longer, and the description in the
rest (at 80 columns, 46). `compact_help` swaps this renderer in for the one call that prints a help page, and
puts typer's back after it; where typer has no such renderer (another version), its own layout stays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

NAMES_WIDTH = 26
"""The widest the names column gets (the descriptions take the rest of the panel)."""

TYPE_WORDS = {"<str>": "TEXT", "<path>": "PATH", "<int>": "N", "<int range>": "N", "<float>": "X",
              "<float range>": "X"}
"""Typer's type placeholders (`<str>`) as a value's usual words, where the option names no metavar of its own."""


def _names(param: Any, ctx: Any) -> Any:
    from rich.text import Text
    from typer import rich_utils as ru
    from typer.core import TyperArgument

    if isinstance(param, TyperArgument):
        label = Text(str(param.metavar or param.display_name_raw).upper(), style=ru.STYLE_OPTION)
        if param.required:
            label.append(" " + ru.REQUIRED_SHORT_STRING, style=ru.STYLE_REQUIRED_SHORT)
        return label
    ordered = sorted(param.opts, key=lambda o: not o.startswith("--"))  # --long first, then -s
    label = Text(", ".join(ordered), style=ru.STYLE_OPTION)
    if param.secondary_opts:
        label.append(" / ")
        label.append(", ".join(param.secondary_opts), style=ru.STYLE_NEGATIVE_OPTION)
    shown = param.display_type_rich(ctx=ctx) if not getattr(param, "is_flag", False) else None
    if shown:
        label.append(" " + TYPE_WORDS.get(str(shown), str(shown)), style=ru.STYLE_TYPES)
    if param.required:
        label.append(" " + ru.REQUIRED_SHORT_STRING, style=ru.STYLE_REQUIRED_SHORT)
    return label


def options_panel(*, name: str, params: list[Any], ctx: Any, markup_mode: Any, console: Any) -> None:
    """typer.rich_utils._print_options_panel's work, in two columns (see the module's docstring)."""
    from rich.panel import Panel
    from rich.table import Table
    from typer import rich_utils as ru

    if not params:
        return
    rows = [(_names(p, ctx), ru._get_parameter_help(param=p, ctx=ctx, markup_mode=markup_mode)) for p in params]
    table = Table(show_header=False, box=None, expand=True, padding=(0, 1), pad_edge=False)
    table.add_column(width=min(NAMES_WIDTH, max(label.cell_len for label, _ in rows)), overflow="fold")
    table.add_column(ratio=1)
    for row in rows:
        table.add_row(*row)
    console.print(Panel(table, border_style=ru.STYLE_OPTIONS_PANEL_BORDER, title=name,
                        title_align=ru.ALIGN_OPTIONS_PANEL))


@contextmanager
def compact_help() -> Iterator[None]:
    """Within the block, typer prints its help pages' option panels with `options_panel`."""
    from typer import rich_utils as ru

    typers = getattr(ru, "_print_options_panel", None)
    if typers is None or not hasattr(ru, "_get_parameter_help"):
        yield  # another typer: its own layout
        return
    ru._print_options_panel = options_panel
    try:
        yield
    finally:
        ru._print_options_panel = typers


def compact(format_help: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """A command's (bound) format_help, printing within compact_help."""
    def format_compact_help(ctx: Any, formatter: Any) -> None:
        with compact_help():
            format_help(ctx, formatter)

    return format_compact_help
