"""Running a study's points: the study directory, one `scaletrain train` subprocess per point and repeat, resume."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain.config import TrainConfig
from scaletrain.config.flags import as_flags
from scaletrain.errors import UserError
from scaletrain.rundir import RunDir, StudyDir, check_out, read_summary, replace_atomic, write_json_atomic
from scaletrain.study.grid import PER_RUN, Point, StudySpec, load_spec_file, resolve_spec, spec_difference, spec_toml

"""Variables that make `scaletrain train` join an outer launch instead of starting its own."""
STOP_GRACE_S = 60.0
POLL_S = 1.0  # how often a launch's `waiting` is called


def check_study_dir(study: StudyDir, spec: StudySpec) -> bool:
    """Refuse an --out that is a file, holds something else, or a study of another spec; True when resuming."""
    root = study.root
    if not check_out(root, "study"):
        return False
    if not study.spec.is_file():
        raise UserError(f"--out {root} holds a study without its study.toml: choose another --out")
    try:
        old = resolve_spec(load_spec_file(study.spec), {}, {}, None)
        difference = spec_difference(old, spec)
    except UserError as e:
        raise UserError(f"--out {root} holds a study whose study.toml is unusable ({e}): "
                        "choose another --out") from None
    if difference:
        raise UserError(f"--out {root} holds a study with a different spec ({difference}): rerun its own command "
                        f"(or --config {study.spec}) to resume it, or choose another --out")
    return True


def recorded_spec(study: StudyDir) -> StudySpec | None:
    """The spec study.toml in --out records, or None: a new study (or one check_study_dir refuses)."""
    try:
        return resolve_spec(load_spec_file(study.spec), {}, {}, None) if study.spec.is_file() else None
    except UserError:
        return None


def write_spec(study: StudyDir, spec: StudySpec) -> None:
    study.root.mkdir(parents=True, exist_ok=True)
    replace_atomic(study.spec, lambda f: f.write(spec_toml(spec)), mode="w")


def write_results(study: StudyDir, entries: list[dict[str, Any]]) -> None:
    write_json_atomic(study.results, entries)


def run_state(run: Path) -> str:
    """`completed`, `failed` (its summary says so), `unfinished` (started, stopped or interrupted) or `new`."""
    summary = read_summary(run, strict=False) or {}
    if summary.get("status") == "completed":
        return "completed"
    # an interrupted run (Ctrl-C, SIGTERM: "interrupted (SIGINT)") is resumed, not counted as failed
    if summary.get("status") == "failed" and not str(summary.get("error")).startswith("interrupted"):
        return "failed"
    return "unfinished" if run.exists() else "new"


@dataclass(frozen=True)
class PlannedRun:
    """One repeat of one point still to run, and its run directory's state before this invocation."""

    point: Point
    repeat: int
    state: str
    """run_state: new, unfinished or failed (completed runs are not planned)."""


def planned_runs(study: StudyDir, grid: list[Point], repeats: int) -> list[PlannedRun]:
    """The runs still to do, in the order every runner starts them (here one at a time, on SLURM as jobs):
    interleaved, every point's first repeat, then every point's second, ..., so that a drift of the machine's
    speed during the study falls on every point alike instead of on the last points."""
    runs = [PlannedRun(p, k, run_state(study.run(p.id, k))) for k in range(repeats) for p in grid]
    return [r for r in runs if r.state != "completed"]


def prepare_run(study: StudyDir, run: PlannedRun, resume: bool) -> str:
    """Make a planned run's directory ready to start, and return the state it starts from: a failed run starts
    again from nothing, an unfinished one too unless `resume` and it left a checkpoint (a SLURM job resumes
    it; train refuses an --out that holds a run otherwise). A run started anew starts its log anew."""
    path, log = study.run(run.point.id, run.repeat), study.log(run.point.id, run.repeat)
    state = run.state
    if state == "failed" or (state == "unfinished" and not (resume and RunDir(path).checkpoint.is_file())):
        shutil.rmtree(path, ignore_errors=True)
        state = "new"
    if state == "new":
        log.unlink(missing_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    return state


def initial_record(study: StudyDir, point_id: str, k: int) -> dict[str, Any]:
    """A run's record before this invocation launches anything: completed runs keep their summary."""
    run = study.run(point_id, k)
    done = run_state(run) == "completed"
    return {"dir": study.relative(run), "status": "completed" if done else "pending",
            "summary": read_summary(run, strict=False) if done else None, "error": None}


def train_command(cfg: TrainConfig, run: Path) -> list[str]:
    """`python -m scaletrain train` with every setting spelt out, so the run is exactly the config validated
    (its progress: plain lines in its log, console/progress.py)."""
    return [sys.executable, "-m", "scaletrain", "train", *as_flags(cfg.to_dict(), skip=PER_RUN), "--out", str(run)]


def error_line(log_text: str, summary: dict[str, Any] | None, returncode: int) -> str:
    """Why a run failed, in one line: the summary's error, else the log's last `error:` line, else the exit code."""
    if summary and summary.get("status") == "failed" and summary.get("error"):
        return str(summary["error"])
    errors = [line[len("error:"):].strip() for line in log_text.splitlines() if line.startswith("error:")]
    if errors:
        return errors[-1]
    if returncode == 0 and summary is not None:
        return f"the run ended with status {summary.get('status')!r}"
    lines = [line for line in log_text.splitlines() if line.strip()]
    tail = f": {lines[-1].strip()}" if lines else ""
    return f"train exited with code {returncode}{tail}"


def launch(cmd: list[str], log: Path, env: Mapping[str, str], waiting: Callable[[], None] | None = None) -> int:
    """Run one training launch, its output into `log`; on Ctrl-C stop it cleanly, then re-raise. `waiting`:
    called every POLL_S while it runs (the study's progress lines in a log)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        # its own session: the terminal's Ctrl-C reaches only the study, which passes exactly one on
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(env), start_new_session=True)
        try:
            while waiting is not None and proc.poll() is None:
                waiting()
                time.sleep(POLL_S)
            return proc.wait()
        except KeyboardInterrupt:
            stop(proc)
            raise


def stop(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGINT to the child's process group (train then writes an `interrupted` summary); kill it if it hangs."""
    _signal_group(proc, signal.SIGINT)
    try:
        proc.wait(grace_s)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):  # hung, or a second Ctrl-C: no more waiting
        _signal_group(proc, signal.SIGKILL)
        proc.wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM/SIGHUP (a cancelled job, a closed terminal) take the Ctrl-C path, so the child is stopped too."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run_point(study: StudyDir, point: Point, k: int, env: Mapping[str, str],
              waiting: Callable[[], None] | None = None) -> dict[str, Any]:
    """Launch one repeat of a point and return its record; a half-finished earlier attempt must be gone first."""
    run = study.run(point.id, k)
    log = study.log(point.id, k)
    code = launch(train_command(point.config, run), log, env, waiting)
    summary = read_summary(run, strict=False)
    if code == 0 and summary is not None and summary.get("status") == "completed":
        return {"dir": study.relative(run), "status": "completed", "summary": summary, "error": None}
    return {"dir": study.relative(run), "status": "failed", "summary": summary,
            "error": error_line(log.read_text(errors="replace"), summary, code)}


__all__ = ["PlannedRun", "planned_runs", "prepare_run", "check_study_dir", "recorded_spec", "write_spec", "write_results", "run_state",
           "initial_record", "train_command", "error_line", "launch", "stop",
           "terminate_as_interrupt", "run_point"]
