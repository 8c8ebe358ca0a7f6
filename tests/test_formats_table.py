"""docs/reference.md's format table is tested against the registered scheme classes, not kept by hand: every
registered key has a row (and every key a row names is registered), each class's stored tensors (`stored()` of
its default configuration) are named in its rows, and every suffix a format gives a role is named in the table."""

from __future__ import annotations

import re
from pathlib import Path

from kimi_audit.model.quant.dispatch import formats
from kimi_audit.model.quant.scheme import Unquantized

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference.md"


def format_rows(text: str | None = None) -> dict[str, list[str]]:
    """Scheme key -> the tensors cells of its rows in the table under "| scheme `key` |"."""
    text = REFERENCE.read_text() if text is None else text
    start = text.index("| scheme `key` |")
    table = text[start:text.index("\n\n", start)].splitlines()[2:]
    out: dict[str, list[str]] = {}
    for row in table:
        cells = [c.strip() for c in row.strip().strip("|").split(" | ")]
        assert len(cells) == 4, row
        for key in re.findall(r"`([^`]+)`", cells[0]):
            out.setdefault(key, []).append(cells[2])
    return out


def named(cells: list[str]) -> set[str]:
    """The tensor suffixes the cells name (backticked, a leading dot or a module path before them allowed)."""
    return {span.lstrip(".") for cell in cells for span in re.findall(r"`([^`]+)`", cell)}


def mentions(cells: list[str], suffix: str) -> bool:
    bare = suffix.lstrip(".")
    return any(n == bare or n.endswith("." + bare) for n in named(cells))


def registered() -> dict[str, type]:
    return {c.key: c for c in formats() if c is not Unquantized}


def test_every_registered_format_has_a_row_and_every_row_a_format() -> None:
    rows = format_rows()
    assert set(rows) == set(registered()), set(rows) ^ set(registered())


def test_each_row_names_what_its_class_stores() -> None:
    rows = format_rows()
    missing = {key: [s.suffix for s in cls().stored(256, 512) if not mentions(rows[key], s.suffix)]
               for key, cls in registered().items()}
    assert not {k: v for k, v in missing.items() if v}, missing


def test_every_suffix_a_format_gives_a_role_is_in_the_table() -> None:
    every = [cell for cells in format_rows().values() for cell in cells]
    unnamed = sorted({s for cls in registered().values() for s, _ in cls.roles if not mentions(every, s)})
    assert unnamed == []


def test_a_format_without_a_row_is_caught() -> None:
    text = REFERENCE.read_text()
    gone = "\n".join(line for line in text.splitlines() if not line.startswith("| `gptq` |")) + "\n"
    assert "gptq" not in format_rows(gone)
