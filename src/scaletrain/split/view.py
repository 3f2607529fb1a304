"""split.json for people: the chosen split stage by stage, then the four splits side by side (no computation)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from scaletrain import fmt
from scaletrain.console.width import output_console
from scaletrain.grid import Grid, rich_table

CAPTION = ("auto: the optimal split; uniform: equal block counts; params: balanced parameter counts "
           "(DeepSpeed's default); time: balanced forward + backward (torchgpipe's balance_by_time)")


def _blocks(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]}..{names[-1]} ({len(names)})"


def stage_table(report: dict[str, Any]) -> Grid:
    chosen = report["chosen"]
    limit = report.get("memory_per_stage")
    title = (f"{report['model']}: {report['stages']} stages, {report['microbatches']} micro-batches of "
             f"{report['micro_batch']} ({report['schedule']})" + (f", at most {fmt.size(limit)} per stage" if limit
                                                                  else ""))
    offloads = any(s["offload"] != "none" for s in chosen["stages"])
    g = Grid(title, ["stage", "blocks", "forward", "backward", "transfer", "time", "memory",
                     *(["host memory"] if offloads else [])], note="* the bottleneck",
             text_columns=(1, 7) if offloads else (1,))
    for i, s in enumerate(chosen["stages"]):
        mark = "*" if i == chosen["bottleneck"] else ""
        row = [f"{i}{mark}", _blocks(s["blocks"]), fmt.duration(s["forward_s"]), fmt.duration(s["backward_s"]),
               fmt.duration(s["transfer_s"]), fmt.duration(s["time_s"]), fmt.size(s["memory_bytes"])]
        if offloads:
            row.append("-" if s["offload"] == "none" else
                       f"{s['offload']} (+{fmt.duration(s['offload_s'])}/micro-batch, "
                       f"+{fmt.duration(s['update_s'])}/step)")
        g.rows.append(row)
    return g


def comparison_table(report: dict[str, Any]) -> Grid:
    g = Grid(f"predicted step of {report['batch_size']} samples, per split",
             ["split", "blocks", "slowest stage", "step", "samples/s", "speedup", "peak memory"], note=CAPTION,
             text_columns=(0, 1))
    limit = report.get("memory_per_stage")
    rows = {"auto": report["chosen"], **report["baselines"]}
    for name, p in rows.items():
        memory = fmt.size(p["peak_memory_bytes"]) + ("" if p["fits"] or not limit else " (over)")
        g.rows.append([name, " | ".join(str(n) for n in p["sizes"]), fmt.duration(p["bottleneck_s"]),
                       fmt.duration(p["step_s"]), fmt.rate(p["samples_per_s"]),
                       fmt.factor(p["speedup_over_uniform"]), memory])
    return g


def print_split(report: dict[str, Any], console: Console | None = None) -> None:
    console = console or output_console(highlight=False)
    console.print(rich_table(stage_table(report)))
    console.print(rich_table(comparison_table(report)))
    for note in report.get("notes", []):
        console.print(f"note: {note}")
