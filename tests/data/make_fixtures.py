"""Writes the hand-made report fixtures in tests/data (run-a, run-b, run-noprofile, study-a, study-b).

Deterministic: rerun `python tests/data/make_fixtures.py` after changing a number here. Each run has
2 ranks x 2 epochs x 6 steps. Every phase is the same on every step except data_wait, which is larger
on the first step of each epoch (loader start-up), so the steady-state means below hold whatever
warm-up rule an analysis uses as long as it leaves out each epoch's first step.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
PHASES = ("data_wait", "h2d", "forward", "backward", "comm_exposed", "optimizer", "other")
STEPS_PER_EPOCH, EPOCHS, BATCH, T0 = 6, 2, 32, 1_800_000_000.0
STARTUP_WAIT_S = 0.050  # extra data_wait on each epoch's first step

# per-rank steady phases in seconds; both ranks' steps last the same (DDP waits for the slowest rank,
# here rank 1 with its slower forward: rank 0 waits longer in comm_exposed)
RUN_A = {0: {"data_wait": 0.0030, "h2d": 0.0010, "forward": 0.0150, "backward": 0.0412, "comm_exposed": 0.0080,
             "optimizer": 0.0040, "other": 0.0008},
         1: {"data_wait": 0.0020, "h2d": 0.0010, "forward": 0.0180, "backward": 0.0412, "comm_exposed": 0.0060,
             "optimizer": 0.0040, "other": 0.0008}}
# run B: backward got 17.3 ms faster, data_wait 0.5 ms slower, the rest is unchanged
RUN_B = {r: {**p, "backward": 0.0239, "data_wait": p["data_wait"] + 0.0005} for r, p in RUN_A.items()}
COMM_TOTAL_S, BYTES_PER_STEP = 0.030, 1_090_000


def step_records(phases_by_rank: dict, profile: bool) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {r: [] for r in phases_by_rank}
    t = T0
    for step in range(STEPS_PER_EPOCH * EPOCHS):
        epoch, in_epoch = divmod(step, STEPS_PER_EPOCH)
        step_time = 0.0
        for rank, base in phases_by_rank.items():
            ph = dict(base)
            if in_epoch == 0:
                ph["data_wait"] += STARTUP_WAIT_S
            step_time = round(sum(ph.values()), 6)
            rec = {"step": step, "epoch": epoch, "step_in_epoch": in_epoch, "loss": round(2.3 - 0.08 * step, 4),
                   "lr": 0.1, "samples": BATCH, "step_time_s": step_time,
                   "samples_per_s": round(BATCH / step_time, 3)}
            if profile:
                exposed = ph["comm_exposed"]
                start = ph["data_wait"] + ph["h2d"] + ph["forward"] + 0.010
                rec.update(t_start_s=round(t, 6), phases_s={k: round(ph[k], 6) for k in PHASES},
                           comm_total_s=COMM_TOTAL_S, comm_hidden_s=round(COMM_TOTAL_S - exposed, 6),
                           overlap_ratio=round((COMM_TOTAL_S - exposed) / COMM_TOTAL_S, 6),
                           bytes_sent=BYTES_PER_STEP,
                           comm_intervals_s=[[round(start, 6), round(start + 0.012, 6)],
                                             [round(start + 0.015, 6), round(start + 0.015 + 0.018, 6)]])
            out[rank].append(rec)
        t += step_time
    return out


def steady(records: list[dict]) -> list[dict]:
    return [r for r in records if r["step_in_epoch"] >= 1]


def analysis(records_by_rank: dict[int, list[dict]], peak: dict[int, int], diagnosis: list[dict]) -> dict:
    """The profiler's summary keys, computed the plain way (means over steady steps, then over ranks)."""
    ranks, phase_means = [], []
    for rank, recs in records_by_rank.items():
        st = steady(recs)
        pm = {k: sum(r["phases_s"][k] for r in st) / len(st) for k in PHASES}
        phase_means.append(pm)
        times = sorted(r["step_time_s"] for r in st)
        ranks.append({"rank": rank, "phases_mean_s": pm, "step_time_mean_s": sum(times) / len(times),
                      "step_time_p50_s": times[len(times) // 2], "step_time_p90_s": times[int(0.9 * (len(times) - 1))],
                      "step_time_max_s": times[-1], "slowest_share": 1.0 if rank == 1 else 0.0,
                      "peak_memory_bytes": peak[rank]})
    n = len(steady(records_by_rank[0]))
    work = {r: records_by_rank[r][5]["step_time_s"] - records_by_rank[r][5]["phases_s"]["comm_exposed"]
            for r in records_by_rank}
    mean = {k: sum(pm[k] for pm in phase_means) / len(phase_means) for k in PHASES}
    exposed = mean["comm_exposed"]
    return {
        "profile": "on", "phases_mean_s": mean, "step_time_mean_s": sum(mean.values()),
        "overlap_ratio": (COMM_TOTAL_S - exposed) / COMM_TOTAL_S, "comm_total_mean_s": COMM_TOTAL_S,
        "comm_hidden_mean_s": COMM_TOTAL_S - exposed, "bytes_sent_per_step": BYTES_PER_STEP, "ranks": ranks,
        "stragglers": {"steps_compared": n, "spread_mean_s": abs(work[1] - work[0]),
                       "slowest_counts": {"0": 0, "1": n},
                       "repeated": []},  # rank 1 lags by 2 ms, under 10% of a step: not a straggler finding
        "peak_memory_bytes": max(peak.values()), "memory_kind": "rss", "diagnosis": diagnosis,
    }


def config(**extra) -> str:
    values = {"model": "resnet20", "dataset": "digits", "image_size": 32, "nproc": 2, "epochs": EPOCHS,
              "batch_size": BATCH, "optimizer": "nesterov", "lr": 0.1, "precision": "fp32", "workers": 0,
              "seed": 0, **extra}
    return "# resolved scaletrain configuration; rerun with --config this-file\n" + "".join(
        f"{k} = {json.dumps(v)}\n" for k, v in values.items())


def write_run(name: str, phases_by_rank: dict, profile: bool, top1: tuple, diagnosis: list[dict]) -> None:
    root = HERE / name
    root.mkdir(exist_ok=True)
    recs = step_records(phases_by_rank, profile)
    for rank, lines in recs.items():
        (root / f"metrics-rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    epoch_times = [round(sum(r["step_time_s"] for r in recs[0] if r["epoch"] == e), 6) for e in range(EPOCHS)]
    (root / "epochs.jsonl").write_text("".join(json.dumps(
        {"epoch": e, "epoch_time_s": epoch_times[e], "train_loss": round(2.0 - 0.5 * e, 4), "lr": 0.1,
         "bad_images_skipped": 0, "top1": top1[e], "top5": 1.0, "val_loss": round(1.0 - 0.3 * e, 4)}) + "\n"
        for e in range(EPOCHS)))
    (root / "config.toml").write_text(config(profile="on" if profile else "off"))
    st = steady(recs[0])
    summary = {
        "status": "completed", "model": "resnet20", "dataset": "digits", "world_size": 2, "global_batch": 2 * BATCH,
        "epochs": EPOCHS, "epochs_planned": EPOCHS, "top1": top1[-1], "top5": 1.0, "best_top1": max(top1),
        "epoch_times_s": epoch_times,
        "samples_per_s": sum(r["samples"] for r in st) * 2 / sum(r["step_time_s"] for r in st),
        "effective_lr": 0.1, "precision": "fp32", "device": "cpu", "backend": "gloo",
        "steps": STEPS_PER_EPOCH * EPOCHS, "train_samples": 2 * BATCH * STEPS_PER_EPOCH, "val_samples": 360,
        "wall_time_s": round(sum(epoch_times) + 1.5, 6), "scaletrain_version": "0.1.0",
        "torch_version": "2.13.0+cpu", "finished_at": "2026-11-21T10:41:50+0000",
    }
    if profile:
        summary.update(analysis(recs, {0: 412_000_000, 1: 405_000_000}, diagnosis))
    else:
        summary.update(profile="off", phases_mean_s=None, step_time_mean_s=sum(r["step_time_s"] for r in st) / len(st),
                       overlap_ratio=None, diagnosis=[])
    (root / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


COMPUTE_A = {"kind": "compute-bound", "share": 0.845,
             "message": "forward, backward and optimizer take 85% of the step (61.7 ms of 73.0 ms)",
             "lever": "try --precision bf16, or a larger --batch-size per process"}
COMPUTE_B = {**COMPUTE_A, "share": 0.79, "message": "forward, backward and optimizer take 79% of the step "
                                                       "(44.4 ms of 56.2 ms)"}

# study points: (nproc, workers) -> epoch time (s) or None for a failed point
STUDY_A = {(1, 0): 40.0, (1, 2): 30.0, (2, 0): 22.0, (2, 2): 16.0, (4, 0): 13.0, (4, 2): None}
STUDY_B = {(1, 0): 36.0, (1, 2): 27.0, (2, 0): 21.0, (2, 2): 14.0, (4, 0): 12.5, (4, 2): 9.0}


def write_study(name: str, times: dict) -> None:
    root = HERE / name
    root.mkdir(exist_ok=True)
    (root / "study.toml").write_text('repeats = 1\n\n[axes]\nnproc = [1, 2, 4]\nworkers = [0, 2]\n\n'
                                     '[train]\nmodel = "resnet20"\ndataset = "digits"\nepochs = 1\nbatch_size = 32\n')
    points = []
    for (nproc, workers), t in times.items():
        pid = f"nproc{nproc}-workers{workers}"
        base_t = times[(1, workers)]
        wait = 0.030 if workers == 0 else 0.004
        phases = {"data_wait": wait, "h2d": 0.001, "forward": 0.015, "backward": 0.040,
                  "comm_exposed": 0.0 if nproc == 1 else 0.004 * nproc, "optimizer": 0.004, "other": 0.001}
        top = ({"kind": "input-bound", "share": round(wait / sum(phases.values()), 3),
                "message": f"waiting for data takes {100 * wait / sum(phases.values()):.0f}% of the step",
                "lever": "try --workers 4"} if workers == 0 else COMPUTE_A)
        point = {"id": pid, "axes": {"nproc": nproc, "workers": workers},
                 "config": {"model": "resnet20", "dataset": "digits", "epochs": 1, "batch_size": 32,
                            "nproc": nproc, "workers": workers},
                 "runs": [f"points/{pid}/r0"], "repeats": 1, "baseline": f"nproc1-workers{workers}"}
        if t is None:
            point.update(status="failed", error="rank 3 exited with code 1: RuntimeError: out of memory",
                         epoch_time_s=None, epoch_time_std_s=None, samples_per_s=None, speedup=None,
                         ideal_speedup=float(nproc), efficiency=None, phases_mean_s=None, overlap_ratio=None,
                         diagnosis=[], top1=None)
        else:
            speedup = base_t / t
            point.update(status="completed", epoch_time_s=t, epoch_time_std_s=0.0,
                         samples_per_s=round(1437 / t, 3), speedup=speedup, ideal_speedup=float(nproc),
                         efficiency=speedup / nproc, phases_mean_s=phases,
                         overlap_ratio=None if nproc == 1 else 0.6, diagnosis=[top], top1=0.9)
        points.append(point)
    (root / "study.json").write_text(json.dumps(points, indent=2) + "\n")


if __name__ == "__main__":
    write_run("run-a", RUN_A, True, (0.80, 0.91), [COMPUTE_A])
    write_run("run-b", RUN_B, True, (0.81, 0.92), [COMPUTE_B])
    write_run("run-noprofile", RUN_A, False, (0.80, 0.91), [])
    write_study("study-a", STUDY_A)
    write_study("study-b", STUDY_B)
