"""plan --validate K: run the plan's top K candidates briefly on this machine, interleaved and repeated, each as
`scaletrain train --plan DIR --plan-rank K` would run it (docs/plan.md). The comparison is agreement.py's.

Runs go to DIR/validation/c<rank>/r<round> (their logs beside them); every candidate runs once per round, in the
predicted order, so that the machine's drift falls on each alike."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Callable

from scaletrain.errors import UserError

STEPS = 30  # the fewest training steps a brief run takes (its first ones, while the heap settles, are not timed)
TIMED_S = 2.0
"""Seconds of steps a brief run takes at its predicted step time, when --validate-steps does not fix the count: a
step's own noise (a rank's hiccup, the other's wait in the collective) is a fixed few milliseconds, so a 12-ms step
needs more of them than a 250-ms one. Measured (the MLP's top 7 of 2 CPU ranks, 3 rounds, docs/plan.md): the
repeats' spread a median 15.3% at 30 steps, 7.0% at 150."""
REPEATS = 3


def steps_for(c: dict[str, Any], steps: int | None) -> int:
    """The steps of candidate `c`'s brief run: `steps` where given, else TIMED_S of its predicted steps, at least
    STEPS."""
    if steps is not None:
        return steps
    return max(STEPS, math.ceil(TIMED_S / c["step_time_s"])) if c.get("step_time_s") else STEPS


def steps_said(steps: int | None) -> str:
    """`30 steps`, or what the default does."""
    return f"{steps} steps" if steps is not None else f"about {TIMED_S:g} s of steps (at least {STEPS})"


def check(plan: dict[str, Any]) -> None:
    """What this machine can run: one node of the plan's ranks, on the basis it was calibrated on."""
    req = plan["request"]
    if plan["basis"] != "calibration":
        raise UserError("--validate runs the candidates on this machine, and a data-sheet plan (--hardware) prices "
                        "another: plan with --calibration of this machine to validate here, or run the chosen "
                        "configuration there (scaletrain train --plan DIR)")
    if req["nodes"] > 1 and not req.get("testbed"):
        raise UserError(f"--validate runs the candidates on this machine, and the plan is of {req['nodes']} nodes: "
                        "validate a one-node plan here (--nodes 1), or plan the testbed's hosts (--testbed)")
    if req.get("testbed"):
        from scaletrain.testbed.net import current

        tb = current()
        if tb is None or tb.hosts != req["nodes"]:
            now = "none is up" if tb is None else f"the one up has {tb.hosts} hosts"
            raise UserError(f"--validate runs the plan's {req['nodes']} nodes on the testbed, and {now}: "
                            f"`scaletrain testbed up --hosts {req['nodes']}` as it was planned")


def brief_flags(c: dict[str, Any], steps: int | None) -> list[str]:
    """A candidate's run cut to about `steps` steps (None: steps_for's): an epoch of that many batches of synthetic
    data, or enough epochs of the real data set; evaluated once, at the end."""
    steps = steps_for(c, steps)
    per_epoch = max(1, round(c["epoch_time_s"] / c["step_time_s"]))
    if c["config"].get("dataset") == "synthetic":
        return ["--epochs", "1", "--synthetic-samples", str(c["global_batch"] * steps)]
    epochs = max(1, math.ceil(steps / per_epoch))
    return ["--epochs", str(epochs), "--eval-every", str(epochs)]


def launcher(req: dict[str, Any]) -> list[str]:
    """What starts `scaletrain train` for the plan's nodes: here, or on every host of the testbed that is up
    (each host its cores, as the plan priced them)."""
    here = [sys.executable, "-m", "scaletrain"]
    if not req.get("testbed"):
        return here
    return [*here, "testbed", "run", "--cores-per-host", str(req["cores_per_host"]), "--", "scaletrain"]


def run_dir(root: Path, rank: int, k: int) -> Path:
    return root / "validation" / f"c{rank}" / f"r{k}"


def measure(root: Path, plan: dict[str, Any], k: int, repeats: int = REPEATS, steps: int | None = None,
            progress: Callable[[str, int, int], None] = lambda *a: None) -> tuple[dict[str, list], list[str]]:
    """Each of the top `k` candidates' completed runs by id, and a line per run that did not complete."""
    from scaletrain.distributed.env import child_env
    from scaletrain.rundir import read_summary
    from scaletrain.study.runner import error_line, launch
    from scaletrain.validate.load import read_run

    top = plan["ranked"][:k]
    env = child_env()
    runs: dict[str, list] = {c["id"]: [] for c in top}
    failed: list[str] = []
    total, done = len(top) * repeats, 0
    for r in range(repeats):  # interleaved: every candidate once a round
        for c in top:
            run = run_dir(root, c["rank"], r)
            log = run.with_suffix(".log")
            if run.exists():
                raise UserError(f"{run} exists: a validation of this plan ran before; plan again into a new --out")
            progress(f"#{c['rank']} round {r + 1}/{repeats}", done, total)
            cmd = [*launcher(plan["request"]), "train", "--plan", str(root), "--plan-rank", str(c["rank"]),
                   *brief_flags(c, steps), "--out", str(run)]
            code = launch(cmd, log, env)
            measured = read_run(run, str(run.relative_to(root)), point=c["id"], notes=[])
            if code == 0 and measured is not None:
                runs[c["id"]].append(measured)
            else:
                why = error_line(log.read_text(errors="replace"), read_summary(run, strict=False), code)
                failed.append(f"#{c['rank']} round {r + 1}: {why} (log {log.relative_to(root)})")
            done += 1
    progress("done", done, total)
    return runs, failed


def collected(root: Path, plan: dict[str, Any]) -> dict[str, list]:
    """The completed runs of a validation already made in `root`, by candidate id (to compare them again)."""
    from scaletrain.validate.load import read_run

    runs: dict[str, list] = {}
    for c in plan["ranked"]:
        where = root / "validation" / f"c{c['rank']}"
        if not where.is_dir():
            continue
        found = [read_run(d, str(d.relative_to(root)), point=c["id"], notes=[]) for d in sorted(where.glob("r*"))
                 if d.is_dir()]
        runs[c["id"]] = [r for r in found if r is not None]
    return runs
