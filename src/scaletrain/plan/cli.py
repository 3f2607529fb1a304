"""`scaletrain plan`: which configuration to run, from a calibration or a data sheet (docs/plan.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from scaletrain.command import Command
from scaletrain.errors import UserError


def add_plan_args(p: argparse.ArgumentParser) -> None:
    p.description = ("Search every configuration the performance model prices (strategy and layout, batch, loader "
                     "workers, precision, compression, activation checkpointing, bucket size) for a model on N "
                     "nodes of P processes, keep those within the memory budget and rank them by time to train.")
    p.epilog = ("example: scaletrain plan --model resnet50 --image-size 224 --nodes 4 --nproc 8 --hardware "
                "dgx-a100-80gb --out runs/plan")
    p.add_argument("--model", required=True, help="a model name (scaletrain models) or package.module:factory")
    p.add_argument("--image-size", type=int, default=None, help="image side in pixels (default: the dataset's)")
    p.add_argument("--nodes", type=int, default=None, help="nodes of the cluster (default 1; with --testbed its hosts)")
    p.add_argument("--nproc", type=int, required=True, help="processes per node (one per GPU)")
    p.add_argument("--calibration", help="calibration file (default: this machine's, made with --quick the first time)")
    p.add_argument("--hardware", help="a hardware profile (a shipped name such as dgx-a100-80gb, or a TOML): a "
                                      "data-sheet basis, no calibration")
    p.add_argument("--loader", help="with --hardware: a loader-rate file from `scaletrain calibrate --only loader`")
    p.add_argument("--memory-per-device", help="memory budget per device, e.g. 40GiB (default: the device's)")
    p.add_argument("--global-batch", type=int, default=None,
                   help="keep this global batch: each layout's trainers share it (default: search --batch-size)")
    p.add_argument("--batch-size", default=None,
                   help="per-device batches to search, a comma list (default 16,32,64,128,256)")
    p.add_argument("--epochs", type=int, default=1, help="epochs to train: the ranking is by time to train them")
    for axis, example in (("strategy", "allreduce,ring"), ("precision", "bf16"), ("workers", "0,4"),
                          ("compress", "none"), ("checkpoint-activations", "none")):
        p.add_argument(f"--{axis}", default=None, metavar="LIST",
                       help=f"search only these values of --{axis}, a comma list (e.g. {example}; default: all)")
    p.add_argument("--dataset", default="synthetic", help="the training data (default synthetic)")
    p.add_argument("--synthetic-samples", type=int, default=1_281_167,
                   help="samples of an epoch with --dataset synthetic (default ImageNet-1k's 1,281,167)")
    p.add_argument("--link", help="link rate between nodes, e.g. 100gbit (default: the calibration's or profile's)")
    p.add_argument("--latency", default=None, help="one-way latency between nodes, with --link")
    p.add_argument("--network", help="commbench.json measured between nodes (replaces --link/--latency)")
    p.add_argument("--testbed", action="store_true",
                   help="plan for the testbed that is up (`scaletrain testbed up`): its hosts the nodes, its link, "
                        "each host's cores as `testbed run` shares them; --validate runs the candidates on it")
    p.add_argument("--cores-per-host", type=int, default=None, metavar="N",
                   help="with --testbed: the cores each host gets (default as testbed run: the machine's // hosts)")
    p.add_argument("--time-ops", default="auto", metavar="auto|off|SECONDS",
                   help="time the model's op shapes the calibration lacks, here (as predict --time-ops)")
    p.add_argument("--top", type=int, default=5, help="candidates to show (default 5)")
    p.add_argument("--no-prune", dest="prune", action="store_false",
                   help="price every candidate: by default one whose forward and backward alone are slower than the "
                        "top's slowest (and, with --validate K, the top K's) is pruned, not priced")
    p.add_argument("--validate", default=None, metavar="K|auto|all",
                   help="then run the top K candidates (auto: those priced within the model's own error of the chosen "
                        "one, docs/plan.md \"How sure\"; all: every one ranked) briefly on this machine, interleaved "
                        "and repeated, re-rank them by measurement and compare with the prediction")
    p.add_argument("--repeats", type=int, default=None, help="with --validate: rounds, each running every candidate "
                                                             "once (default 3)")
    p.add_argument("--validate-steps", type=int, default=None,
                   help="with --validate: training steps of each brief run (default: about 2 s of its predicted "
                        "steps, at least 30; the first, while the heap settles, are not timed)")
    p.add_argument("--out", required=True, help="directory for plan.json and plan.png")


def request_from(args: argparse.Namespace):
    from scaletrain.plan.space import ONLY, Request, strategies
    from scaletrain.study.grid import parse_axis
    from scaletrain.units import size_flag

    nodes = 1 if args.nodes is None else args.nodes
    for flag, value, least in (("--nodes", nodes, 1), ("--nproc", args.nproc, 1), ("--epochs", args.epochs, 1),
                               ("--top", args.top, 1)):
        if value < least:
            raise UserError(f"{flag} {value}: give at least {least}")
    if args.global_batch is not None and args.batch_size is not None:
        raise UserError(f"--global-batch {args.global_batch} and --batch-size {args.batch_size} both set the batch: "
                        "give one of them")
    if args.global_batch is not None and args.global_batch < 1:
        raise UserError(f"--global-batch {args.global_batch}: give the batch of all trainers together, at least 1")
    batches: tuple[int, ...] = ()
    if args.batch_size is not None:
        try:
            batches = tuple(sorted({int(t) for t in args.batch_size.split(",")}))
        except ValueError:
            raise UserError(f"--batch-size {args.batch_size!r}: give a comma list of whole numbers, e.g. 32,64")
        if min(batches) < 1:
            raise UserError(f"--batch-size {args.batch_size}: every batch must be at least 1")
    budget = size_flag(args.memory_per_device, "--memory-per-device") if args.memory_per_device else None
    only = {axis: tuple(parse_axis(axis, getattr(args, axis))) for axis in ONLY if getattr(args, axis, None)}
    strategies(only.get("strategy", ()))  # a strategy named that a plan does not search: refused before anything
    return Request(model=args.model, nodes=nodes, nproc=args.nproc, image_size=args.image_size,
                   dataset=args.dataset, synthetic_samples=args.synthetic_samples, epochs=args.epochs,
                   batch_sizes=batches, global_batch=args.global_batch, memory_budget=budget, top=args.top,
                   only=only, priced_top=priced_top(args))


def priced_top(args: argparse.Namespace) -> int | None:
    """How many of the fastest candidates the search must price exactly: those shown and those --validate runs;
    None (every one) with --no-prune or --validate all."""
    if not getattr(args, "prune", True) or getattr(args, "validate", None) == "all":
        return None
    try:
        k = int(args.validate) if getattr(args, "validate", None) is not None else 0
    except ValueError:
        k = 0  # (validate_request says what is wrong with it)
    return max(args.top, k)


def on_testbed(args: argparse.Namespace, req):
    """--testbed: the request's nodes, link and cores from the testbed that is up (predict's testbed_basis)."""
    import dataclasses

    from scaletrain.predict.cli import testbed_basis

    if not args.testbed:
        raise UserError(f"--cores-per-host {args.cores_per_host} gives each testbed host its cores: add --testbed, "
                        "or drop --cores-per-host")
    given = [f for f, v in (("--hardware", args.hardware), ("--link", args.link), ("--latency", args.latency),
                            ("--network", args.network)) if v is not None]
    if given:
        raise UserError(f"--testbed takes the hosts' link and cores from the testbed that is up, and {given[0]} "
                        f"gives them too: drop {given[0]}")
    if args.cores_per_host is not None and args.cores_per_host < 1:
        raise UserError(f"--cores-per-host {args.cores_per_host}: give at least 1")
    hosts, per_host = testbed_basis(args, [args.nodes] if args.nodes else None, "--nodes")
    return dataclasses.replace(req, nodes=hosts, testbed=True, cores_per_host=per_host,
                               shared_cores=args.shared_cores)


def validate_request(args: argparse.Namespace, req) -> int | str | None:
    """--validate's K (0: all; "auto": the plan's uncertain count, known after the search), checked before the
    search: None without --validate."""
    from scaletrain.plan.measure import check

    if args.validate is None:
        for flag, value in (("--repeats", args.repeats), ("--validate-steps", args.validate_steps)):
            if value is not None:
                raise UserError(f"{flag} {value} says how --validate measures: add --validate K")
        return None
    if args.validate in ("all", "auto"):
        k = 0 if args.validate == "all" else "auto"
    else:
        try:
            k = int(args.validate)
        except ValueError:
            raise UserError(f"--validate {args.validate!r}: give how many of the top candidates to run, e.g. 3, "
                            "or auto, or all") from None
        if k < 1:
            raise UserError(f"--validate {k}: give how many of the top candidates to run, at least 1 (or all)")
    for flag, value in (("--repeats", args.repeats), ("--validate-steps", args.validate_steps)):
        if value is not None and value < 1:
            raise UserError(f"{flag} {value}: give at least 1")
    check({"basis": "datasheet" if args.hardware else "calibration",
           "request": {"nodes": req.nodes, "testbed": req.testbed}})
    return k


def run_validation(plan: dict, out: Path, k: int, args: argparse.Namespace, console) -> None:
    """--validate: measure the top candidates, add the comparison to plan.json and the report, print it."""
    from scaletrain.console.phase import phase
    from scaletrain.grid import rich_table
    from scaletrain.plan.agreement import agreement_line, compare
    from scaletrain.plan.measure import REPEATS, measure, steps_said
    from scaletrain.plan.present import describe, validation_grid, write_report
    from scaletrain.rundir import PLAN, write_json_atomic

    top = plan["ranked"][:k or len(plan["ranked"])]
    repeats, steps = args.repeats or REPEATS, args.validate_steps
    console.print(f"validating the top {len(top)}: {len(top) * repeats} brief runs of {steps_said(steps)} "
                  f"({repeats} rounds) in {out / 'validation'}")
    with phase("plan --validate: running the candidates", eta=True) as update:
        runs, failed = measure(out, plan, len(top), repeats, steps, progress=update)
    plan["validation"] = {**compare(top, runs), "repeats": repeats, "steps": steps, "failed": failed}
    write_json_atomic(out / PLAN, plan)
    write_report(plan, out)
    console.print(rich_table(validation_grid(plan)))
    for line in failed:
        console.print(f"failed: {line}", markup=False)
    names = {c["id"]: describe(c) for c in top}
    console.print(agreement_line(plan["validation"], names.get), markup=False)


def run_plan(args: argparse.Namespace) -> int:
    from scaletrain.console.phase import phase
    from scaletrain.console.width import output_console
    from scaletrain.grid import rich_table
    from scaletrain.plan.present import skipped_grid, top_grid, write_report
    from scaletrain.plan.search import search
    from scaletrain.predict.cli import load_basis, network_from, shapes_mode
    from scaletrain.predict.shapes import for_calibration
    from scaletrain.rundir import PLAN, check_out, write_json_atomic

    req = request_from(args)
    if args.testbed or args.cores_per_host is not None:
        req = on_testbed(args, req)
    validate_k = validate_request(args, req)
    check_out(args.out, "plan")  # before a calibration is made or read
    if args.hardware and args.calibration:
        raise UserError("--hardware and --calibration: a plan rests on one basis, a data sheet or a calibration of "
                        "a machine: give one of them")
    if args.loader and not args.hardware:
        raise UserError(f"--loader {args.loader} gives a data-sheet plan its input pipeline's rate: add --hardware")
    try:
        time_ops = shapes_mode(args.time_ops)
    except argparse.ArgumentTypeError as e:
        raise UserError(str(e)) from None
    cal, hw, basis = load_basis(args)
    network = network_from(args, cal, hw)
    shapes = for_calibration(cal if hw is None else None, time_ops)
    with phase("plan: pricing every candidate", eta=False) as update:
        plan = search(req, cal, network, hw, basis, shapes=shapes, progress=update)
    if req.image_size is None and plan["chosen"]:  # no side fixed: the largest each layout trains within budget
        from scaletrain.plan.sides import largest_sides

        with phase("plan: the largest image side of each layout (meta-device walks)", eta=False) as update:
            plan["largest_sides"] = largest_sides(plan, hw.kind if hw is not None else cal["device"]["type"],
                                                  progress=update)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / PLAN, plan)
    report = write_report(plan, out)
    console = output_console(highlight=False)
    console.print(rich_table(top_grid(plan)))
    console.print(rich_table(skipped_grid(plan)))
    if plan.get("largest_sides"):
        from scaletrain.plan.sides import sides_grid

        console.print(rich_table(sides_grid(plan)))
    for line in plan["caveats"] + plan["notes"]:
        console.print(f"note: {line}")
    console.print(f"{plan['candidates']} candidates, {plan['priced']} priced in {plan['search_s']:.1f} s; "
                  f"chosen: {plan['chosen'] or ('none fits the memory budget' if plan['priced'] else 'none')}")
    if validate_k is not None and plan["chosen"]:
        run_validation(plan, out, plan["uncertain"]["count"] if validate_k == "auto" else validate_k, args, console)
    console.print(f"{PLAN}: {out / PLAN}\nreport: {report} (plan.png beside it)")
    if not plan["chosen"]:
        why = (f"none of the {plan['priced']} priced candidates fits {args.memory_per_device or 'the device'}: give "
               "more --memory-per-device, smaller --batch-size values, or more --nproc / --nodes" if plan["priced"] else
               f"no candidate could be priced ({plan['skipped_why'][0]['reason']})")
        raise UserError(f"plan: {why}; plan.json lists every candidate")
    return 0


COMMANDS = (
    Command("plan", "choose the configuration to run: every one the model prices, ranked by time to train",
            add_plan_args, run_plan),
)
