"""`scaletrain graph`: a model's graph at the layer, block or module level as graph.json, DOT and a picture,
each node with its output shape, parameters, FLOPs and predicted time, cut points marked (docs/graph.md)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from scaletrain import fmt
from scaletrain.command import Command
from scaletrain.config import PRECISIONS
from scaletrain.errors import UserError
from scaletrain.grid import Grid, rich_table

MAX_ROWS = 60  # the terminal table's rows; graph.json has every node


def add_graph_args(p: argparse.ArgumentParser) -> None:
    p.description = ("The model's graph from torch.fx at one level (layer, block or module): graph.json, graph.dot, "
                     "graph.png and graph.svg, each node with its output shape, parameters, FLOPs and predicted "
                     "time; the cut points, where a pipeline may cut, marked.")
    p.epilog = "example: scaletrain graph --model resnet56 --out runs/graph"
    p.add_argument("--model", required=True, help="a built-in model (`scaletrain models`) or package.module:factory")
    p.add_argument("--out", required=True, help="folder for graph.json, graph.dot, graph.png, graph.svg")
    p.add_argument("--level", default="block", help="layer, block (default: single-entry/single-exit regions "
                                                    "such as a residual block) or module (top-level children)")
    p.add_argument("--batch-size", type=int, default=32, help="batch the shapes, FLOPs and times are given at")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--in-channels", type=int, default=3)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--calibration", help="calibration file for predicted times (default: this machine's, if "
                                         "`scaletrain calibrate` has made one; else no times)")
    p.add_argument("--precision", default="fp32", help="precision the times are predicted at: fp32, bf16, fp16")


def run_graph(args: argparse.Namespace) -> int:
    from scaletrain.console.phase import phase
    from scaletrain.console.width import output_console
    from scaletrain.graph.build import document, trace
    from scaletrain.graph.dot import to_dot
    from scaletrain.graph.picture import draw
    from scaletrain.predict.node_times import block_times, node_times
    from scaletrain.models import build_model
    from scaletrain.perf.blocks import LEVELS, group
    from scaletrain.perf.footprint import check_forward_fits
    from scaletrain.predict.calibration import unsteady
    from scaletrain.rundir import GRAPH, check_out, replace_atomic, write_json_atomic

    check_out(args.out, "graph")
    if args.level not in LEVELS:
        raise UserError(f"--level {args.level!r} is not a level: use one of {', '.join(LEVELS)}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1 (got {args.batch_size})")
    if min(args.image_size, args.in_channels, args.num_classes) < 1:
        raise UserError("--image-size, --in-channels and --num-classes must be at least 1")
    if args.precision not in PRECISIONS:
        raise UserError(f"--precision {args.precision!r}: use one of {', '.join(PRECISIONS)}")
    cal, basis = calibration(args.calibration)
    console = output_console(highlight=False)
    input_shape = (args.in_channels, args.image_size, args.image_size)

    def factory():
        return build_model(args.model, num_classes=args.num_classes, in_channels=args.in_channels,
                           image_size=args.image_size)

    check_forward_fits(factory, args.batch_size, args.in_channels, args.image_size,
                       f"tracing {args.model} at --batch-size {args.batch_size} and --image-size {args.image_size}",
                       "lower --batch-size, --image-size or --num-classes")
    model = factory()
    out = writable(args.out)  # before the slow part, after what needs no folder
    shape = "x".join(str(d) for d in (args.batch_size, *input_shape))
    # a real forward pass of the batch (twice with a calibration): minutes for large images
    with phase(f"tracing {args.model} on a batch of {shape}", console=console):
        traced = trace(model, input_shape, args.batch_size, label=args.model)
        blocks = group(traced.graph, args.level)
        if not blocks:
            raise UserError(f"{args.model} has no layer that computes (its forward returns its input): "
                            "nothing to draw")
        times = None
        if cal is not None:
            per_op = node_times(model, input_shape, args.batch_size, cal, args.precision)
            times = block_times(blocks, traced.graph, per_op)
    doc = document(args.model, args.level, input_shape, traced, blocks, times, basis, args.precision)
    if cal is not None and unsteady(cal):
        doc["notes"].append(unsteady(cal))
    if cal is None:
        doc["notes"].append("no predicted times: no calibration of this machine yet; `scaletrain calibrate` "
                            "makes one (about 10 minutes), or pass --calibration FILE")
    write_json_atomic(out / GRAPH, doc)
    replace_atomic(out / "graph.dot", lambda f: f.write(to_dot(doc)), mode="w")
    pictures = draw(doc, out)
    console.print(rich_table(summary_table(doc)))
    for note in doc["notes"]:
        console.print(f"note: {note}", soft_wrap=True)  # one line each, however narrow the terminal
    if basis:
        console.print(f"times: {basis}", soft_wrap=True)
    for path in (out / GRAPH, out / "graph.dot", *pictures):
        console.print(f"wrote {path}", soft_wrap=True)
    return 0


def writable(path: str) -> Path:
    """`path` as a folder that exists and takes files, or one UserError line."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise UserError(f"cannot write to --out {path} ({type(e).__name__}: {e.strerror or e}): "
                        "pick a folder you can write") from None
    return out


def calibration(path: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """(the calibration, one line on where it comes from), or (None, None) when none was given and this
    machine has none: `graph` never calibrates."""
    from scaletrain.predict import calibration as cal_file

    where = Path(path) if path else cal_file.cache_path()
    if not path and not where.is_file():
        return None, None
    cal = cal_file.load(where)
    d = cal["device"]
    return cal, (f"calibration {where}: {d['name']}, {d['cores']} cores, made {cal.get('created')}"
                 + (" (--quick)" if cal.get("quick") else "") + "; one process, loss and optimizer left out")


def summary_table(doc: dict[str, Any]) -> Grid:
    from scaletrain.graph import labels

    t = doc["totals"]
    cuts = set(doc["cut_points"])
    rows = [[str(n["id"]), n["name"], labels.shape(n["out_shape"]), labels.count(n["params"]),
             labels.count(n["flops"]), fmt.ms_sig(n["forward_s"], unit=False), fmt.ms_sig(n["backward_s"], unit=False),
             "cut" if n["id"] in cuts else ""] for n in doc["nodes"][:MAX_ROWS]]
    if len(doc["nodes"]) > MAX_ROWS:
        rows.append(["", f"... {len(doc['nodes']) - MAX_ROWS} more in graph.json", *[""] * 6])
    total = ["", "total", "", labels.count(t["params"]), labels.count(t["flops"]),
             fmt.ms_sig(t["forward_s"], unit=False), fmt.ms_sig(t["backward_s"], unit=False), ""]
    return Grid(f"{doc['model']}: {t['nodes']} {doc['level']} nodes, {t['edges']} edges, {t['cut_points']} cut "
                f"points, batch {doc['batch_size']}", ["#", "name", "output", "params", "FLOPs", "fwd ms", "bwd ms",
                                                       "cut"], rows, text_columns=(1, 2, 7), foot=[total])


COMMANDS = (
    Command("graph", "the model's graph (layers, blocks, modules) with shapes, FLOPs, "
            "times and cut points",
            add_graph_args, run_graph),
)
