"""Every check of `scaletrain train` that can be made before a worker starts; writes nothing."""

from __future__ import annotations

import errno
import socket
import sys
from pathlib import Path

import torch

from scaletrain import fmt
from scaletrain.comm import memory
from scaletrain.comm.registry import strategy_class
from scaletrain.distributed.allocator import resolved
from scaletrain.config import TrainConfig
from scaletrain.data import build_datasets, default_image_size
from scaletrain.distributed.device import check_device_request
from scaletrain.distributed.env import cache_dir
from scaletrain.errors import UserError
from scaletrain.models import build_model
from scaletrain.perf import footprint
from scaletrain.rundir import RunDir, check_out_dir
from scaletrain.train import checkpoint
from scaletrain.units import size_flag


def validate(cfg: TrainConfig) -> TrainConfig:
    """Every check of a training request that needs no run directory: the launch's shape, the device,
    the data, the model, the batch against the data. Writes nothing; `study` runs it for every point. Returns
    the request with the settings left to auto that the memory decides resolved (planned())."""
    cfg.check_launch()
    requested = cfg
    device_type = check_device_request(cfg.launch.device, cfg.launch.nproc, cfg.model.precision)
    if cfg.model.sync_bn and device_type != "cuda":
        raise UserError("--sync-bn needs CUDA (PyTorch's SyncBatchNorm has no CPU kernel): drop --sync-bn")
    if cfg.strategy.offload != "none" and device_type != "cuda":
        raise UserError(f"--offload {cfg.strategy.offload} needs a CUDA device: on the CPU the model already lives "
                        "in host memory, there is nowhere to offload to: drop --offload")
    # estimated before building anything: digits is resized into memory, and a model is only built on
    # the meta device until it is known to fit
    size = cfg.data.image_size or default_image_size(cfg.data.dataset)
    hint = (f"lower --image-size (now {size}), --batch-size (now {cfg.optim.batch_size}) or --width, "
            f"or start fewer processes (--nproc {cfg.launch.nproc})")
    in_memory = footprint.dataset_bytes(cfg.data.dataset, size)
    footprint.check_fits(footprint.Footprint(dataset=in_memory), cfg.launch.nproc, footprint.available_bytes("cpu"),
                         "cpu", hint)
    data = build_datasets(cfg.data.dataset, image_size=cfg.data.image_size, seed=cfg.optim.seed,
                          synthetic_samples=cfg.data.synthetic_samples, synthetic_classes=cfg.data.synthetic_classes,
                          augment=False, cache=cache_dir())

    def factory():
        return build_model(cfg.model.name, num_classes=data.num_classes, in_channels=data.in_channels,
                           image_size=data.image_size, stem=cfg.model.stem, width=cfg.model.width)

    try:  # a model name or factory that builds nothing: said first (on the meta device: no memory)
        with torch.device("meta"):
            factory()
    except UserError:
        raise
    except Exception:  # noqa: BLE001 - a model the meta device cannot build is built for real below
        pass
    trainers = cfg.layout.replicas
    per_rank = -(-len(data.train) // trainers)  # DistributedSampler pads every rank to the same count
    if per_rank < cfg.optim.batch_size:
        most = max(1, len(data.train) // cfg.optim.batch_size)
        raise UserError(f"--batch-size {cfg.optim.batch_size} x {trainers} training ranks is more than the "
                        f"{len(data.train)} training samples of {cfg.data.dataset}: lower --batch-size to "
                        f"{max(1, per_rank)} or use at most {most} training ranks")
    strategy = strategy_class(cfg.strategy.name)
    if cfg.launch.checkpoint_every and not strategy.lockstep:
        raise UserError("--checkpoint-every needs ranks that take their steps together; --strategy "
                        f"{cfg.strategy.name}'s workers step at their own pace and checkpoint at epoch ends: drop "
                        "--checkpoint-every")
    if cfg.faults.max_restarts and strategy.agent_per_rank:
        raise UserError(f"--max-restarts restarts a node's workers together, and --strategy {cfg.strategy.name} "
                        "starts one agent per rank (a dead worker is tolerated, not restarted): drop --max-restarts")
    shape = (data.in_channels, data.image_size, data.image_size)
    strategy.check_model(cfg, factory, shape)
    cfg = planned(cfg, strategy, factory, shape, device_type)
    if requested.model.checkpoint_activations == "auto":
        chosen = cfg.model.checkpoint_activations
        print(f"note: --checkpoint-activations auto: {'no block' if chosen == 'none' else chosen} (the fewest "
              "blocks that bring the plan within the memory per rank)", file=sys.stderr)
    need = memory.per_rank(cfg, factory, shape, device_type)
    if need is None:
        factory()  # a model the meta device cannot run: build it for real, to see that it builds
    else:
        footprint.check_fits(need, cfg.launch.nproc, footprint.available_bytes(device_type), device_type, hint)
        if cfg.launch.memory_per_device:
            check_budget(cfg, factory, shape, need, size_flag(cfg.launch.memory_per_device, "--memory-per-device"),
                         device_type)
    return cfg


def planned(cfg: TrainConfig, strategy, factory, shape: tuple[int, ...], device_type: str) -> TrainConfig:
    """The settings left to auto that the memory decides: the allocator's (a CPU run with --memory-per-device runs
    lean, said in one line: steady's heap grows past what is live by what the model cannot price, e.g. +900 MiB
    on 2 tiles of a 1,920 px image, docs/perf.md; else steady), then the strategy's (e.g. --spatial-until) and
    checkpointing's."""
    budget = size_flag(cfg.launch.memory_per_device, "--memory-per-device") if cfg.launch.memory_per_device else 0
    if cfg.launch.allocator == "auto":
        lean = resolved("auto", bool(budget), device_type) == "lean"
        cfg = cfg.replace(allocator="lean" if lean else "steady")
        if lean:
            print(f"note: --allocator auto: lean (what a step frees goes back to the system, so the resident peak "
                  f"is the live one that --memory-per-device {cfg.launch.memory_per_device} is planned against; "
                  "steps are slower: docs/perf.md)", file=sys.stderr)
    elif budget and device_type == "cpu" and cfg.launch.allocator == "steady":
        print(f"note: --allocator steady: glibc's heap may grow past the live peak that --memory-per-device "
              f"{cfg.launch.memory_per_device} is planned against (docs/perf.md); --allocator lean keeps to it",
              file=sys.stderr)
    if budget:
        cfg = strategy.resolve(cfg, factory, shape, lambda c: memory.within(
            (memory.per_rank(c, factory, shape, device_type) or footprint.Footprint()).total, budget))
    return checkpointing(cfg, factory, shape, device_type)


def checkpointing(cfg: TrainConfig, factory, shape: tuple[int, ...], device_type: str) -> TrainConfig:
    """The blocks --checkpoint-activations names must be the model's; `auto` becomes the blocks it takes."""
    from scaletrain.train.recompute import plan_units

    value = cfg.model.checkpoint_activations
    if value in ("none", "blocks"):
        return cfg
    if value == "auto":
        return memory.resolve_checkpointing(cfg, factory, shape, device_type)
    with torch.device("meta"):
        plan_units(factory(), shape, value)  # a name that is no block: refused, naming the blocks
    return cfg


def check_budget(cfg: TrainConfig, factory, shape: tuple[int, ...], need: footprint.Footprint, budget: int,
                 device_type: str) -> None:
    """Refuse a run whose planned memory per rank exceeds --memory-per-device, naming the layouts that fit."""
    if memory.within(need.total, budget):
        return
    parts = ", ".join(f"{name} {fmt.size(v)}" for name, v in need.parts().items() if v)
    fits = memory.fitting(cfg, factory, shape, budget, device_type, need.runtime)
    fix = (f"layouts of these {cfg.layout.world} ranks that fit: " + "; ".join(f"{flags} ({fmt.size(b)})"
                                                                           for flags, b in fits[:3])
           if fits else "no layout of these ranks fits: lower --image-size or --batch-size, or use more ranks")
    raise UserError(f"this run plans {fmt.size(need.total)} per rank ({parts}), more than --memory-per-device "
                    f"{cfg.launch.memory_per_device} less a {memory.MARGIN:.0%} margin: {fix}")


def preflight(cfg: TrainConfig) -> tuple[RunDir, TrainConfig]:
    """Every check that can be made before a worker starts; writes nothing. Returns the run directory and the
    request as the workers take it (validate: `auto` resolved)."""
    check_address("--master-addr", cfg.launch.master_addr)
    if cfg.launch.local_addr:
        check_address("--local-addr", cfg.launch.local_addr)
    cfg = validate(cfg)
    # the run directory is node 0's to check and create (other nodes of a shared file system join it)
    launch = cfg.launch
    run = check_out_dir(launch.out, launch.resume) if launch.node_rank == 0 else RunDir(Path(launch.out))
    if cfg.launch.resume and cfg.launch.node_rank == 0:
        ckpt = checkpoint.load(run.checkpoint, mmap=True)
        checkpoint.check_resume(ckpt, cfg.to_dict(), run.checkpoint, default_image_size)
        _note_world_change(ckpt, cfg)
    return run, cfg


def _note_world_change(ckpt: dict, cfg: TrainConfig) -> None:
    """A resume on another number of processes is allowed, but it is not the same run: say so. A checkpoint
    counts the ranks that train (a parameter server's workers, not its servers), as the layout's trainers do."""
    layout = cfg.layout
    before, now = ckpt.get("world_size"), layout.trainers
    strategy_class(cfg.strategy.name).check_resume(cfg, layout.world)  # e.g. a parameter server's layout
    if before is None or before == now:
        return
    nproc = before + layout.servers  # the processes to launch: the trainers and the servers
    as_started = f"--nproc {nproc // layout.nodes if nproc % layout.nodes == 0 else nproc}"
    if ckpt.get("within_epoch"):
        raise UserError(f"the checkpoint in {cfg.launch.out} was written part way through epoch {ckpt['epoch'] + 1} by "
                        f"{before} processes, and its place in the epoch is theirs: resume with {before} processes "
                        f"({as_started})")
    per_trainer = layout.replicas / now  # the replicas a training rank stands for (a pipeline's stages share one)
    batch = ckpt["config"].get("batch_size")
    print(f"note: the run was trained with {before} processes (global batch {round(before * per_trainer) * batch}), "
          f"this resume uses {now} (global batch {layout.replicas * cfg.optim.batch_size}): the LR schedule is "
          f"re-planned for the new steps per epoch and the data order does not replay; {as_started} continues it "
          "exactly", file=sys.stderr)


def check_address(flag: str, addr: str) -> None:
    """An address the nodes can use: an IP address, or a host name that resolves here (one line, not the
    rendezvous's error after --timeout)."""
    try:
        socket.getaddrinfo(addr, None)
    except (socket.gaierror, UnicodeError):
        raise UserError(f"{flag} {addr} is neither an IP address nor a host name that resolves here: give the "
                        "node's IP address (see `hostname -I` on it)") from None


def free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        _bind(s, addr, 0)
        return s.getsockname()[1]


def check_port(addr: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        _bind(s, addr, port)


def _bind(s: socket.socket, addr: str, port: int) -> None:
    """Bind the rendezvous address here (node 0 hosts it): a busy port, or an address that is not this
    machine's, is one line."""
    try:
        s.bind((addr, port))
    except socket.gaierror:
        raise UserError(f"--master-addr {addr} does not resolve to an address: give node 0's IP address "
                        "(or leave it out on one node)") from None
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise UserError(f"master port {port} on {addr} is already in use (another job?): pass a free "
                            "--master-port, or leave it out to pick one automatically") from None
        raise UserError(f"--master-addr {addr} is not an address of this machine ({e.strerror}), and node 0 "
                        "hosts the rendezvous: on one node leave --master-addr out (127.0.0.1); on node 0 of "
                        "several, give its own address that the other nodes reach") from None
