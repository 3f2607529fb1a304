"""graph.json as Graphviz DOT text (docs/graph.md): one box per node with its name, kinds, output shape,
parameters, FLOPs and predicted time; a node after which a pipeline may cut has a doubled bold border,
and its single outgoing edge is labelled "cut"."""

from __future__ import annotations

from typing import Any

from scaletrain.graph import labels


def to_dot(doc: dict[str, Any]) -> str:
    out_edges: dict[int, int] = {}
    for src, _ in doc["edges"]:
        out_edges[src] = out_edges.get(src, 0) + 1
    cuts = set(doc["cut_points"])
    title = (f"{doc['model']}, {doc['level']} level, batch {doc['batch_size']}, input "
             f"{labels.shape(doc['input_shape'])}: doubled border = a pipeline may cut after it")
    lines = [f"// scaletrain graph: {_quote(title)}",
             f'digraph "{_quote(doc["model"])}" {{',
             f'  label="{_quote(title)}"; labelloc=t; fontname="Helvetica";',
             '  rankdir=TB; node [shape=box, style="rounded", fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=9];']
    for n in doc["nodes"]:
        text = "\\n".join(_quote(line) for line in labels.lines(n))
        extra = ", peripheries=2, penwidth=2" if n["id"] in cuts else ""
        lines.append(f'  n{n["id"]} [label="{text}"{extra}];')
    for src, dst in doc["edges"]:
        cut = ' [label="cut", style=bold]' if src in cuts and out_edges[src] == 1 else ""
        lines.append(f"  n{src} -> n{dst}{cut};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
