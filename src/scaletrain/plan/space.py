"""The candidates a plan searches: every axis the performance model prices, as values for one request.

A candidate is a point of predict's grid (study/grid.py): the values of options a strategy does not take
drop out of its config, so a combination that repeats another, or that the layout cannot run, is skipped by
the search with its reason, never aborting it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scaletrain.errors import UserError

BATCHES = (16, 32, 64, 128, 256)  # per device, when neither --batch-size nor --global-batch is given
WORKERS = (0, 1, 2, 4, 8, 16)  # loader workers per rank, up to the node's cores per rank
PRECISIONS = {"cpu": ("fp32", "bf16"), "cuda": ("fp32", "bf16", "fp16")}
CHECKPOINTING = ("none", "auto")  # auto: blocks only where the plan would not fit the budget otherwise
COMPRESS = ("none", "fp16")  # the one lossless-enough compression every bucketed strategy that takes one runs


@dataclass(frozen=True)
class Request:
    """What the user asks the plan for (scaletrain plan's flags)."""

    model: str
    nodes: int
    nproc: int  # processes per node
    image_size: int | None = None
    dataset: str = "synthetic"
    synthetic_samples: int = 1_281_167  # ImageNet-1k's training set: an epoch of a real job
    epochs: int = 1
    batch_sizes: tuple[int, ...] = ()
    global_batch: int | None = None
    memory_budget: int | None = None  # bytes per device; None: the basis's device memory
    top: int = 5
    only: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # an axis's values to search instead of all (ONLY)
    testbed: bool = False  # the nodes are the hosts of the testbed that is up (plan --testbed)
    cores_per_host: int | None = None  # with testbed: the cores `testbed run` gives each host
    shared_cores: int | None = None  # with testbed: the cores its hosts share, where they do not fit side by side
    # the fastest candidates the search must price: one whose bound (search.py) is slower than the slowest of them
    # is pruned, not priced; None: every candidate priced (--no-prune, --validate all)
    priced_top: int | None = 5

    @property
    def world(self) -> int:
        return self.nodes * self.nproc


def stage_counts(world: int, nproc: int) -> list[int]:
    """Pipeline depths worth searching: 2, 4, 8 ... that divide the job's ranks (replicas of equal depth)."""
    return [s for s in (2, 4, 8, 16) if s <= world and world % s == 0 and (s <= nproc or s % nproc == 0)]


ONLY = ("strategy", "precision", "workers", "compress", "checkpoint_activations")
"""Axes a request may narrow to the values it names (plan --strategy, --precision, ...): a user who runs only one
strategy, or a measured comparison that must stay affordable."""


def tile_counts(world: int) -> list[int]:
    """Spatial tiles per image worth searching: 2, 4, 8 that divide the job's ranks (a square-ish grid each)."""
    return [s for s in (2, 4, 8) if s <= world and world % s == 0]


def strategies(only: tuple[str, ...] = ()) -> list[str]:
    """The strategies a plan searches: every one predict prices that does not say why a plan leaves it out (of
    those in `only`, when given: naming one it leaves out, or none, is a UserError)."""
    from scaletrain.comm.registry import STRATEGIES, strategy_class

    searched = [n for n in STRATEGIES if strategy_class(n).priced and not strategy_class(n).plan_leaves_out]
    for name in only:
        if name not in STRATEGIES:
            raise UserError(f"--strategy {name}: not a strategy; give some of {', '.join(searched)}")
        if name not in searched:
            why = strategy_class(name).plan_leaves_out or "predict does not price it"
            raise UserError(f"--strategy {name}: a plan does not search it ({why}); give some of {', '.join(searched)}")
    return [n for n in searched if n in only] if only else searched


def left_out() -> dict[str, str]:
    """The strategies a plan does not search, and why (shown in its output)."""
    from scaletrain.comm.registry import STRATEGIES, strategy_class

    return {n: strategy_class(n).plan_leaves_out for n in STRATEGIES if strategy_class(n).plan_leaves_out}


def grids(req: Request, device_kind: str, cores_per_node: int, precisions: tuple[str, ...] | None = None,
          budget: int | None = 0) -> list[dict[str, list[Any]]]:
    """predict's axes for the request, one grid per strategy with the options that strategy takes (a value of
    an option it does not take would only repeat a candidate): their union is the candidates, before those
    that do not combine are skipped. Loader workers stop at the node's cores per rank: more only share them.
    `budget` None (no memory budget): checkpointing `auto` would checkpoint nothing, so only `none` is searched."""
    from scaletrain.comm.registry import OPTIONS

    per_rank = max(1, cores_per_node // req.nproc)
    only = req.only
    common: dict[str, list[Any]] = {
        "nproc": [req.nproc], "nnodes": [req.nodes],
        "precision": list(only.get("precision") or precisions or PRECISIONS[device_kind]),
        "workers": list(only.get("workers") or [w for w in WORKERS if w <= per_rank]),
        "checkpoint_activations": list(only.get("checkpoint_activations")
                                       or (CHECKPOINTING if budget is not None else ("none",))),
    }
    if req.global_batch is None:
        common["batch_size"] = list(req.batch_sizes or BATCHES)
    out = []
    for name in strategies(tuple(only.get("strategy", ()))):
        grid = {"strategy": [name], **common}
        if "compress" in OPTIONS[name]:
            grid["compress"] = list(only.get("compress") or COMPRESS)
        if "spatial" in OPTIONS[name]:  # S tiles of each image, alone, and in K pipeline stages of S tiles each
            tiles = tile_counts(req.world)
            if tiles:
                out.append({**grid, "spatial": tiles})
            for t in tiles:  # a grid per tile count and depth: the depths whose tiles x stages divide the ranks
                out += [{**grid, "spatial": [t], "stages": [k], "microbatches": microbatch_counts(k)}
                        for k in stage_counts(req.world, req.nproc) if req.world % (t * k) == 0]
            continue
        if "stages" in OPTIONS[name]:  # a grid per depth, each with its own micro-batch counts
            out += [{**grid, "stages": [k], "microbatches": microbatch_counts(k)}
                    for k in stage_counts(req.world, req.nproc)]
            continue
        out.append(grid)
    return out


def microbatch_counts(stages: int) -> list[int]:
    """Micro-batches per step worth searching for a K-stage pipeline: K (the fewest its schedules run), 2K and 4K
    (GPipe's M >= 4K, where the bubble's (K - 1) / (M + K - 1) falls under a fifth); more shrink each micro-batch,
    which the model prices."""
    return [stages, 2 * stages, 4 * stages]


def grid_name(axes: dict[str, list[Any]]) -> str:
    """A grid's name, the prefix of its candidates' ids: its strategy, and a pipeline's depth and tiles where its grid
    has one of each (`pipeline-stages4`, `spatial-staged-tiles2-stages4`: a point's id names only the axes with more
    than one value)."""
    name = axes["strategy"][0]
    if "stages" not in axes:
        return name
    if "spatial" in axes:
        name += "-staged" + (f"-tiles{axes['spatial'][0]}" if len(axes["spatial"]) == 1 else "")
    return name + (f"-stages{axes['stages'][0]}" if len(axes["stages"]) == 1 else "")


def train_settings(req: Request, strategy: str) -> dict[str, Any]:
    """The fixed settings of a strategy's candidates: the model and data, and the gradient bucket the model
    finds best where the strategy buckets its gradients."""
    from scaletrain.comm.registry import OPTIONS

    settings: dict[str, Any] = {"model": req.model, "dataset": req.dataset, "epochs": req.epochs}
    if req.dataset == "synthetic":
        settings["synthetic_samples"] = req.synthetic_samples
    if "bucket_cap_mb" in OPTIONS[strategy]:
        settings["bucket_cap_mb"] = "auto"
    if req.image_size is not None:
        settings["image_size"] = req.image_size
    return settings
