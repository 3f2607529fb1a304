"""How one node of graph.json reads to a person: its numbers in short units and its label's lines, shared
by the DOT text, the picture and the terminal table."""

from __future__ import annotations

from collections import Counter
from typing import Any

from scaletrain import fmt

_ABBREV = {"BatchNorm2d": "BN", "BatchNorm1d": "BN", "AdaptiveAvgPool2d": "AvgPool", "AdaptiveMaxPool2d": "MaxPool",
           "MaxPool2d": "MaxPool", "AvgPool2d": "AvgPool", "Conv2d": "Conv", "Linear": "Linear"}


def count(n: float | None) -> str:
    """1234567 -> 1.2M; 0 -> 0."""
    if n is None:
        return "-"
    for unit, size in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def flops(n: float | None) -> str:
    return "-" if n is None else f"{count(n)} FLOPs"


def shape(s: list[int] | tuple[int, ...] | None) -> str:
    return "x".join(str(d) for d in s) if s else "(not one tensor)"


_QUIET = ("Identity", "getitem", "getattr", "size", "dim", "contiguous")  # no arithmetic, nothing to see


def kinds(names: list[str], width: int = 44) -> str:
    """A block's layer kinds in order of first appearance with their counts: 'Conv x2, BN x2, ReLU x2, add'
    (reads of shapes and items, and Identity, left out unless that is all there is)."""
    shown = [k for k in names if k not in _QUIET] or names
    counts = Counter(_ABBREV.get(k, k) for k in shown)
    text = ", ".join(k if c == 1 else f"{k} x{c}" for k, c in counts.items())
    return text if len(text) <= width else text[: width - 3].rstrip(", ") + "..."


def lines(node: dict[str, Any]) -> list[str]:
    """name / kinds / output shape / parameters and FLOPs / predicted forward and backward time."""
    out = [node["name"], kinds(node["kinds"]), shape(node["out_shape"]),
           f"{count(node['params'])} params, {flops(node['flops'])}"]
    if node.get("forward_s") is not None:
        out.append(f"fwd {fmt.ms_sig(node['forward_s'])}, bwd {fmt.ms_sig(node['backward_s'])}")
    return out
