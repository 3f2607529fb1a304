"""`scaletrain calibrate`: arguments, its progress (console/phase.py), and the file it writes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scaletrain.errors import UserError


def add_calibrate_args(p: argparse.ArgumentParser) -> None:
    p.description = ("Measure this machine once for `scaletrain predict`: op times over a grid of shapes, the "
                     "optimizer, the data loader, the network between local ranks and the training loop itself.")
    p.add_argument("--out", default=None, help="calibration file to write (default: the machine's cache, which "
                                               "predict reads when given no --calibration)")
    p.add_argument("--quick", action="store_true", help="a fifth of the shapes, fp32 only: under a minute (tests)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")


def run_calibrate(args: argparse.Namespace) -> int:
    path = make_calibration(Path(args.out) if args.out else None, quick=args.quick, device=args.device)
    print(f"calibration: {path}\npredict with it:  scaletrain predict --calibration {path} --model resnet20 "
          "--nproc 1,2,4 --out runs/prediction")
    return 0


def make_calibration(out: Path | None, *, quick: bool, device: str = "auto") -> Path:
    import torch

    from scaletrain.console.phase import phase
    from scaletrain.dist.device import machine_cores
    from scaletrain.predict import calibrate, calibration
    from scaletrain.rundir import check_out_file

    if device not in ("auto", "cpu", "cuda"):
        raise UserError(f"--device {device}: use auto, cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA GPU is visible here: calibrate on the GPU node, or use --device cpu")
    dev = torch.device("cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu")
    out = out or calibration.cache_path()
    check_out_file(out, "calibration", _is_calibration)  # before minutes of measuring
    threads = torch.get_num_threads()
    # minutes, in parts of unequal cost (op timings, then real training runs): no ETA from the count
    with calibrate.scratch() as work, phase(f"calibrate ({'quick, ' if quick else ''}{dev.type})", eta=False) as update:
        result = calibrate.calibrate(quick=quick, device=dev, cores=machine_cores(), work_dir=Path(work),
                                     progress=update)
    torch.set_num_threads(threads)
    problems = [r["error"] for r in result["loop"]["runs"] if "error" in r]
    if result["network"].get("error"):
        problems.append(f"commbench: {result['network']['error']}")
    path = calibration.save(result, out)
    if problems:
        print(f"warning: part of the calibration failed ({'; '.join(problems)}): predictions will lack it")
    if calibration.unsteady(result):
        print(f"warning: {calibration.unsteady(result)}")
    return path


def _is_calibration(path: Path) -> bool:
    """A file `calibrate` wrote (of any format): the one kind of file it may replace."""
    from scaletrain.predict.calibration import KIND

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("kind") == KIND
