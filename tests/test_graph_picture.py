"""graph/picture.py: the layout (a long chain dealt into serpentine columns, parallel branches side by side,
columns broken where one tensor crosses) and the files drawn from it."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from scaletrain.graph.picture import BOX_W, Layout, draw, layout


def chain(n):
    return [{"id": i} for i in range(n)], [[i, i + 1] for i in range(n - 1)]


def test_a_chain_of_50_is_dealt_into_serpentine_columns():
    nodes, edges = chain(50)
    lay = layout(nodes, edges)
    assert 4 <= len(lay.columns) <= 8
    assert [a for a, _ in lay.columns] == [0] + [b + 1 for _, b in lay.columns[:-1]]
    assert 1.0 <= lay.width / lay.height <= 2.2  # about as wide as a screen
    for c, (a, b) in enumerate(lay.columns):
        ys = [lay.pos[i][1] for i in range(a, b + 1)]
        assert ys == sorted(ys, reverse=c % 2 == 1)  # down, up, down, ...
        assert len({lay.pos[i][0] for i in range(a, b + 1)}) == 1  # one lane
    for _, b in lay.columns[:-1]:  # the next column starts level with this one's end
        assert lay.pos[b][1] == lay.pos[b + 1][1] and lay.pos[b + 1][0] > lay.pos[b][0] + BOX_W


def test_parallel_branches_sit_side_by_side_and_rejoin():
    # 0 forks into a long branch 1-2-3 and a short one 4; 5 joins them; 6 after
    nodes = [{"id": i} for i in range(7)]
    edges = [[0, 1], [1, 2], [2, 3], [0, 4], [3, 5], [4, 5], [5, 6]]
    lay = layout(nodes, edges)
    assert len(lay.columns) == 1
    assert lay.row[1] == lay.row[4] == 1 and lay.lane[1] == 0 and lay.lane[4] == 1
    assert lay.pos[4][0] > lay.pos[1][0] and lay.pos[4][1] == lay.pos[1][1]
    assert lay.lane[5] == 0 and lay.row[5] == 4
    # the short branch's edge runs down its own lane to the row above the join, then across
    route = lay.edges[edges.index([4, 5])]
    assert len(route) == 3 and route[0][0] == route[1][0] == lay.pos[4][0]


def test_a_skip_connection_keeps_its_lane_clear():
    # 0 feeds 1-2-3 and, directly, the join 4 (out + x): the body moves over, the skip runs straight down
    lay = layout([{"id": i} for i in range(5)], [[0, 1], [1, 2], [2, 3], [0, 4], [3, 4]])
    assert lay.lane[0] == lay.lane[4] == 0 and {lay.lane[i] for i in (1, 2, 3)} == {1}


def test_columns_break_where_one_tensor_crosses():
    # residual-like units of 4 rows: fork, body, join; only after a join is a clean break
    nodes, edges, n = [], [], 0
    for _ in range(12):
        a, b, c, d = n, n + 1, n + 2, n + 3
        edges += [[a, b], [b, c], [a, d], [c, d]] + ([[d, d + 1]] if _ < 11 else [])
        n += 4
    nodes = [{"id": i} for i in range(n)]
    lay = layout(nodes, edges)
    assert len(lay.columns) > 1
    for _, last in lay.columns[:-1]:
        in_row = [i for i in lay.row if lay.row[i] == last]
        assert len(in_row) == 1 and in_row[0] % 4 == 3  # ends on a join


def test_draw_writes_a_png_and_an_svg(tmp_path):
    nodes = [{"id": i, "name": f"n{i}", "kinds": ["Conv2d"], "out_shape": [2, 4], "params": 10, "flops": 100 * i,
              "forward_s": 0.001 * i, "backward_s": 0.002 * i} for i in range(4)]
    doc = {"model": "m", "level": "block", "batch_size": 2, "input_shape": [3, 8, 8], "traced_by": "fx",
           "nodes": nodes, "edges": [[0, 1], [1, 2], [2, 3]], "cut_points": [0, 1, 2],
           "totals": {"nodes": 4, "params": 40, "flops": 600, "forward_s": 0.006, "backward_s": 0.012}}
    png, svg = draw(doc, tmp_path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph.png", "graph.svg"]  # no temporary left
    assert isinstance(layout(nodes, doc["edges"]), Layout)
