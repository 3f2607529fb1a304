"""`scaletrain calibrate`: arguments, its progress (console/phase.py), and the file it writes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scaletrain.command import Command
from scaletrain.errors import UserError


def add_calibrate_args(p: argparse.ArgumentParser) -> None:
    p.description = ("Measure this machine once for `scaletrain predict`: op times over a grid of shapes, the "
                     "optimizer, the data loader, the network between local ranks and the training loop itself.")
    p.add_argument("--out", default=None, help="calibration file to write (default: the machine's cache, which "
                                               "predict reads when given no --calibration)")
    p.add_argument("--quick", action="store_true", help="a fifth of the shapes, fp32 only, one run of each "
                   "training-loop setting: about 2.5 minutes on 2 cores (tests)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--only", choices=("loader",), default=None,
                   help="loader: measure only one core's input-pipeline rate for --dataset at --image-size (seconds; "
                        "on a node of the cluster, for `predict --hardware ... --loader FILE`)")
    p.add_argument("--dataset", default=None, help="with --only loader: the dataset to read (e.g. imagefolder:PATH)")
    p.add_argument("--image-size", type=int, default=None, help="with --only loader: the run's image size")


def run_calibrate(args: argparse.Namespace) -> int:
    if args.only == "loader":
        return _loader_only(args)
    if args.dataset or args.image_size:
        raise UserError("--dataset and --image-size choose what `--only loader` reads: add --only loader, or drop "
                        "them (a full calibration measures its own datasets)")
    path = make_calibration(Path(args.out) if args.out else None, quick=args.quick, device=args.device)
    print(f"calibration: {path}\npredict with it:  scaletrain predict --calibration {path} --model resnet20 "
          "--nproc 1,2,4 --out runs/prediction")
    return 0


def make_calibration(out: Path | None, *, quick: bool, device: str = "auto") -> Path:
    import torch

    from scaletrain.console.phase import phase
    from scaletrain.distributed.device import machine_cores
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

    return _is_kind(path, KIND)


def _loader_only(args: argparse.Namespace) -> int:
    from scaletrain.console.phase import phase
    from scaletrain.predict import loader_rate
    from scaletrain.rundir import check_out_file, write_json_atomic

    if not args.dataset or not args.out:
        raise UserError("--only loader measures one dataset into one file: give --dataset (e.g. imagefolder:PATH), "
                        "--image-size and --out loader.json")
    if args.image_size is not None and args.image_size < 1:
        raise UserError(f"--image-size {args.image_size}: give the run's image side in pixels, at least 1")
    if args.quick:
        raise UserError("--quick shortens a full calibration; --only loader is seconds already: drop --quick")
    out = Path(args.out)
    check_out_file(out, "loader rate", lambda p: _is_kind(p, loader_rate.KIND))
    with phase(f"calibrate: one core through {args.dataset}", eta=False):
        rate = loader_rate.measure(args.dataset, args.image_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out, rate)
    print(f"one core: {rate['samples_per_s_per_core']:.1f} samples/s through {args.dataset} at "
          f"{rate['image_size']} px: {out}\npredict with it:  scaletrain predict --hardware PROFILE --loader {out} "
          f"--dataset {args.dataset} ...")
    return 0


def _is_kind(path: Path, kind: str) -> bool:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("kind") == kind


COMMANDS = (
    Command("calibrate", "measure this machine once for the performance model",
            add_calibrate_args, run_calibrate),
)
