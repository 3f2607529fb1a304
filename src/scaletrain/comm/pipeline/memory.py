"""A pipeline stage's memory by the one memory model (perf/footprint.ModelMemory, from the meta walk), part by part:
what `--strategy pipeline` plans its split within under --memory-per-device, what `predict` and the pre-flight check
count for the fullest stage, and what `scaletrain split` shows and holds to --memory-per-stage (split/partition.py
solves over it)."""

from __future__ import annotations

from typing import Callable

from scaletrain.perf.peak import peak


def stage_parts(mm, blocks: list, s: int, lo: int, hi: int, *, stages: int, microbatches: int, schedule: str,
                read_bytes: int = 0) -> dict[str, int]:
    """Stage s of `stages` over blocks lo..hi-1 (perf/peak.BlockBytes, as a stage holds them): its weights,
    gradients and optimizer state; `activations`, the micro-batches in flight before the one in backward (GPipe:
    all; 1F1B: K - s), each holding its blocks' saved tensors (checkpointed: their inputs) and the input it
    received; `working`, that one at its backward's peak (perf/peak.py, the allocator's retained heap included) and,
    on stage 0, what it holds of the batch it reads (`read_bytes`)."""
    part = blocks[lo:hi]
    flight = microbatches if schedule == "gpipe" else min(microbatches, stages - s)
    kept = [b.input if mm.recomputed(b) else b.saved + (b.input if i == 0 else 0) for i, b in enumerate(part)]
    first = 0 if mm.recomputed(part[0]) else part[0].input  # (a recomputed block's peak holds its input)
    params = sum(b.params for b in part)
    return {"weights": params, "gradients": params, "optimizer": mm.state_bytes(params, buckets=False) - 2 * params,
            "activations": (flight - 1) * sum(kept),
            "working": first + peak(part, mm.checkpointed, mm.retained_below) + (read_bytes if s == 0 else 0)}


def stages_of(mm, blocks: list, *, stages: int, microbatches: int, schedule: str,
              read_bytes: int = 0) -> Callable[[int, int, int], dict[str, int]]:
    """`stage_parts` as split/partition.py takes it: stage s over blocks i..j-1."""
    def parts(s: int, i: int, j: int) -> dict[str, int]:
        return stage_parts(mm, blocks, s, i, j, stages=stages, microbatches=microbatches, schedule=schedule,
                           read_bytes=read_bytes)
    return parts
