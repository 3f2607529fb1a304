"""`--strategy pipeline`: the model cut into K stages (split/), one process each, run by
torch.distributed.pipelining's GPipe or 1F1B schedule over M micro-batches; with more processes than
stages, R = processes / K replicas of the pipeline on a 2-D mesh (replica x stage), each stage's gradients
averaged over its replicas after backward (docs/strategies.md, docs/split.md).

    rank = replica * K + stage          stage 0 reads the batch, the last stage the labels and the loss

    GPipe, K=2, M=4 (F: forward of a micro-batch, B: backward; . idle: the bubble)
      stage 0   F0 F1 F2 F3 .  .  .  .  B3 B2 B1 B0
      stage 1   .  F0 F1 F2 F3 B3 B2 B1 B0 .

Every rank builds the whole model in host memory with the run's seed (so its stage's weights start equal to
a one-process run's), cuts it into the stages' modules, keeps its own stage's parameters and buffers (on its
device) and drops the rest: the other stages' tensors become shapes without storage (the meta device), so a
rank holds one stage's weights, gradients and optimizer state, never the whole model's. Evaluation passes
the validation batches through the stages as training passes its micro-batches (the last stage counts);
checkpoints and the run's digest assemble the whole model stage by stage, in host memory, on the first stage
of each replica (rank 0: the checkpoint). BatchNorm runs per micro-batch, as any gradient-accumulation loop
would: its running statistics are updated M times per step, each from one micro-batch.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import fx, nn

from scaletrain.comm.pipeline.memory import stage_parts, stages_of
from scaletrain.comm.strategy import Profiled, Strategy, offloading
from scaletrain.config import TrainConfig
from scaletrain.distributed.group import all_reduce_flat, block_groups, broadcast_object, gather_objects
from scaletrain.distributed.rank import RankInfo
from scaletrain.distributed.p2p_link import measure_links
from scaletrain.errors import UserError
from scaletrain.perf.precision import AUTOCAST, place_model, to_device
from scaletrain.train.evaluate import EvalResult, Tally


class Pipeline(Strategy):
    """One stage of one replica of a K-stage pipeline."""

    computes_whole_model = False  # a stage runs its own blocks

    def __init__(self, cfg: TrainConfig, rank: RankInfo, device: torch.device, backend: str) -> None:
        super().__init__(cfg, rank, device, backend)
        self.stages = cfg.layout.stages
        self.replicas = cfg.layout.replicas
        self.checkpointed: list[str] = []  # the blocks of this stage recomputed in backward (--checkpoint-activations)
        self.stage, self.replica_index, self.pp_group, self.dp_group = self._place_in_mesh(rank.rank)
        self.schedule: Any = None
        self.stage_module: nn.Module | None = None  # this stage's module as evaluation runs it
        self.stage_layers: set[str] = set()
        self.recomputed_layers: set[str] = set()
        self.bounds: list[tuple[int, int]] = []
        self.block_names: list[str] = []
        self.split_info: dict[str, Any] = {}
        self._optimizer: torch.optim.Optimizer | None = None
        self._model: nn.Module | None = None
        self._in_shape: tuple[int, ...] = ()  # one sample's input to this stage (no batch dimension)

    # ------------------------------------------------------------ launch-time facts (no process yet)
    @classmethod
    def cost(cls, pricing):
        """The stages' forward, backward, p2p and bubble as the schedule plays them on the split the run would
        choose (predict/pipeline.py), the mean stage's optimizer, each stage's gradients all-reduced over the
        replicas after backward (exposed). The blocks priced op by op by either basis."""
        from scaletrain.predict import pipeline as PP
        from scaletrain.predict.pricing import Cost

        s, cfg = pricing.setting, pricing.cfg
        alpha, beta = pricing.link("allreduce")
        # a stage's activations and gradients are point-to-point messages: priced by commbench's `ps` fit (on 2
        # ranks one send and one receive per worker; a data sheet's link), not the all-reduce's
        pp = PP.pipeline_phases(pricing.predictor, cfg, pricing.facts, s.rank_threads, pricing.link("ps"))
        k = len(pp["stage_param_bytes"])
        mean_params = sum(pp["stage_param_bytes"]) / k
        tensors = max(1, len(pricing.grads) // k)
        exposed = PP.replicas_allreduce_s(pp["stage_param_bytes"], s.trainers, alpha, beta)
        transfers = sum(st["transfer_s"] for st in pp["split"]["stages"]) * cfg.pipeline.microbatches
        comm = {"bytes_per_step": 0, "buckets": 0, "comm_total_s": transfers + exposed, "comm_hidden_s": 0.0,
                "overlap_ratio": None}
        phases = {"forward": pp["forward"], "backward": pp["backward"], "bubble": pp["bubble"], "p2p": pp["p2p"],
                  "optimizer": pricing.optimizer_s(tensors, int(mean_params // 4))
                  + pricing.loop.overheads(pp["forward"] + pp["backward"])[0]}
        return Cost(exposed, comm, phases=phases, extra={"pipeline": pp}, flops_share=1 / k)

    @classmethod
    def step_floor_s(cls, cfg: TrainConfig, facts: dict[str, Any], predictor: Any, threads: int) -> float | None:
        """Its blocks' compute over the stages (predict/pipeline.floor_s), before a split is searched; None where the
        blocks cannot be priced (the cost then says why)."""
        from scaletrain.predict import pipeline as PP

        try:
            model, graph, shape, micro = PP.blocked_model(cfg, facts)
            return PP.floor_s(cfg, PP.priced_blocks(predictor, cfg, graph, model, shape, micro, threads))
        except UserError:
            return None

    @classmethod
    def memory(cls, cfg: TrainConfig, memory_at, factory, sample_shape):
        """The fullest stage of the split balanced on the blocks' FLOPs (the run balances measured times): its
        parameters and state, and per micro-batch in flight (GPipe: all; 1F1B: K - s) its blocks' saved tensors
        (checkpointed: their inputs), with one block's transients in backward (checkpointed: and its recompute)."""
        mm = memory_at(max(1, cfg.optim.batch_size // cfg.pipeline.microbatches))
        blocks, read = cls.held_blocks(cfg, mm, factory, sample_shape)
        return cls.fullest_stage(cfg, mm, blocks, read)

    @classmethod
    def held_blocks(cls, cfg: TrainConfig, mm, factory, sample_shape) -> tuple[list, int]:
        """The blocks' bytes as a stage of this layout holds them (perf/peak.BlockBytes), and what stage 0 holds
        of the batch it reads besides them."""
        return list(mm.blocks), 0

    @staticmethod
    def stage_footprint(cfg: TrainConfig, mm, blocks: list, s: int, lo: int, hi: int, read_bytes: int = 0):
        """Stage s over blocks lo..hi-1 as a Footprint: its parameters and state, and its activations (in flight and
        at work), from comm/pipeline/memory.stage_parts."""
        from scaletrain.perf.footprint import Footprint

        parts = stage_parts(mm, blocks, s, lo, hi, stages=cfg.layout.stages, microbatches=cfg.pipeline.microbatches,
                            schedule=cfg.pipeline.schedule, read_bytes=read_bytes)
        return Footprint(params=parts["weights"] + parts["gradients"] + parts["optimizer"],
                         activations=parts["activations"] + parts["working"])

    @classmethod
    def fullest_stage(cls, cfg: TrainConfig, mm, blocks: list, read_bytes: int = 0):
        """The fullest stage's Footprint of the split a run would choose: `--split uniform|params|FILE` as given;
        `auto`/`time` on the blocks' FLOPs (the run times them), the fastest whose stages fit mm.room under
        --memory-per-device, else the fastest."""
        bounds = cls.split_within(cfg, mm, blocks, read_bytes)
        return max((cls.stage_footprint(cfg, mm, blocks, s, lo, hi, read_bytes) for s, (lo, hi) in enumerate(bounds)),
                   key=lambda f: f.total)

    @classmethod
    def split_within(cls, cfg: TrainConfig, mm, blocks: list, read_bytes: int = 0, choose: Callable | None = None):
        """What `choose(within)` gives (default: the bounds of the run's split, on the blocks' FLOPs for `auto` and
        `time`; only `auto` keeps to a budget), `within` holding split/partition.py's `memory` (the stages by the
        memory model, comm/pipeline/memory.py) and `memory_limit` (mm.room); without a budget, or when no split fits
        it, `choose(None)`: the fastest split."""
        from scaletrain.split.partition import BASELINES, BlockCost, Infeasible, optimal

        if choose is None:
            after = [b.input for b in blocks[1:]] + [0]  # the tensor crossing each cut: the next block's input
            # the split follows the FLOPs' ratios alone: per sample where they divide (exact), one search serves every
            # micro-batch (split/partition._fastest keeps it per cost vector)
            micro = max(1, cfg.optim.batch_size // cfg.pipeline.microbatches)
            per = micro if all(b.flops % micro == 0 for b in blocks) else 1
            costs = [BlockCost(b.name, float(b.flops // per), 2.0 * (b.flops // per), b.params, b.saved, out)
                     for b, out in zip(blocks, after)]
            method, k = cfg.pipeline.split, cfg.layout.stages

            def choose(within):
                if method in BASELINES:  # (time: balanced on the FLOPs, as the run balances measured times)
                    return BASELINES[method](costs, k)
                if method != "auto":  # a split.json
                    from types import SimpleNamespace

                    from scaletrain.split.plan import load_split

                    return load_split(method, SimpleNamespace(names=[b.name for b in blocks]), k, cfg.model.name)
                return optimal(costs, k, microbatches=cfg.pipeline.microbatches, schedule=cfg.pipeline.schedule,
                               **(within or {})).bounds
        if mm.room is not None:
            memory = stages_of(mm, blocks, stages=cfg.layout.stages, microbatches=cfg.pipeline.microbatches,
                               schedule=cfg.pipeline.schedule, read_bytes=read_bytes)
            try:
                return choose({"memory": memory, "memory_limit": mm.room})
            except Infeasible:
                pass
        return choose(None)

    @staticmethod
    def check_model(cfg: TrainConfig, factory: Callable[[], nn.Module], sample_shape: tuple[int, ...]) -> None:
        """The model must be cut into at least --stages blocks; a split file must be this model's."""
        from scaletrain.split import plan
        from scaletrain.split.stages import blocked

        stages = cfg.layout.stages
        graph = blocked(factory(), sample_shape, max(1, cfg.optim.batch_size // cfg.pipeline.microbatches), meta=True)
        if stages > len(graph.blocks):
            raise UserError(f"--stages {stages} is more than the {len(graph.blocks)} blocks {cfg.model.name} can "
                            f"be cut into (its cut points: `scaletrain graph --model {cfg.model.name}`): lower "
                            "--stages")
        if cfg.pipeline.split not in plan.METHODS:
            plan.load_split(cfg.pipeline.split, graph, stages, model_name=cfg.model.name)

    def _place_in_mesh(self, rank: int) -> tuple[int, int, Any, Any]:
        """(stage, replica, this replica's pipeline group, this stage's data-parallel group); the groups are None
        with one replica (the default group is the pipeline's). Collective: every rank creates every group."""
        return (rank % self.stages, rank // self.stages, *block_groups(self.stages, self.replicas, rank))

    def _global(self, stage: int, replica: int | None = None) -> int:
        """The rank of `stage` in this rank's replica (or in `replica`)."""
        return (self.replica_index if replica is None else replica) * self.stages + stage

    def _chain(self) -> list[int]:
        """The first replica's stages' ranks in order (the same on every rank): whose links the split is chosen by."""
        return [s for s in range(self.stages)]

    @property
    def _replica_size(self) -> int:
        """Ranks per replica (replica i holds ranks [i n, (i + 1) n))."""
        return self.stages

    @property
    def _counts(self) -> bool:
        """Whether this rank counts the evaluation's predictions (the last stage)."""
        return self.is_last

    @property
    def is_last(self) -> bool:
        return self.stage == self.stages - 1

    # ------------------------------------------------------------ the worker
    def replica(self) -> tuple[int, int]:
        return self.replica_index, self.replicas

    def checkpoint_blocks(self, model: nn.Module, units: list) -> list[str]:
        return self.checkpointed  # set in wrap, on this stage's blocks

    def place(self, model: nn.Module) -> nn.Module:
        return model  # in host memory until wrap has cut it: only this rank's stage goes to the device

    def wrap(self, model: nn.Module, steps_per_epoch: int, sample_shape: tuple[int, ...]) -> nn.Module:
        from scaletrain.split.stages import blocked

        cfg = self.cfg
        micro = cfg.optim.batch_size // cfg.pipeline.microbatches
        graph = blocked(model, sample_shape, micro, meta=True)  # shapes on a meta copy: no memory, statistics untouched
        self.block_names = graph.names
        self.bounds, self.split_info = self._split(model, graph, sample_shape)
        lo, hi = self.bounds[self.stage]
        module = self._stage_of(graph, lo, hi)
        keep_only(model, module)
        place_model(module, self.device)
        self._model = model
        in_shape, out_shape = self._shapes(graph, lo, hi, micro, sample_shape)
        self._in_shape = tuple(in_shape[1:])
        if AUTOCAST.get(cfg.model.precision) is not None or cfg.strategy.offload == "activations":
            module = _Stage(module, self.device.type, AUTOCAST.get(cfg.model.precision), cfg.strategy.offload)
        self._stage, self.schedule = build_schedule(module, self.stage, self.stages, self.device, in_shape,
                                                    out_shape, cfg.pipeline.schedule, cfg.pipeline.microbatches,
                                                    self.pp_group)
        return module

    def _stage_of(self, graph, lo: int, hi: int) -> nn.Module:
        """Blocks lo..hi-1 as this stage trains them (with --checkpoint-activations, cut into its blocks, those
        asked for recomputed in backward); `stage_module`, as evaluation runs them."""
        from scaletrain.train.recompute import Chain, chosen

        names = chosen(self.cfg.model.checkpoint_activations)
        pieces = self._pieces(graph, lo, hi, by_block=bool(names))
        again = [bool(names) and bool(blocks) and (names is True or bool(names & set(blocks))) for blocks, _ in pieces]
        self.checkpointed = ["+".join(blocks) for (blocks, _), a in zip(pieces, again) if a]
        # the layers (fx call_module targets) this stage runs, and those it runs again in backward
        called = [{n.target for n in m.graph.nodes if n.op == "call_module"} if isinstance(m, fx.GraphModule) else
                  set() for _, m in pieces]
        self.stage_layers = set().union(*called)
        self.recomputed_layers = set().union(*(c for c, a in zip(called, again) if a))
        modules = [piece for _, piece in pieces]
        self.stage_module = modules[0] if len(modules) == 1 else Chain(modules, [False] * len(modules))
        return Chain(modules, again) if any(again) else self.stage_module

    def _timed_on_tiles(self) -> tuple[int, int, int] | None:
        """(rows, columns, blocks) where the first blocks run on tiles of a grid: timed so (split/costs.py)."""
        return None

    def _pieces(self, graph, lo: int, hi: int, by_block: bool) -> list[tuple[list[str], nn.Module]]:
        """Blocks lo..hi-1 as consecutive modules, each with the names of the blocks it runs (one module, or one
        per block where activation checkpointing may recompute it)."""
        from scaletrain.split.stages import block_pieces, stage_module

        return block_pieces(graph, lo, hi) if by_block else [(graph.names[lo:hi], stage_module(graph, lo, hi))]

    def _shapes(self, graph, lo: int, hi: int, micro: int, sample_shape) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The shapes of the micro-batch this stage receives (stage 0: reads) and of the one it sends on."""
        blocks = graph.blocks
        return ((micro, *sample_shape) if lo == 0 else tuple(blocks[lo - 1].out_shape)), tuple(blocks[hi - 1].out_shape)

    def _split(self, model: nn.Module, graph, sample_shape) -> tuple[list[tuple[int, int]], dict[str, Any]]:
        """The stage bounds, chosen on rank 0 and shared with every rank; for `auto` and `time`, on block costs
        measured by every rank at once (measured_together), on the devices and threads the stages will run on: seconds (minutes for
        large images: rank 0 says so as it goes), and the split that measured best. A calibration's predicted
        costs (what `scaletrain split` and `predict` use before a run) priced VGG-11's 512-channel blocks at
        0.57x their time here and cut it one block early, 0.79-0.96 of the best split (docs/bench-pipeline.md)."""
        from scaletrain.console.phase import phase
        from scaletrain.split import plan
        from scaletrain.split.costs import ROUNDS

        from scaletrain.split.costs import block_sizes

        cfg = self.cfg
        micro = cfg.optim.batch_size // cfg.pipeline.microbatches
        timed = cfg.pipeline.split in ("auto", "time")  # a split given (uniform, params, a file) needs no times
        what = (f"pipeline split: measuring {len(graph.blocks)} blocks' costs on every rank ({ROUNDS} rounds, "
                f"micro-batch {micro})")
        link = None
        if timed:
            with phase(what) if self.rank.is_main else contextlib.nullcontext() as update:
                costs = measured_together(graph, model, sample_shape, micro, cfg.model.precision, self.device,
                                          update, self._timed_on_tiles())
            # the link the stages' activations cross, measured between this job's neighbours (at the largest cut's
            # bytes, 1-64 MiB): the split weighs the transfers it saves by it
            largest = max((c.out_bytes for c in costs[:-1]), default=0)
            link = measure_links(self._chain(), self.rank.rank, self.device, min(64 << 20, max(1 << 20, largest)))
        else:
            costs = block_sizes(graph, micro, cfg.model.precision)
        on_link = {"link_bytes_per_s": link["bytes_per_s"], "latency_s": link["latency_s"]} if link else {}
        choice = None
        if self.rank.rank == 0:
            def choose(within):
                return plan.choose(cfg.pipeline.split, graph, model, sample_shape, stages=self.stages,
                                   microbatches=cfg.pipeline.microbatches, schedule=cfg.pipeline.schedule,
                                   batch_size=cfg.optim.batch_size, precision=cfg.model.precision,
                                   optimizer=cfg.optim.optimizer, model_name=cfg.model.name, costs=costs,
                                   **on_link, **(within or {}))

            try:
                part = self._within_budget(model, sample_shape, choose)
                choice = {"bounds": [list(b) for b in part.bounds], "method": part.method,
                          "predicted_step_s": part.step_s if timed else None, "costs": "measured" if timed else None,
                          "link": link}
            except UserError as e:
                choice = {"error": str(e)}
        choice = broadcast_object(choice)
        if "error" in choice:
            raise UserError(choice["error"])
        return [tuple(b) for b in choice["bounds"]], choice

    def _within_budget(self, model: nn.Module, sample_shape, choose: Callable):
        """`choose(within)` with the stages held to --memory-per-device by the memory model (comm/pipeline/memory.py),
        as the pre-flight check planned them; `choose(None)` without a budget."""
        from scaletrain.comm.memory import stage_memory

        cfg = self.cfg
        if not cfg.launch.memory_per_device:
            return choose(None)
        factory = lambda: copy.deepcopy(model).to("meta")  # noqa: E731 - shapes only: no memory
        micro = max(1, cfg.optim.batch_size // cfg.pipeline.microbatches)
        mm = stage_memory(cfg, factory, sample_shape, micro, self.device.type)
        if mm is None:
            return choose(None)
        blocks, read = self.held_blocks(cfg, mm, factory, sample_shape)
        return self.split_within(cfg, mm, blocks, read, choose)

    def profiled(self) -> Profiled:
        return Profiled(spans=True)  # the report draws each stage's timeline of a step

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, loss_of: Callable, optimizer: torch.optim.Optimizer,
                         scaler: torch.amp.GradScaler | None, prof) -> torch.Tensor:
        """The schedule's forwards and backwards over the micro-batches of (x, y); the loss (the mean
        over micro-batches, from the last stage) on every rank of the pipeline."""
        self._optimizer = optimizer
        with prof.phase("optimizer"):
            optimizer.zero_grad(set_to_none=True)
        losses: list[torch.Tensor] = []
        with timed(self._stage, prof):
            if self.stage == 0:
                self.schedule.step(x, return_outputs=False)
            elif self.is_last:
                self.schedule.step(target=y, losses=losses, return_outputs=False)
            else:
                self.schedule.step(return_outputs=False)
        # in the dtype every stage makes its zeros in (float64 with --precision fp64): broadcast's buffers must agree
        loss = torch.stack([l.detach().to(torch.get_default_dtype()) for l in losses]).mean() if losses else \
            torch.zeros((), device=self.device)
        with prof.phase("p2p"):
            # the loss to every stage (rank 0 reports it): one scalar, a sync point of the pipeline
            dist.broadcast(loss, src=self._global(self.stages - 1), group=self.pp_group)
        self._reduce_gradients(prof)
        return loss

    def _reduce_gradients(self, prof) -> None:
        if self.dp_group is not None:
            with prof.phase("comm_exposed"):
                self._average_over_replicas()

    def _average_over_replicas(self) -> None:
        """This stage's gradients averaged over the replicas (one flat all-reduce)."""
        all_reduce_flat([p.grad for p in self.stage_module.parameters() if p.grad is not None], self.dp_group,
                        divide=self.replicas)

    # ------------------------------------------------------------ evaluation and the whole model
    def eval_shard(self) -> tuple[int, int] | None:
        return self.replica_index, self.replicas  # the ranks of one pipeline pass the same batches along

    def before_eval(self) -> None:
        """Replicas evaluate and save the first replica's BatchNorm statistics (their weights are equal)."""
        if self.dp_group is not None:
            for b in self.stage_module.buffers():
                dist.broadcast(b, src=self._global(self.stage, replica=0), group=self.dp_group)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader, autocast_dtype: torch.dtype | None, num_classes: int) -> EvalResult:
        """The validation batches through the stages: each batch cut into up to M micro-batches, stage s
        receiving each from stage s-1 and sending its output on without waiting (the stages overlap, as in
        training); the last stage counts. Every rank of a pipeline reads the same batches, so each knows
        the sizes of what it receives."""
        module = self.stage_module
        was_training = module.training
        module.eval()
        tally = Tally(self.device, num_classes)
        prev, nxt = self._global(self.stage - 1), self._global(self.stage + 1)
        for x, y, _bad in loader:
            if len(y) == 0:
                continue
            chunks = x.tensor_split(min(self.cfg.pipeline.microbatches, len(y)))
            outputs, sends = [], []
            for chunk in chunks:
                if self.stage == 0:
                    h = to_device(chunk, self.device)
                else:
                    h = torch.empty((len(chunk), *self._in_shape), device=self.device)
                    dist.recv(h, src=prev, group=self.pp_group)
                with torch.autocast(self.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                    out = module(h).to(torch.get_default_dtype())  # what the next stage receives
                if self._counts:
                    outputs.append(out)
                elif not self.is_last:
                    sends.append(dist.isend(out.contiguous(), dst=nxt, group=self.pp_group))
            for work in sends:
                work.wait()
            if self._counts:
                tally.add(torch.cat(outputs), to_device(y, self.device))
        module.train(was_training)
        return tally.result()

    def _assemble(self) -> dict[str, torch.Tensor] | None:
        """The whole model's state_dict in host memory on the first stage of this rank's replica (None on the
        others), received one stage at a time (collective within the pipeline)."""
        model = self._model
        mine = {k: v.detach().cpu() for k, v in model.state_dict().items() if v.device.type != "meta"}
        if self.stage > 0:
            dist.send_object_list([mine], dst=self._global(0))
            return None
        parts = dict(mine)
        for s in range(1, self.stages):
            box: list[Any] = [None]
            dist.recv_object_list(box, src=self._global(s))
            parts.update(box[0])
        return {k: parts[k] for k in model.state_dict()}

    def state_dict(self, chief: bool) -> dict[str, Any]:
        """The whole model, assembled on rank 0, and the optimizer's state merged from every stage (each rank
        holds its stage's momentum); the checkpoint then equals a one-process run's."""
        whole = self._assemble() if self.replica_index == 0 else None  # (the other replicas' models are equal)
        states = gather_objects(self._own_optimizer_state())
        out: dict[str, Any] = {"comm": [], "ps": None}
        if chief:
            out["model"] = whole
            if states[0] is not None:
                merged = states[0]
                merged["state"] = {k: v for s in states[:self._replica_size] for k, v in s["state"].items()}
                out["optimizer"] = merged
        return out

    def _own_optimizer_state(self) -> dict[str, Any] | None:
        """The optimizer's state_dict with only this stage's parameters' state, in host memory."""
        if self._optimizer is None:
            return None
        sd = self._optimizer.state_dict()
        params = [p for g in self._optimizer.param_groups for p in g["params"]]
        sd["state"] = {k: {name: v.cpu() if torch.is_tensor(v) else v for name, v in state.items()}
                       for k, state in sd["state"].items() if params[k].device.type != "meta"}
        return sd

    def load_model_state(self, model: nn.Module, state: dict[str, Any]) -> None:
        """The checkpoint's (whole model's) entries for this rank's stage; RuntimeError for another model's."""
        current = model.state_dict(keep_vars=True)
        if state.keys() != current.keys():
            raise RuntimeError("the checkpoint's keys are not this model's")
        with torch.no_grad():
            for name, t in current.items():
                if t.device.type == "meta":
                    continue  # another stage's
                if state[name].shape != t.shape:
                    raise RuntimeError(f"{name}: shape {tuple(state[name].shape)} in the checkpoint, "
                                       f"{tuple(t.shape)} here")
                t.copy_(state[name])

    def load_optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """The merged state of every stage, kept for this stage's parameters."""
        params = [p for g in optimizer.param_groups for p in g["params"]]
        optimizer.load_state_dict({**state, "state": {k: v for k, v in state["state"].items()
                                                      if params[int(k)].device.type != "meta"}})

    def digest(self, model: nn.Module) -> str:
        """SHA-256 of the whole model's parameters, assembled on this replica's first stage (as a one-process
        run's param_digest hashes them); every rank of the replica reports it."""
        whole = self._assemble()
        box = [None]
        if whole is not None:
            h = hashlib.sha256()
            for name, _ in model.named_parameters():
                h.update(whole[name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
            box = [h.hexdigest()]
        dist.broadcast_object_list(box, src=self._global(0), group=self.pp_group)
        return box[0]

    def _held_bytes(self) -> tuple[int, int]:
        """(parameter bytes, parameter + gradient + optimizer state bytes) this rank holds (meta: none)."""
        size = lambda t: t.numel() * t.element_size() if t.device.type != "meta" else 0  # noqa: E731
        params = list(self._model.parameters())
        weights = sum(size(p) for p in params)
        grads = sum(size(p.grad) for p in params if p.grad is not None)
        state = sum(size(v) for st in (self._optimizer.state.values() if self._optimizer else ())
                    for v in st.values() if torch.is_tensor(v))
        return weights, weights + grads + state

    def finish(self, chief: bool) -> dict[str, Any]:
        held = gather_objects(self._held_bytes())
        if not chief:
            return {}
        k, m = self.stages, self.cfg.pipeline.microbatches
        return {"pipeline": {
            "stages": k, "replicas": self.replicas, "microbatches": m, "schedule": self.cfg.pipeline.schedule,
            "split": self.split_info.get("method"), "bounds": [list(b) for b in self.bounds],
            "stage_blocks": [self.block_names[lo:hi] for lo, hi in self.bounds],
            "predicted_step_s": self.split_info.get("predicted_step_s"), "split_costs": self.split_info.get("costs"),
            "split_link": self.split_info.get("link"),
            "bubble_theory": (k - 1) / (m + k - 1),
            # what each rank holds (its stage's): parameters, and with their gradients and optimizer state
            "param_bytes_per_rank": [h[0] for h in held], "state_bytes_per_rank": [h[1] for h in held],
            "model_param_bytes": sum(p.numel() * p.element_size() for p in self._model.parameters()),
        }}


def keep_only(model: nn.Module, stage: nn.Module) -> None:
    """Drop from `model` every parameter and buffer that `stage` (a module sharing its tensors) does not use:
    each becomes a tensor of the same shape on the meta device (no storage), so the optimizer built over
    the model keeps its layout (groups, positions) but holds state for this stage alone."""
    own = {id(t) for t in [*stage.parameters(), *stage.buffers()]}
    dropped: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # a tensor two modules share, dropped once
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is None or id(t) in own:
                    continue
                if id(t) not in dropped:  # (the pair keeps t alive: its id is not reused meanwhile)
                    meta = torch.empty_like(t, device="meta")
                    dropped[id(t)] = t, nn.Parameter(meta, t.requires_grad) if isinstance(t, nn.Parameter) else meta
                table[name] = dropped[id(t)][1]



def build_schedule(module: nn.Module, stage_index: int, stages: int, device: torch.device, in_shape: tuple[int, ...],
                   out_shape: tuple[int, ...], schedule: str, microbatches: int, group=None):
    """(PipelineStage, schedule) for one stage computing `module` on micro-batches of `in_shape`; the last
    stage's loss is cross-entropy, the gradients averaged over the micro-batches (scale_grads)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    # input and output shapes given: the stage does not run a forward to learn them (which would move
    # BatchNorm's running statistics once more than the training does); requires_grad as in training:
    # a received activation and every output carry a gradient back
    inp = torch.empty(in_shape, device=device, requires_grad=stage_index > 0)
    out = torch.empty(out_shape, device=device, requires_grad=True)
    stage = PipelineStage(module, stage_index, stages, device, input_args=(inp,), output_args=(out,), group=group)
    schedule_cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
    return stage, schedule_cls(stage, microbatches, loss_fn=nn.CrossEntropyLoss(), scale_grads=True)


def measured_together(graph, model: nn.Module, sample_shape: tuple[int, ...], micro: int,
                      precision: str = "fp32", device: torch.device | None = None,
                      progress: Callable[[str, int, int], None] | None = None,
                      tiles: tuple[int, int, int] | None = None) -> list:
    """The blocks' costs measured by every rank at the same time (collective), each block's times the mean
    over the ranks. The stages of a running pipeline compute side by side, sharing the node's cores, caches
    and memory bandwidth; timed by one process on an otherwise idle node, the blocks came out 3-48% faster
    than inside the pipeline, and by uneven amounts (docs/bench-pipeline.md), which moved the cut."""
    import dataclasses

    from scaletrain.split.costs import block_costs

    mine = block_costs(graph, model, sample_shape, micro, source="measured", precision=precision, device=device,
                       progress=progress, tiles=tiles)
    every = gather_objects([(c.forward_s, c.backward_s) for c in mine])
    n = len(every)
    return [dataclasses.replace(c, forward_s=sum(r[i][0] for r in every) / n,
                                backward_s=sum(r[i][1] for r in every) / n) for i, c in enumerate(mine)]


class _Stage(nn.Module):
    """A stage's forward under autocast and/or with its saved tensors offloaded (the schedule calls the
    module directly, outside the trainer's forward)."""

    def __init__(self, inner: nn.Module, device_type: str, dtype: torch.dtype | None, offload: str) -> None:
        super().__init__()
        self.inner, self.device_type, self.dtype, self.offload = inner, device_type, dtype, offload

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype is not None), \
                offloading(self.offload):
            return self.inner(x).to(torch.get_default_dtype())


@contextlib.contextmanager
def timed(stage, prof):
    """The schedule's step with its time split into the profiler's phases (docs/metrics.md): the stage's
    forward and backward chunks; `bubble`, blocked waiting on a neighbouring stage (for an activation or a
    gradient, or for it to take what this stage sends): the pipeline filling and draining, a slower
    neighbour, the transfers themselves; `p2p`, the rest of the schedule: posting sends and receives,
    splitting the batch, its bookkeeping between chunks.

    torch's schedules call the module function `_wait_batch_p2p` to block; it is wrapped here for the step's
    duration (profiling on only). Were it renamed, the waits would count as `p2p`."""
    if not prof.enabled:
        yield
        return
    from torch.distributed.pipelining import schedules

    orig_wait = schedules._wait_batch_p2p
    orig_fwd, orig_bwd = stage.forward_one_chunk, stage.backward_one_chunk

    def wait(works):
        prof.mark("p2p")
        orig_wait(works)
        prof.mark("bubble")

    def chunk(fn, phase):
        def run(*args, **kwargs):
            prof.mark("p2p")
            with prof.after_mark(phase):  # (a spatial stage's halos are carved out of it)
                return fn(*args, **kwargs)
        return run

    schedules._wait_batch_p2p = wait
    stage.forward_one_chunk, stage.backward_one_chunk = chunk(orig_fwd, "forward"), chunk(orig_bwd, "backward")
    try:
        yield
        prof.mark("p2p")
    finally:
        schedules._wait_batch_p2p = orig_wait
        del stage.forward_one_chunk, stage.backward_one_chunk
