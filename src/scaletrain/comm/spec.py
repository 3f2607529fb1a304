"""--strategy and --compress as written by users: parsed and validated without importing torch."""

from __future__ import annotations

from scaletrain.comm import registry
from scaletrain.errors import UserError

STRATEGIES = tuple(registry.STRATEGIES)
COMPRESSORS = ("fp16", "bf16", "topk:RATIO", "sign", "qsgd:LEVELS", "powersgd:RANK")


def parse_compress(spec: str | None) -> tuple[str, float | int | None] | None:
    """`topk:0.01` -> ("topk", 0.01); `fp16` -> ("fp16", None); None or `none` -> None."""
    if spec in (None, "", "none"):
        return None
    name, _, arg = spec.partition(":")
    known = f"known: {', '.join(COMPRESSORS)}, or none"
    if name in ("fp16", "bf16", "sign"):
        if arg:
            raise UserError(f"--compress {spec}: {name} takes no argument ({known})")
        return name, None
    if name not in ("topk", "qsgd", "powersgd"):
        raise UserError(f"--compress {spec}: unknown compressor ({known})")
    try:
        value: float | int = float(arg) if name == "topk" else int(arg)
    except ValueError:
        raise UserError(f"--compress {spec}: cannot read {arg!r} as a number, e.g. topk:0.01, qsgd:127, "
                        "powersgd:2") from None
    if name == "topk" and not 0 < value <= 1:
        raise UserError(f"--compress {spec}: the ratio must be in (0, 1], e.g. topk:0.01")
    if name == "qsgd" and not 1 <= value <= 32767:
        raise UserError(f"--compress {spec}: levels must be 1..32767, e.g. qsgd:127")
    if name == "powersgd" and value < 1:
        raise UserError(f"--compress {spec}: the rank must be at least 1, e.g. powersgd:2")
    return name, value


def compressible(strategy: str) -> bool:
    """Whether --compress can go with the strategy (it takes the setting, and check's rules), as the diagnosis's
    lever needs it."""
    if "compress" not in registry.OPTIONS.get(strategy, ()):
        return False
    try:
        check(strategy, "bf16")
    except UserError:
        return False
    return True


def check(strategy: str, compress: str | None) -> None:
    """Validate the pair at config time: one clear line for what cannot work."""
    if strategy not in registry.STRATEGIES:  # read at call time: a strategy registered since import counts
        raise UserError(f"--strategy must be one of {', '.join(registry.STRATEGIES)} (got {strategy!r})")
    parse_compress(compress)
    if compress in (None, "", "none"):
        return
    if strategy == "fsdp":
        raise UserError("--compress is not supported with --strategy fsdp (its reduce-scatter goes through "
                        "FSDP2, not a DDP hook): drop --compress")
    if strategy == "pipeline":
        raise UserError("--compress is not supported with --strategy pipeline (its stages send activations, "
                        "not gradients): drop --compress")
    if strategy == "ring":
        raise UserError("--compress works with --strategy allreduce or a parameter server (the ring "
                        "sends full-precision buckets): drop one of them")
    if strategy.startswith("ps-") and compress.startswith("powersgd"):
        raise UserError(f"--compress powersgd is PyTorch's all-reduce hook and cannot go through --strategy "
                        f"{strategy}: use topk:RATIO, sign, qsgd:LEVELS, fp16 or bf16")
