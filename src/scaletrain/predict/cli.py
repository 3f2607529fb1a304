"""`scaletrain predict`: the same flags and comma-list axes as `study`, a network and a calibration (or a
hardware profile); writes prediction.json and a report, in seconds (docs/predict.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scaletrain.command import Command
from scaletrain.errors import UserError
from scaletrain.rundir import COMMBENCH
from scaletrain.units import parse_latency, parse_rate  # noqa: F401 (predict's own flags; re-exported)

if TYPE_CHECKING:
    from scaletrain.study.grid import StudySpec

PREDICT_AXES_EXTRA = ("nnodes",)


def add_predict_args(p: argparse.ArgumentParser) -> None:
    from scaletrain.config.flags import add_config_flags
    from scaletrain.study.grid import AXES, STUDY_OWNED

    p.description = ("Predict every combination of the axis values (comma lists, as `study`): step phases, "
                     "epoch time, speedup, efficiency, peak memory and the limit, from a calibration.")
    p.epilog = "example: scaletrain predict --model resnet20 --nproc 1,2,4,8 --nnodes 1,2 --link 10gbit --out runs/pred"
    p.add_argument("--out", required=True, help="directory for prediction.json and report.html")
    p.add_argument("--config", help="study TOML with [axes] and [train] (as `scaletrain study --config`)")
    p.add_argument("--calibration", help="calibration file (default: this machine's, made with --quick the "
                                         "first time)")
    p.add_argument("--hardware", help="a hardware profile (TOML, or a shipped name such as dgx-a100-80gb) "
                                      "for a machine you do not have: a roofline on its data sheet")
    p.add_argument("--loader", help="with --hardware: a loader-rate file (`scaletrain calibrate --only loader` run "
                                    "on a node of the cluster): one core's input-pipeline rate for the run's data")
    p.add_argument("--link", help="link rate between nodes in bits per second, as `testbed --rate`: 100mbit, "
                                  "10gbit or 10Gbit/s (default: the calibration's local rate, or the hardware "
                                  "profile's)")
    p.add_argument("--latency", default=None, help="one-way latency between nodes, with --link: e.g. 1ms, 50us "
                                                   "(default 0)")
    p.add_argument("--network", help="commbench.json measured between nodes: its alpha-beta fits replace "
                                     "--link/--latency")
    p.add_argument("--global-batch", type=int, default=None,
                   help="strong scaling: keep this global batch, each trainer gets global / trainers")
    p.add_argument("--probe", choices=("auto", "on", "off"), default="off",
                   help="time a one-second speed probe and scale the calibrated compute by how much faster or "
                        "slower this machine runs now than when calibrated (auto: on the calibrated host only; "
                        "default off: docs/predict.md says why)")
    p.add_argument("--time-ops", type=shapes_mode, default="auto", metavar="auto|off|SECONDS",
                   help="time the model's op shapes the calibration's grid lacks, here, when the calibration was made "
                        "on this machine (kept in the cache for the next prediction): auto within 30 s, or within "
                        "SECONDS; off: price them by the calibrated laws alone (docs/predict.md)")
    p.add_argument("--shared-cores", type=int, default=None,
                   help="the nodes are testbed hosts sharing this many cores of one machine")
    p.add_argument("--testbed", action="store_true",
                   help="predict the testbed that is up (`scaletrain testbed up`): its hosts as the nodes, its "
                        "link rate and delay, and each host's cores as `testbed run` shares them")
    p.add_argument("--cores-per-host", type=int, default=None, metavar="N",
                   help="with --testbed: the cores `testbed run --cores-per-host N` gives each host (default as "
                        "testbed run: the machine's cores // hosts)")
    add_config_flags(p, lists=tuple(AXES) + PREDICT_AXES_EXTRA, skip=tuple(STUDY_OWNED))
    side = next(a for a in p._actions if a.dest == "image_size")  # predict's own value: `max`
    side.type = side_or_max
    side.help = (side.help or "") + " `max` (with --memory-per-device): the largest side each layout of these ranks " \
                                    "trains within the budget, by the memory model (no calibration)"


def side_or_max(text: str) -> int | str:
    if text == "max":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid --image-size {text!r}: give pixels (e.g. 224) or max") from None


def check_request(args: argparse.Namespace, spec: StudySpec) -> None:
    """What predict's own flags say, alone and together: refused before a calibration is read or made."""
    if args.global_batch is not None:
        if args.global_batch < 1:
            raise UserError(f"--global-batch {args.global_batch}: give the batch of all trainers together, "
                            "at least 1")
        if "batch_size" in spec.axes or "batch_size" in spec.train:
            raise UserError(f"--global-batch {args.global_batch} sets each trainer's batch (global / trainers) and "
                            "--batch-size (or batch_size in the --config file) sets it too: give one of them")
    if args.shared_cores is not None and args.shared_cores < 1:
        raise UserError(f"--shared-cores {args.shared_cores}: give the cores the testbed hosts share, at least 1 "
                        "(or leave it out)")
    if args.network and (args.link or args.latency):
        raise UserError("--network gives the link between nodes as commbench measured it, --link/--latency declare "
                        "one: give one of them")
    if args.latency and not args.link:
        raise UserError(f"--latency {args.latency} delays the link between nodes that --link declares: give --link "
                        "too, or drop --latency")
    if args.link:
        parse_rate(args.link)
    parse_latency(args.latency)
    if getattr(args, "cores_per_host", None) is not None and not getattr(args, "testbed", False):
        raise UserError(f"--cores-per-host {args.cores_per_host} gives each testbed host its cores: add --testbed, "
                        "or drop --cores-per-host")
    if getattr(args, "testbed", False):
        given = [f for f, v in (("--hardware", args.hardware), ("--shared-cores", args.shared_cores),
                                ("--link", args.link), ("--latency", args.latency), ("--network", args.network))
                 if v is not None]
        if given:
            raise UserError(f"--testbed takes the hosts' link and cores from the testbed that is up, and {given[0]} "
                            f"gives them too: drop {given[0]}")
    if getattr(args, "loader", None) and not args.hardware:
        raise UserError(f"--loader {args.loader} gives a data-sheet prediction its input pipeline's rate; a "
                        "calibration measures its own: add --hardware, or drop --loader")
    if args.hardware:
        if args.calibration:
            raise UserError("--hardware and --calibration: a prediction rests on one basis, a data sheet or a "
                            "calibration of a machine: give one of them")
        if args.probe == "on":
            raise UserError("--probe on corrects a calibration by this machine's speed now; --hardware predicts "
                            "a machine from its data sheet: drop --probe on")
        if args.shared_cores is not None:
            raise UserError("--shared-cores describes testbed hosts sharing this machine's cores, which a "
                            "calibration measures; --hardware is a machine from its data sheet: drop one of them")


def hardware_profile(name: str):
    """--hardware's profile; a training or study config given in its place is named as one."""
    from scaletrain.perf.hardware import load_hardware, shipped_profiles

    try:
        return load_hardware(name)
    except UserError:
        if not _is_run_config(name):
            raise
    raise UserError(f"--hardware {name} is a training config, not a hardware profile: give --hardware a data sheet "
                    f"({', '.join(shipped_profiles())}, or a TOML of docs/perf.md), and the run's settings as flags "
                    "or under [train] of a study file (--config)") from None


def _is_run_config(path: str) -> bool:
    """Whether `path` is a TOML of training settings (`model = ...`) or a study file ([axes], [train])."""
    from scaletrain.config import field_names, read_toml

    try:
        data = read_toml(path)
    except (OSError, UserError):
        return False
    keys = {k.replace("-", "_") for k in data}
    return bool(keys) and (keys <= set(field_names()) or bool(keys & {"axes", "train"}) and "format" not in keys)


def network_from(args: argparse.Namespace, cal: dict[str, Any] | None, hw) -> dict[str, Any]:
    intra = dict((cal or {}).get("network", {}).get("fits") or {})
    source = "calibration (local commbench)" if intra else "none"
    if hw is not None:
        from scaletrain.perf.hardware import link

        a, b = link(hw, inter_node=False)
        intra = {k: {"alpha_s": a, "beta_s_per_byte": b} for k in ("allreduce", "ring", "ps")}
        ai, bi = link(hw, inter_node=True)
        inter = {"alpha_s": ai, "beta_s_per_byte": bi}
        source = f"hardware profile {hw.name}"
    else:
        inter = None
    if args.network:
        path = Path(args.network)
        if path.is_dir():
            path = path / COMMBENCH
        if not path.is_file():
            raise UserError(f"--network {args.network}: no commbench.json there: run scaletrain commbench across "
                            "the nodes first")
        try:
            fits = json.loads(path.read_text())["fits"]
            f = fits.get("allreduce") or next(iter(fits.values()))
            inter = {"alpha_s": float(f["alpha_s"]), "beta_s_per_byte": float(f["beta_s_per_byte"])}
        except (KeyError, ValueError, TypeError, StopIteration, json.JSONDecodeError):
            raise UserError(f"--network {path} is not a commbench.json (no fits): pass the file commbench wrote") from None
        source = f"commbench {path}"
    elif args.link:
        rate = parse_rate(args.link)
        inter = {"alpha_s": parse_latency(args.latency), "beta_s_per_byte": 1.0 / rate}
        source = f"--link {args.link}" + (f" --latency {args.latency}" if args.latency else "")
    if not intra:
        raise UserError("the calibration has no network measurement (commbench failed when it ran): calibrate again")
    return {"intra": intra, "inter": inter, "source": source}


def load_basis(args: argparse.Namespace):
    """(calibration dict or None, hardware or None, one line on what the prediction rests on): a data sheet
    (--hardware) reads and makes no calibration of this machine; otherwise --calibration, or this machine's,
    made with --quick the first time."""
    from scaletrain.predict import calibration

    if args.hardware:
        from scaletrain.perf.hardware import describe

        hw = hardware_profile(args.hardware)
        if getattr(args, "loader", None):
            from scaletrain.predict import loader_rate

            rate = loader_rate.load(args.loader)
            hw = loader_rate.applied(hw, rate)
            return None, hw, (f"{describe(hw)}; input pipeline: {rate['samples_per_s_per_core']:.1f} samples/s per "
                              f"core, measured on {rate['host']} ({rate['dataset']}, {rate['image_size']} px)")
        return None, hw, describe(hw)
    if args.calibration:
        cal = calibration.load(args.calibration)
        where = args.calibration
    else:
        path = calibration.cache_path()
        if not path.is_file():
            from scaletrain.predict.calibrate_cli import make_calibration

            print(calibration.quick_notice(path))
            make_calibration(path, quick=True)
        cal = calibration.load(path)
        where = str(path)
    d = cal["device"]
    basis = (f"calibration {where}: {d['name']}, {d['cores']} cores, made {cal['created']}"
             + (" (--quick)" if cal.get("quick") else ""))
    return cal, None, basis


def shapes_mode(text: str) -> str | float:
    from scaletrain.predict.shapes import mode_flag

    try:
        return mode_flag(text)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def run_predict(args: argparse.Namespace, spec: StudySpec | None = None) -> int:
    """`spec`: the grid already made from settings (scaletrain.api); else from the flags in `args`."""
    from scaletrain.console.phase import phase
    from scaletrain.console.width import output_console
    from scaletrain.predict.report import print_prediction, write_prediction_report
    from scaletrain.predict.scaling import check_grid, predict_grid
    from scaletrain.predict.shapes import for_calibration
    from scaletrain.rundir import PREDICTION, check_out, write_json_atomic

    if spec is None and str(getattr(args, "image_size", None)) == "max":
        return run_largest(args)
    spec = spec if spec is not None else spec_from_args(args)
    check_request(args, spec)
    cores = None
    if getattr(args, "testbed", False):
        spec, cores = testbed_request(args, spec)
    check_out(args.out, "prediction")  # before a calibration is made or read
    # every point against the data, the hardware and this machine's memory, before a calibration or a trace
    check_grid(spec, hardware_profile(args.hardware) if args.hardware else None, args.global_batch)
    cal, hw, basis = load_basis(args)
    network = network_from(args, cal, hw)
    probe = speed_probe(cal, hw, args.probe)
    shapes = for_calibration(cal if hw is None else None, getattr(args, "time_ops", "auto"))
    # each model is traced once per batch size, a real forward pass: minutes for large images
    with phase("predict: tracing the model and pricing each point", eta=False) as update:
        prediction = predict_grid(spec, cal, network, hw, basis, global_batch=args.global_batch,
                                  shared_cores=args.shared_cores, cores=cores, probe=probe, progress=update,
                                  shapes=shapes)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / PREDICTION, prediction)
    report = write_prediction_report(prediction, out)
    console = output_console(highlight=False)
    print_prediction(prediction, console)
    console.print(f"{PREDICTION}: {out / PREDICTION}\nreport: {report}")
    return 0


def run_largest(args: argparse.Namespace) -> int:
    """`--image-size max`: the largest side each layout of these ranks trains within --memory-per-device, by the
    memory model alone (no calibration: predict/largest.py); writes largest-side.json."""
    from scaletrain.console.phase import phase
    from scaletrain.console.width import output_console
    from scaletrain.grid import rich_table
    from scaletrain.models import build_model
    from scaletrain.predict.largest import largest_sides, largest_table
    from scaletrain.predict.points import data_facts
    from scaletrain.rundir import check_out, write_json_atomic
    from scaletrain.study.grid import points
    from scaletrain.units import size_flag

    if not getattr(args, "memory_per_device", None):
        raise UserError("--image-size max asks for the largest side within a memory budget: give "
                        "--memory-per-device (e.g. 2GiB)")
    budget = size_flag(args.memory_per_device, "--memory-per-device")
    args.image_size = None
    grid = points(spec_from_args(args))
    if len(grid) != 1:
        raise UserError("--image-size max plans one configuration of ranks: give single values, not comma lists")
    cfg = grid[0].config
    check_out(args.out, "prediction")
    device_type = hardware_profile(args.hardware).kind if args.hardware else "cpu"
    facts = data_facts(cfg.data.dataset, None, cfg.data.synthetic_samples, cfg.data.synthetic_classes)

    def build(c, side: int):
        return lambda: build_model(c.model.name, num_classes=facts["classes"], in_channels=facts["channels"],
                                   image_size=side, stem=c.model.stem, width=c.model.width)

    with phase("predict: the largest side of each layout (meta-device walks)", eta=False) as update:
        rows = largest_sides(cfg, build, facts["channels"], budget, device_type, progress=update)
    what = f"{cfg.model.name}, batch {cfg.optim.batch_size} per replica, {cfg.layout.world} ranks, {device_type}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "largest-side.json", {"budget_bytes": budget, "model": cfg.model.name,
                                                  "batch_size": cfg.optim.batch_size, "ranks": cfg.layout.world,
                                                  "device": device_type, "layouts": [r.to_dict() for r in rows]})
    console = output_console(highlight=False)
    console.print(rich_table(largest_table(rows, args.memory_per_device, what)))
    console.print(f"largest-side.json: {out / 'largest-side.json'}")
    return 0


def testbed_request(args: argparse.Namespace, spec: StudySpec) -> tuple[StudySpec, int]:
    """The testbed that is up as predict's request (testbed_basis), its hosts the nodes (an --nnodes given must
    be theirs). Returns the spec and the cores per host."""
    import dataclasses

    hosts, per_host = testbed_basis(args, spec.axes.get("nnodes"), "--nnodes")
    axes = {**spec.axes, "nnodes": [hosts]}
    train = {"master_port": 29500, "master_addr": "node0", **spec.train}  # where hosts meet changes no prediction
    return dataclasses.replace(spec, axes=axes, train=train), per_host


def testbed_basis(args: argparse.Namespace, nodes: list[int] | None, flag: str) -> tuple[int, int]:
    """The testbed that is up: its rate and delay the link between nodes (a message crosses two shaped
    interfaces: twice the delay one way), and the cores `testbed run` gives each host; hosts that do not fit the
    machine's CPUs side by side share them (--shared-cores). Sets args.link/latency/shared_cores; returns the
    hosts and the cores per host. `nodes`: the nodes the request gave (with `flag`), which must be its hosts."""
    import os

    from scaletrain.testbed.cores import share_cores
    from scaletrain.testbed.net import current

    tb = current()
    if tb is None:
        raise UserError("--testbed: no testbed is up: build it with `scaletrain testbed up --hosts H --rate R`, or "
                        "give the nodes with --link and --shared-cores")
    if nodes is not None and list(nodes) != [tb.hosts]:
        raise UserError(f"{flag} {','.join(map(str, nodes))}: the testbed that is up has {tb.hosts} hosts: drop "
                        f"{flag} (--testbed takes its hosts)")
    share = share_cores(sorted(os.sched_getaffinity(0)), tb.hosts, args.cores_per_host)
    args.link = tb.rate
    delay = parse_latency(tb.delay)
    args.latency = f"{2 * delay * 1e6:g}us" if delay else None
    args.shared_cores = len(share.machine_cpus) if share.cpus is None else None
    if args.shared_cores is None:  # each host pinned to its own CPUs: no host competes with another
        print(share.describe())
    else:
        print(f"{share.describe()}: predicted as hosts sharing {args.shared_cores} cores")
    return tb.hosts, share.per_host


def speed_probe(cal: dict[str, Any], hw, mode: str) -> dict[str, Any] | None:
    """The speed probe's result for a calibration-based prediction (None with a hardware profile)."""
    if hw is not None:
        return None
    from scaletrain.predict.probe import speed_now

    return speed_now(cal, mode)


def _nodes(text: str) -> list[int]:
    """--nnodes 1,2,4 (checked here: a single train run's check wants a rendezvous that predict never needs)."""
    try:
        values = [int(t) for t in text.split(",")]
    except ValueError:
        raise UserError(f"--nnodes {text!r}: give a comma list of integers such as 1,2,4") from None
    if len(set(values)) != len(values):
        raise UserError(f"--nnodes {text}: give each value once")
    return values


def spec_from_args(args: argparse.Namespace):
    from scaletrain.study.grid import AXES, given_settings, parse_axis

    names = tuple(AXES) + PREDICT_AXES_EXTRA
    given = vars(args)
    axes = {n: (_nodes(given[n]) if n == "nnodes" else parse_axis(n, given[n])) for n in names if n in given}
    train = given_settings(given, names)
    return predict_spec(args.config, axes, train)


def predict_spec(config: str | None, axes: dict[str, list[Any]], train: dict[str, Any]) -> StudySpec:
    """The grid `predict` prices: the study file's axes and settings (`config`, may be None) overridden by
    `axes` (lists of typed values, checked) and `train` (fixed settings); nnodes is an axis here too."""
    from scaletrain.study.grid import AXES, StudySpec, load_spec_file

    names = tuple(AXES) + PREDICT_AXES_EXTRA
    file_spec = load_spec_file(config) if config else {"axes": {}, "train": {}}
    axes = {**file_spec["axes"], **axes}
    for n in names:
        if n in file_spec["train"] and n not in axes:
            axes[n] = [file_spec["train"].pop(n)]
    axes.setdefault("nproc", [1])
    for n in ("nproc", "nnodes"):
        for v in axes.get(n, []):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UserError(f"--{n} {v!r}: every value must be a whole number of at least 1")
    train = {**file_spec["train"], **train}
    if any(v > 1 for v in axes.get("nnodes", [])):  # where the nodes would meet does not change a prediction
        train.setdefault("master_port", 29500)
        train.setdefault("master_addr", "node0")
    return StudySpec(axes={n: axes[n] for n in names if n in axes}, train=train, repeats=1)


COMMANDS = (
    Command("predict", "predict step time, scaling and memory before running",
            add_predict_args, run_predict),
)
