"""`predict --image-size max --memory-per-device B`: the largest square image side each layout of the same ranks
trains within B per rank, by the memory model (comm/memory.py, docs/perf.md "Memory per rank, per layout").

Memory per rank is a fixed part (parameters and their state, the process) and a part that grows with the pixels
(activations, batches): one walk at a reference side gives the slope, the side that meets the budget follows,
and walks at that side and the next settle it on a multiple of STEP (a side a layout cannot take, e.g. a width
its tiles do not divide, is stepped over; on a CPU a few past the first that does not fit). Meta-device walks
only, shared by the layouts at each side: no memory, seconds for a ResNet-18's ten layouts."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from scaletrain import fmt
from scaletrain.comm import memory
from scaletrain.comm.registry import strategy_class
from scaletrain.distributed.allocator import resolved
from scaletrain.config import TrainConfig
from scaletrain.errors import UserError
from scaletrain.grid import Grid

STEP = 64  # sides on multiples of 64: a ResNet's /32, split in two by 2 tiles
REFERENCE = 1024
LARGEST = 1 << 17  # 131,072 px: a side beyond which the search stops (a pathology slide's order)
LOOKAHEAD = 4  # steps tried past a side that does not fit


@dataclass(frozen=True)
class Largest:
    flags: str  # what asks for the layout ("as given" for the request itself)
    side: int | None  # None: not even STEP fits
    bytes: int | None  # memory per rank at that side
    why: str | None = None  # a layout these ranks cannot take, or none fits
    allocator: str | None = None  # the CPU allocator policy it takes (distributed/allocator.py); None: a GPU's

    def to_dict(self) -> dict:
        return {"layout": self.flags, "largest_side": self.side, "bytes_per_rank": self.bytes, "why": self.why,
                "allocator": self.allocator}


def largest_sides(cfg: TrainConfig, build: Callable[[TrainConfig, int], Callable], channels: int, budget: int,
                  device_type: str,
                  progress: Callable[[str, int, int | None], None] = lambda *a: None) -> list[Largest]:
    """For the request and each alternative layout (comm/memory.alternatives), its largest side within `budget`;
    `build(cfg, side)` gives the model factory at a side."""
    # on a CPU, a run with a budget and `--allocator auto` runs lean (distributed/launch/preflight.planned)
    policy = resolved(cfg.launch.allocator, True, device_type)
    runtime = memory.runtime_bytes(device_type, policy)
    # (a pipeline's stages are split within the budget)
    cfg = cfg.replace(memory_per_device=str(budget), allocator=policy or "steady")
    layouts = [("as given", cfg), *memory.alternatives(cfg)]
    walks: dict[int, dict] = {}  # the model's walks at each side, shared by the layouts (one model, one batch)
    out = []
    for i, (flags, layout) in enumerate(layouts):
        found = _largest(flags, layout, build, channels, budget, device_type, runtime, walks)
        out.append(replace(found, allocator=policy))
        progress(flags, i + 1, len(layouts))
    return out


def _largest(flags: str, cfg: TrainConfig, build, channels: int, budget: int, device_type: str,
             runtime: int, walks: dict[int, dict] | None = None) -> Largest:
    walks = {} if walks is None else walks
    def need(side: int) -> int | None:
        """Bytes per rank at `side`; None where the layout cannot take it (its memory refuses the side)."""
        factory = build(cfg, side)
        try:
            f = memory.per_rank(cfg.replace(image_size=side), factory, (channels, side, side), device_type, runtime,
                                cache=walks.setdefault(side, {}))
        except UserError:
            return None
        if f is None:
            raise UserError(f"{cfg.model.name} cannot run on the meta device, so its memory cannot be planned: "
                            "give --image-size a number")
        return f.total

    try:  # the layout itself, once, at a small side (a pipeline's check traces a real forward)
        strategy_class(cfg.strategy.name).check_model(cfg.replace(image_size=STEP * 2), build(cfg, STEP * 2),
                                                      (channels, STEP * 2, STEP * 2))
    except UserError as e:
        return Largest(flags, None, None, str(e))
    ref = need(REFERENCE)
    small = need(STEP * 2)
    if ref is None or small is None:
        return Largest(flags, None, None, "these ranks cannot take this layout at any side tried")
    slope = max(1e-9, (ref - small) / (REFERENCE ** 2 - (STEP * 2) ** 2))
    usable = budget / (1 + memory.MARGIN)
    side = int(math.sqrt(max(0.0, (usable - small) / slope + (STEP * 2) ** 2)) // STEP * STEP)
    side = max(STEP, min(side, LARGEST))
    at = need(side)
    while side > STEP and (at is None or not memory.within(at, budget)):
        side -= STEP
        at = need(side)
    if at is None or not memory.within(at, budget):
        return Largest(flags, None, None, f"not even {STEP} px fits {fmt.size(budget)}")
    # up while a side fits. On a CPU memory is not monotonic (a tensor passing the allocator's mmap threshold is
    # returned when freed): LOOKAHEAD sides past the last that fits are tried; on a GPU the first that does not fit
    # ends it (a side the layout cannot take is stepped over either way)
    misses, untaken, patience, s = 0, 0, LOOKAHEAD if device_type == "cpu" else 1, side
    while misses < patience and untaken < LOOKAHEAD and s + STEP <= LARGEST:
        s += STEP
        b = need(s)
        if b is None:
            untaken += 1
        elif memory.within(b, budget):
            side, at, misses, untaken = s, b, 0, 0
        else:
            misses += 1
    return Largest(flags, side, at)


def largest_table(rows: list[Largest], budget: str, what: str) -> Grid:
    base = rows[0].side if rows and rows[0].side else None
    grid = Grid(f"largest image side within {budget} per rank ({what})",
                ["layout", "largest side", "memory per rank", "x as given", "allocator"], text_columns=(0, 4))
    for r in rows:
        if r.side is None:
            grid.rows.append([r.flags, "-", r.why or "-", "-", "-"])
            continue
        grid.rows.append([r.flags, f"{r.side:,}", fmt.size(r.bytes), f"{r.side / base:.2f}" if base else "-",
                          r.allocator or "-"])
    grid.note = ("the memory model: meta-device walks, nothing allocated (docs/perf.md); measured against real runs "
                 "in docs/spatial.md")
    return grid
