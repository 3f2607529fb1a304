"""`scaletrain split`: the best split of a model into K pipeline stages beside the uniform, parameter-count and
time-balanced ones; prints them and writes split.json (docs/split.md)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from scaletrain.command import Command
from scaletrain.errors import UserError
from scaletrain.units import parse_rate, size_flag


def add_split_args(p: argparse.ArgumentParser) -> None:
    from scaletrain.config import OPTIMIZERS, PRECISIONS

    p.description = ("Split a model's blocks into K contiguous pipeline stages with the smallest predicted step "
                     "time under a per-stage memory limit, beside the uniform, parameter-count (DeepSpeed) and "
                     "time-balanced (torchgpipe) splits.")
    p.epilog = "example: scaletrain split --model vgg11 --stages 2 --memory-per-stage 512MiB --link 10Gbit/s"
    p.add_argument("--model", required=True, help="a built-in model or package.module:factory")
    p.add_argument("--stages", type=int, required=True, help="pipeline stages K")
    p.add_argument("--microbatches", type=int, default=4, help="micro-batches per step M (default 4)")
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="1f1b",
                   help="pipeline schedule: how many micro-batches' activations a stage holds (default 1f1b)")
    p.add_argument("--batch-size", type=int, default=32, help="global batch of one step (default 32)")
    p.add_argument("--memory-per-stage", help="memory limit of each stage, e.g. 512MiB, 2GiB (default none)")
    p.add_argument("--link", help="link rate between stages, e.g. 10Gbit/s, 1gbit (default: the calibration's "
                                  "measured network, else 10Gbit/s)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd", help="its state counts in memory")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32")
    p.add_argument("--calibration", help="calibration file (default: this machine's, when there is one)")
    p.add_argument("--costs", choices=("auto", "predicted", "measured"), default="auto",
                   help="block times predicted from the calibration or measured here (auto: predicted when "
                        "there is a calibration)")
    p.add_argument("--offload", nargs="?", const="measure", default=None, metavar="RATE",
                   help="a stage that does not fit may keep its optimizer state, then its activations, in pinned "
                        "host memory; copies priced at RATE (e.g. 128Gbit/s), measured here when omitted")
    p.add_argument("--out", help="directory for split.json (default runs/split-MODEL-TIME)")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--in-channels", type=int, default=3)
    p.add_argument("--num-classes", type=int, default=10)


def _check(args: argparse.Namespace) -> None:
    if args.stages < 1:
        raise UserError(f"--stages {args.stages}: a pipeline needs at least 1 stage")
    if args.batch_size < 1:
        raise UserError(f"--batch-size {args.batch_size}: give the global batch of one step, at least 1")
    if min(args.image_size, args.in_channels, args.num_classes) < 1:
        raise UserError("--image-size, --in-channels and --num-classes must be at least 1")


def _calibration(args: argparse.Namespace) -> tuple[dict[str, Any] | None, str | None]:
    """(calibration, where) from --calibration or this machine's cache; never makes one."""
    from scaletrain.predict import calibration

    if args.calibration:
        return calibration.load(args.calibration), args.calibration
    path = calibration.cache_path()
    return (calibration.load(path), str(path)) if path.is_file() else (None, None)


def _link(args: argparse.Namespace, cal: dict[str, Any] | None) -> tuple[float, float, str]:
    """(bytes/s, latency s, where it comes from)."""
    if args.link:
        return parse_rate(args.link), 0.0, f"--link {args.link}"
    fit = ((cal or {}).get("network") or {}).get("fits", {}).get("allreduce")
    if fit and fit.get("beta_s_per_byte", 0) > 0:
        return 1 / fit["beta_s_per_byte"], float(fit.get("alpha_s", 0.0)), "the calibration's measured network"
    from scaletrain.split.plan import DEFAULT_LINK

    return DEFAULT_LINK, 0.0, "the default (no calibration with a network measurement; set --link)"


def _costs_source(costs: str, where: str | None) -> tuple[str, str]:
    """(predicted | measured, a note saying which and why)."""
    measured = "block times measured here, block by block (torchgpipe's balance_by_time)"
    if costs == "measured":
        return "measured", measured
    if where is None:
        if costs == "predicted":
            raise UserError("--costs predicted needs a calibration: run `scaletrain calibrate`, pass --calibration "
                            "FILE, or use --costs measured")
        return "measured", f"no calibration of this machine: {measured}; `scaletrain calibrate` makes predicted ones"
    return "predicted", f"block times predicted from {where}"


def _offload_rate(offload: str | None) -> tuple[float | None, str | None]:
    """(bytes/s of copies to pinned host memory, a note on where it comes from); (None, None) without --offload."""
    if offload is None:
        return None, None
    if offload == "measure":
        from scaletrain.split.costs import host_copy_rate

        rate, how = host_copy_rate()
    else:
        rate, how = parse_rate(offload, "--offload"), f"--offload {offload}"
    return rate, f"offload copies priced at {rate / 1e9:.3g} GB/s: {how}"


def run_split(args: argparse.Namespace) -> int:
    import torch

    from scaletrain.console.phase import phase
    from scaletrain.console.width import output_console
    from scaletrain.models import build_model
    from scaletrain.perf.footprint import check_forward_fits
    from scaletrain.rundir import SPLIT, check_out, write_json_atomic
    from scaletrain.split import plan
    from scaletrain.split.costs import ROUNDS, block_sizes
    from scaletrain.split.partition import baselines, check_memory, optimal
    from scaletrain.split.stages import blocked
    from scaletrain.split.view import print_split

    _check(args)
    out = Path(args.out or _default_out(args.model))
    check_out(out, "split")
    micro = plan.micro_batch(args.batch_size, args.microbatches)
    limit = size_flag(args.memory_per_stage, "--memory-per-stage") if args.memory_per_stage else None
    cal, where = _calibration(args)
    rate, latency, link_source = _link(args, cal)
    source, costs_note = _costs_source(args.costs, where)
    offload_rate, offload_note = _offload_rate(args.offload)
    notes = [f"link {rate * 8 / 1e9:.3g} Gbit/s" + (f", {latency * 1e6:.0f} us latency" if latency else "")
             + f": {link_source}", costs_note] + ([offload_note] if offload_note else [])

    def factory():
        return build_model(args.model, num_classes=args.num_classes, in_channels=args.in_channels,
                           image_size=args.image_size)

    check_forward_fits(factory, micro, args.in_channels, args.image_size,
                       f"running {args.model} at a micro-batch of {micro} (--batch-size {args.batch_size} / "
                       f"--microbatches {args.microbatches}) and --image-size {args.image_size}",
                       "lower --batch-size, raise --microbatches, or lower --image-size")
    model = factory()
    shape = (args.in_channels, args.image_size, args.image_size)
    b = blocked(model, shape, 1)
    device_type = (cal or {}).get("device", {}).get("type") or ("cuda" if torch.cuda.is_available() else "cpu")
    memory = plan.stage_memory(factory, b, shape, micro, stages=args.stages, microbatches=args.microbatches,
                               schedule=args.schedule, optimizer=args.optimizer, precision=args.precision,
                               device_type=device_type, budget=limit is not None)
    if memory is None:
        notes.append("stage memory from the blocks' bytes: the model cannot run on the meta device, where the memory "
                     "model walks it")
    pipe = plan.pipeline_args(microbatches=args.microbatches, schedule=args.schedule, optimizer=args.optimizer,
                              link_bytes_per_s=rate, latency_s=latency, memory_limit=limit,
                              offload_bytes_per_s=offload_rate, memory=memory)
    # stage count and memory need bytes alone: refuse them before seconds of timing
    check_memory(block_sizes(b, micro, args.precision), args.stages, **pipe)
    console = output_console(highlight=False)
    verb, how = ("measuring", f"{ROUNDS} rounds") if source == "measured" else ("predicting", "from the calibration")
    with phase(f"{verb} {len(b.blocks)} blocks' costs ({how}, micro-batch {micro})", console=console) as update:
        costs, source = plan.costs_for(b, model, shape, micro, source=source, calibration=cal,
                                       precision=args.precision, progress=update)
    chosen = optimal(costs, args.stages, **pipe)
    report = plan.split_report(args.model, b, shape, args.batch_size, chosen, baselines(costs, args.stages, **pipe),
                               link_bytes_per_s=rate, memory_limit=limit, costs_source=source, costs=costs,
                               notes=notes)
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / SPLIT, report)
    except OSError as e:
        raise UserError(f"cannot write {out / SPLIT} ({e.strerror}): choose another --out") from None
    print_split(report, console)
    console.print(f"wrote {out / SPLIT}  (train with it: --strategy pipeline --split {out / SPLIT})")
    return 0


def _default_out(model: str) -> str:
    name = model.replace(":", "_").replace("/", "_").replace(".", "_")[:60]
    return str(Path("runs") / f"split-{name}-{time.strftime('%Y%m%d-%H%M%S')}")


COMMANDS = (
    Command("split", "split a model into pipeline stages: the best split beside uniform, "
            "parameter-count and time-balanced ones",
            add_split_args, run_split),
)
