"""`scaletrain graph` (docs/graph.md): a model's graph at the layer, block or module level.

    build.py    the layer graph (fx, or module order for a Sequential fx cannot trace) as graph.json's dict
    timing.py   predicted seconds per node and per block, from a calibration (shared with `split`)
    labels.py   numbers and node labels for people        dot.py   DOT text
    picture.py  layout (pure) and drawing: graph.png, graph.svg      cli.py   the command
"""
