"""Assembling reports: tables and plots of a run, a study or a comparison, written as one HTML page.

Writes only `report.html` and `plots/*.png` inside the directory reported on (a comparison writes
only the file it is given); every other file is read, never changed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from scaletrain.analysis import pipeline as stages
from scaletrain.grid import Grid
from scaletrain.report import plots, series, tables
from scaletrain.report.html import Section, page, write_page
from scaletrain.report.load import Run, Study, axis_values, load_run, load_study, overview
from scaletrain.report.output import check_report_dir, writing

REPORT = "report.html"
PLOTS = "plots"


def write_run_report(run_dir: str | Path) -> Path:
    """Write RUN/report.html (and RUN/plots/*.png) from the run's files; returns the HTML path."""
    return render_run(load_run(run_dir))


def write_study_report(study_dir: str | Path) -> Path:
    """Write STUDY/report.html (and STUDY/plots/*.png) from study.json; returns the HTML path."""
    return render_study(load_study(study_dir))


def run_grids(run: Run) -> list[Grid]:
    """The run's tables, in reading order: summary, phases, communication, ranks, diagnosis (and a pipeline's
    stages)."""
    a = run.analysis
    grids = [tables.run_summary(overview(run), run.analysis_source), tables.run_phases(a),
             tables.run_communication(a), tables.run_ranks(a), tables.diagnosis(a.get("diagnosis"), run.profiled)]
    pipe = (run.summary or {}).get("pipeline")
    if pipe:
        grids.append(tables.pipeline_stages(pipe, stages.stage_rows(pipe, run.records)))
    return grids


def render_run(run: Run) -> Path:
    """Draw the run's plots into RUN/plots/ and write RUN/report.html."""
    check_report_dir(run.root, REPORT, PLOTS)
    with writing(run.root / REPORT):
        return _render_run(run)


def _render_run(run: Run) -> Path:
    a = run.analysis
    out = run.root / PLOTS
    summary, phases, comm, ranks, diagnosis = run_grids(run)[:5]
    phase_figs, notes = [], list(run.notes)
    if a.get("phases_mean_s"):
        bars = {f"rank {r['rank']}": r["phases_mean_s"] for r in a.get("ranks") or [] if r.get("phases_mean_s")}
        bars["mean"] = a["phases_mean_s"]
        phase_figs.append((plots.phase_bars(bars, out / "phases-per-rank.png", "mean time per step, by phase"),
                           "mean milliseconds per step of each phase, per rank and over ranks"))
    shares = series.phase_shares(run.records)
    if shares:
        phase_figs.append((plots.phase_share_area(*shares, out / "phase-shares.png"),
                           "each phase's share of the step, step by step (mean over ranks)"))
    else:
        notes.append("phase plots are left out: phases were not recorded (the run used --profile off)")
    step_fig = (plots.step_time_lines(series.step_times(run.records), out / "step-time.png"),
                "step time of every step, per rank (the first steps of each epoch include loader start-up)")
    curves, curve_notes = series.training_curves(run.records, run.epochs)
    curve_figs = [(plots.line_plot(c.lines, out / f"{c.name}.png", c.title, c.xlabel, c.ylabel, markers=c.markers),
                   c.caption) for c in curves]
    top = (a.get("diagnosis") or [None])[0]
    pipeline_section = _pipeline_section(run, out)
    sections = [
        Section("summary", lead=f"{top['kind']}: {top['message']}. Try: {top['lever']}." if top else None,
                grids=[summary]),
        Section("diagnosis", grids=[diagnosis]),
        Section("where the time goes", grids=[phases, comm], figures=phase_figs),
        *([pipeline_section] if pipeline_section else []),
        Section("ranks and stragglers", grids=[ranks], figures=[step_fig]),
        Section("training: loss, accuracy, learning rate", figures=curve_figs, notes=curve_notes),
    ]
    if notes:
        sections.append(Section("notes", notes=notes))
    ov = overview(run)
    title = f"run {ov['name']}"
    subtitle = f"{ov['model']} on {ov['dataset']}, {ov['world_size']} rank(s), {ov['status']}"
    return write_page(run.root / REPORT, page(title, subtitle, sections))


def _pipeline_section(run: Run, out: Path) -> Section | None:
    """A pipeline run's stages: their phases and bubble fraction against theory, and one step's timeline."""
    pipe = (run.summary or {}).get("pipeline")
    if not pipe:
        return None
    rows = stages.stage_rows(pipe, run.records)
    figures = []
    shown = stages.timeline(run.records)
    if shown:
        step, spans = shown
        k = int(pipe.get("stages") or 1)
        labels = {r: f"stage {r % k}" + (f" (replica {r // k})" if pipe.get("replicas", 1) > 1 else "")
                  for r in spans}
        figures.append((plots.stage_timeline(spans, labels, out / "pipeline-timeline.png",
                                             f"step {step}: each stage's phases on one clock"),
                        f"one typical step ({step}: the median of the steady steps' slowest-stage times), each "
                        "stage's forward and backward per micro-batch and its waits on its neighbours"))
    bubble = stages.bubble_summary(rows)
    lead = None
    if bubble and bubble["theory"] is not None:
        lead = (f"measured bubble fraction {bubble['median']:.1%} (stages {bubble['min']:.1%} to {bubble['max']:.1%}) "
                f"against theory's (K-1)/(M+K-1) = {bubble['theory']:.1%}")
    return Section("pipeline stages", lead=lead, grids=[tables.pipeline_stages(pipe, rows)], figures=figures)


def study_grids(study: Study) -> list[Grid]:
    """The study's tables: the scaling table, points above the ideal, phases per point, diagnosis per point."""
    return [tables.study_points(study.points, study.axes), tables.study_flags(study.points),
            tables.study_phases(study.points), tables.study_diagnosis(study.points)]


def _sweep_note(study: Study, axis: str, what: str, lines) -> str | None:
    """Why a plot against `axis` is not drawn, or None when it can be."""
    if axis not in study.axes:
        return f"{what}: not drawn, {axis} is not an axis of this study"
    values = axis_values(study, axis)
    if len(values) < 2:
        return f"{what}: not drawn, {axis} has only one value ({values[0] if values else 'none'})"
    if not lines:
        return f"{what}: not drawn, no point has an epoch time"
    return None


def render_study(study: Study) -> Path:
    """Draw the study's plots (those whose axis is swept) into STUDY/plots/ and write STUDY/report.html."""
    check_report_dir(study.root, REPORT, PLOTS)
    with writing(study.root / REPORT):
        return _render_study(study)


def _render_study(study: Study) -> Path:
    pts, axes, out = study.points, study.axes, study.root / PLOTS
    scaling_figs, phase_figs, notes = [], [], []
    epoch_lines = series.study_lines(pts, axes, "nproc", "epoch_time_s")
    why = _sweep_note(study, "nproc", "epoch time and speedup against nproc", epoch_lines)
    if why:
        notes.append(why)
    else:
        scaling_figs.append((plots.line_plot(epoch_lines, out / "epoch-time.png", "epoch time against processes",
                                             "processes (nproc)", "epoch time (s)"),
                             "epoch time against the number of processes, one line per series"))
        scaling_figs.append((plots.line_plot(series.study_lines(pts, axes, "nproc", "speedup"), out / "speedup.png",
                                             "speedup against ideal", "processes (nproc)", "speedup (x)",
                                             reference=series.ideal_lines(pts, axes)),
                             "speedup against the series' baseline, with the ideal (linear) speedup dashed"))
    sweep = series.study_lines(pts, axes, "workers", "epoch_time_s")
    why = _sweep_note(study, "workers", "workers sweep", sweep)
    if why:
        notes.append(why)
    else:
        scaling_figs.append((plots.line_plot(sweep, out / "workers-sweep.png", "epoch time against loader workers",
                                             "data-loader workers per rank", "epoch time (s)"),
                             "epoch time against data-loader workers, one line per nproc (and other axes)"))
    bars = {p["id"]: p["phases_mean_s"] for p in pts if p.get("phases_mean_s")}
    if bars:
        phase_figs.append((plots.phase_bars(bars, out / "phases-per-point.png", "mean time per step, by phase"),
                           "mean milliseconds per step of each phase, per point"))
    else:
        notes.append("phases per point: not drawn, no point recorded phases")
    points_grid, flags_grid, phases_grid, diag_grid = study_grids(study)
    failed = sum(1 for p in pts if p.get("status") == "failed")
    done = sum(1 for p in pts if p.get("status") == "completed")
    sections = [
        Section("scaling", grids=[points_grid, flags_grid] if flags_grid.rows else [points_grid],
                figures=scaling_figs),
        Section("where the time goes", grids=[phases_grid], figures=phase_figs),
        Section("diagnosis", grids=[diag_grid]),
    ]
    if notes:
        sections.append(Section("notes", notes=notes))
    swept = "; ".join(f"{a}: {', '.join(map(str, axis_values(study, a)))}" for a in axes)
    subtitle = f"{swept} — {done} of {len(pts)} points completed" + (f", {failed} failed" if failed else "")
    return write_page(study.root / REPORT, page(f"study {study.root.resolve().name}", subtitle, sections))


def render_compare(cmp: dict, a: Run | Study, b: Run | Study, path: str | Path) -> Path:
    """The comparison as one self-contained page at `path` (its plot is drawn in a temporary folder)."""
    with writing(path):
        return _render_compare(cmp, a, b, path)


def _render_compare(cmp: dict, a: Run | Study, b: Run | Study, path: str | Path) -> Path:
    grid = tables.compare_runs(cmp) if cmp["kind"] == "runs" else tables.compare_studies(cmp)
    with tempfile.TemporaryDirectory() as tmp:
        figures = []
        if cmp["kind"] == "runs" and isinstance(a, Run) and isinstance(b, Run):
            bars = {f"A: {cmp['a']}": a.analysis.get("phases_mean_s"),
                    f"B: {cmp['b']}": b.analysis.get("phases_mean_s")}
            if all(bars.values()):
                figures.append((plots.phase_bars(bars, Path(tmp) / "phases.png", "mean time per step, by phase"),
                                "mean milliseconds per step of each phase in A and B"))
        elif isinstance(a, Study) and isinstance(b, Study):
            lines = [series.Line(f"{side}: {line.label}", line.xs, line.ys) for side, study in (("A", a), ("B", b))
                     for line in series.study_lines(study.points, cmp["axes"], "nproc", "epoch_time_s")]
            if any(len(line.xs) > 1 for line in lines):
                figures.append((plots.line_plot(lines, Path(tmp) / "epoch-time.png", "epoch time against processes",
                                                "processes (nproc)", "epoch time (s)"),
                                "epoch time against the number of processes, each series of A and of B"))
        html = page(f"compare {a.root.resolve().name} and {b.root.resolve().name}", f"A = {a.root}; B = {b.root}",
                    [Section("configuration", grids=[tables.compare_config(cmp)]),
                     Section("comparison", lead=cmp["verdict"], grids=[grid], figures=figures)])
    return write_page(path, html)
