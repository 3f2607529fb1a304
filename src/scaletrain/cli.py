"""Command line: `scaletrain train | study | report | compare | models | make-imagefolder`; bad input becomes one line and exit code 2."""

from __future__ import annotations

import argparse
import sys

from scaletrain.dist.env import quiet_torch_cpp_logs

quiet_torch_cpp_logs()  # before anything imports torch

import scaletrain  # noqa: E402
from scaletrain.config import TrainConfig, resolve_train_config
from scaletrain.config.flags import OneLineParser, add_train_args
from scaletrain.errors import UserError
from scaletrain.dist.allocator import settle as settle_allocator
from scaletrain.dist.launch.spawned import refuse_in_spawned_import


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="scaletrain", description=scaletrain.__doc__)
    parser.add_argument("--version", action="version", version=f"scaletrain {scaletrain.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_args(sub.add_parser("train", help="train a model with data parallelism (DDP)"))
    from scaletrain.report.cli import add_compare_args, add_report_args
    from scaletrain.study.cli import add_study_args
    add_study_args(sub.add_parser("study", help="run a grid of training launches and report their scaling"))
    add_report_args(sub.add_parser("report", help="rebuild the report of a run or study from its files"))
    add_compare_args(sub.add_parser("compare", help="put two runs or studies side by side"))
    from scaletrain.commbench.cli import add_commbench_args
    add_commbench_args(sub.add_parser("commbench", help="time all-reduce strategies over sizes and ranks, "
                                                         "against the alpha-beta model"))
    from scaletrain.testbed.cli import add_testbed_args
    add_testbed_args(sub.add_parser("testbed", help="a virtual cluster: hosts as network namespaces, shaped links"))
    from scaletrain.predict.calibrate_cli import add_calibrate_args
    add_calibrate_args(sub.add_parser("calibrate", help="measure this machine once for the performance model"))
    from scaletrain.predict.cli import add_predict_args
    add_predict_args(sub.add_parser("predict", help="predict step time, scaling and memory before running"))
    from scaletrain.validate.cli import add_validate_args
    add_validate_args(sub.add_parser("validate", help="compare a prediction with measured runs or studies"))
    from scaletrain.graph.cli import add_graph_args
    add_graph_args(sub.add_parser("graph", help="the model's graph (layers, blocks, modules) with shapes, FLOPs, "
                                                "times and cut points"))
    from scaletrain.split.cli import add_split_args
    add_split_args(sub.add_parser("split", help="split a model into pipeline stages: the best split beside "
                                                "uniform, parameter-count and time-balanced ones"))
    from scaletrain.slurm.cli import add_slurm_args
    add_slurm_args(sub.add_parser("slurm", help="write and submit an sbatch job of a train or study command "
                                                "(requeued on preemption)"))
    from scaletrain.doctor.cli import add_doctor_args
    add_doctor_args(sub.add_parser("doctor", help="pre-flight checks of a multi-node launch: hosts, ports, "
                                                  "versions, clocks, shared run directory, links"))
    from scaletrain.watch.cli import add_watch_args
    add_watch_args(sub.add_parser("watch", help="a live view of a running job from its run directory "
                                                "(terminal, or a self-refreshing HTML page)"))
    models = sub.add_parser("models", help="list the models with parameters and forward FLOPs")
    models.add_argument("--image-size", type=int, default=32)
    models.add_argument("--in-channels", type=int, default=3)
    models.add_argument("--num-classes", type=int, default=10)
    mk = sub.add_parser("make-imagefolder", help="write a JPEG image folder (train/ val/) from real data")
    mk.add_argument("--source", default="digits", help="where the images come from (default: digits)")
    mk.add_argument("--out", required=True, help="folder to create (must not exist or be empty)")
    mk.add_argument("--image-size", type=int, default=64)
    mk.add_argument("--copies", type=int, default=1, help="shifted copies of each training image")
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--quality", type=int, default=90, help="JPEG quality")
    parser.commands = sub.choices  # name -> the command's parser, for its own error line
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse; an unknown flag is reported by its command's parser (`see scaletrain study --help`)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def train_config(args: argparse.Namespace) -> TrainConfig:
    """Defaults < the run's saved config (on --resume) < --config file < flags."""
    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "config")}
    return resolve_train_config(overrides, args.config)


def main(argv: list[str] | None = None) -> int:
    refuse_in_spawned_import("scaletrain.cli.main()")  # a script's unguarded call, run again by a worker
    args = parse_args(argv)
    settle_allocator()  # before anything is timed or allocated for training (dist/allocator.py)
    try:
        if args.command == "train":
            from scaletrain.dist.launch.start import train
            return train(train_config(args))
        if args.command == "study":
            from scaletrain.study.cli import run_study
            return run_study(args)
        if args.command == "report":
            from scaletrain.report.cli import run_report
            return run_report(args)
        if args.command == "compare":
            from scaletrain.report.cli import run_compare
            return run_compare(args)
        if args.command == "commbench":
            from scaletrain.commbench.cli import run_commbench
            return run_commbench(args)
        if args.command == "testbed":
            from scaletrain.testbed.cli import run_testbed
            return run_testbed(args)
        if args.command == "calibrate":
            from scaletrain.predict.calibrate_cli import run_calibrate
            return run_calibrate(args)
        if args.command == "predict":
            from scaletrain.predict.cli import run_predict
            return run_predict(args)
        if args.command == "validate":
            from scaletrain.validate.cli import run_validate
            return run_validate(args)
        if args.command == "graph":
            from scaletrain.graph.cli import run_graph
            return run_graph(args)
        if args.command == "split":
            from scaletrain.split.cli import run_split
            return run_split(args)
        if args.command == "slurm":
            from scaletrain.slurm.cli import run_slurm
            return run_slurm(args)
        if args.command == "doctor":
            from scaletrain.doctor.cli import run_doctor
            return run_doctor(args)
        if args.command == "watch":
            from scaletrain.watch.cli import run_watch
            return run_watch(args)
        if args.command == "models":
            from scaletrain.models import model_rows
            from scaletrain.console.summary import print_models
            if min(args.image_size, args.in_channels, args.num_classes) < 1:
                raise UserError("--image-size, --in-channels and --num-classes must be at least 1")
            print_models(model_rows(image_size=args.image_size, in_channels=args.in_channels,
                                    num_classes=args.num_classes), args.image_size)
            return 0
        if args.command == "make-imagefolder":
            return _make_imagefolder(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 1


def _make_imagefolder(args: argparse.Namespace) -> int:
    from scaletrain.console.phase import phase
    from scaletrain.data import write_imagefolder
    from scaletrain.data.make_imagefolder import check_request

    check_request(source=args.source, out=args.out, image_size=args.image_size, copies=args.copies, seed=args.seed,
                  quality=args.quality)  # before the progress bar: a refusal is its line alone
    with phase(f"writing JPEGs to {args.out}") as update:
        result = write_imagefolder(source=args.source, out=args.out, image_size=args.image_size,
                                   copies=args.copies, seed=args.seed, quality=args.quality,
                                   progress=lambda done, total: update("", done, total))
    print(f"wrote {result['train']} training and {result['val']} validation images of {result['classes']} "
          f"classes to {result['path']}\ntrain on it with:  scaletrain train --dataset imagefolder:{result['path']} "
          f"--image-size {args.image_size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
