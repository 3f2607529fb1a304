"""`make validate-predict`: the performance model against measurements on this machine (issue 11).

Runs every group below for real (studies on this machine, testbed launches over shaped links), predicts
the same configurations from a calibration, and validates point by point. The models include two
written for this test alone (validation_models.py: widenet, dwnet) besides built-in ones; the calibration
was never run on any of them (its loop runs use predict/refnet.py).

    python benchmarks/validate_predict.py [--calibration FILE] [--out DIR] [--repeats N] [--no-testbed]
                                          [--only GROUP]

Writes DIR/validation.json (every point's errors against the mean of its N runs, run interleaved, with
the runs' spread beside each; median and 90th percentile and the errors' signs; the ratios measured side by
side, which cancel the machine's drift; `repeatability`: how far a point's runs differ from each other, the
floor under any prediction's error), DIR/plots/ and each group's study and prediction under DIR/<group>/. Points already
run are reused (delete DIR to start over).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
COMMON = ["--epochs", "1", "--no-augment", "--tensorboard", "off", "--eval-every", "1"]
W, D = "validation_models:widenet", "validation_models:dwnet"

# name: (axes and settings as flags, extra predict flags, testbed (hosts, rate) or None)
GROUPS = {
    "cnn-fp32": (["--model", f"resnet20,lenet5,{W},{D}", "--nproc", "1,2", "--batch-size", "32,96",
                  "--dataset", "synthetic", "--synthetic-samples", "2304", "--image-size", "32"], [], None),
    "bf16": (["--model", f"resnet20,{W}", "--nproc", "1,2", "--batch-size", "64", "--precision", "bf16",
              "--dataset", "synthetic", "--synthetic-samples", "2048", "--image-size", "32"], [], None),
    "mlp-digits": (["--model", "mlp", "--nproc", "1,2", "--batch-size", "128", "--dataset", "digits"], [], None),
    # the strategies that split the model (issue 12): the bubble and the transfers, FSDP's gathers
    "pipeline": (["--model", f"resnet20,{W}", "--strategy", "pipeline", "--nproc", "2", "--microbatches", "2,8",
                  "--split", "auto,uniform", "--batch-size", "64", "--dataset", "synthetic",
                  "--synthetic-samples", "2048", "--image-size", "32"], [], None),
    "fsdp": (["--model", f"resnet20,{W}", "--strategy", "fsdp", "--nproc", "2", "--batch-size", "64",
              "--dataset", "synthetic", "--synthetic-samples", "2048", "--image-size", "32"], [], None),
    "imagefolder": (["--model", f"lenet5,{D}", "--nproc", "1", "--workers", "0,1,2", "--batch-size", "32",
                     "--image-size", "32"], [], "folder"),
}
TESTBED = {  # group: (hosts, rate, train flags)
    "testbed-2h-100mbit": (2, "100mbit", ["--model", "resnet20", "--batch-size", "64", "--strategy", "allreduce,ring"]),
    "testbed-2h-1gbit": (2, "1gbit", ["--model", f"resnet20,{W}", "--batch-size", "64"]),
    "testbed-3h-200mbit": (3, "200mbit", ["--model", "lenet5", "--batch-size", "64", "--strategy", "allreduce,ps-sync"]),
    # a parameter server beside a larger model on a faster link (added 2026-11-27, after the server's idle core)
    "testbed-3h-1gbit": (3, "1gbit", ["--model", "resnet20", "--batch-size", "32", "--strategy", "allreduce,ps-sync"]),
}
TESTBED_COMMON = ["--dataset", "synthetic", "--synthetic-samples", "2048", "--image-size", "32"]


def scaletrain(*args: str, log: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    cmd = [sys.executable, "-m", "scaletrain", *args]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(" ".join(cmd) + "\n" + result.stdout + result.stderr)
    if check and result.returncode != 0:
        raise SystemExit(f"failed ({result.returncode}): {' '.join(cmd)}\n{(result.stderr or result.stdout)[-2000:]}")
    return result


def expand(flags: list[str]) -> list[dict[str, str]]:
    """Comma-list flags -> one dict of flag values per combination (for testbed launches, one run each)."""
    import itertools

    pairs = [(flags[i], flags[i + 1]) for i in range(0, len(flags), 2)]
    names = [p[0] for p in pairs]
    return [dict(zip(names, combo)) for combo in itertools.product(*(p[1].split(",") for p in pairs))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", default=None)
    ap.add_argument("--out", default=str(ROOT / "runs" / "validate-predict"))
    ap.add_argument("--repeats", type=int, default=3, help="runs of each configuration, interleaved (default 3)")
    ap.add_argument("--no-testbed", action="store_true")
    ap.add_argument("--only", default=None, help="comma list of groups")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cal = Path(args.calibration) if args.calibration else out / "calibration.json"
    if not cal.is_file():
        print(f"calibrating this machine: {cal}", flush=True)
        scaletrain("calibrate", "--out", str(cal), log=out / "calibrate.log")
    only = set(args.only.split(",")) if args.only else None
    testbed = not args.no_testbed and os.geteuid() == 0 and shutil.which("tc") and shutil.which("ip")
    folder = out / "digits-64"
    if not (folder / "train").is_dir():
        scaletrain("make-imagefolder", "--out", str(folder), "--image-size", "64")

    from scaletrain.validate.match import error_summary, phase_summary, summary_line
    from scaletrain.validate.output import prepare, write_validation

    merged, notes, started = [], [], time.time()
    for name, (flags, extra, kind) in GROUPS.items():
        if only and name not in only:
            continue
        flags = [*flags, *(["--dataset", f"imagefolder:{folder}"] if kind == "folder" else [])]
        gdir = out / name
        # predicted first, as `study --predict` does: its speed probe is timed just before the runs it predicts
        scaletrain("predict", *flags, *COMMON, *extra, "--calibration", str(cal), "--out", str(gdir / "prediction"),
                   log=gdir / "predict.log")
        print(f"[{name}] study", flush=True)
        scaletrain("study", *flags, *COMMON, "--repeats", str(args.repeats), "--out", str(gdir / "study"),
                   log=gdir / "study.log", check=False)
        merged += _validated(name, gdir / "prediction", [gdir / "study"], notes)
    for name, (hosts, rate, flags) in TESTBED.items():
        if only and name not in only:
            continue
        if not testbed:
            notes.append(f"{name}: skipped (the testbed needs root, ip and tc)")
            continue
        gdir = out / name
        # the testbed up first: the prediction takes its hosts' link and cores from it (predict --testbed)
        scaletrain("testbed", "down", log=gdir / "testbed-down.log", check=False)
        scaletrain("testbed", "up", "--hosts", str(hosts), "--rate", rate, log=gdir / "testbed-up.log")
        scaletrain("predict", *flags, *TESTBED_COMMON, *COMMON, "--nproc", "1", "--testbed", "--calibration",
                   str(cal), "--out", str(gdir / "prediction"), log=gdir / "predict.log")
        runs = []
        # interleaved: every configuration once, then again, so that a drift of the machine falls on all alike
        for k, combo in ((k, c) for k in range(args.repeats) for c in expand(flags)):
            run_flags = [x for kv in combo.items() for x in kv]
            rid = "-".join(v.split(":")[-1] for v in combo.values()) + (f"-r{k}" if k else "")
            run = gdir / "runs" / rid
            if not (run / "summary.json").is_file():
                shutil.rmtree(run, ignore_errors=True)
                print(f"[{name}] testbed run {rid}", flush=True)
                exe = str(Path(sys.executable).parent / "scaletrain")  # the venv's, whether or not it is on PATH
                scaletrain("testbed", "run", "--hosts", str(hosts), "--rate", rate, "--", exe, "train",
                           "--nproc", "1", *run_flags, *TESTBED_COMMON, *COMMON, "--out", str(run),
                           log=gdir / "runs" / f"{rid}.log", check=False)
            runs.append(run)
        merged += _validated(name, gdir / "prediction", runs, notes)
        scaletrain("testbed", "down", log=gdir / "testbed-down.log", check=False)

    from scaletrain.validate import ratios

    timed = [p for p in merged if p["errors"]["step_time"] is not None]
    ratio_rows = ratios.ratios(merged)
    result = {"format": 1, "kind": "validation", "basis": "calibration", "basis_note": f"calibration {cal}",
              "points": merged, "unmatched": [], "unmeasured_points": [],
              "summary": error_summary([p["errors"]["step_time"] for p in timed],
                                       [p["measured"]["spread"] for p in timed]),
              "ratios": ratio_rows, "ratio_summary": ratios.summary(ratio_rows), "phase_summary": phase_summary(merged),
              "repeatability": repeatability(merged), "notes": notes,
              "seconds": round(time.time() - started)}
    prepare(out)
    write_validation(result, out)
    _table(merged)
    print(summary_line(result["summary"]))
    from scaletrain.validate.output import ratio_line

    if ratio_line(result):
        print(ratio_line(result))
    rep = result["repeatability"]
    if rep["points"]:
        print(f"repeatability: a point's two runs differ by median {rep['median_abs_difference']:.1%}, "
              f"90th percentile {rep['p90_abs_difference']:.1%} ({rep['points']} points)")
    print(f"validation.json: {out / 'validation.json'}")
    return 0


def repeatability(points: list[dict]) -> dict:
    """How far each point's first two runs' step times differ (|a / b - 1|): the measurement's own noise."""
    import json

    from scaletrain.validate.match import quantile

    diffs = []
    for p in points:
        steps = []
        for d in p.get("run_dirs") or []:
            path = Path(d) / "summary.json"
            if path.is_file():
                steps.append(json.loads(path.read_text()).get("step_time_mean_s"))
        steps = [s for s in steps if s]
        if len(steps) >= 2:
            diffs.append(abs(steps[0] / steps[1] - 1))
    return {"points": len(diffs), "median_abs_difference": quantile(diffs, 0.5) if diffs else None,
            "p90_abs_difference": quantile(diffs, 0.9) if diffs else None}


def _validated(group: str, prediction_dir: Path, paths: list[Path], notes: list[str]) -> list[dict]:
    from scaletrain.validate import load_measured, validate

    from scaletrain.validate.load import load_prediction

    prediction = load_prediction(prediction_dir)
    runs = load_measured([p for p in paths if p.exists()], notes)
    result = validate(prediction, runs)
    for p in result["points"]:
        p["id"] = f"{group}/{p['id']}"
    notes += [f"{group}: unmatched {u['run_dir']}" for u in result["unmatched"]]
    return result["points"]


def _table(points: list[dict]) -> None:
    print(f"{'point':58s} {'measured':>10s} {'predicted':>10s} {'error':>8s}  largest phase error")
    for p in points:
        m, q, e = p["measured"]["step_time_s"], p["predicted"]["step_time_s"], p["errors"]["step_time"]
        ph = max(((k, v) for k, v in p["errors"]["phases"].items() if v.get("difference_s") is not None),
                 key=lambda kv: abs(kv[1]["difference_s"]), default=(None, {}))
        phase = f"{ph[0]} {1e3 * ph[1]['difference_s']:+.1f} ms" if ph[0] else ""
        print(f"{p['id']:58s} {1e3 * m:8.1f}ms {1e3 * q:8.1f}ms {100 * e:+7.1f}%  {phase}")


if __name__ == "__main__":
    sys.exit(main())
