"""What a run's, a study's or a plan's slurm/ folder holds: the batch scripts and jobs.json, the jobs submitted for
it, and the lock its gatherers take."""

from __future__ import annotations

import contextlib
import fcntl
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from scaletrain.errors import UserError
from scaletrain.rundir import write_json_atomic
from scaletrain.slurm import submit


@dataclass(frozen=True)
class Job:
    """One submitted batch job."""

    job_id: str
    script: str
    output: str
    run: str
    submitted_at: str


def slurm_dir(root: Path) -> Path:
    """RUN/slurm or STUDY/slurm: the scripts, jobs.json (and a train job's output files)."""
    return root / "slurm"


def read_jobs(root: Path) -> list[Job]:
    path = slurm_dir(root) / "jobs.json"
    try:
        return [Job(**entry) for entry in json.loads(path.read_text())]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, TypeError) as e:
        raise UserError(f"{path} is unreadable ({e}): remove it if no job of it is still queued") from None


def record_jobs(root: Path, new: list[Job]) -> None:
    """Append this submission's jobs to jobs.json (the history of every submission for this folder)."""
    write_json_atomic(slurm_dir(root) / "jobs.json", [asdict(j) for j in [*read_jobs(root), *new]])


def refuse_if_queued(root: Path, what: str) -> None:
    """A second submission while an earlier job of the same folder is still queued would train it twice."""
    earlier = read_jobs(root)
    still = submit.queued(j.job_id for j in earlier) if earlier else {}
    if still:
        listed = ", ".join(f"{j} ({state})" for j, state in still.items())
        raise UserError(f"{what} {root} has jobs still in the queue: {listed}: wait for them to end, or "
                        f"`scancel {' '.join(still)}` first")


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """One gatherer at a time (ROOT/slurm/gather.lock): jobs that end together would otherwise write their
    results over each other."""
    lock = slurm_dir(root) / "gather.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
