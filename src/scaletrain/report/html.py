"""A self-contained HTML page: inline CSS, PNGs embedded as data: URIs, no script, no external resource.

The page opens from the file system, from an e-mail attachment or from a CI artifact alike.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

import scaletrain
from scaletrain.grid import Grid, plain
from scaletrain.rundir import replace_atomic

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1280px;
       padding: 0 1rem; color: #222; line-height: 1.4; }
h1 { font-size: 1.5rem; margin-bottom: 0.2rem; }
h2 { font-size: 1.15rem; margin-top: 2rem; border-bottom: 1px solid #ccc; padding-bottom: 0.2rem; }
.sub { color: #666; margin-top: 0; }
.lead { font-size: 1.05rem; background: #f4f4f4; border-left: 4px solid #888; padding: 0.5rem 0.8rem; }
.scroll { overflow-x: auto; margin: 0.8rem 0; }
table { border-collapse: collapse; font-size: 0.9rem; }
caption { text-align: left; font-weight: 600; padding: 0.3rem 0; }
th, td { border: 1px solid #ddd; padding: 0.25rem 0.6rem; vertical-align: top; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.foot td { font-weight: bold; border-top: 1px solid #999; }
p.note { color: #555; font-size: 0.85rem; margin: 0.2rem 0 0.8rem; }
figure { margin: 1rem 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.85rem; }
footer { color: #888; font-size: 0.8rem; margin-top: 3rem; }
"""


@dataclass
class Section:
    """A heading, then an optional lead sentence, tables, figures (PNG path, caption) and notes."""

    heading: str
    lead: str | None = None
    grids: list[Grid] = field(default_factory=list)
    figures: list[tuple[Path, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(png).read_bytes()).decode("ascii")


def grid_html(grid: Grid) -> str:
    head = ("<thead><tr>" + "".join(f"<th>{escape(c)}</th>" for c in grid.columns) + "</tr></thead>"
            if grid.header else "")
    body = "".join(
        f"<tr{tag}>" + "".join(f'<td class="text">{escape(plain(cell))}</td>' if i in grid.text_columns else
                               f'<td class="num">{_number(plain(cell))}</td>' for i, cell in enumerate(row)) + "</tr>"
        for row, tag in [*((r, "") for r in grid.rows), *((r, ' class="foot"') for r in grid.foot)])
    table = (f'<div class="scroll"><table><caption>{escape(grid.title)}</caption>{head}<tbody>{body}</tbody>'
             f"</table></div>") if grid.rows else f"<h3>{escape(grid.title)}</h3>"
    note = f'<p class="note">{escape(grid.note)}</p>' if grid.note else ""
    return table + note


def _number(cell: str) -> str:
    """A number keeps its unit on its line ("41.2 ms"); only a share in brackets may wrap below it."""
    return escape(cell).replace(" ", "&nbsp;").replace("&nbsp;(", " (")


def section_html(s: Section) -> str:
    parts = [f"<section><h2>{escape(s.heading)}</h2>"]
    if s.lead:
        parts.append(f'<p class="lead">{escape(s.lead)}</p>')
    parts += [grid_html(g) for g in s.grids]
    for png, caption in s.figures:
        parts.append(f'<figure><img src="{data_uri(png)}" alt="{escape(caption)}">'
                     f"<figcaption>{escape(caption)}</figcaption></figure>")
    parts += [f'<p class="note">{escape(n)}</p>' for n in s.notes]
    parts.append("</section>")
    return "\n".join(parts)


def page(title: str, subtitle: str, sections: list[Section]) -> str:
    body = "\n".join(section_html(s) for s in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body>"
            f'<h1>{escape(title)}</h1><p class="sub">{escape(subtitle)}</p>\n{body}\n'
            f"<footer>written by scaletrain {escape(scaletrain.__version__)} from the directory's files"
            f"</footer></body></html>\n")


def write_page(path: str | Path, text: str) -> Path:
    """Atomically: a reader never sees half a report, and a failed write leaves the old one."""
    path = Path(path)
    replace_atomic(path, lambda f: f.write(text), mode="w")
    return path
