"""The sub-specs of a training configuration (`--inject`, `--torch-profile`), parsed once into values."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from scaletrain.errors import UserError


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


def without_failures(spec: str | None) -> str | None:
    """The --inject spec less its kill-rank and stop-rank items: a restarted worker is not made to fail
    again (the failure was the point; what follows is the recovery)."""
    if not spec:
        return spec
    kept = [item for item in spec.split(",") if item.strip().partition("=")[0] not in ("kill-rank", "stop-rank")]
    return ",".join(kept) or None


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

