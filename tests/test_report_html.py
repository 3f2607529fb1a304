"""report.html: one self-contained page (inline CSS, embedded PNGs, no script, no external resource)."""

from __future__ import annotations

import base64
import re

from scaletrain.report import html, plots
from scaletrain.grid import Grid


def assert_self_contained(text: str) -> None:
    assert "http://" not in text and "https://" not in text
    assert not re.search(r'(src|href)="(?!data:)', text), "every src/href must be a data: URI"
    assert "<script" not in text.lower() and "<link" not in text.lower()


def test_grid_is_escaped_and_aligned():
    g = Grid("a <b> table", ["name", "value"], [["x<y & z", "1.0 ms"]], note="note: <careful>")
    out = html.grid_html(g)
    assert "x&lt;y &amp; z" in out and "a &lt;b&gt; table" in out and "note: &lt;careful&gt;" in out
    assert '<td class="text">x&lt;y' in out and '<td class="num">1.0&nbsp;ms</td>' in out
    assert html.grid_html(Grid("t", ["a", "b"], [["x", "41.2 ms (56%)"]])).count("41.2&nbsp;ms (56%)") == 1
    empty = html.grid_html(Grid("nothing here", ["a"], note="phases were not recorded"))
    assert "<table" not in empty and "phases were not recorded" in empty


def test_page_embeds_pngs(tmp_path):
    png = plots.line_plot([], tmp_path / "p.png", "t", "x", "y")
    text = html.page("run <x>", "sub", [html.Section("plots", lead="lead", grids=[Grid("g", ["a"], [["1"]])],
                                                     figures=[(png, "a plot")], notes=["a note"])])
    assert_self_contained(text)
    uri = re.search(r'src="data:image/png;base64,([^"]+)"', text).group(1)
    assert base64.b64decode(uri) == png.read_bytes()
    assert "<title>run &lt;x&gt;</title>" in text and 'alt="a plot"' in text and "a note" in text


def test_write_page_leaves_no_temporary_file(tmp_path):
    path = html.write_page(tmp_path / "report.html", "<p>one</p>")
    html.write_page(path, "<p>two</p>")
    assert path.read_text() == "<p>two</p>" and [p.name for p in tmp_path.iterdir()] == ["report.html"]
