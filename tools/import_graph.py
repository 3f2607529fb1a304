"""The scaletrain package's import graph: each module, one line, with the package modules it imports
(lazy imports inside functions included). `python tools/import_graph.py [--cycles]` (docs/architecture.md)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "scaletrain"


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        name = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def graph(root: Path = PACKAGE) -> dict[str, list[str]]:
    """{module: [package modules it imports]}; `from pkg import mod` counts as importing pkg.mod."""
    mods = modules(root)
    out = {}
    for name, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("scaletrain"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    deps.add(sub if sub in mods else node.module)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("scaletrain"))
        deps.discard(name)
        out[name] = sorted(d for d in deps if d in mods)
    return out


def cycles(g: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in g:
        if v not in index:
            visit(v)
    return found


def short(name: str) -> str:
    return name.removeprefix("scaletrain.") if name != "scaletrain" else name


if __name__ == "__main__":
    g = graph()
    if "--cycles" in sys.argv:
        print("cycles:", cycles(g) or "none")
    else:
        for module, deps in g.items():
            print(f"{short(module)}: {', '.join(short(d) for d in deps) or '-'}")
