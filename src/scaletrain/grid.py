"""Tables as data (Grid: title, columns, rows of strings, a note) and as rich Tables (`rich_table`): the one
table layer of every command's console and of the HTML pages (report/html.py renders the same Grid), so a
terminal and a page show the same numbers in the same columns."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich import box
from rich.table import Table
from rich.text import Text


@dataclass
class Grid:
    """A table to show: `text_columns` are left-aligned (the others hold numbers, right-aligned).

    Cells may carry rich markup (`[red]failed[/]`): a terminal shows the colour, a page the text. `foot` rows
    follow a line: the first in bold (a total or a mean), the others dim (its shares). An `open` grid has no
    frame, only a rule under its header, and its title on the left: what a wide table read (or parsed) line by
    line in a terminal needs."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    note: str | None = None
    header: bool = True
    text_columns: tuple[int, ...] = (0,)
    foot: list[list[str]] = field(default_factory=list)
    open: bool = False


def plain(cell: str) -> str:
    """A cell's text without its markup."""
    return Text.from_markup(cell).plain


def rich_table(grid: Grid) -> Table | Text:
    """The grid as a rich Table; a grid without rows is just its title and note (no empty box)."""
    if not grid.rows:
        return Text(f"{grid.title}: {grid.note or 'nothing to show'}")
    frame = {"box": box.SIMPLE_HEAD, "title_justify": "left", "pad_edge": False} if grid.open else {}
    # a narrow table is widened to its title rather than wrap the title over several lines
    t = Table(title=grid.title, show_header=grid.header, caption=grid.note, caption_justify="left",
              min_width=len(grid.title), **frame)
    cells = [[plain(c) for c in row] for row in (*grid.rows, *grid.foot)]
    for i, col in enumerate(grid.columns):
        if i in grid.text_columns:  # text wraps between words; a word breaks only beyond 20 characters
            words = [w for text in (col, *(r[i] for r in cells)) for w in text.split()]
            t.add_column(col, overflow="fold", min_width=min(max(map(len, words), default=1), 20))
        else:  # numbers never break (a note in their place may wrap); a long header may wrap above them
            t.add_column(col, justify="right", min_width=max((len(r[i]) for r in cells if len(r[i]) <= 20), default=1))
    for row in grid.rows:
        t.add_row(*row)
    if grid.foot:
        t.add_section()
    for i, row in enumerate(grid.foot):
        t.add_row(*row, style="bold" if i == 0 else "dim")
    return t
