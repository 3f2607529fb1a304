"""The batch script of a job: one launch agent per node, rendezvous on the allocation's first node,
checkpoint-and-requeue on SLURM's warning signal, resume on every start that finds a checkpoint."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scaletrain.slurm.options import WARNING_S, SlurmOptions

PREEMPTED = 75
"""`scaletrain train`'s exit code after it checkpointed on a preemption request (EX_TEMPFAIL)."""


@dataclass(frozen=True, kw_only=True)
class BatchJob:
    """Everything one batch script says; paths absolute (a job starts in another directory, on another node)."""

    options: SlurmOptions
    job_name: str
    run: Path
    """The run directory (train's --out): where the checkpoint, RUN/preempt and summary.json live."""
    train: Sequence[str]
    """The `scaletrain train` command without the flags the script sets (--out, --nnodes, ...)."""
    output: str
    """SLURM's --output (its %j is the job id); appended to on every start."""
    workdir: Path
    """Where the job runs (the submitting directory: relative paths of the train flags mean the same)."""
    after: Sequence[Sequence[str]] = field(default_factory=tuple)
    """Commands run after every start's training step, before a requeue (a study's bookkeeping)."""
    threads_from_cores: int | None = None
    """A study's grid's largest processes per node, when no --threads is set: each node's agent passes
    --threads (its cores / this, at least 1), so every point runs the same threads per rank."""
    title: str = ""


def render(job: BatchJob) -> str:
    """The sbatch script's text."""
    o = job.options
    sbatch = [f"--job-name={job.job_name}", f"--nodes={o.nodes}", "--ntasks-per-node=1"]
    sbatch += [f"--gpus-per-node={o.gpus_per_node}"] * (o.gpus_per_node is not None)
    sbatch += [f"--cpus-per-task={o.cpus_per_task}"] * (o.cpus_per_task is not None)
    for name in ("partition", "account", "qos", "time"):
        if getattr(o, name) is not None:
            sbatch.append(f"--{name}={getattr(o, name)}")
    sbatch += ["--exclusive"] * o.exclusive
    sbatch += [f"--chdir={job.workdir}", f"--output={job.output}", "--open-mode=append",
               f"--signal=B:USR1@{WARNING_S}", "--requeue"]
    srun = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    srun += [f"--cpus-per-task={o.cpus_per_task}"] * (o.cpus_per_task is not None)  # srun does not inherit it
    agent = 'exec "$@" --node-rank "$SLURM_NODEID"'
    if job.threads_from_cores:  # the task's cores as the trainer counts them (affinity; nproc without OMP_*)
        agent = (f"T=$(( $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) / {job.threads_from_cores} )); "
                 f'{agent} --threads $(( T > 1 ? T : 1 ))')
    lines = [
        "#!/bin/bash",
        f"# {job.title or 'scaletrain train'} (written by scaletrain slurm; submit with sbatch THIS-FILE)",
        "# Every start resumes from RUN/checkpoint.pt when there is one, so a requeued job goes on where it",
        f"# stopped. SIGUSR1 ({WARNING_S} s before the time limit, or `scancel --signal=USR1 --batch JOB`) asks the",
        f"# run to checkpoint within 10 steps and stop (exit {PREEMPTED}); the job then requeues itself.",
        *(f"#SBATCH {flag}" for flag in sbatch),
        "",
        "set -u",
        "export PYTHONUNBUFFERED=1",
        f"RUN={shlex.quote(str(job.run))}",
        'echo "scaletrain: job $SLURM_JOB_ID, start $(( ${SLURM_RESTART_COUNT:-0} + 1 )), on $SLURM_JOB_NODELIST'
        ' at $(date -Is)"',
        "",
        "# the warning: train checkpoints within 10 steps when RUN/preempt exists, and exits "
        f"{PREEMPTED}",
        'trap \'echo "scaletrain: SIGUSR1 at $(date -Is): checkpoint and stop"; : > "$RUN/preempt"\' USR1',
        'mkdir -p "$RUN"  # (a study point\'s run directory is made by its first start)',
        'rm -f "$RUN/preempt"  # an earlier start\'s request, answered',
        "",
        "# the allocation's first node hosts the rendezvous, at the address SLURM reaches it by (its NodeAddr:",
        "# on most clusters its name); the port follows the job id and the start",
        'FIRST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'MASTER_ADDR=$(scontrol show node "$FIRST" 2>/dev/null | sed -n \'s/.*NodeAddr=\\([^ ]*\\).*/\\1/p\' | head -n 1)',
        'MASTER_ADDR=${MASTER_ADDR:-$FIRST}',
        "MASTER_PORT=$(( 20000 + (SLURM_JOB_ID % 2000) * 10 + ${SLURM_RESTART_COUNT:-0} % 10 ))",
        'RESUME=""',
        'if [ -f "$RUN/checkpoint.pt" ]; then RESUME="--resume"; fi',
        "",
        "# one launch agent per node (one task per node), each starting its node's --nproc workers; without",
        "# SLURM_PROCID/SLURM_NTASKS, which would make `scaletrain train` join as a single worker instead",
        *([f"# (every point of the study gets the same threads per rank: the node's cores / "
           f"{job.threads_from_cores}, the grid's largest --nproc)"] if job.threads_from_cores else []),
        _continued([" ".join(srun),
                    "env -u SLURM_PROCID -u SLURM_NTASKS",
                    f"bash -c {shlex.quote(agent)} node-agent",
                    *_wrapped(job.train),
                    '--out "$RUN" --nnodes "$SLURM_NNODES" --master-addr "$MASTER_ADDR" '
                    '--master-port "$MASTER_PORT" $RESUME &']),
        "STEP=$!",
        "# bash runs a trap only between commands: so the step runs in the background, and after a trap",
        "# interrupted `wait` (status above 128 while the step still runs) it is waited for again",
        "while true; do",
        '    wait "$STEP"; CODE=$?',
        '    if [ "$CODE" -gt 128 ] && kill -0 "$STEP" 2>/dev/null; then continue; fi',
        "    break",
        "done",
        'echo "scaletrain: train exited with $CODE at $(date -Is)"',
        *(shlex.join(cmd) for cmd in job.after),
        f'if [ "$CODE" -eq {PREEMPTED} ]; then',
        '    echo "scaletrain: checkpointed; requeueing job $SLURM_JOB_ID (it resumes when it starts again)"',
        '    scontrol requeue "$SLURM_JOB_ID"',
        "fi",
        'exit "$CODE"',
    ]
    return "\n".join(lines) + "\n"


def _wrapped(argv: Sequence[str], width: int = 96) -> list[str]:
    """The command quoted for the shell, a flag and its value kept together, cut into lines of ~width."""
    words: list[str] = []
    for arg in argv:
        quoted = shlex.quote(arg)
        if words and not arg.startswith("-") and words[-1].startswith("--") and " " not in words[-1]:
            words[-1] += " " + quoted
        else:
            words.append(quoted)
    lines, current = [], ""
    for word in words:
        if current and len(current) + 1 + len(word) > width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    return [*lines, current] if current else lines


def _continued(parts: list[str]) -> str:
    """Lines joined as one shell command (backslash continuations), the later ones indented."""
    return " \\\n    ".join(parts)
