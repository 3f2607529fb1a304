"""Asking SLURM: are its commands here, which partitions exist, which jobs are still queued; and sbatch."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from scaletrain.errors import UserError

TIMEOUT_S = 60.0
"""How long a SLURM command may take to answer (a busy controller) before the submission gives up."""


def require(command: str) -> str:
    """The path of a SLURM command, or one line saying it is not here."""
    path = shutil.which(command)
    if path is None:
        raise UserError(f"`{command}` is not on PATH: run this on a SLURM login node (or load the cluster's "
                        f"slurm module), or add --dry-run to only print the batch script")
    return path


def _ask(argv: list[str], what: str) -> str:
    """A SLURM command's standard output; its own error as one line when it fails."""
    name = " ".join([Path(argv[0]).name, *argv[1:2]])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise UserError(f"`{name}` did not answer within {TIMEOUT_S:g} s while {what}: is the "
                        "SLURM controller up? (try `sinfo`)") from None
    except OSError as e:
        raise UserError(f"cannot run `{name}` while {what}: {e.strerror}") from None
    if proc.returncode != 0:
        said = " ".join((proc.stderr or proc.stdout).split()) or f"exit code {proc.returncode}"
        if UNREACHABLE.search(said):
            last = [line.strip() for line in (proc.stderr or proc.stdout).splitlines() if line.strip()][-1]
            raise UserError(f"no SLURM controller is reachable from here (`{name}` while {what}: {last}): run this "
                            "on a login node of the cluster, where `squeue` answers (or load its slurm module / "
                            "set SLURM_CONF), or add --dry-run to only print the batch script")
        raise UserError(f"`{name}` failed while {what}: {said}")
    return proc.stdout


UNREACHABLE = re.compile(r"unable to contact slurm controller|could not establish a configuration source|"
                         r"dns srv lookup failed|resolve_ctls_from_dns_srv|unable to establish control machine|"
                         r"socket timed out on send/recv", re.IGNORECASE)
"""What SLURM's commands say when no controller answers (configless DNS lookups that fail, a controller down)."""


def partitions() -> list[str]:
    """The cluster's partitions (`sinfo -h -o %P`), the default's `*` removed, in sinfo's order."""
    out = _ask([require("sinfo"), "-h", "-o", "%P"], "listing the partitions")
    return list(dict.fromkeys(line.strip().rstrip("*") for line in out.splitlines() if line.strip()))


def check_partition(name: str | None, known: list[str] | None = None) -> None:
    """An unknown --partition is refused here, not after sbatch has queued a job that can never start
    (`known`: the partitions, when already asked)."""
    if name is None:
        return
    known = partitions() if known is None else known
    if name not in known:
        raise UserError(f"--partition {name} is not a partition of this cluster (sinfo lists: "
                        f"{', '.join(known) or 'none'}): pick one of them, or leave --partition out for the default")


def queued(job_ids: Iterable[str]) -> dict[str, str]:
    """Of these job ids, those still in the queue (pending, running, requeued, ...) with their state."""
    wanted = {str(j) for j in job_ids}
    if not wanted:
        return {}
    out = _ask([require("squeue"), "--me", "-h", "-o", "%i %T"], "looking for this job's earlier submissions")
    states = dict(line.split(None, 1) for line in out.splitlines() if len(line.split(None, 1)) == 2)
    return {j: states[j].strip() for j in sorted(wanted) if j in states}


def sbatch(script: Path, extra: Iterable[str] = ()) -> str:
    """Submit a batch script; its job id (`sbatch --parsable` prints `ID` or `ID;CLUSTER`)."""
    out = _ask([require("sbatch"), "--parsable", *extra, str(script)], f"submitting {script}")
    job_id = out.strip().splitlines()[-1].split(";")[0].strip() if out.strip() else ""
    if not job_id.isdigit():
        raise UserError(f"sbatch accepted {script} but printed no job id ({out.strip()!r}): look at `squeue --me`")
    return job_id


__all__ = ["require", "partitions", "check_partition", "queued", "sbatch", "TIMEOUT_S"]
