"""graph/dot.py: one labelled box per node, one edge per edge, cut points doubled and their single
outgoing edge labelled; names that DOT would misread are escaped."""

from __future__ import annotations

import re

from scaletrain.graph.dot import to_dot


def doc(nodes, edges, cuts):
    return {"model": 'my"model', "level": "layer", "batch_size": 2, "input_shape": [3, 8, 8], "edges": edges,
            "cut_points": cuts, "nodes": [{"id": i, "name": name, "kinds": ["Conv2d"], "out_shape": [2, 4],
                                            "params": 10, "flops": 100, "forward_s": None, "backward_s": None}
                                           for i, name in enumerate(nodes)]}


def test_nodes_edges_and_cuts():
    # a fork: 0 feeds 1 and 2, which join in 3; one tensor crosses after 0 and after 3 (not after 1 or 2)
    text = to_dot(doc(["in", "left", 'say "hi"', "join", "out"], [[0, 1], [0, 2], [1, 3], [2, 3], [3, 4]], [0, 3]))
    assert text.splitlines()[1] == 'digraph "my\\"model" {' and text.rstrip().endswith("}")
    assert len(re.findall(r"^  n\d+ \[label=", text, re.M)) == 5
    pairs = re.findall(r"^  n(\d+) -> n(\d+)", text, re.M)
    assert pairs == [("0", "1"), ("0", "2"), ("1", "3"), ("2", "3"), ("3", "4")]
    assert text.count("peripheries=2") == 2
    assert '  n3 -> n4 [label="cut", style=bold];' in text
    assert "  n0 -> n1;" in text  # two edges leave node 0: the node is marked, not each edge
    assert 'say \\"hi\\"' in text and "10 params, 100 FLOPs" in text
