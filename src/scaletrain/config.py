"""The training configuration: one typed dataclass, read from TOML and CLI overrides, validated once."""

from __future__ import annotations

import dataclasses
import difflib
import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import tomli_w

from scaletrain.errors import UserError

OPTIMIZERS = ("sgd", "nesterov", "adagrad", "adamw")
PRECISIONS = ("fp32", "bf16", "fp16")
SCHEDULES = ("cosine", "step", "constant")
BAD_IMAGE_POLICIES = ("error", "skip")
DEVICES = ("auto", "cpu", "cuda")
SWITCHES = ("on", "off")
TENSORBOARD = ("auto", "on", "off")
# names other tools use for our keys: only for suggestions, never accepted silently
ALIASES = {"learning_rate": "lr", "num_workers": "workers", "wd": "weight_decay", "batch": "batch_size",
           "world_size": "nproc", "nproc_per_node": "nproc", "output_dir": "out", "amp": "precision"}


@dataclass(kw_only=True)
class TrainConfig:
    """Everything a training run needs; saved resolved as `config.toml` in the run directory."""

    model: str = "resnet20"
    """Registry name (see `scaletrain models`) or `package.module:factory`."""
    dataset: str = "digits"
    """`digits`, `synthetic` or `imagefolder:PATH`."""
    image_size: int | None = None
    """Square input size; None takes the dataset's default (32 for digits/synthetic, 224 for folders)."""
    stem: str = "auto"
    """ResNet-18/34/50 stem: `imagenet`, `cifar` or `auto` (cifar when image_size <= 64)."""
    width: float = 1.0
    """Channel/hidden-width multiplier of the model."""
    augment: bool = True
    """Training-time augmentation (random shifts for digits, random resized crop + flip for folders)."""
    synthetic_samples: int = 4096
    """Training samples of the `synthetic` dataset (validation gets a quarter)."""
    synthetic_classes: int = 10
    """Classes of the `synthetic` dataset."""
    bad_images: str = "error"
    """`error` stops at the first unreadable image (naming it); `skip` drops it and counts it."""

    nproc: int = 1
    """Local worker processes (one per GPU, or CPU ranks), started by torch's elastic agent."""
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
    precision: str = "fp32"
    """`fp32`, `bf16` (autocast) or `fp16` (autocast + GradScaler; CUDA only)."""
    sync_bn: bool = False
    """Convert BatchNorm to SyncBatchNorm (CUDA only in PyTorch)."""
    workers: int = 0
    """Data-loader processes per rank (0 = load in the training process)."""
    persistent_workers: bool = False
    """Keep data-loader workers alive between epochs instead of starting them anew each epoch (a resumed
    run then no longer replays augmentation bit-exactly)."""
    seed: int = 0
    """Seed of initialisation, data order and augmentation."""
    eval_every: int = 1
    """Evaluate on the validation split every N epochs (and always after the last)."""
    stop_after: int | None = None
    """Stop this invocation after N epochs, leaving a resumable run (for time-limited jobs)."""

    out: str | None = None
    """Run directory; default runs/<model>-<dataset>-<timestamp>."""
    resume: bool = False
    """Continue the run in `out` from its last checkpoint."""
    device: str = "auto"
    """`auto` (CUDA when present), `cpu` or `cuda`."""
    threads: int | None = None
    """Torch intra-op threads per CPU rank; default: cores / local ranks."""
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
    timeout: float = 180.0
    """Seconds to wait for a peer that does not answer (a rank stopped or hung, a node that never joins)
    before the job ends naming it; applies to every collective and to the nodes' rendezvous."""
    progress: bool = True
    """Show the progress bar on rank 0."""
    strategy: str = "allreduce"
    """Gradient aggregation: `allreduce` (DDP with the engine's collective), `ring` (the ring all-reduce
    of the literature on point-to-point operations, as a DDP hook), `ps-sync` (a sharded parameter server,
    synchronous: the same trajectory as allreduce) or `ps-async` (Downpour SGD); see docs/strategies.md."""
    ps_servers: int = 1
    """With ps-sync/ps-async: how many of the nproc x nnodes processes are parameter servers (the last
    ones); the rest are workers. The parameters are split evenly over the servers."""
    ps_fetch: int = 1
    """ps-async: a worker fetches fresh parameters every this many steps (Downpour's n_fetch)."""
    ps_push: int = 1
    """ps-async: a worker pushes its gradients, summed since the last push, every this many steps (n_push)."""
    ps_optimizer: str = "adagrad"
    """ps-async: the update each shard applies on its own, `adagrad` (per-parameter, as Downpour) or `sgd` (plain)."""
    staleness_lr: bool = False
    """ps-async: divide each update's learning rate by its staleness (Zhang, Gupta et al. 2016)."""
    max_staleness: int | None = None
    """ps-async: drop a gradient more than this many shard updates old (its worker then fetches afresh)."""
    compress: str | None = None
    """Gradient compression with `allreduce` or a parameter server: `fp16`, `bf16`, `topk:RATIO`, `sign`,
    `qsgd:LEVELS`, `powersgd:RANK` (allreduce only; top-k and sign keep the rest as error feedback);
    see docs/strategies.md."""
    bucket_cap_mb: float | None = None
    """DDP gradient bucket size in MiB (smaller buckets start communicating earlier in backward); unset:
    DDP's default, 25 MiB with a first bucket of 1 MiB (a setting applies to the first bucket too)."""

    profile: str = "on"
    """Step profiler: `on` times every step's phases on every rank (see docs/metrics.md); `off` only step time."""
    torch_profile: str | None = None
    """`START:END`: wrap global steps START..END-1 in torch.profiler; traces in torch-profile/rank{r}.json."""
    tensorboard: str = "auto"
    """TensorBoard scalars in tensorboard/rank{r}/: `auto` (when tensorboard is installed), `on` or `off`."""
    diag_input: float = 0.15
    """Diagnosis threshold: input-bound when data wait is at least this share of step time."""
    diag_comm: float = 0.15
    """Diagnosis threshold: communication-bound when exposed communication is at least this share."""
    diag_straggler: float = 0.10
    """Diagnosis threshold: straggler when one rank is slowest in most steps by at least this share."""
    inject: str | None = None
    """Slow things down on purpose, to see a diagnosis: `data=S` (seconds per sample), `comm=S` (per
    gradient bucket), `slow-rank=R:S` (rank R sleeps S seconds per step), `kill-rank=R:STEP` (rank R kills
    itself with SIGKILL at step STEP, to see a worker die), `stop-rank=R:STEP` (rank R stops itself with
    SIGSTOP at step STEP, to see a hung worker reported after --timeout); comma separated."""

    def __post_init__(self) -> None:
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        _check_choice("precision", self.precision, PRECISIONS)
        _check_choice("schedule", self.schedule, SCHEDULES)
        _check_choice("bad_images", self.bad_images, BAD_IMAGE_POLICIES)
        _check_choice("device", self.device, DEVICES)
        _check_choice("profile", self.profile, SWITCHES)
        _check_choice("tensorboard", self.tensorboard, TENSORBOARD)
        if self.torch_profile is not None:
            torch_profile_window(self.torch_profile)
        if self.inject is not None:
            parse_inject(self.inject)
        for name in ("diag_input", "diag_comm", "diag_straggler"):
            if not 0 < getattr(self, name) < 1:
                raise UserError(f"--{_flag(name)} must be a fraction between 0 and 1 (got {getattr(self, name)})")
        from scaletrain.comm.spec import check
        check(self.strategy, self.compress)
        self._check_ps()
        if self.bucket_cap_mb is not None and not 0 < self.bucket_cap_mb < math.inf:
            raise UserError(f"--bucket-cap-mb must be positive (got {self.bucket_cap_mb})")
        for name in ("nproc", "epochs", "batch_size", "ref_batch", "eval_every", "synthetic_samples",
                     "synthetic_classes"):
            if getattr(self, name) < 1:
                raise UserError(f"--{_flag(name)} must be at least 1 (got {getattr(self, name)})")
        if self.workers < 0:
            raise UserError(f"--workers must be 0 or more (got {self.workers})")
        if not 0 < self.lr < math.inf:  # also refuses NaN
            raise UserError(f"--lr must be a positive number (got {self.lr})")
        if not 0 <= self.weight_decay < math.inf:
            raise UserError(f"--weight-decay must be 0 or a positive number (got {self.weight_decay}): e.g. 5e-4")
        if not 0 <= self.momentum < 1:
            raise UserError(f"--momentum must be in [0, 1) (got {self.momentum}): e.g. 0.9")
        if not 0 <= self.seed < 2 ** 32:
            raise UserError(f"--seed must be in 0..{2 ** 32 - 1} (got {self.seed})")
        if not 0 < self.timeout < math.inf:
            raise UserError(f"--timeout must be a positive number of seconds (got {self.timeout}): e.g. 180")
        if not 0 <= self.warmup_epochs <= self.epochs:
            raise UserError(f"--warmup-epochs must be between 0 and --epochs ({self.epochs}), got {self.warmup_epochs}")
        if self.image_size is not None and self.image_size < 1:
            raise UserError(f"--image-size must be at least 1 (got {self.image_size})")
        if not 0 < self.width < math.inf:
            raise UserError(f"--width must be a positive number (got {self.width})")
        if self.stop_after is not None and self.stop_after < 1:
            raise UserError(f"--stop-after must be at least 1 epoch (got {self.stop_after})")
        if self.threads is not None and self.threads < 1:
            raise UserError(f"--threads must be at least 1 (got {self.threads})")
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise UserError(f"--node-rank must be in 0..{self.nnodes - 1} for --nnodes {self.nnodes} "
                            f"(got {self.node_rank})")
        if self.nnodes > 1 and self.master_port is None:
            raise UserError("--nnodes > 1 needs --master-port (the same on every node) and --master-addr "
                            "(node 0's address)")
        if self.master_port is not None and not 1 <= self.master_port <= 65535:
            raise UserError(f"--master-port must be in 1..65535 (got {self.master_port})")

    def _check_ps(self) -> None:
        _check_choice("ps_optimizer", self.ps_optimizer, ("adagrad", "sgd"))
        for name in ("ps_servers", "ps_fetch", "ps_push"):
            if getattr(self, name) < 1:
                raise UserError(f"--{_flag(name)} must be at least 1 (got {getattr(self, name)})")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise UserError(f"--max-staleness must be 0 or more (got {self.max_staleness})")
        if not self.strategy.startswith("ps-"):
            return
        if self.precision == "fp16":
            raise UserError(f"--precision fp16 is not supported with --strategy {self.strategy} (the "
                            "servers apply unscaled gradients): use --precision bf16 or fp32")
        if self.sync_bn:
            raise UserError(f"--sync-bn is not supported with --strategy {self.strategy}: drop --sync-bn")

    def check_launch(self) -> None:
        """What depends on the launch's shape (nproc x nnodes), checked when launching, not per study axis."""
        world = self.nproc * self.nnodes
        inject = parse_inject(self.inject)
        for what, rank in (("slow-rank", inject.slow_rank), ("kill-rank", inject.kill_rank),
                           ("stop-rank", inject.stop_rank)):
            if rank is not None and rank >= world:
                raise UserError(f"--inject {what}={rank}:...: there are only {world} ranks (0..{world - 1}): "
                                "name one of them")
        if self.strategy.startswith("ps-") and world - self.ps_servers < 1:
            raise UserError(f"--strategy {self.strategy} with --ps-servers {self.ps_servers} needs more "
                            f"processes than servers (got {world}): raise --nproc to at least {self.ps_servers + 1}")

    @property
    def injection(self) -> Injection:
        """--inject, parsed."""
        return parse_inject(self.inject)

    @property
    def torch_profile_steps(self) -> tuple[int, int] | None:
        """--torch-profile, parsed: (first step, end step), or None."""
        return torch_profile_window(self.torch_profile) if self.torch_profile else None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def torch_profile_window(spec: str) -> tuple[int, int]:
    """`START:END` -> (start, end): the global steps wrapped in torch.profiler, END exclusive."""
    try:
        start, end = (int(x) for x in spec.split(":"))
    except ValueError:
        raise UserError(f"--torch-profile must be START:END, two step numbers (got {spec!r}): e.g. 10:15") from None
    if not 0 <= start < end:
        raise UserError(f"--torch-profile {spec}: need 0 <= START < END, e.g. 10:15")
    return start, end


@dataclass(frozen=True)
class Injection:
    """Deliberate slow-downs (see --inject): seconds per sample, per bucket, and one rank's per-step sleep."""

    data_s: float = 0.0
    comm_s: float = 0.0
    slow_rank: int | None = None
    slow_rank_s: float = 0.0
    kill_rank: int | None = None
    kill_step: int = 0
    stop_rank: int | None = None
    stop_step: int = 0


def parse_inject(spec: str | None) -> Injection:
    """`data=0.002,comm=0.05,slow-rank=1:0.03` -> Injection; one clear line for anything else."""
    if not spec:
        return Injection()
    values: dict[str, Any] = {}
    example = "e.g. --inject data=0.002,comm=0.05,slow-rank=1:0.03"
    for item in spec.split(","):
        key, _, value = item.strip().partition("=")
        try:
            if key == "data":
                values["data_s"] = float(value)
            elif key == "comm":
                values["comm_s"] = float(value)
            elif key == "slow-rank":
                rank, _, seconds = value.partition(":")
                values["slow_rank"], values["slow_rank_s"] = int(rank), float(seconds)
            elif key in ("kill-rank", "stop-rank"):
                rank, _, step = value.partition(":")
                kind = key.split("-")[0]
                values[f"{kind}_rank"], values[f"{kind}_step"] = int(rank), int(step)
            else:
                raise UserError(f"--inject: unknown item {item!r} (known: data, comm, slow-rank, kill-rank, "
                                f"stop-rank): "
                                f"{example}")
        except ValueError:
            raise UserError(f"--inject: cannot read {item!r}: {example}") from None
    if any(not 0 <= v < math.inf for v in values.values() if v is not None):
        raise UserError(f"--inject: values must be finite and not negative ({spec!r})")
    return Injection(**values)


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UserError(f"--{_flag(name)} must be one of {', '.join(choices)} (got {value!r})")


def field_names() -> list[str]:
    return [f.name for f in fields(TrainConfig)]


def read_toml(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """A TOML file as a dict; a missing or malformed file is one clear line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} {path} does not exist: check the --config path")
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{what} {path} is not valid TOML ({e}): fix that line") from None


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML config into {field: value}, naming any unknown or misspelt key."""
    path = Path(path)
    raw = read_toml(path)
    if set(raw) == {"train"}:  # the settings may sit in a [train] table
        if not isinstance(raw["train"], dict):
            raise UserError(f"'train' in {path} must be a [train] table of settings: write them as key = value")
        raw = raw["train"]
    known = field_names()
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in known:
            close = difflib.get_close_matches(name, known + list(ALIASES), n=1)
            hint = (f"did you mean '{ALIASES.get(close[0], close[0])}'?" if close
                    else f"known keys: {', '.join(known)}")
            raise UserError(f"unknown key '{key}' in {path}: {hint}")
        values[name] = value
    return values


def build_config(file_values: dict[str, Any], overrides: dict[str, Any]) -> TrainConfig:
    """Defaults < TOML file < command-line overrides; types are checked against the defaults."""
    types = {f.name: str(f.type) for f in fields(TrainConfig)}
    # every value is checked, also a file's value that a flag overrides: a wrong file stays wrong
    file_values = {k: _coerce(k, v, types[k]) for k, v in file_values.items() if k in types}
    overrides = {k: _coerce(k, v, types[k]) for k, v in overrides.items() if k in types}
    return TrainConfig(**{**file_values, **overrides})


_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def _coerce(name: str, value: Any, annotation: str) -> Any:
    """Check a value against its field's annotation ("int", "str | None", ...); ints widen to float."""
    parts = [p.strip() for p in annotation.split("|")]
    if value is None and "None" in parts:
        return value
    want = _TYPES[parts[0]]
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, want) or (want is not bool and isinstance(value, bool)):
        raise UserError(f"'{name}' must be a {want.__name__}, got {value!r}: fix it in the config file")
    return value


# settings of one invocation, not of the run: never saved in config.toml, never inherited on --resume
INVOCATION_ONLY = ("resume", "stop_after")


def save_toml(config: TrainConfig, path: Path) -> None:
    """Write the run's resolved settings (None values omitted, as TOML has no null; nor the invocation's
    own, INVOCATION_ONLY), so that `--config this-file --out NEW` reruns the run."""
    data = {k: v for k, v in config.to_dict().items() if v is not None and k not in INVOCATION_ONLY}
    path.write_text("# resolved scaletrain configuration; rerun with --config this-file\n" + tomli_w.dumps(data))


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    known = set(field_names())
    return TrainConfig(**{k: v for k, v in data.items() if k in known})


__all__ = ["TrainConfig", "Injection", "parse_inject", "torch_profile_window", "load_toml", "build_config", "save_toml", "config_from_dict", "field_names"]
