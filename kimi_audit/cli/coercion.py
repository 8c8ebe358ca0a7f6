"""A parameter's value coerced without pydantic where it is a str, a Path, or an int already (typer 0.29's own rules
kept).

typer 0.29 coerces each parameter's value, defaults included, through a pydantic TypeAdapter built the first time
the parameter is processed: every run of any command imported pydantic (~30-50 ms, a sixth of a GGUF header
audit's whole process) to turn the str it was given into that str. `plain_coercion` gives the parameters whose
annotation is `str`, `bool`, `Path` or a list of them the coercion typer's adapter performs for them, without
pydantic: a str or a bool is kept (--help's own option is a bool whose value is None: its adapter was built for
None), an int parameter's default (None, or an int) is kept, a Path goes through typer's own `coerce_cli_path` (its
checks: exists, file_okay, readable ...) once it is a Path. An int given on the command line arrives as a str and
goes through typer's own adapter (its range and its messages are pydantic's), as does any other annotation (a
custom parser, an Enum) and any value of an unexpected type: `verify` without `-j` imported pydantic (~25 ms) to
keep its default None. Where typer has no such hook (another version:
no `_runtime_param`, or no `coerce_cli_path`), nothing changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args, get_origin

__all__ = ["plain_coercion"]


def plain_coercion(params: list[Any]) -> None:
    """Install the pydantic-free coercion on each parameter of `params` it covers (see the module docstring)."""
    try:
        from typer._param_types import coerce_cli_path  # noqa: F401  (the hook the Path coercion needs)
    except ImportError:
        return
    for param in params:
        descriptor = getattr(param, "type_descriptor", None)
        if descriptor is None or getattr(param, "_runtime_param", False) is not None:
            continue  # not typer 0.29's parameter, or its coercion already built
        info = descriptor.parameter_info
        if descriptor.file_annotation is not None or getattr(info, "parser", None) is not None:
            continue
        annotation, many = descriptor.annotation, False
        if get_origin(annotation) is list:
            annotation, many = get_args(annotation)[0], True
        if annotation in (str, bool, int) or (annotation is Path and info.path_type in (None, Path)):
            param._runtime_param = _Plain(annotation, many)


class _Plain:
    """typer's RuntimeParam for a str, bool, int or Path parameter (or a list of them): its `coerce`, without
    pydantic (an int only when it is one already: a default)."""

    __slots__ = ("item", "many")

    def __init__(self, item: type, many: bool) -> None:
        self.item, self.many = item, many

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        is_multi_value = param.multiple or param.nargs == -1
        if value is None:
            return () if is_multi_value else None
        if is_multi_value and isinstance(value, str):
            return _typers(value, param, ctx)  # typer's "Value must be an iterable."
        items = (value if isinstance(value, (list, tuple)) else [value]) if self.many else [value]
        if not all(type(v) is int if self.item is int else isinstance(v, self.item) or (
                self.item is Path and isinstance(v, str)) for v in items):
            return _typers(value, param, ctx)
        if self.item is Path:
            from typer._param_types import coerce_cli_path

            info = param.type_descriptor.parameter_info
            items = [coerce_cli_path(Path(v), info, path_type=Path, param=param, ctx=ctx) for v in items]
        return list(items) if self.many else items[0]


def _typers(value: Any, param: Any, ctx: Any) -> Any:
    """What typer's own coercion makes of `value` (its pydantic adapter: an unexpected value, and its error)."""
    from typer._coercion import build_runtime_param

    return build_runtime_param(param.type_descriptor).coerce(value, param=param, ctx=ctx)

