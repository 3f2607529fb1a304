"""graph.json as a picture a person can read: graph.png and graph.svg, drawn with matplotlib (no graphviz).

`layout` (pure) places the boxes: a node's row is its longest path from the first node; parallel branches
take lanes side by side (a branch keeps its lane as long as it runs, a join takes the leftmost free lane of
its inputs'); the rows are dealt into columns of about equal height, broken preferably where one tensor
crosses, and the columns run down, up, down (serpentine) so that the edge from one column to the next
stays short. A chain of 50 blocks becomes about six columns of nine. `draw` renders a layout.

    col 0     col 1     col 2
    [a]       [f]  ->   [g]
     |         ^         |
    [b]       [e]       [h]
     |         ^         |
    [c]  ->   [d]       [i]
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaletrain import fmt
from scaletrain.graph import labels

BOX_W, BOX_H = 2.5, 0.95  # one node's box, inches (five lines of 7.5 pt text)
LANE_W, ROW_H = BOX_W + 0.4, BOX_H + 0.45
COL_GAP = 0.5  # between columns, beyond the lanes' own spacing
MARGIN, TITLE_H = 0.3, 1.05  # TITLE_H: room for TITLE_LINES lines of the title
TITLE_LINES, TITLE_LINE_H, TITLE_CHAR_W = 4, 0.17, 0.072  # inches a line takes, and a character (9 pt)
MIN_W = 7.0  # the narrowest picture, inches: a title fits
ASPECT = 1.4  # the width / height the columns aim at
MAX_PIXELS = 16000  # the PNG's longest side; a larger figure gets a lower resolution
FONT = 7.5
MIN_ROWS = 7  # a graph this many rows deep (about ten inches) is not split into columns


@dataclass
class Layout:
    pos: dict[int, tuple[float, float]]  # node id -> its box's centre, inches from the top left (y down)
    row: dict[int, int]
    lane: dict[int, int]
    column: dict[int, int]
    columns: list[tuple[int, int]]  # each column's first and last row
    step: list[float]  # each column's distance between rows (inches)
    width: float
    height: float
    edges: list[list[tuple[float, float]]] = field(default_factory=list)  # each edge's polyline, arrow at the end


def layout(nodes: list[dict[str, Any]], edges: list[list[int]]) -> Layout:
    ids = [n["id"] for n in nodes]
    inputs: dict[int, list[int]] = {i: [] for i in ids}
    consumers: dict[int, list[int]] = {i: [] for i in ids}
    for s, t in edges:
        inputs[t].append(s)
        consumers[s].append(t)
    row: dict[int, int] = {}
    for i in sorted(ids):  # traced order is topological
        row[i] = max((row[s] + 1 for s in inputs[i] if s in row), default=0)
    lane = _lanes(ids, row, inputs, consumers)
    rows = max(row.values(), default=0) + 1
    lanes = max(lane.values(), default=0) + 1
    per_column = _rows_per_column(rows, lanes)
    columns = _columns(rows, per_column, _clean_breaks(rows, row, edges))
    column = {i: next(c for c, (a, b) in enumerate(columns) if a <= row[i] <= b) for i in ids}
    tallest = max(b - a + 1 for a, b in columns)
    pos: dict[int, tuple[float, float]] = {}
    step: list[float] = []
    x0 = MARGIN
    for c, (a, b) in enumerate(columns):
        # every column but the last spans the full height, so that its end meets the next one's start
        pitch = (tallest - 1) / (b - a) if b > a and c < len(columns) - 1 else 1.0
        step.append(pitch * ROW_H)
        members = [i for i in ids if column[i] == c]
        low = min(lane[i] for i in members)
        for i in members:
            slot = (row[i] - a) * pitch if c % 2 == 0 else tallest - 1 - (row[i] - a) * pitch
            pos[i] = (x0 + (lane[i] - low + 0.5) * LANE_W, MARGIN + TITLE_H + (slot + 0.5) * ROW_H)
        x0 += (max(lane[i] for i in members) - low + 1) * LANE_W + COL_GAP
    out = Layout(pos, row, lane, column, columns, step, x0 - COL_GAP + MARGIN,
                 2 * MARGIN + TITLE_H + tallest * ROW_H)
    out.edges = [_route(out, s, t) for s, t in edges]
    return out


def _lanes(ids, row, inputs, consumers) -> dict[int, int]:
    """A lane per node: the leftmost of its inputs' lanes, or the next one free from there for as long as
    the node's output is still to be read (its edges run down its lane to the row above its last reader)."""
    until = {i: max([row[c] - 1 for c in consumers[i]] + [row[i]]) for i in ids}
    taken: dict[int, set[int]] = {}
    lane: dict[int, int] = {}
    for i in sorted(ids, key=lambda i: (row[i], i)):
        span = set(range(row[i], until[i] + 1))
        k = min((lane[s] for s in inputs[i] if s in lane), default=0)
        while taken.get(k, set()) & span:
            k += 1
        lane[i] = k
        taken.setdefault(k, set()).update(span)
    return lane


def _rows_per_column(rows: int, lanes: int) -> int:
    """Rows per column so that the picture is about ASPECT times as wide as high; up to MIN_ROWS rows
    stay in one column."""
    width = min(lanes, 4) * LANE_W + COL_GAP
    return max(min(rows, MIN_ROWS), round(math.sqrt(rows * width / (ASPECT * ROW_H))))


def _clean_breaks(rows: int, row: dict[int, int], edges: list[list[int]]) -> set[int]:
    """Rows r after which a column may break cleanly: rows r and r + 1 hold one node each and no edge
    passes between them but the one from the first to the second."""
    count: dict[int, int] = {}
    for r in row.values():
        count[r] = count.get(r, 0) + 1
    clean = {r for r in range(rows - 1) if count.get(r) == 1 and count.get(r + 1) == 1}
    for s, t in edges:
        for r in range(row[s], row[t]):
            if row[s] != r or row[t] != r + 1:
                clean.discard(r)
    return clean


def _columns(rows: int, per_column: int, clean: set[int]) -> list[tuple[int, int]]:
    """(first row, last row) of each column: about `per_column` rows, broken at the clean break nearest
    that within half a column either way (else exactly there), leaving the last column at least half a
    column; a remainder of up to a quarter column joins the one before."""
    out, a = [], 0
    while a < rows:
        if rows - a <= per_column * 1.25:
            out.append((a, rows - 1))
            break
        target = a + per_column - 1
        window = [r for r in range(a + max(0, per_column // 2 - 1), a + (3 * per_column) // 2)
                  if r in clean and r < rows - 1 - per_column // 2]
        b = min(window, key=lambda r: (abs(r - target), r)) if window else target
        out.append((a, b))
        a = b + 1
    return out


def _route(lay: Layout, s: int, t: int) -> list[tuple[float, float]]:
    (xs, ys), (xt, yt) = lay.pos[s], lay.pos[t]
    cs, ct = lay.column[s], lay.column[t]
    if cs != ct:  # from one column's end to the next one's start: side to side
        return [(xs + BOX_W / 2, ys), (xt - BOX_W / 2, yt)]
    d = 1 if cs % 2 == 0 else -1  # +1: this column runs down the page
    start, end = (xs, ys + d * BOX_H / 2), (xt, yt - d * BOX_H / 2)
    if lay.row[t] == lay.row[s] + 1 or xs == xt:
        return [start, end]
    above = yt - d * lay.step[ct]  # the row before the target's: down the source's lane to there, then across
    return [start, (xs, above + d * BOX_H / 2), end]


def _fill(kinds: list[str]) -> str:
    if any("Conv" in k for k in kinds):
        return "#dbe9f6"
    if any("Linear" in k for k in kinds):
        return "#dcefdc"
    return "#eeeeee"


def draw(doc: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write graph.png and graph.svg of graph.json's `doc` into `out_dir`; the paths written."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch, Rectangle

    from scaletrain.plot import save

    lay = layout(doc["nodes"], doc["edges"])
    width = max(lay.width, MIN_W)
    title = _title(doc, int((width - 2 * MARGIN) / TITLE_CHAR_W))
    extra = max(0, title.count("\n") + 1 - TITLE_LINES) * TITLE_LINE_H  # more lines than TITLE_H holds
    fig = Figure(figsize=(width, lay.height + extra))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(lay.height, -extra)
    ax.axis("off")
    cuts = set(doc["cut_points"])
    timed = doc["totals"].get("forward_s") is not None
    size = {n["id"]: (n["forward_s"] + n["backward_s"]) if timed else n["flops"] for n in doc["nodes"]}
    largest = max(size.values(), default=0) or 1
    first_edge: dict[int, list[tuple[float, float]]] = {}
    for (src, _), line in zip(doc["edges"], lay.edges):
        first_edge.setdefault(src, line)
        xs, ys = zip(*line)
        ax.plot(xs, ys, color="#555555", lw=0.9, zorder=1)
        ax.annotate("", xy=line[-1], xytext=line[-2], zorder=1,
                    arrowprops={"arrowstyle": "-|>", "color": "#555555", "lw": 0.9, "shrinkA": 0, "shrinkB": 0})
    for n in doc["nodes"]:
        x, y = lay.pos[n["id"]]
        cut = n["id"] in cuts
        ax.add_patch(FancyBboxPatch((x - BOX_W / 2, y - BOX_H / 2), BOX_W, BOX_H,
                                    boxstyle="round,pad=0,rounding_size=0.08",
                                    fc=_fill(n["kinds"]), ec="#8b1a1a" if cut else "#777777", lw=2.2 if cut else 0.8,
                                    zorder=2))
        share = size[n["id"]] / largest
        ax.add_patch(Rectangle((x - BOX_W / 2 + 0.06, y + BOX_H / 2 - 0.09), (BOX_W - 0.12) * share, 0.05,
                               fc="#e07b39", ec="none", zorder=3))
        text = labels.lines(n)
        ax.text(x, y - BOX_H / 2 + 0.07, text[0][:40], ha="center", va="top", fontsize=FONT, weight="bold", zorder=3)
        ax.text(x, y - BOX_H / 2 + 0.24, "\n".join(text[1:]), ha="center", va="top", fontsize=FONT,
                linespacing=1.25, zorder=3)
        if cut and n["id"] in first_edge:  # beside the start of its (first) outgoing edge
            (x0, y0), (x1, y1) = first_edge[n["id"]][:2]
            length = math.hypot(x1 - x0, y1 - y0) or 1.0
            ax.text(x0 + 0.2 * (x1 - x0) / length + 0.06, y0 + 0.2 * (y1 - y0) / length - 0.04, "cut", ha="left",
                    va="bottom" if abs(x1 - x0) > abs(y1 - y0) else "center", fontsize=FONT - 1, color="#8b1a1a",
                    style="italic", zorder=3)
    ax.text(MARGIN, MARGIN - extra, title, ha="left", va="top", fontsize=FONT + 1.5, linespacing=1.4)
    dpi = min(110, MAX_PIXELS / max(width, lay.height + extra))
    out = Path(out_dir)
    paths = [out / "graph.png", out / "graph.svg"]
    return [save(fig, p, dpi=dpi, tight=False) for p in paths]


def _title(doc: dict[str, Any], chars: int) -> str:
    """What the picture is, its totals and how to read it, wrapped to `chars` a line."""
    t = doc["totals"]
    head = (f"{doc['model']}: {doc['level']} level, {t['nodes']} nodes, batch {doc['batch_size']}, input "
            f"{labels.shape(doc['input_shape'])}" + (" (module order: fx could not trace it)"
                                                    if doc["traced_by"] != "fx" else ""))
    totals = f"{labels.count(t['params'])} params, {labels.flops(t['flops'])}"
    timed = t.get("forward_s") is not None
    if timed:
        totals += f", predicted fwd {fmt.ms_sig(t['forward_s'])}, bwd {fmt.ms_sig(t['backward_s'])} per step"
    legend = ["red border and 'cut': exactly one tensor crosses after it, a pipeline may cut there",
              f"orange bar: {'predicted time' if timed else 'FLOPs'} against the largest node's; "
              "blue: convolutions, green: linear layers"]
    return "\n".join(line for text in (head, totals, *legend) for line in textwrap.wrap(text, max(20, chars)))
