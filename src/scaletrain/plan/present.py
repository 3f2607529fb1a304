"""The plan shown: the top candidates (table), why others were skipped, and the candidates' predicted time
against their memory with the chosen one marked (plan.png)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scaletrain import fmt
from scaletrain.grid import Grid
from scaletrain.plan.measure import steps_said

VARIED = ("strategy", "stages", "batch_size", "workers", "precision", "compress", "checkpoint_activations")


def describe(c: dict[str, Any]) -> str:
    """A candidate in flags: what differs between candidates (the bucket the model chose, where one applies)."""
    a, cfg = c["axes"], c["config"]
    staged = (cfg.get("stages") or 1) > 1
    layout = {"pipeline": f" x{cfg.get('stages')} stages",
              "spatial": f" x{cfg.get('spatial')} tiles" + (f" in {cfg['stages']} stages" if staged else "")}
    words = [a["strategy"] + layout.get(a["strategy"], "")]
    words.append(f"batch {c['config']['batch_size']}")
    words.append(f"{a['workers']} worker{'s' if a['workers'] != 1 else ''}")
    words.append(a["precision"])
    if c["config"].get("compress", "none") != "none":
        words.append(f"compress {c['config']['compress']}")
    if c["config"].get("checkpoint_activations", "none") != "none":
        words.append(f"checkpointing {c['config']['checkpoint_activations']}")
    if c.get("bucket_cap_mb"):
        words.append(f"bucket {c['bucket_cap_mb']:g} MB")
    return ", ".join(words)


def top_grid(plan: dict[str, Any]) -> Grid:
    req = plan["request"]
    top = plan["ranked"][:req["top"]]
    phases = ("data_wait", "forward", "backward", "comm_exposed", "optimizer")
    g = Grid(f"plan: the {len(top)} fastest of {plan['priced']} priced candidates ({req['model']}, {req['nodes']} "
             f"node(s) x {req['nproc']} processes, {req['epochs']} epoch(s))",
             ["#", "configuration", "to train", "step", "samples/s", *phases, "memory", "limit", "lever"],
             text_columns=(1, 10, 11))
    for c in top:
        ph = c["phases_s"]
        g.rows.append([str(c["rank"]), describe(c), fmt.duration(c["time_to_train_s"]),
                       f"{c['step_time_s'] * 1e3:,.1f} ms", f"{c['samples_per_s']:,.0f}",
                       *(f"{ph.get(k, 0.0) * 1e3:,.1f}" for k in phases),
                       fmt.size(c["peak_memory_bytes"]) if c["peak_memory_bytes"] else "?",
                       c["limit"], c["limit_note"] or ""])
    g.note = (f"phases in ms per step; memory per device at the step's peak, within "
              f"{fmt.size(plan['memory_budget_bytes']) if plan['memory_budget_bytes'] else 'no budget'} less "
              f"{plan['memory_margin']:.0%}; chosen: #1")
    return g


def skipped_grid(plan: dict[str, Any]) -> Grid:
    g = Grid(f"not priced: {plan['candidates'] - plan['priced']} candidates, {len(plan['over_budget'])} over the "
             "memory budget",
             ["candidates", "why"], text_columns=(1,))
    for r in plan["skipped_why"]:
        g.rows.append([str(r["candidates"]), r["reason"]])
    if plan.get("pruned"):
        g.rows.append([str(len(plan["pruned"])), f"pruned by the model's bound: {plan['pruned_by']}"])
    if plan["over_budget"]:
        g.rows.append([str(len(plan["over_budget"])), "over the memory budget (with its margin)"])
    for name, why in plan["not_searched"].items():
        g.rows.append(["-", f"{name}: {why}"])
    return g


def validation_grid(plan: dict[str, Any]) -> Grid:
    """plan --validate: each measured candidate, predicted and measured, in measured order."""
    v = plan["validation"]
    names = {c["id"]: describe(c) for c in plan["ranked"]}
    g = Grid(f"validation: the top {len(v['candidates'])} measured on this machine, {v['repeats']} round(s) of "
             f"{steps_said(v.get('steps'))}", ["measured #", "predicted #", "configuration", "to train, predicted",
                                     "measured", "step error", "repeats' spread", "vs chosen, predicted",
                                     "measured (spread)"], text_columns=(2,))
    rows = sorted(v["candidates"], key=lambda r: (r["measured_rank"] is None, r["measured_rank"] or 0))
    for r in rows:
        if not r["runs"]:
            g.rows.append(["-", str(r["predicted_rank"]), names.get(r["id"], r["id"]), "", "failed", "", "", "", ""])
            continue
        ratio = r["ratio_to_chosen"]
        measured = "?" if ratio["measured"] is None else f"{ratio['measured']:.3f} ({_pct(ratio['spread'])})"
        g.rows.append([str(r["measured_rank"]), str(r["predicted_rank"]), names.get(r["id"], r["id"]),
                       fmt.duration(r["predicted_time_to_train_s"]), fmt.duration(r["measured_time_to_train_s"]),
                       _pct(r["errors"]["step_time"], signed=True), _pct(r["measured"]["spread"]),
                       f"{ratio['predicted']:.3f}", measured])
    g.note = ("measured: the median over rounds; step error: (predicted - measured) / measured, the mean of the "
              "repeats, whose spread is (max - min) / mean; vs chosen: time to train over the chosen one's, each "
              "round's drift (the median over its candidates) taken out, its spread the two candidates' median "
              "absolute deviations over rounds together")
    return g


def _pct(x: float | None, signed: bool = False) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


def plot(plan: dict[str, Any], path: Path) -> Path | None:
    """Predicted time to train against memory per device, every priced candidate within the budget; the
    chosen one marked."""
    ranked = [c for c in plan["ranked"] if c["peak_memory_bytes"]]
    if not ranked:
        return None
    from matplotlib.figure import Figure

    from scaletrain.plot import save

    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    by_strategy: dict[str, list[dict[str, Any]]] = {}
    for c in ranked:
        by_strategy.setdefault(c["axes"]["strategy"], []).append(c)
    for name, cs in sorted(by_strategy.items()):
        ax.scatter([c["peak_memory_bytes"] / 2**30 for c in cs], [c["time_to_train_s"] for c in cs], s=14,
                   alpha=0.6, label=name)
    best = ranked[0] if ranked[0]["id"] == plan["chosen"] else None
    if best is not None:
        ax.scatter([best["peak_memory_bytes"] / 2**30], [best["time_to_train_s"]], s=140, facecolors="none",
                   edgecolors="black", linewidths=1.5, label="chosen")
    _measured(ax, plan)
    if plan["memory_budget_bytes"]:
        ax.axvline(plan["memory_budget_bytes"] / 2**30, color="grey", linestyle="--", linewidth=1, label="budget")
    ax.set_yscale("log")
    ax.set_xlabel("memory per device at the step's peak (GiB)")
    ax.set_ylabel(f"predicted time to train {plan['request']['epochs']} epoch(s) (s)")
    ax.set_title(f"plan: {plan['request']['model']}, {plan['priced']} candidates priced"
                 + (", the top measured" if plan.get("validation") else ""))
    ax.legend(fontsize=8)
    return save(fig, path, dpi=110)


def _measured(ax, plan: dict[str, Any]) -> None:
    """plan --validate: each measured candidate's time at its measured peak, joined to its prediction."""
    v = plan.get("validation")
    if not v:
        return
    predicted = {c["id"]: c for c in plan["ranked"]}
    rows = [r for r in v["candidates"] if r["runs"] and predicted[r["id"]]["peak_memory_bytes"]]
    for i, r in enumerate(rows):
        c = predicted[r["id"]]
        x0 = c["peak_memory_bytes"] / 2**30
        x1 = (r["measured"]["peak_memory_bytes"] or c["peak_memory_bytes"]) / 2**30
        ax.plot([x0, x1], [c["time_to_train_s"], r["measured_time_to_train_s"]], color="black", linewidth=0.6,
                alpha=0.5)
        ax.scatter([x1], [r["measured_time_to_train_s"]], marker="x", color="black", s=30,
                   label="measured (plan --validate)" if i == 0 else None)


def read_plan(root: Path) -> dict[str, Any]:
    """ROOT/plan.json, or one line saying what is wrong with it."""
    import json

    from scaletrain.errors import UserError
    from scaletrain.rundir import PLAN

    try:
        plan = json.loads((root / PLAN).read_text())
        if plan.get("kind") != "plan" or not isinstance(plan.get("ranked"), list):
            raise ValueError
    except (OSError, ValueError, AttributeError):
        raise UserError(f"{root / PLAN} is not a plan scaletrain plan wrote (unreadable, or no ranked candidates): "
                        "plan again with the same flags") from None
    return plan


def write_report(plan: dict[str, Any], root: Path) -> Path:
    """ROOT/report.html (and plan.png again) from the plan: the chosen configuration, the top candidates, the
    candidates' time against memory, what was not priced and why."""
    from scaletrain.report.html import Section, page, write_page
    from scaletrain.report.output import check_report_dir, writing

    root = Path(root)
    check_report_dir(root, "report.html", "plots")
    with writing(root / "report.html"):
        picture = plot(plan, root / "plan.png")
        chosen = plan["ranked"][0] if plan["ranked"] else None
        lead = (f"chosen: {describe(chosen)} — {fmt.duration(chosen['time_to_train_s'])} to train "
                f"{plan['request']['epochs']} epoch(s), {fmt.size(chosen['peak_memory_bytes'])} per device"
                if chosen and chosen["peak_memory_bytes"] else "no candidate fits the memory budget")
        figures = [(picture, "predicted time to train against memory per device; the chosen one circled")] \
            if picture else []
        sections = [Section("the configuration to run", lead=lead, grids=[top_grid(plan)], figures=figures,
                            notes=plan["caveats"]),
                    Section("what was not priced", lead=plan["basis_note"], grids=[skipped_grid(plan)],
                            notes=plan["notes"])]
        if plan.get("largest_sides"):
            from scaletrain.plan.sides import sides_grid

            sections.append(Section("the largest image side of each layout", grids=[sides_grid(plan)],
                                    lead="no image size was fixed: the largest square side the chosen configuration, "
                                         "and each layout of its ranks that holds less, trains within the budget"))
        if plan.get("validation"):
            from scaletrain.plan.agreement import agreement_line

            names = {c["id"]: describe(c) for c in plan["ranked"]}
            sections.insert(1, Section("measured on this machine (plan --validate)",
                                       lead=agreement_line(plan["validation"], names.get),
                                       grids=[validation_grid(plan)], notes=plan["validation"]["failed"]))
        req = plan["request"]
        subtitle = (f"{req['model']} on {req['nodes']} node(s) x {req['nproc']} processes: {plan['candidates']} "
                    f"candidates, {plan['priced']} priced in {plan['search_s']:.1f} s")
        return write_page(root / "report.html", page("plan", subtitle, sections))
