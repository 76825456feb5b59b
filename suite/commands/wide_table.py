"""``--wide``: every field of the comparison rows, as one table where the terminal is wide enough for it,
otherwise as one block per row, field by field."""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.table import Table

from kvbench.printable import printable
from kvbench.results.compare import HEADER, arm_name, display_cells

NATURAL = 10**6
"""A width no table reaches: measured within it, a table takes the width its cells ask for."""


def wide_view(rows: list[dict], title: str, console: Console) -> RenderableType:
    """The rows in HEADER's columns where their table fits ``console``'s width without wrapping a cell;
    otherwise a block per row of two columns, field and value. The full table is about 320 columns wide:
    folded into 100 (or 160, piped) each cell broke over several lines, a column a few letters wide."""
    table = Table(title=title)
    for column in HEADER:
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*map(printable, display_cells(row)))
    if console.measure(table, options=console.options.update_width(NATURAL)).maximum <= console.width:
        return table
    return Group(title, *(_block(row) for row in rows))


def _block(row: dict) -> Table:
    """One row's fields, one a line; a value longer than its column wraps, and is never cut."""
    block = Table(
        title=printable(f"{arm_name(row)}: {row['task']} on {row['model']}"),
        title_justify="left",
        show_header=False,
    )
    block.add_column(style="bold")
    block.add_column(overflow="fold")
    for field, value in zip(HEADER, display_cells(row), strict=True):
        block.add_row(field, printable(value))
    return block
