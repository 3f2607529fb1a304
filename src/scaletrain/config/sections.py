"""The sections of a training configuration, each next to what it configures and validated on its own.

Each section is a dataclass whose fields are settings: flags of `scaletrain train` and keys of config.toml,
flat (`--lr`, `lr = 0.1`; a field named otherwise says its key: `cfg.model.name` is `--model`, config/fields.py);
the docstring under a field is its --help text. Sub-specs (`--compress`, `--inject`, `--torch-profile`) are
parsed here once, into the values components use. A strategy's own settings live beside it (comm/ps/options.py,
comm/pipeline/options.py). `TrainConfig` (config/train.py) nests all of them: `cfg.optim.lr`.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass, field

from scaletrain.comm.registry import VALUES_OF_ONE
from scaletrain.comm.spec import check, parse_compress
from scaletrain.config.fields import at_least, check_choice, flag, key
from scaletrain.config.specs import Injection, parse_inject, torch_profile_window
from scaletrain.errors import UserError
from scaletrain.units import size_flag

OPTIMIZERS = ("sgd", "nesterov", "adagrad", "adamw")
PRECISIONS = ("fp32", "bf16", "fp16")  # what predict, graph and split price
TRAIN_PRECISIONS = (*PRECISIONS, "fp64")  # fp64: for proving equivalence (perf/precision.py)
SCHEDULES = ("cosine", "step", "constant")
BAD_IMAGE_POLICIES = ("error", "skip")
DEVICES = ("auto", "cpu", "cuda")
SWITCHES = ("on", "off")
TENSORBOARD = ("auto", "on", "off")
OFFLOADS = ("none", "activations", "params")
ALLOCATORS = ("steady", "lean", "auto")  # distributed/allocator.py
CHECKPOINTS = ("none", "blocks", "auto")


@dataclass(kw_only=True)
class DataConfig:
    """What the model is trained on and how it is loaded."""

    dataset: str = "digits"
    """`digits`, `bigdigits:SIZE` (a digit on a SIZE x SIZE canvas: docs/datasets.md), `synthetic` or
    `imagefolder:PATH`."""

    image_size: int | None = None
    """Square input size; None takes the dataset's default (32 for digits/synthetic, SIZE for bigdigits:SIZE, which
    a smaller side averages down, 224 for folders)."""

    augment: bool = True
    """Training-time augmentation (random shifts for digits, random resized crop + flip for folders; none for
    bigdigits)."""

    synthetic_samples: int = 4096
    """Training samples of the `synthetic` dataset (validation gets a quarter)."""

    synthetic_classes: int = 10
    """Classes of the `synthetic` dataset."""

    bad_images: str = "error"
    """`error` stops at the first unreadable image (naming it); `skip` drops it and counts it."""

    workers: int = 0
    """Data-loader processes per rank (0 = load in the training process)."""

    persistent_workers: bool = False
    """Keep data-loader workers alive between epochs instead of starting them anew each epoch (a resumed
    run then no longer replays augmentation bit-exactly)."""

    def __post_init__(self) -> None:
        check_choice("bad_images", self.bad_images, BAD_IMAGE_POLICIES)
        at_least(self, 1, "synthetic_samples", "synthetic_classes")
        at_least(self, 0, "workers")
        if self.image_size is not None and self.image_size < 1:
            raise UserError(f"--image-size must be at least 1 (got {self.image_size})")


@dataclass(kw_only=True)
class ModelConfig:
    """The network and its arithmetic."""

    name: str = field(default="resnet20", metadata=key("model"))
    """Registry name (see `scaletrain models`) or `package.module:factory`."""

    stem: str = "auto"
    """ResNet-18/34/50 stem: `imagenet`, `cifar` or `auto` (cifar when image_size <= 64)."""

    width: float = 1.0
    """Channel/hidden-width multiplier of the model."""

    precision: str = "fp32"
    """`fp32`, `bf16` (autocast), `fp16` (autocast + GradScaler; CUDA only) or `fp64` (float64 throughout:
    for checking that a strategy computes what one process does, on any CPU; slow)."""

    sync_bn: bool = False
    """Convert BatchNorm to SyncBatchNorm (CUDA only in PyTorch)."""

    checkpoint_activations: str = "none"
    """Activation checkpointing: `blocks` keeps only each block's input for backward and runs the block's forward
    again there (less memory, about one more forward of compute; the same gradients); `auto` the fewest blocks
    that bring the planned memory within --memory-per-device (docs/perf.md); or the blocks named, comma-separated
    (`scaletrain graph --level block` names them); `none` keeps every activation."""

    def __post_init__(self) -> None:
        check_choice("precision", self.precision, TRAIN_PRECISIONS)
        if self.checkpoint_activations not in CHECKPOINTS and not all(
                name.strip() for name in self.checkpoint_activations.split(",")):
            raise UserError(f"--checkpoint-activations {self.checkpoint_activations!r}: give none, blocks, auto, or "
                            "block names separated by commas (e.g. stem,layer1.0)")
        if not 0 < self.width < math.inf:
            raise UserError(f"--width must be a positive number (got {self.width})")


@dataclass(kw_only=True)
class OptimConfig:
    """The optimisation: epochs, batch, optimizer, learning-rate schedule, seed, evaluation cadence."""

    epochs: int = 10
    """Training epochs (in total, across resumes)."""

    batch_size: int = 64
    """Per-process batch size; the global batch is batch_size x world size."""

    optimizer: str = "sgd"
    """`sgd`, `nesterov`, `adagrad` or `adamw`."""

    lr: float = 0.1
    """Base learning rate (before the linear scaling rule)."""

    momentum: float = 0.9
    """Momentum for sgd/nesterov (beta1 for adamw)."""

    weight_decay: float = 5e-4
    """L2 weight decay (decoupled for adamw)."""

    scale_lr: bool = False
    """Linear scaling rule (Goyal et al. 2017): lr x global_batch / ref_batch."""

    ref_batch: int = 256
    """Reference batch of the linear scaling rule."""

    warmup_epochs: float = 0.0
    """Gradual warm-up: the LR ramps linearly per step from the base lr to the scaled lr."""

    schedule: str = "cosine"
    """After warm-up: `cosine` decay to 0, `step` (x0.1 at 50% and 75% of training) or `constant`."""

    seed: int = 0
    """Seed of initialisation, data order and augmentation."""

    eval_every: int = 1
    """Evaluate on the validation split every N epochs (and always after the last)."""

    def __post_init__(self) -> None:
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("schedule", self.schedule, SCHEDULES)
        at_least(self, 1, "epochs", "batch_size", "ref_batch", "eval_every")
        if not 0 < self.lr < math.inf:  # also refuses NaN
            raise UserError(f"--lr must be a positive number (got {self.lr})")
        if not 0 <= self.weight_decay < math.inf:
            raise UserError(f"--weight-decay must be 0 or a positive number (got {self.weight_decay}): e.g. 5e-4")
        if not 0 <= self.momentum < 1:
            raise UserError(f"--momentum must be in [0, 1) (got {self.momentum}): e.g. 0.9")
        if not 0 <= self.seed < 2 ** 32:
            raise UserError(f"--seed must be in 0..{2 ** 32 - 1} (got {self.seed})")
        if not 0 <= self.warmup_epochs <= self.epochs:
            raise UserError(f"--warmup-epochs must be between 0 and --epochs ({self.epochs}), got {self.warmup_epochs}")


@dataclass(kw_only=True)
class LaunchConfig:
    """Where and how the processes start, and the run directory they write."""

    nproc: int = 1
    """Local worker processes (one per GPU, or CPU ranks), started by torch's elastic agent; with
    --strategy pipeline, `KxR` starts R replicas of a K-stage pipeline (K x R processes)."""

    nnodes: int = 1
    """Nodes of a multi-node launch: run the same command on every node with its --node-rank."""

    node_rank: int = 0
    """This node's index, 0..nnodes-1 (node 0 hosts the rendezvous at --master-addr:--master-port)."""

    master_addr: str = "127.0.0.1"
    """Rendezvous address: this machine for a one-node launch, node 0's address for several nodes."""

    master_port: int | None = None
    """Rendezvous port; default: a free one (one node only; several nodes must name the same port)."""

    local_addr: str | None = None
    """Address the other nodes reach this node at (multi-node); default: what the hostname resolves to."""

    device: str = "auto"
    """`auto` (CUDA when present), `cpu` or `cuda`."""

    threads: int | None = None
    """Torch intra-op threads per CPU rank; default: cores / local ranks (in a study: cores / its largest
    nproc, the same for every point)."""

    out: str | None = None
    """Run directory; default runs/<model>-<dataset>-<timestamp>."""

    resume: bool = False
    """Continue the run in `out` from its last checkpoint."""

    stop_after: int | None = None
    """Stop this invocation after N epochs, leaving a resumable run (for time-limited jobs)."""

    checkpoint_every: int = 0
    """Also checkpoint every N training steps (atomically, as at epoch ends), so that a crash or a
    preemption loses at most N steps; 0: at epoch ends only."""

    memory_per_device: str | None = None
    """Memory one rank may use (e.g. 2GiB: of a GPU, or of the host per CPU rank): a run whose planned memory per
    rank is more is refused before it starts, naming the layouts of the same ranks that fit (docs/perf.md)."""

    allocator: str = "auto"
    """How a CPU rank's memory allocator keeps what a step frees: `steady` (glibc's heap keeps tensors under 32 MiB
    for the next step: steady, fast steps, a resident peak above the live one), `lean` (tensors of 1 MiB and more
    are given back when freed: the resident peak is the live one, steps slower by the kernel's fresh pages), or
    `auto`: steady, unless --memory-per-device is met only with lean (docs/perf.md)."""

    progress: bool = True
    """Show progress on rank 0: a bar on a terminal; in a log (a SLURM job's output, nohup, a pipe) a line
    after the first step, then every 100 steps (10 s apart at least) or 30 s, whichever comes first."""

    def __post_init__(self) -> None:
        check_choice("device", self.device, DEVICES)
        at_least(self, 1, "nproc")
        if self.stop_after is not None and self.stop_after < 1:
            raise UserError(f"--stop-after must be at least 1 epoch (got {self.stop_after})")
        if self.threads is not None and self.threads < 1:
            raise UserError(f"--threads must be at least 1 (got {self.threads})")
        if self.checkpoint_every < 0:
            raise UserError(f"--checkpoint-every must be 0 (epoch ends only) or a number of steps (got "
                            f"{self.checkpoint_every})")
        at_least(self, 1, "nnodes")
        if not 0 <= self.node_rank < self.nnodes:
            raise UserError(f"--node-rank must be in 0..{self.nnodes - 1} for --nnodes {self.nnodes} "
                            f"(got {self.node_rank})")
        check_address("master_addr", self.master_addr)
        check_address("local_addr", self.local_addr)
        if self.memory_per_device is not None:
            size_flag(self.memory_per_device, "--memory-per-device")
        check_choice("allocator", self.allocator, ALLOCATORS)
        if self.nnodes > 1 and self.master_port is None:
            raise UserError("--nnodes > 1 needs --master-port (the same on every node) and --master-addr "
                            "(node 0's address)")
        if self.master_port is not None and not 1 <= self.master_port <= 65535:
            raise UserError(f"--master-port must be in 1..65535 (got {self.master_port})")


@dataclass(kw_only=True)
class StrategyConfig:
    """How gradients are aggregated across processes (docs/strategies.md)."""

    name: str = field(default="allreduce", metadata=key("strategy"))
    """How gradients are aggregated across the processes (each strategy and what it trades: docs/strategies.md)."""

    compress: str | None = None
    """Gradient compression with `allreduce` or a parameter server: `fp16`, `bf16`, `topk:RATIO`, `sign`,
    `qsgd:LEVELS`, `powersgd:RANK` (allreduce only; top-k and sign keep the rest as error feedback);
    see docs/strategies.md."""

    bucket_cap_mb: float | str | None = None
    """DDP gradient bucket size in MiB (smaller buckets start communicating earlier in backward); unset:
    DDP's default, 25 MiB with a first bucket of 1 MiB (a setting applies to the first bucket too); `auto`:
    the size the performance model predicts hides the most communication (docs/predict.md)."""

    offload: str = "none"
    """Keep in pinned host memory what does not fit the GPU (CUDA only): `activations` (the tensors saved
    for backward, copied out during forward and back during backward; any strategy) or `params`
    (parameters, gradients and optimizer state, the step on the CPU; --strategy fsdp)."""

    compression: tuple[str, float | int | None] | None = field(init=False, repr=False, compare=False)
    """`compress` parsed: (name, argument) or None (comm/spec.py)."""

    def __post_init__(self) -> None:
        check(self.name, self.compress)
        self.compression = parse_compress(self.compress)
        check_choice("offload", self.offload, OFFLOADS)
        takers, why = VALUES_OF_ONE.get(("offload", self.offload), ((self.name,), ""))
        if self.name not in takers:
            raise UserError(f"--offload {self.offload} needs --strategy {' or '.join(takers)} ({why}): add it, or "
                            "use --offload activations")
        if isinstance(self.bucket_cap_mb, str):
            if self.bucket_cap_mb.strip().lower() != "auto":
                try:
                    self.bucket_cap_mb = float(self.bucket_cap_mb)
                except ValueError:
                    raise UserError(f"--bucket-cap-mb {self.bucket_cap_mb!r}: give MiB (e.g. 0.5) or auto") from None
            else:
                self.bucket_cap_mb = "auto"
        if self.bucket_cap_mb not in (None, "auto") and not 0 < self.bucket_cap_mb < math.inf:
            raise UserError(f"--bucket-cap-mb must be positive or auto (got {self.bucket_cap_mb})")


@dataclass(kw_only=True)
class ProfileConfig:
    """What is measured, where it goes, and the diagnosis thresholds."""

    step_profiler: str = field(default="on", metadata=key("profile"))
    """Step profiler: `on` times every step's phases on every rank (see docs/metrics.md); `off` only step time."""

    torch_profile: str | None = None
    """`START:END`: wrap global steps START..END-1 in torch.profiler; traces in torch-profile/rank{r}.json."""

    tensorboard: str = "auto"
    """TensorBoard scalars in tensorboard/rank{r}/: `auto` (when tensorboard is installed), `on` or `off`."""

    tensorboard_every: int = 10
    """Steps per TensorBoard point, each scalar the mean over them (1: every step; a point costs its rank about
    0.7 ms of CPU). Every step's record is in metrics-rank{r}.jsonl whatever this is."""

    diag_input: float = 0.15
    """Diagnosis threshold: input-bound when data wait is at least this share of step time."""

    diag_comm: float = 0.15
    """Diagnosis threshold: communication-bound when exposed communication is at least this share (and
    pipeline-bound when a pipeline stage waits on its neighbours for at least this share)."""

    diag_straggler: float = 0.10
    """Diagnosis threshold: straggler when one rank is slowest in most steps by at least this share."""

    torch_profile_steps: tuple[int, int] | None = field(init=False, repr=False, compare=False)
    """`torch_profile` parsed: (first step, end step), END exclusive; or None."""

    def __post_init__(self) -> None:
        check_choice("profile", self.step_profiler, SWITCHES)
        check_choice("tensorboard", self.tensorboard, TENSORBOARD)
        if not (isinstance(self.tensorboard_every, int) and self.tensorboard_every >= 1):
            raise UserError(f"--tensorboard-every must be a whole number of steps, 1 or more (got "
                            f"{self.tensorboard_every})")
        self.torch_profile_steps = torch_profile_window(self.torch_profile) if self.torch_profile else None
        for name in ("diag_input", "diag_comm", "diag_straggler"):
            if not 0 < getattr(self, name) < 1:
                raise UserError(f"{flag(name)} must be a fraction between 0 and 1 (got {getattr(self, name)})")


@dataclass(kw_only=True)
class FaultsConfig:
    """Waiting for peers that do not answer, and faults injected on purpose."""

    timeout: float = 180.0
    """Seconds to wait for a peer that does not answer (a rank stopped or hung, a node that never joins)
    before the job ends naming it; applies to every collective and to the nodes' rendezvous."""

    max_restarts: int = 0
    """Restart the workers up to N times after one fails (a crash, a kill, a lost node), through the
    elastic agent; they resume from the latest checkpoint (see --checkpoint-every)."""

    inject: str | None = None
    """Slow things down on purpose, to see a diagnosis: `data=S` (seconds per sample), `comm=S` (per
    gradient bucket), `slow-rank=R:S` (rank R sleeps S seconds per step), `kill-rank=R:STEP` (rank R kills
    itself with SIGKILL at step STEP, to see a worker die), `stop-rank=R:STEP` (rank R stops itself with
    SIGSTOP at step STEP, to see a hung worker reported after --timeout); comma separated."""

    injection: Injection = field(init=False, repr=False, compare=False)
    """`inject` parsed."""

    def __post_init__(self) -> None:
        if not 0 < self.timeout < math.inf:
            raise UserError(f"--timeout must be a positive number of seconds (got {self.timeout}): e.g. 180")
        if self.max_restarts < 0:
            raise UserError(f"--max-restarts must be 0 (a failure ends the run) or more (got {self.max_restarts})")
        self.injection = parse_inject(self.inject)


def check_address(name: str, value: str | None) -> None:
    """An address must be an IP address or a host name: `999.1.1.1` is neither (whether a name resolves is
    checked where the launch starts, distributed/launch/preflight.py check_address)."""
    text = (value or "").strip()
    try:
        if value is not None and (not text or text.split()[0] != text or re.fullmatch(r"[\d.]+", text)):
            ipaddress.ip_address(text)  # all digits and dots: it must be an IPv4 address
    except ValueError:
        raise UserError(f"{flag(name)} {value!r} is not an IP address or a host name: give one such as "
                        "10.0.0.1 or node0.cluster") from None
