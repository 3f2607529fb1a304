"""Predicting a pipeline's stages and bubble (docs/predict.md), for comm/pipeline/strategy.py's Pipeline.cost.

Pipeline (`--strategy pipeline`, K stages, M micro-batches, R replicas): the blocks' forward and backward
at the micro-batch, priced op by op by the point's basis (a calibration's per-op laws at the rank's threads, with
the loop factors calibrated on as many ranks per node: the stages run side by side, each on its share of the cores;
a data sheet's roofline per op, each stage on its own device), the split the run would
choose were its blocks to cost that and its link the basis's point-to-point one (split/plan.py, asked as the run
asks it; the run measures its blocks and the link between its stages first, so where the basis misprices a block the
two can differ by a cut), and that split's step from
split/partition.py: the schedule played op by op (split/schedule.py), stage s's forward and backward ops
each f_s or b_s + half its transfers per micro-batch.

Phases, as the profiler records them and averaged over the stages (summary.json's phases_mean_s):
forward = M x mean f_s, backward = M x mean b_s, p2p = M x mean transfer_s and the loss's broadcast,
bubble = the rest of the step; the optimizer steps the mean stage's parameters; with R > 1 each stage's
gradients are all-reduced over the replicas after backward (exposed).

FSDP prices itself in comm/fsdp.py (Fsdp.cost).
"""

from __future__ import annotations

import functools
from typing import Any

from scaletrain.errors import UserError
from scaletrain.perf import alphabeta
from scaletrain.predict.kept import Kept


@functools.lru_cache(maxsize=16)
def _blocked(model_name: str, classes: int, channels: int, image_size: int, micro: int, stem: str, width: float):
    """The model on the meta device and its block graph at the micro-batch: shapes, bytes and FLOPs without memory
    or a forward (a large image's is seconds and gigabytes on the host). One model for every micro-batch (its walks
    at other batches kept: perf/walk.layer_graph)."""
    from scaletrain.models.registry import meta_model
    from scaletrain.split.stages import blocked

    model = meta_model(model_name, num_classes=classes, in_channels=channels, image_size=image_size, stem=stem,
                       width=width)
    return model, blocked(model, (channels, image_size, image_size), micro, meta=True)


def pipeline_phases(predictor, cfg, facts: dict[str, Any], threads: int, alpha_beta) -> dict[str, Any]:
    """The pipeline's forward, backward, p2p and bubble phases per step (means over the stages), the split,
    and the bytes of the mean stage's parameters (for its optimizer and the replicas' all-reduce). `predictor`: the
    point's basis, which prices the blocks' ops."""
    def compute() -> dict[str, Any]:
        model, graph, shape, micro = blocked_model(cfg, facts)
        costs = priced_blocks(predictor, cfg, graph, model, shape, micro, threads)
        again = recompute_s(costs, recomputed_blocks(cfg, facts))
        return split_phases(cfg, graph, model, shape, costs, alpha_beta, again)

    return kept("pipeline", predictor, cfg, facts, threads, alpha_beta, compute)


def kept(what: str, predictor, cfg, facts: dict[str, Any], threads: int, alpha_beta, compute):
    """`compute()` once per basis and configuration: a plan's candidates that differ in loader workers alone share a
    split's pricing (its search is a third of a second)."""
    from scaletrain.comm.memory import workerless

    return _KEPT.get((predictor,), (what, workerless(cfg), tuple(sorted(facts.items())), threads, tuple(alpha_beta)),
                     compute)


_KEPT = Kept(256)


def blocked_model(cfg, facts: dict[str, Any]):
    """(the model on the meta device, its block graph at the micro-batch, one sample's shape, the micro-batch)."""
    from scaletrain.split import plan

    micro = plan.micro_batch(cfg.optim.batch_size, cfg.pipeline.microbatches)
    size = facts["image_size"]
    model, graph = _blocked(cfg.model.name, facts["classes"], facts["channels"], size, micro, cfg.model.stem,
                            cfg.model.width)
    return model, graph, (facts["channels"], size, size), micro


def blocked_at(cfg, facts: dict[str, Any], shape: tuple[int, ...]):
    """The block graph of blocked_model's model on samples of another `shape` (a tile's) at the micro-batch."""
    from scaletrain.split import plan

    micro = plan.micro_batch(cfg.optim.batch_size, cfg.pipeline.microbatches)
    return _blocked_at(cfg.model.name, facts["classes"], facts["channels"], facts["image_size"], micro, cfg.model.stem,
                       cfg.model.width, tuple(shape))


@functools.lru_cache(maxsize=16)
def _blocked_at(model_name: str, classes: int, channels: int, image_size: int, micro: int, stem: str, width: float,
                shape: tuple[int, ...]):
    from scaletrain.split.stages import blocked

    model, _ = _blocked(model_name, classes, channels, image_size, micro, stem, width)
    return blocked(model, shape, micro, meta=True)


def priced_blocks(predictor, cfg, graph, model, shape: tuple[int, ...], micro: int, threads: int) -> list:
    """The blocks' costs at the micro-batch, each op priced by the basis as the stages' ranks run it."""
    from scaletrain.split import plan

    costs, _ = plan.costs_for(graph, model, shape, micro, source="predicted", predictor=predictor,
                              precision=cfg.model.precision, threads=threads, ranks=cfg.launch.nproc)
    return costs


def recomputed_blocks(cfg, facts: dict[str, Any]) -> frozenset[str] | bool:
    """The blocks a stage runs again in backward under --checkpoint-activations (as the launcher resolves `auto`): True
    for every one, else their names (train/recompute.chosen, what the stages read)."""
    from scaletrain.predict.points import checkpointing
    from scaletrain.train.recompute import chosen

    return chosen(checkpointing(cfg, facts))


def recompute_s(costs: list, recomputed: frozenset[str] | bool) -> list[float] | None:
    """Per block, the seconds activation checkpointing adds to its backward: its forward again where it is
    recomputed (None: no block is)."""
    if not recomputed:
        return None
    return [c.forward_s if recomputed is True or c.name in recomputed else 0.0 for c in costs]


def split_phases(cfg, graph, model, shape: tuple[int, ...], costs: list, alpha_beta,
                 again: list[float] | None = None) -> dict[str, Any]:
    """The split the run chooses on these block costs and its phases; `again` (recompute_s): per block, what
    activation checkpointing adds to its backward. The run times its blocks without it and chooses its split on those;
    its stages then run it: the split is chosen on `costs`, its step played with the recomputes."""
    import dataclasses

    from scaletrain.split import plan
    from scaletrain.split.partition import evaluate

    alpha, beta = alpha_beta
    link = 1 / beta if beta > 0 else plan.DEFAULT_LINK
    # the split the run chooses, and its step, as comm/pipeline/strategy.py's Pipeline._split asks for it: these block
    # costs standing for the ones the run measures, the basis's point-to-point link for the one it measures between its
    # stages
    part = plan.choose(cfg.pipeline.split, graph, model, shape, stages=cfg.layout.stages,
                       microbatches=cfg.pipeline.microbatches, schedule=cfg.pipeline.schedule,
                       batch_size=cfg.optim.batch_size, precision=cfg.model.precision, optimizer=cfg.optim.optimizer,
                       model_name=cfg.model.name, costs=costs, link_bytes_per_s=link, latency_s=alpha)
    if again:
        redone = [dataclasses.replace(c, backward_s=c.backward_s + extra) for c, extra in zip(costs, again)]
        part = evaluate(redone, part.bounds, method=part.method, **plan.pipeline_args(
            microbatches=cfg.pipeline.microbatches, schedule=cfg.pipeline.schedule, optimizer=cfg.optim.optimizer,
            link_bytes_per_s=link, latency_s=alpha))
    m, k = cfg.pipeline.microbatches, len(part.stages)
    mean = lambda key: sum(st[key] for st in part.stages) / k  # noqa: E731
    fwd, bwd = m * mean("forward_s"), m * mean("backward_s")
    p2p = m * mean("transfer_s") + alpha  # the loss's broadcast: one small message
    bubble = max(0.0, part.step_s - m * mean("time_s"))
    stage_params = [sum(c.param_bytes for c in costs[lo:hi]) for lo, hi in part.bounds]
    return {"forward": fwd, "backward": bwd, "p2p": p2p, "bubble": bubble, "split": part.to_dict(),
            "split_method": part.method, "stage_param_bytes": stage_params,
            "bubble_theory": (k - 1) / (m + k - 1)}


def floor_s(cfg, costs: list) -> float:
    """A lower bound on the step split_phases prices from these block costs (a plan prunes by it): every stage runs
    its M forward and M backward ops one after another, so the step takes at least M x the slowest stage's time, at
    least M x the blocks' forward and backward over the K stages; the phases (forward, backward, p2p, bubble) add up
    to no less, and a recompute, transfers, halos and the optimizer only add."""
    return cfg.pipeline.microbatches * sum(c.forward_s + c.backward_s for c in costs) / cfg.layout.stages


def replicas_allreduce_s(stage_param_bytes: list[int], replicas: int, alpha: float, beta: float) -> float:
    """Each stage's gradients averaged over the replicas after backward: one flat all-reduce (the slowest)."""
    if replicas < 2 or not stage_param_bytes:
        return 0.0
    return alphabeta.predict(alpha, beta, replicas, max(stage_param_bytes))
