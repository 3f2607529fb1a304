"""`scaletrain predict`: the same flags and comma-list axes as `study`, a network and a calibration (or a
hardware profile); writes prediction.json and a report, in seconds (docs/predict.md)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from scaletrain.errors import UserError

PREDICT_AXES_EXTRA = ("nnodes",)
RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


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
    p.add_argument("--link", help="link rate between nodes, e.g. 100mbit, 10gbit (default: the calibration's "
                                  "local rate, or the hardware profile's)")
    p.add_argument("--latency", default=None, help="one-way latency between nodes, e.g. 1ms, 50us (default 0)")
    p.add_argument("--network", help="commbench.json measured between nodes: its alpha-beta fits replace "
                                     "--link/--latency")
    p.add_argument("--global-batch", type=int, default=None,
                   help="strong scaling: keep this global batch, each trainer gets global / trainers")
    p.add_argument("--probe", choices=("auto", "on", "off"), default="off",
                   help="time a one-second speed probe and scale the calibrated compute by how much faster or "
                        "slower this machine runs now than when calibrated (auto: on the calibrated host only; "
                        "default off: docs/predict.md says why)")
    p.add_argument("--shared-cores", type=int, default=None,
                   help="the nodes are testbed hosts sharing this many cores of one machine")
    add_config_flags(p, lists=tuple(AXES) + PREDICT_AXES_EXTRA, skip=tuple(STUDY_OWNED))


def parse_rate(text: str) -> float:
    """`100mbit` -> bytes per second."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]+)\s*", text or "")
    if not m or m.group(2).lower() not in RATE_UNITS:
        raise UserError(f"--link {text!r}: give a rate such as 100mbit, 1gbit or 25gbit")
    value = float(m.group(1)) * RATE_UNITS[m.group(2).lower()] / 8
    if value <= 0:
        raise UserError(f"--link {text!r} must be positive")
    return value


def parse_latency(text: str | None) -> float:
    if not text:
        return 0.0
    m = re.fullmatch(r"\s*([0-9.]+)\s*(s|ms|us)\s*", text)
    if not m:
        raise UserError(f"--latency {text!r}: give a time such as 1ms, 200us or 0.5ms")
    return float(m.group(1)) * TIME_UNITS[m.group(2)]


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
            path = path / "commbench.json"
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
    """(calibration dict, hardware or None, one line on what the prediction rests on)."""
    from scaletrain.predict import calibration

    hw = None
    if args.hardware:
        from scaletrain.perf.hardware import describe, load_hardware

        hw = load_hardware(args.hardware)
    if args.calibration:
        cal = calibration.load(args.calibration)
        where = args.calibration
    else:
        path = calibration.cache_path()
        if not path.is_file():
            from scaletrain.predict.calibrate_cli import make_calibration

            print(f"no calibration of this machine yet: measuring one now with --quick ({path}); "
                  "`scaletrain calibrate` makes a full one")
            make_calibration(path, quick=True)
        cal = calibration.load(path)
        where = str(path)
    if hw is not None:
        return cal, hw, describe(hw)
    d = cal["device"]
    basis = (f"calibration {where}: {d['name']}, {d['cores']} cores, made {cal['created']}"
             + (" (--quick)" if cal.get("quick") else ""))
    return cal, None, basis


def run_predict(args: argparse.Namespace) -> int:
    from rich.console import Console

    from scaletrain.predict.report import print_prediction, write_prediction_report
    from scaletrain.predict.scaling import predict_grid
    from scaletrain.rundir import write_json_atomic

    spec = spec_from_args(args)
    cal, hw, basis = load_basis(args)
    network = network_from(args, cal, hw)
    prediction = predict_grid(spec, cal, network, hw, basis, global_batch=args.global_batch,
                              shared_cores=args.shared_cores, probe=speed_probe(cal, hw, args.probe))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "prediction.json", prediction)
    report = write_prediction_report(prediction, out)
    console = Console(highlight=False)
    print_prediction(prediction, console)
    console.print(f"prediction.json: {out / 'prediction.json'}\nreport: {report}")
    return 0


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
    from scaletrain.config import config_fields
    from scaletrain.study.grid import AXES, STUDY_OWNED, StudySpec, load_spec_file, parse_axis

    names = tuple(AXES) + PREDICT_AXES_EXTRA
    file_spec = load_spec_file(args.config) if args.config else {"axes": {}, "train": {}}
    given = vars(args)
    axes = {**file_spec["axes"], **{n: (_nodes(given[n]) if n == "nnodes" else parse_axis(n, given[n]))
                                     for n in names if n in given}}
    for n in names:
        if n in file_spec["train"] and n not in axes:
            axes[n] = [file_spec["train"].pop(n)]
    axes.setdefault("nproc", [1])
    for n in ("nproc", "nnodes"):
        for v in axes.get(n, []):
            if v < 1:
                raise UserError(f"--{n} {v}: every value must be at least 1")
    train = {**file_spec["train"], **{f.name: given[f.name] for f in config_fields()
                                        if f.name in given and f.name not in names and f.name not in STUDY_OWNED}}
    if any(v > 1 for v in axes.get("nnodes", [])):  # where the nodes would meet does not change a prediction
        train.setdefault("master_port", 29500)
        train.setdefault("master_addr", "node0")
    return StudySpec(axes={n: axes[n] for n in names if n in axes}, train=train, repeats=1)
