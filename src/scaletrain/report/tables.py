"""The report's tables as Grids (scaletrain/grid.py): the same Grid feeds the terminal and the HTML page, so
both show the same numbers."""

from __future__ import annotations

from typing import Any

from scaletrain import fmt
from scaletrain.grid import Grid
from scaletrain.report.compare import SUMMARY_FACTS, Row
from scaletrain.report.series import PHASE_LABELS, phase_names
from scaletrain.study.results import above_ideal, scaling_flags
from scaletrain.study.view import threads_text


# ---- one run ----

def run_summary(ov: dict[str, Any], analysis_source: str) -> Grid:
    g = Grid(f"{ov['name']}: {ov['model']} on {ov['dataset']}", ["", ""], header=False, text_columns=(0, 1))
    status = ov["status"] + (f": {ov['error']}" if ov.get("error") else "")
    replicas = ov.get("replicas") or ov["world_size"]  # the ranks that share the global batch
    others = f" (of {ov['world_size']} ranks)" if replicas != ov["world_size"] else ""
    batch = (f"{replicas} x {ov['batch_per_rank']} = {ov['global_batch']}{others}" if ov.get("batch_per_rank")
             else f"{ov['world_size']} ranks")
    device = ov.get("device") or "-"
    times = ov.get("epoch_times_s") or []
    g.rows = [
        ["status", status],
        ["ranks x batch", batch],
        ["precision", ov.get("precision") or "-"],
        ["device", device + (f" ({ov['backend']})" if ov.get("backend") else "")],
        ["epochs", f"{ov['epochs']}/{ov['epochs_planned']}" if ov.get("epochs_planned") else str(ov["epochs"])],
        ["top-1", fmt.share(ov["top1"], 2) if ov.get("top1") is not None else "not measured"],
        ["samples/s (steady state)", fmt.rate(ov["samples_per_s"]) if ov.get("samples_per_s") else
         "not measured (too few steps)"],
        ["epoch time", _epoch_time(ov["epoch_time_median_s"], len(times)) if times else "no epoch finished"],
        ["step time (steady mean)", fmt.duration(ov.get("step_time_mean_s"))],
        ["threads per rank", _threads(ov)],
        ["analysis", analysis_source],
    ]
    return g


def _threads(ov: dict[str, Any]) -> str:
    """Torch intra-op threads each CPU rank used, and the cores its node's ranks shared."""
    t, cores = ov.get("threads_per_rank"), ov.get("cpu_cores")
    if t is None:
        if str(ov.get("device") or "").startswith("cuda"):
            return "- (GPU run)"
        return "unknown (not recorded by this run, and --threads was not set)"
    where = f", {cores} cores shared by the node's ranks" if cores else ""
    how = "" if ov.get("threads_recorded") else " (--threads; the run did not record it)"
    return f"{t}{where}{how}"


def _epoch_time(median_s: float, n: int) -> str:
    clock = f" ({fmt.hms(median_s)})" if median_s >= 60 else ""
    return f"{median_s:.2f} s{clock}, median of {n} epoch{'s' if n != 1 else ''}"


def run_phases(analysis: dict[str, Any]) -> Grid:
    """Mean seconds per step of each phase, per rank and over ranks, with its share of the step."""
    ranks = analysis.get("ranks") or []
    mean = analysis.get("phases_mean_s")
    cols = ["phase"] + [f"rank {r['rank']}" for r in ranks] + ["mean", "share of step"]
    g = Grid("where a step's time goes (steady-state means)", cols)
    if not mean:
        g.note = ("phases were not recorded (the run used --profile off): train with --profile on "
                  "to see where each step's time goes")
        return g
    step = analysis.get("step_time_mean_s") or sum(mean.values())
    for p in phase_names([mean]):
        cells = []
        for r in ranks:
            ph, st = r.get("phases_mean_s") or {}, r.get("step_time_mean_s")
            cells.append(f"{fmt.duration(ph.get(p))} ({fmt.share(ph[p] / st, 0)})" if p in ph and st else fmt.DASH)
        g.rows.append([PHASE_LABELS.get(p, p), *cells, fmt.duration(mean[p]), fmt.share(mean[p] / step)])
    g.rows.append(["step time", *[fmt.duration(r.get("step_time_mean_s")) for r in ranks], fmt.duration(step),
                   "100.0%"])
    return g


def pipeline_stages(pipeline: dict[str, Any], rows: list[dict[str, Any]]) -> Grid:
    """Each stage's (rank's) mean forward, backward, bubble and transfers per steady step, and its measured
    bubble fraction beside theory's (K-1)/(M+K-1) (analysis/pipeline.py)."""
    k, m = pipeline.get("stages"), pipeline.get("microbatches")
    g = Grid(f"pipeline stages: {k} stages x {pipeline.get('replicas', 1)} replica(s), {m} micro-batches, "
             f"{pipeline.get('schedule')}, split {pipeline.get('split')}",
             ["rank", "stage", "blocks", "forward", "backward", "bubble", "transfers", "rest", "step",
              "bubble fraction", "theory"], text_columns=(2,))
    for r in rows:
        blocks = r["blocks"]
        named = (blocks[0] if len(blocks) == 1 else f"{blocks[0]} .. {blocks[-1]} ({len(blocks)})") if blocks \
            else fmt.DASH
        ph = r["phases_s"]
        g.rows.append([str(r["rank"]), str(r["stage"]), named, *(fmt.duration(ph[p]) for p in
                                                               ("forward", "backward", "bubble", "p2p")),
                       fmt.duration(r["rest_s"]), fmt.duration(r["step_s"]), fmt.share(r["bubble_fraction"]),
                       fmt.share(r["bubble_theory"])])
    if not rows:
        g.note = "phases were not recorded (the run used --profile off)"
    else:
        g.note = ("bubble fraction = bubble / step (docs/metrics.md); theory (K-1)/(M+K-1) assumes equal stages "
                  "and free transfers: above it, the stages are unequal or the transfers slow")
    return g


def run_communication(analysis: dict[str, Any]) -> Grid:
    g = Grid("gradient communication per step", ["", ""], header=False, text_columns=(0, 1))
    total = analysis.get("comm_total_mean_s")
    if total is None:
        g.note = "not recorded (the run used --profile off)"
        return g
    if total == 0:
        g.note = "no communication: a single process exchanges no gradients"
        return g
    overlap = analysis.get("overlap_ratio")
    exposed = (analysis.get("phases_mean_s") or {}).get("comm_exposed")
    g.rows = [
        ["overlap ratio", f"{fmt.share(overlap)} of the communication is hidden behind computation"
         if overlap is not None else "-"],
        ["communication time", fmt.duration(total)],
        ["hidden", fmt.duration(analysis.get("comm_hidden_mean_s"))],
        ["exposed (the step waits)", fmt.duration(exposed)],
        ["bytes sent per rank", fmt.size(analysis.get("bytes_sent_per_step"))],
    ]
    return g


def run_ranks(analysis: dict[str, Any]) -> Grid:
    """Step-time spread, who was slowest how often, and peak memory, per rank."""
    kind = {"cuda": "GPU, allocator peak", "rss": "process RSS"}.get(analysis.get("memory_kind") or "", "")
    strag = analysis.get("stragglers") or {}
    counts = strag.get("slowest_counts") or {}
    compared = strag.get("steps_compared") or 0
    ranks = analysis.get("ranks") or []
    memory = any(r.get("peak_memory_bytes") for r in ranks)
    g = Grid("ranks: step time, stragglers, memory", ["rank", "step mean", "p50", "p90", "max", "slowest in"])
    if memory:
        g.columns.append(f"peak memory ({kind})" if kind else "peak memory")
    for r in ranks:
        n = counts.get(str(r["rank"]), 0)
        row = [str(r["rank"]), fmt.duration(r.get("step_time_mean_s")), fmt.duration(r.get("step_time_p50_s")),
               fmt.duration(r.get("step_time_p90_s")), fmt.duration(r.get("step_time_max_s")),
               f"{n}/{compared} steps" if compared else fmt.DASH]
        if memory:
            row.append(fmt.size(r.get("peak_memory_bytes")) if r.get("peak_memory_bytes") else "not recorded")
        g.rows.append(row)
    notes = []
    if compared:
        notes.append(f"spread: the slowest rank's work exceeds the fastest's by "
                     f"{fmt.duration(strag.get('spread_mean_s'))} per step on average ({compared} steps compared)")
    for s in strag.get("repeated") or []:
        notes.append(f"rank {s['rank']} is repeatedly last: slowest in {fmt.share(s['share'], 0)} of steps, "
                     f"{fmt.duration(s['lag_mean_s'])} behind")
    if ranks and not memory:
        notes.append("peak memory was not recorded")
    if not ranks:
        notes.append("no per-rank statistics: summary.json has none and the analysis could not be recomputed")
    g.note = "; ".join(notes) or None
    return g


def diagnosis(findings: list[dict[str, Any]] | None, profiled: bool = True) -> Grid:
    g = Grid("diagnosis (most severe first)", ["finding", "share of step", "what was measured", "what to try"],
             text_columns=(0, 2, 3))
    for f in findings or []:
        g.rows.append([f["kind"], fmt.share(f.get("share"), 0), f["message"], f.get("lever") or ""])
    if not g.rows:
        g.note = ("no diagnosis: phases were not recorded (--profile off)" if not profiled
                  else "no diagnosis recorded for this run")
    return g


# ---- a study ----

def study_points(points: list[dict], axes: list[str]) -> Grid:
    """The thesis table: configuration, epoch time, speedup against the baseline, ideal, efficiency.

    Axes with one value across the points are left out of the columns and named in the note instead.
    """
    fixed = [a for a in axes if len({str(p.get("axes", {}).get(a)) for p in points}) == 1 and len(axes) > 1]
    fixed_note = "; ".join(f"{a} = {points[0].get('axes', {}).get(a)}" for a in fixed) if points else ""
    axes = [a for a in axes if a not in fixed]
    g = Grid("scaling: epoch time, speedup and efficiency per point",
             [*axes, "threads/rank", "epoch time", "seconds", "speedup", "ideal", "efficiency", "top-1", "note"],
             text_columns=(*range(len(axes)), len(axes) + 7))
    errors = []
    for p in points:
        ok = p.get("status") == "completed" and p.get("epoch_time_s") is not None
        std = p.get("epoch_time_std_s")
        secs = (f"{p['epoch_time_s']:.2f}" + (f" ± {std:.2f}" if std and (p.get("repeats") or 1) > 1 else "")
                if ok else fmt.DASH)
        note = "baseline" if ok and p.get("baseline") == p.get("id") else ("" if ok else p.get("status", "pending"))
        if ok and above_ideal(p.get("efficiency")):
            note = "above ideal: see below"
        if p.get("error"):
            errors.append(f"{p['id']} failed: {p['error']}")
        g.rows.append([*(str(p.get("axes", {}).get(a, fmt.DASH)) for a in axes), threads_text(p),
                       fmt.hms(p["epoch_time_s"]) if ok else fmt.DASH, secs,
                       fmt.factor(p.get("speedup")) if ok else fmt.DASH, fmt.factor(p.get("ideal_speedup")),
                       fmt.share(p.get("efficiency"), 0) if ok else fmt.DASH,
                       fmt.share(p.get("top1"), 1) if ok else fmt.DASH, note])
    g.note = ("speedup = baseline epoch time / epoch time, within a series (the points sharing every axis value "
              "but nproc; its baseline is the point with the fewest processes); ideal = nproc / baseline nproc; "
              "efficiency = speedup / ideal; threads/rank = torch intra-op threads of each CPU rank (? = not "
              "recorded)" + "".join(f". {e}" for e in errors)
              + (f". Same for every point: {fixed_note}" if fixed_note else ""))
    return g


def study_flags(points: list[dict]) -> Grid:
    """The points whose efficiency is above 1.0, with the likely cause (study.results.scaling_flags)."""
    by_id = {p["id"]: p for p in points}
    g = Grid("efficiency above 1.0: not a real speedup", ["point", "efficiency", "threads/rank (baseline)",
                                                          "likely cause and fix"], text_columns=(0, 2, 3))
    for f in scaling_flags(points):
        base = by_id.get(f["baseline"]) or {}
        g.rows.append([f["id"], f"{f['efficiency']:.2f}",
                       f"{threads_text(by_id[f['id']])} ({threads_text(base) if base else fmt.DASH})", f["message"]])
    return g


def study_phases(points: list[dict]) -> Grid:
    names = phase_names(p.get("phases_mean_s") for p in points)
    g = Grid("phase breakdown per point (mean per step)",
             ["point", *[PHASE_LABELS.get(n, n) for n in names], "step", "overlap"])
    for p in points:
        ph = p.get("phases_mean_s")
        if not ph:
            why = "failed" if p.get("status") == "failed" else "not recorded"
            g.rows.append([p["id"], *[fmt.DASH] * len(names), why, fmt.DASH])
            continue
        step = sum(ph.values())
        g.rows.append([p["id"], *[f"{fmt.duration(ph.get(n))} ({fmt.share(ph.get(n, 0) / step, 0)})" for n in names],
                       fmt.duration(step), fmt.share(p.get("overlap_ratio"), 0)])
    if not names:
        g.note = "no point recorded phases (profiling was off, or every point failed)"
    return g


def study_diagnosis(points: list[dict]) -> Grid:
    g = Grid("diagnosis per point (top finding)", ["point", "finding", "what was measured", "what to try"],
             text_columns=(0, 1, 2, 3))
    for p in points:
        top = (p.get("diagnosis") or [None])[0]
        if p.get("status") == "failed":
            g.rows.append([p["id"], "failed", p.get("error") or "no error recorded", "see the run's directory"])
        elif top:
            g.rows.append([p["id"], f"{top['kind']} ({fmt.share(top.get('share'), 0)})", top["message"],
                           top.get("lever") or ""])
        else:
            g.rows.append([p["id"], fmt.DASH, "no diagnosis recorded", ""])
    return g


# ---- compare ----

def compare_config(cmp: dict[str, Any]) -> Grid:
    """What was configured differently in A and B (compare.config_differences), shown before any measurement."""
    g = Grid("configuration: the settings that differ", ["setting", "A", "B"], text_columns=(0, 1, 2))
    if cmp.get("config") is None:
        g.note = "not compared"
        return g
    def cell(key: str, value: Any) -> str:  # absent: a setting left at its default, or a fact not recorded
        return "not recorded" if value is None and key in SUMMARY_FACTS else fmt.setting(value)

    g.rows = [[key, cell(key, a), cell(key, b)] for key, a, b in cmp["config"]]
    if not g.rows:
        g.note = "none: A and B ran with the same configuration"
    return g


def compare_runs(cmp: dict[str, Any]) -> Grid:
    g = Grid(f"A = {cmp['a']}   B = {cmp['b']}", ["measure", "A", "B", "B - A", "change"])
    for r in cmp["rows"]:
        g.rows.append([r.label, fmt.value(r.kind, r.a), fmt.value(r.kind, r.b), _delta(r), fmt.change(r.relative)])
    return g


def _delta(r: Row) -> str:
    if r.delta is None:
        return fmt.DASH
    if r.kind == "share":  # a difference of two fractions is in percentage points
        return f"{100 * r.delta:+.1f} pt"
    if r.kind == "factor":
        return f"{r.delta:+.2f}"
    text = fmt.value(r.kind, abs(r.delta))
    return ("-" if r.delta < 0 else "+") + text


def compare_studies(cmp: dict[str, Any]) -> Grid:
    axes = cmp["axes"]
    g = Grid("studies side by side (points matched by their axis values)",
             [*axes, "epoch time A", "epoch time B", "change", "speedup A", "speedup B", "efficiency A",
              "efficiency B", "note"], text_columns=(*range(len(axes)), len(axes) + 7))
    for r in cmp["rows"]:
        t, s, e = r["epoch_time"], r["speedup"], r["efficiency"]
        notes = [f"{side}: {st}" + (f" ({err})" if err else "")
                 for side, st, err in (("A", r["status"], r["error_a"]), ("B", r["status_b"], r["error_b"]))
                 if st != "completed"]
        notes += [f"{side}: efficiency above 1.0, not a real speedup (see `scaletrain report` of {side})"
                  for side, eff in (("A", e.a), ("B", e.b)) if above_ideal(eff)]
        g.rows.append([*(str(r["axes"].get(a, fmt.DASH)) for a in axes), fmt.value("seconds", t.a),
                       fmt.value("seconds", t.b), fmt.change(t.relative), fmt.factor(s.a), fmt.factor(s.b),
                       fmt.share(e.a, 0), fmt.share(e.b, 0), "; ".join(notes)])
    return g
