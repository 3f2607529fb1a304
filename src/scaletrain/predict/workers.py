"""What a rank's loader workers cost it: the wait for its next batch and the compute it loses to workers that
share its cores (docs/predict.md, "Loader workers"). Pure arithmetic; the calibration's loader rows give
`Workers` (predictor.Predictor.workers).

A worker makes a whole batch: `batch x seconds per sample` of its decode plus its `handoff` (the collate into
shared memory and the queue), one core's work. The rank takes each made batch off the queue (`receive`, on one
thread). The rank's compute on its threads comes first: a worker whose core a rank thread also runs gets half
of it, and the rank's thread team, held at every op's end by that thread, half of its speed, so each second
of a worker's work done beside the rank's compute costs the rank a second (measured 2026-11-27: one worker
beside a rank on both cores cost dwnet 9.6 ms of forward for a 10.6 ms batch, and LeNet-5, whose compute is
shorter than a batch, its compute once more and the rest as a wait). Work left when the rank's compute is done
is a wait, made on the rank's cores by as many workers as it has, at the calibrated rate of two workers.
Cores that the rank's threads leave free (one thread per rank on a larger node; an accelerator's host) take a
worker's work during the whole step at no cost, and the rank's waits (exposed communication) leave its cores to
its workers (two ranks of one thread with a worker each stepped as fast as without workers: LeNet-5, 2026-11-27).

While the rank computes, one of its workers is busy at a time: a DataLoader asks for one batch per batch taken,
so more workers help only a rank that waits for them (measured: dwnet's step the same with 1 and 2 workers).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Workers:
    """A rank's loader workers as the calibration measured them (one and two workers beside an idle rank)."""

    handoff_s: float = 0.0  # a worker's per-batch work beyond the in-process decode (collate to shared memory, queue)
    receive_s: float = 0.0  # the rank's: taking a made batch off the queue
    pair_speedup: float = 2.0  # two workers' rate over one's
    startup_s: float = 0.0  # an epoch's first batch beyond the batch's own decode (the workers' start)
    sharing: bool = True  # work on the cores the rank's threads fill costs the rank (predictor "worker_sharing")

    def rate(self, workers: float) -> float:
        """Batches' work per second of `workers` workers (cores' worth: one worker makes 1), from one and two."""
        if workers <= 1:
            return max(0.0, workers)
        return 1.0 + (workers - 1) * max(0.0, self.pair_speedup - 1.0)


def worker_cost(w: Workers, workers: int, produce_s: float, multi_s: float, single_s: float, idle_s: float,
                cores_per_rank: float, threads: int) -> tuple[float, float]:
    """(compute seconds the rank loses to its workers, its data_wait) for one step.

    `produce_s`: one batch's work (decode + hand-over); `multi_s`: the rank's compute on its `threads` threads
    (0 on an accelerator: its compute holds no core); `single_s`: its loop on one thread; `idle_s`: its waits
    (exposed communication), which leave its cores to its workers; `cores_per_rank`: the node's cores over the
    ranks that compute on them."""
    free = max(0.0, cores_per_rank - threads)  # cores the rank's compute leaves free
    free_single = max(0.0, cores_per_rank - 1)  # ... and its one-thread time
    waiting = w.rate(min(workers, max(1.0, cores_per_rank)))  # the rank's workers on its cores while it waits
    done = w.rate(min(workers, free)) * multi_s + w.rate(min(workers, free_single)) * (single_s + w.receive_s) + \
        waiting * idle_s
    left = max(0.0, produce_s - done)
    shared = min(multi_s, left) * max(0.0, 1.0 - free) if threads else 0.0  # made on cores the rank computes on
    wait = (left - shared) / max(1e-12, waiting)
    return (shared if w.sharing else 0.0), w.receive_s + wait
