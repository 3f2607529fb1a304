"""The strategy seam: one interface for every way of aggregating gradients (docs/architecture.md).

The trainer's loop knows only this interface; each strategy lives in its own module and is named in
`registry.py`. What a strategy decides, in the order the worker meets it:

    strategy = create(cfg, rank)           # joins its process group(s); its role is fixed here
    if strategy.role == SERVER:            #   (a parameter server serves instead of training)
        strategy.serve(model)
    model = strategy.place(model)          # the model on the device (a pipeline stage: none of it yet)
    module = strategy.wrap(model, steps, sample_shape)  # what forward/backward run through (DDP, the model)
    loss = strategy.forward_backward(x, y, loss_of, optimizer, scaler, prof)
    extra = strategy.step(optimizer, scaler, prof, global_step)   # after backward: apply the update
    strategy.eval_shard()                  # which part of the validation split this rank evaluates
    strategy.evaluate(model, loader, ...)  # its part of the evaluation (by default through eval_module(model))
    strategy.state_dict(chief) / load_state_dict(ckpt, step)      # its part of the checkpoint
    strategy.finish(chief)                 # ends its exchange; its entries of summary.json
    strategy.close()                       # tears its process group(s) down

A pipeline or a sharded (FSDP) strategy implements the same methods: `wrap` returns the stage or the
sharded module, `forward_backward` runs the pipeline schedule over the micro-batches (in place of one
forward and one backward), `step` the optimizer step, `eval_shard`/`evaluate` who evaluates and how (a
pipeline's stages pass the validation batches along as they pass training's).
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from typing import Any, Callable

import torch

from scaletrain.config import TrainConfig
from scaletrain.distributed.rank import RankInfo
from scaletrain.perf.precision import place_model
from scaletrain.train.evaluate import EvalResult

WORKER, SERVER = "worker", "server"


@dataclass
class Profiled:
    """What the step profiler may wrap: the DDP module whose gradient buckets it times, and the
    communication hook (with its state) that the strategy would register itself."""

    module: torch.nn.Module | None = None
    hook: Callable | None = None
    state: Any = None
    spans: bool = False  # record each step's phase spans (a pipeline stage's timeline), not only their sums


class Strategy:
    """Base class: a single process that trains alone (no exchange). Subclasses override what differs."""

    role = WORKER
    tolerates_dead_workers = False  # ps-async: a worker that dies does not end the job
    lockstep = True  # every rank takes step n together: the loop may agree on something at any step
    agent_per_rank = False  # start one elastic agent per rank on one node (see distributed/launch/isolated.py)
    optimizer_state_keys = "positions"  # how checkpoints key optimizer state: by parameter "positions" or "names"
    gradient_buckets = False  # DDP's buckets carry the gradients: --bucket-cap-mb applies (the diagnosis asks)
    local_update = True  # the rank's own optimizer applies the update (a parameter server's workers: no)
    exchange_settings: tuple[str, ...] = ()  # settings besides batch and --compress that change its exchange's time
    priced = True  # its cost(pricing) prices a step (predict refuses a strategy that does not, before tracing)
    plan_leaves_out = ""  # why `scaletrain plan` does not search it (empty: plan searches it)
    # every trainer runs the whole model's forward and backward at its batch, and its cost only adds to them: a
    # step takes at least that compute (plan prunes by it); a pipeline's stage or a spatial tile runs a part
    computes_whole_model = True

    # where calibrate keeps its `host_work` rows (strategies that share their host work share the key; "": none)
    host_key = ""

    @classmethod
    def step_floor_s(cls, cfg: TrainConfig, facts: dict[str, Any], predictor: Any, threads: int) -> float | None:
        """Where its trainers do not run the whole model (`computes_whole_model` False): a lower bound on the step its
        `cost` prices for `cfg` (seconds; facts: the data's; the point's basis and threads per rank), cheaper than
        pricing it, which a plan prunes by; None: no bound (every candidate priced)."""
        return None

    @classmethod
    def host_work(cls, device: torch.device, threads: int, quick: bool) -> list[dict[str, Any]]:
        """What its step does on the host that no op, collective or the local optimizer's law prices, timed once by
        `scaletrain calibrate` at `threads` (already set): rows {threads, tensors, numel, ..., <part>_s}, which its
        `cost` reads back as laws through `Pricing.host_law`. None by default."""
        return []

    def __init__(self, cfg: TrainConfig, rank: RankInfo, device: torch.device, backend: str) -> None:
        self.cfg = cfg
        self.rank = rank  # this process among the ranks that train (a parameter-server job's workers)
        self.device = device
        self.backend = backend

    @classmethod
    def create(cls, cfg: TrainConfig, rank: RankInfo) -> "Strategy":
        """This rank's strategy on its device (on CPU with its share of the cores as threads), in the
        process group every rank joins. Strategies with roles or groups of their own override it."""
        from scaletrain.distributed.device import choose_device, cpu_threads_per_rank
        from scaletrain.distributed.group import init_process_group

        device = choose_device(cfg.launch.device, rank)
        if device.type == "cpu":
            torch.set_num_threads(cpu_threads_per_rank(rank.local_world_size, cfg.launch.threads))
        return cls(cfg, rank, device, init_process_group(device, rank, timeout_s=cfg.faults.timeout))

    # ------------------------------------------------------------ launch-time facts (no process yet)
    @classmethod
    def cost(cls, pricing):
        """What this strategy adds to a predicted step (a predict.pricing.Cost from a predict.pricing.Pricing):
        its exposed communication, phases and memory it changes. One process alone exchanges nothing."""
        from scaletrain.predict.pricing import Cost

        return Cost()

    @classmethod
    def memory(cls, cfg: TrainConfig, memory_at: Callable, factory: Callable[[], torch.nn.Module],
               sample_shape: tuple[int, ...]):
        """Bytes per rank of its layout (a perf.footprint.Footprint: parameters with their state, the activations'
        peak), from `memory_at(batch)`: the model's perf.footprint.ModelMemory at a batch; `factory()` gives the
        model on the meta device, one instance kept for every call (read it, never train or change it). A
        data-parallel rank holds the whole model and its batch's activations."""
        from scaletrain.perf.footprint import Footprint

        mm = memory_at(cfg.optim.batch_size)
        return Footprint(params=mm.state_bytes(buckets=cls.gradient_buckets), activations=mm.activations())

    @classmethod
    def resolve(cls, cfg: TrainConfig, factory: Callable[[], torch.nn.Module], sample_shape: tuple[int, ...],
                fits: Callable[[TrainConfig], bool]) -> TrainConfig:
        """Its settings left to `auto` that depend on memory, chosen before any process starts (every rank then
        takes the same): `fits(cfg)` says whether a choice's planned memory per rank is within the budget."""
        return cfg

    @staticmethod
    def check_model(cfg: TrainConfig, factory: Callable[[], torch.nn.Module], sample_shape: tuple[int, ...]) -> None:
        """Refuse, before any process starts, a model (built by `factory`) this strategy cannot run as asked."""

    @staticmethod
    def check_resume(cfg: TrainConfig, world_size: int) -> None:
        """Refuse, before any process starts, a resume that this strategy cannot continue."""

    # ------------------------------------------------------------ the worker
    def serve(self, model: torch.nn.Module) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no server role")

    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        """The freshly built model on this rank's device (a pipeline stage moves only its own part, in wrap)."""
        return place_model(model, self.device)

    def wrap(self, model: torch.nn.Module, steps_per_epoch: int, sample_shape: tuple[int, ...]) -> torch.nn.Module:
        """The module forward and backward run through (`sample_shape`: one input sample's, no batch
        dimension). Collective where it builds groups: every rank calls it at the same point."""
        return model

    def checkpoint_blocks(self, model: torch.nn.Module, units: list) -> list[str]:
        """Activation checkpointing of the model's blocks (train/recompute.Unit, read before wrap), set after wrap;
        the names of the blocks checkpointed on this rank."""
        from scaletrain.train.recompute import apply

        apply(model, units)
        return [u.name for u in units]

    def replica(self) -> tuple[int, int]:
        """(index, count) of the data-parallel replica this rank belongs to: which shard of each epoch it
        reads and how many replicas share the global batch (ranks of one pipeline read the same batches)."""
        return self.rank.rank, self.rank.world_size

    def profiled(self) -> Profiled:
        return Profiled()

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, loss_of: Callable, optimizer: torch.optim.Optimizer,
                         scaler: torch.amp.GradScaler | None, prof) -> torch.Tensor:
        """One step's forward (`loss_of(x, y)`: the wrapped module and the criterion under autocast) and
        backward, timed as the profiler's phases; returns the loss."""
        with prof.phase("forward"), offloading(self.cfg.strategy.offload):
            loss = loss_of(x, y)
        with prof.phase("optimizer"):
            # freed just before backward allocates new gradients, so the allocator hands the same memory
            # back; freed right after the step instead, steps were 20% slower on CPU (page faults)
            optimizer.zero_grad(set_to_none=True)
        with prof.phase("backward"):  # DDP all-reduces gradient buckets while backward runs
            (scaler.scale(loss) if scaler is not None else loss).backward()
        return loss

    def step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None, prof,
             global_step: int) -> dict[str, Any]:
        """After backward: apply the update. Returns fields to record with the step."""
        with prof.phase("optimizer"):
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
        return {}

    def eval_shard(self) -> tuple[int, int] | None:
        """(index, count) of the validation split this rank evaluates; None: it does not evaluate."""
        return self.rank.rank, self.rank.world_size

    def eval_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """What evaluation runs the validation batches through (the local model, not DDP's wrapper)."""
        return model

    def evaluate(self, model: torch.nn.Module, loader, autocast_dtype: torch.dtype | None,
                 num_classes: int) -> EvalResult:
        """This rank's part of evaluating the model on the validation split (collective): rank 0's BN
        statistics on every rank first (DDP syncs them only at the next forward), so every rank evaluates,
        and the checkpoint saves, the same model."""
        from scaletrain.distributed.group import broadcast_buffers
        from scaletrain.train.evaluate import evaluate

        broadcast_buffers(model)
        return evaluate(self.eval_module(model), loader, self.device, autocast_dtype, num_classes,
                        lockstep=self.lockstep_eval)

    lockstep_eval = False  # every rank must run as many evaluation forwards as the others (FSDP)

    def load_model_state(self, model: torch.nn.Module, state: dict[str, Any]) -> None:
        """Load a checkpoint's model state (the whole model's) into this rank's model."""
        model.load_state_dict(state)

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                             state: dict[str, Any]) -> None:
        """Load a checkpoint's optimizer state into this rank's optimizer."""
        optimizer.load_state_dict(state)

    def digest(self, model: torch.nn.Module) -> str:
        """SHA-256 of this rank's model parameters (summary.json's param_digests)."""
        return param_digest(model)

    def before_eval(self) -> None:
        """Bring the local model up to date before it is evaluated and saved."""

    def state_dict(self, chief: bool) -> dict[str, Any]:
        """Its entries of the checkpoint (`comm`: per-rank state, `ps`: the servers'), on the chief.
        Collective: every rank calls it at the same point."""
        return {"comm": [], "ps": None}

    def load_state_dict(self, ckpt: dict[str, Any], global_step: int) -> None:
        """After the model and optimizer were loaded from `ckpt`."""

    def finish(self, chief: bool) -> dict[str, Any]:
        """End the exchange (collective); the chief gets its entries of summary.json."""
        return {}

    def close(self) -> None:
        """Tear the process group(s) down."""
        from scaletrain.distributed.group import shutdown

        shutdown()


def offloading(offload: str) -> contextlib.AbstractContextManager:
    """`--offload activations`: the tensors autograd saves during forward go to pinned host memory, copied
    asynchronously, and come back when backward needs them (torch.autograd.graph.save_on_cpu)."""
    if offload != "activations":
        return contextlib.nullcontext()
    return torch.autograd.graph.save_on_cpu(pin_memory=True)


@contextlib.contextmanager
def closing(strategy: Strategy):
    try:
        yield strategy
    finally:
        strategy.close()


def param_digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter's bytes: equal on all ranks iff the replicas are bit-identical."""
    h = hashlib.sha256()
    for p in model.parameters():
        # raw bytes of any dtype (bf16 has no numpy type); note: a device-to-host copy, once per run
        h.update(p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
