"""Activation checkpointing (`--checkpoint-activations blocks`): each block of the model keeps only its input for
backward and runs its forward again there (docs/perf.md, "Activation checkpointing").

The units are the block graph's blocks (perf/blocks.py) read on a meta copy of the model (no memory), named by
module path: a block that is one module (a residual block `layer1.0`, a `stem`) is checkpointed with torch's
composable `checkpoint` (forward hooks: the module's structure, parameter names and state dict stay as they
are); a block that is a run of an nn.Sequential's children (`features.0-3`) as one segment of that Sequential's
forward. A block made of several modules (`layer4.1+pool`) checkpoints each of them; a single leaf layer (the
classifier's `fc`) is left alone: it keeps no more than its input either way.

The recomputed forward is the forward that ran: the random state is restored (torch's `preserve_rng_state`), and
batch norm's running statistics are put back for the recompute to what the forward saw, then restored, so that
they are updated once per step, not twice. Gradients are therefore those of a run without checkpointing
(float64: equal; tested).
"""

from __future__ import annotations

import contextlib
import copy
import types
from dataclasses import dataclass, replace

import torch
from torch import nn

from scaletrain.errors import UserError

MODES = ("none", "blocks", "auto")
"""`none`; `blocks`: every block; `auto`: the fewest blocks that bring the plan within the memory budget
(comm/memory.resolve_checkpointing, before the ranks start); or the blocks named, comma-separated."""


def chosen(value: str) -> frozenset[str] | bool:
    """--checkpoint-activations as the blocks it checkpoints: False (none), True (all), or their names."""
    if value in ("none", "auto"):
        return value == "auto"  # (auto is resolved before a rank builds its model: here, all)
    if value == "blocks":
        return True
    return frozenset(name.strip() for name in value.split(",") if name.strip())


@dataclass(frozen=True)
class Unit:
    """One checkpointed region: the module at `path`, or the children `first..last` of the Sequential at `path`;
    `block`: the block graph's block it belongs to (the name --checkpoint-activations takes)."""

    path: str
    first: int | None = None
    last: int | None = None
    block: str = ""

    @property
    def name(self) -> str:
        if self.first is None:
            return self.path
        span = f"{self.first}-{self.last}" if self.last != self.first else str(self.first)
        return f"{self.path}.{span}" if self.path else span

    def covers(self, path: str) -> bool:
        """Whether the module at `path` runs inside this unit (its forward then runs again in backward)."""
        inside = path.split(".")[len(self.path.split(".")) if self.path else 0:]
        if self.path and not (path + ".").startswith(self.path + "."):
            return False
        return self.first is None or bool(inside) and inside[0].isdigit() and self.first <= int(inside[0]) <= self.last


def plan_units(model: nn.Module, sample_shape: tuple[int, ...], value: str = "blocks") -> list[Unit]:
    """The units of `model`'s blocks that --checkpoint-activations `value` names, in order, read from its block
    graph on a meta copy (no memory); a name that is no block is refused, naming the blocks."""
    return pick_units(*block_units(model, sample_shape), value)


def block_units(model: nn.Module, sample_shape: tuple[int, ...]) -> tuple[list[Unit], list[str]]:
    """(the units of every block of `model`, the names of its blocks, each in order), from its block graph on a meta
    copy: what pick_units chooses from (a plan asks for many choices of one model's blocks)."""
    from scaletrain.perf.blocks import group
    from scaletrain.perf.walk import walk

    meta = copy.deepcopy(model).to("meta")
    graph = walk(meta, tuple(sample_shape), 1)
    by_id = {n.id: n for n in graph.leaves()}
    blocks = group(graph, "block")
    targets = [[by_id[i].target.split(".") for i in b.nodes if i in by_id and by_id[i].op == "call_module"]
               for b in blocks]
    return units_of(model, targets, [b.name for b in blocks]), [b.name for b in blocks]


def pick_units(units: list[Unit], known: list[str], value: str) -> list[Unit]:
    """Of block_units' `units`, those of the blocks --checkpoint-activations `value` names; a name that is no block
    (`known`) is refused, naming the blocks."""
    names = chosen(value)
    if names is True or names is False:
        return units if names else []
    unknown = sorted(names - set(known))
    if unknown:
        raise UserError(f"--checkpoint-activations: no block named {unknown[0]}; the blocks are {', '.join(known)} "
                        "(or give blocks, auto or none)")
    return [u for u in units if u.block in names]


def units_of(model: nn.Module, targets: list[list[list[str]]], names: list[str] | None = None) -> list[Unit]:
    """The units covering each block's modules (`targets[b]`: the module paths of block b's layers, split at
    the dots; `names[b]` its name): the largest modules only that block uses, runs of a Sequential's children
    as one segment."""
    owners: dict[tuple[str, ...], set[int]] = {}
    for b, paths in enumerate(targets):
        for p in paths:
            for k in range(1, len(p) + 1):
                owners.setdefault(tuple(p[:k]), set()).add(b)
    units: list[Unit] = []
    for b, paths in enumerate(targets):
        units += [replace(u, block=names[b] if names else "") for u in _cover(model, paths, (), owners, b)]
    return units


def _cover(model: nn.Module, paths: list[list[str]], prefix: tuple[str, ...], owners, b: int) -> list[Unit]:
    runs: list[tuple[str, list[list[str]]]] = []  # consecutive layers under the same child of `prefix`
    for p in paths:
        if len(p) <= len(prefix):
            continue
        child = p[len(prefix)]
        if runs and runs[-1][0] == child:
            runs[-1][1].append(p)
        else:
            runs.append((child, [p]))
    parent = model.get_submodule(".".join(prefix)) if prefix else model
    units: list[Unit] = []
    whole: list[str] = []  # children of `prefix` only this block uses, in a row
    for child, below in runs:
        if owners.get((*prefix, child)) == {b}:
            whole.append(child)
            continue
        units += _whole(parent, prefix, whole)
        whole = []
        units += _cover(model, below, (*prefix, child), owners, b)
    return units + _whole(parent, prefix, whole)


def _whole(parent: nn.Module, prefix: tuple[str, ...], children: list[str]) -> list[Unit]:
    """Children of `parent` used by one block alone: a run of a Sequential's as one segment, else each (a
    single leaf layer left out)."""
    path = ".".join(prefix)
    indices = [int(c) for c in children if c.isdigit()]
    if isinstance(parent, nn.Sequential) and len(children) > 1 and len(indices) == len(children) \
            and indices == list(range(indices[0], indices[-1] + 1)):
        return [Unit(path, indices[0], indices[-1])]
    out = []
    for c in children:
        module = parent.get_submodule(c)
        if any(True for _ in module.children()):
            out.append(Unit(f"{path}.{c}" if path else c))
    return out


def apply(model: nn.Module, units: list[Unit]) -> None:
    """Checkpoint each unit of `model` in place (after the strategy wrapped it: fx traces nothing hooked)."""
    from torch.distributed._composable import checkpoint

    segments: dict[str, list[Unit]] = {}
    for u in units:
        if u.first is None:
            module = model.get_submodule(u.path) if u.path else model
            checkpoint(module, context_fn=_contexts(module))
        else:
            segments.setdefault(u.path, []).append(u)
    for path, spans in segments.items():
        parent = model.get_submodule(path) if path else model
        parent.forward = types.MethodType(_segmented_forward(spans), parent)


class Chain(nn.Module):
    """Modules run one after the other, those `recomputed` checkpointed: a pipeline stage cut into its blocks (a
    stage's fx module has no block modules to hook)."""

    def __init__(self, pieces: list[nn.Module], recomputed: list[bool]) -> None:
        super().__init__()
        self.pieces, self.recomputed = nn.ModuleList(pieces), list(recomputed)

    def forward(self, x):
        for piece, again in zip(self.pieces, self.recomputed):
            x = torch.utils.checkpoint.checkpoint(piece, x, use_reentrant=False, context_fn=_contexts(piece)) \
                if again else piece(x)
        return x


def _segmented_forward(spans: list[Unit]):
    """A Sequential's forward running each span of its children as one checkpointed segment."""
    starts = {u.first: u.last for u in spans}

    def forward(self: nn.Sequential, x):
        children = list(self)
        i = 0
        while i < len(children):
            if i in starts:
                segment = nn.Sequential(*children[i:starts[i] + 1])
                x = torch.utils.checkpoint.checkpoint(segment, x, use_reentrant=False, context_fn=_contexts(segment))
                i = starts[i] + 1
            else:
                x = children[i](x)
                i += 1
        return x

    return forward


def _contexts(module: nn.Module):
    """checkpoint's context_fn: the forward records the norms' running statistics; the recompute runs with
    them put back and frozen (momentum 0), then restores the values the forward left."""
    def make():
        norms = [m for m in module.modules() if _has_running_stats(m)]
        seen: list[list[torch.Tensor]] = []
        return _Record(norms, seen), _Replay(norms, seen)

    return make


def _has_running_stats(m: nn.Module) -> bool:
    return getattr(m, "running_mean", None) is not None and hasattr(m, "momentum")


class _Record(contextlib.AbstractContextManager):
    def __init__(self, norms: list[nn.Module], seen: list[list[torch.Tensor]]) -> None:
        self.norms, self.seen = norms, seen

    def __enter__(self):
        self.seen[:] = [_stats(m) for m in self.norms]
        return self

    def __exit__(self, *exc) -> None:
        return None


class _Replay(contextlib.AbstractContextManager):
    def __init__(self, norms: list[nn.Module], seen: list[list[torch.Tensor]]) -> None:
        self.norms, self.seen = norms, seen
        self.after: list[list[torch.Tensor]] = []
        self.momenta: list = []

    def __enter__(self):
        self.after = [_stats(m) for m in self.norms]
        self.momenta = [m.momentum for m in self.norms]
        for m, values in zip(self.norms, self.seen):
            _load(m, values)
            m.momentum = 0.0
        return self

    def __exit__(self, *exc) -> None:
        for m, values, momentum in zip(self.norms, self.after, self.momenta):
            _load(m, values)
            m.momentum = momentum


_STATS = ("running_mean", "running_var", "num_batches_tracked")


def _stats(m: nn.Module) -> list[torch.Tensor]:
    return [getattr(m, k).detach().clone() for k in _STATS if getattr(m, k, None) is not None]


def _load(m: nn.Module, values: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for k, v in zip([k for k in _STATS if getattr(m, k, None) is not None], values):
            getattr(m, k).copy_(v)
