"""Reading a run or a study directory from its files alone (never writes, never reruns anything)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from collections.abc import Callable
from typing import Any

from scaletrain.analysis import RANK_FILE, RUN_FACTS, analyze_run, load_records
from scaletrain.config import io as config_io
from scaletrain.config import layout_of
from scaletrain.config.io import train_table
from scaletrain.errors import UserError
from scaletrain.report import schema
from scaletrain.analysis.steps import steady
from scaletrain.analysis.throughput import steady_samples_per_s
from scaletrain.rundir import PLAN, RunDir, StudyDir, read_jsonl, read_summary

# the profiler's keys of summary.json (docs/run-directory.md), recomputed from metrics files when possible
ANALYSIS_KEYS = ("phases_mean_s", "step_time_mean_s", "overlap_ratio", "comm_total_mean_s", "comm_hidden_mean_s",
                 "bytes_sent_per_step", "ranks", "stragglers", "peak_memory_bytes", "memory_kind", "diagnosis",
                 "steady")
WHAT_TO_GIVE = "give the --out directory of `scaletrain train`, `scaletrain study` or `scaletrain plan`"
FIX_SUMMARY = "fix that value, or delete summary.json to report from the metrics files alone"
FIX_CONFIG = "fix that value in config.toml, or delete config.toml to report without it"
FIX_LINE = "fix or delete that line"
FIX_STUDY = "fix that value, or rerun the study to rewrite study.json"


@dataclass
class Run:
    """One run directory as read from its files; `analysis` holds the profiler's keys (may be empty)."""

    root: Path
    config: dict[str, Any]
    summary: dict[str, Any] | None
    records: dict[int, list[dict[str, Any]]]
    epochs: list[dict[str, Any]]
    analysis: dict[str, Any]
    analysis_source: str
    notes: list[str] = field(default_factory=list)

    @property
    def profiled(self) -> bool:
        return any("phases_s" in r for recs in self.records.values() for r in recs)


@dataclass
class Study:
    """One study directory: its spec (study.toml, may be empty) and its points (study.json, grid order)."""

    root: Path
    spec: dict[str, Any]
    points: list[dict[str, Any]]
    axes: list[str]


def kind_of(path: str | Path) -> str:
    """'run', 'study' or 'plan', from the files the directory holds; anything else is a UserError naming what is
    missing."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{p} does not exist: {WHAT_TO_GIVE}")
    if not p.is_dir():
        raise UserError(f"{p} is a file, not a directory: {WHAT_TO_GIVE}")
    if StudyDir(p).results.is_file():
        return "study"
    if (p / PLAN).is_file():
        return "plan"
    if RunDir(p).summary.is_file() or any(RANK_FILE.fullmatch(f.name) for f in p.iterdir()):
        return "run"
    if StudyDir(p).spec.is_file():
        raise UserError(f"{p} has study.toml but no study.json: no point of the study has finished yet; "
                        "run the study (scaletrain study) before reporting it")
    raise UserError(f"{p} is neither a run nor a study (nor a plan): it has no study.json, summary.json, "
                    f"metrics-rank*.jsonl or plan.json; {WHAT_TO_GIVE}")


def load(path: str | Path) -> Run | Study:
    return load_study(path) if kind_of(path) == "study" else load_run(path)


def load_run(path: str | Path) -> Run:
    """A run from config.toml, summary.json, metrics-rank*.jsonl and epochs.jsonl; the analysis is recomputed."""
    root = Path(path)
    kind = kind_of(root)
    if kind != "run":
        raise UserError(f"{root} is a {kind}, not a run: " + ("give one of its runs (points/<id>/r0) or report the "
                        "study" if kind == "study" else "scaletrain report shows it"))
    notes: list[str] = []
    summary = read_summary(root, fix=FIX_SUMMARY)
    if summary is None:
        notes.append("no summary.json (the run did not finish): everything shown comes from the metrics files")
    records = load_records(root, notes=notes)
    for rank, recs in records.items():
        _check_lines(recs, root / f"metrics-rank{rank}.jsonl", schema.STEP_RECORD)
    if not any(records.values()):
        why = f" (the run failed: {summary['error']})" if summary and summary.get("error") else ""
        raise UserError(f"{root} has no metrics lines in metrics-rank*.jsonl{why}: the run recorded no training "
                        "step; train it (or resume it) before reporting")
    files = RunDir(root)
    config = read_toml(files.config) if files.config.is_file() else {}
    schema.check(config, schema.CONFIG, str(files.config), FIX_CONFIG)
    epochs = read_jsonl(files.epochs, notes)
    _check_lines(epochs, files.epochs, schema.EPOCH_RECORD)
    analysis, source = _analysis(records, config, summary)
    return Run(root, config, summary, records, epochs, analysis, source, notes)


def analyzer() -> Callable[..., dict[str, Any]] | None:
    """The analysis that recomputes the profiler's keys from metrics files (None: use summary.json's)."""
    return analyze_run


def _analysis(records: dict[int, list[dict]], config: dict, summary: dict | None) -> tuple[dict, str]:
    analyze = analyzer()
    if analyze is not None:
        # peak memory is measured in the workers, not written per step: take it from summary.json
        memory = [(r["rank"], r["peak_memory_bytes"], summary["memory_kind"])
                  for r in (summary or {}).get("ranks") or []
                  if r.get("peak_memory_bytes") is not None and (summary or {}).get("memory_kind")]
        # as the trainer analysed it: config.toml's settings plus the device, ranks and threads it ran with
        placed = {**config, **{k: (summary or {})[k] for k in RUN_FACTS if (summary or {}).get(k) is not None}}
        return analyze(records, placed, memory=memory or None), "recomputed from the metrics files"
    if summary and any(k in summary for k in ANALYSIS_KEYS):
        return {k: summary[k] for k in ANALYSIS_KEYS if k in summary}, "summary.json"
    return {}, "none"


def overview(run: Run) -> dict[str, Any]:
    """The headline numbers of a run, from summary.json where present, else from the other files."""
    s = run.summary or {}
    c = run.config
    layout = layout_of(c) if c else None  # (a custom loop's records come without a config)
    world = s.get("world_size") or (layout.world if layout else None) or len(run.records)
    replicas = layout.replicas if layout else world  # the ranks that share the global batch
    per_rank = c.get("batch_size") or ((s["global_batch"] // replicas) if s.get("global_batch") else None)
    times = s.get("epoch_times_s") or [e["epoch_time_s"] for e in run.epochs if "epoch_time_s" in e]
    evals = [e for e in run.epochs if e.get("top1") is not None]
    rank0 = run.records.get(0) or next((r for r in run.records.values() if r), [])
    # a custom loop's records may lack epochs: then all steps count as one epoch
    rank0 = [r if "step_in_epoch" in r else {**r, "step_in_epoch": i} for i, r in enumerate(rank0)]
    steps_per_epoch = max(r["step_in_epoch"] for r in rank0) + 1 if rank0 else 0
    samples_per_s = s.get("samples_per_s") if "samples_per_s" in s else \
        steady_samples_per_s(rank0, replicas, steps_per_epoch)
    step_time = run.analysis.get("step_time_mean_s")
    if step_time is None:
        kept = [r["step_time_s"] for r in steady(rank0)]
        step_time = sum(kept) / len(kept) if kept else None
    return {
        "name": _run_name(run.root), "status": s.get("status", "unfinished"), "error": s.get("error"),
        "model": s.get("model") or c.get("model"), "dataset": s.get("dataset") or c.get("dataset"),
        "world_size": world, "replicas": replicas, "batch_per_rank": per_rank,
        "global_batch": s.get("global_batch") or (per_rank * replicas if per_rank else None),
        "precision": s.get("precision") or c.get("precision"), "device": s.get("device") or c.get("device"),
        "backend": s.get("backend"), "workers": c.get("workers"),
        "epochs": s.get("epochs", len(times)), "epochs_planned": s.get("epochs_planned") or c.get("epochs"),
        "top1": s["top1"] if "top1" in s else (evals[-1]["top1"] if evals else None),
        "samples_per_s": samples_per_s, "epoch_times_s": times,
        "epoch_time_median_s": median(times) if times else None,
        "step_time_mean_s": step_time, "steps": sum(len(r) for r in run.records.values()) // max(len(run.records), 1),
        "threads_per_rank": s.get("threads_per_rank", c.get("threads")), "cpu_cores": s.get("cpu_cores"),
        "threads_recorded": "threads_per_rank" in s,
        "profiled": run.profiled, "phases_mean_s": run.analysis.get("phases_mean_s"),
        "overlap_ratio": run.analysis.get("overlap_ratio"),
    }


def load_study(path: str | Path) -> Study:
    """A study from study.json (its list of points) and study.toml (the axes' order and values)."""
    root = Path(path)
    if kind_of(root) != "study":
        raise UserError(f"{root} is a run, not a study: report it as a run, or give the study's --out directory")
    study = StudyDir(root)
    points = _read_json(study.results)
    if not isinstance(points, list) or not all(isinstance(p, dict) and "id" in p for p in points):
        raise UserError(f"{study.results} is not a list of points with an 'id' each: the file is damaged; "
                        "rerun the study to rewrite it")
    for i, p in enumerate(points, 1):
        name = f" ({p['id']})" if isinstance(p["id"], str) else ""
        schema.check(p, schema.STUDY_POINT, f"{study.results} point {i}{name}", FIX_STUDY)
    spec = read_toml(study.spec) if study.spec.is_file() else {}
    schema.check(spec, schema.STUDY_TOML, str(study.spec), "fix that value in study.toml")
    # a hand-written study.toml may give an axis one bare value: it is a list of one
    spec["axes"] = {a: v if isinstance(v, list) else [v] for a, v in (spec.get("axes") or {}).items()}
    axes = list(spec["axes"].keys())
    for p in points:
        axes += [a for a in p.get("axes", {}) if a not in axes]
    return Study(root, spec, points, axes)


def axis_values(study: Study, axis: str) -> list[Any]:
    """The distinct values an axis takes, in the spec's order (else in grid order)."""
    seen = list((study.spec.get("axes") or {}).get(axis) or [])
    for p in study.points:
        v = p.get("axes", {}).get(axis)
        if v is not None and v not in seen:
            seen.append(v)
    return seen


def _read_checked_json(path: Path, spec: Any, fix: str) -> Any:
    data = _read_json(path)
    schema.check(data, spec, str(path), fix)
    return data


def _check_lines(lines: list[Any], path: Path, spec: Any) -> None:
    """Each JSON line against `spec`; lines count as read_jsonl counts them (blank lines left out)."""
    for i, line in enumerate(lines, 1):
        schema.check(line, spec, f"{path} line {i}", FIX_LINE)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not valid JSON ({e.msg}, line {e.lineno}): the file is damaged") from None


def read_toml(path: Path) -> dict[str, Any]:
    """A run's config.toml or a study's study.toml as a dict (its [train] table when it has only that)."""
    return train_table(config_io.read_toml(path, "", fix="fix or delete that file"))


def _run_name(root: Path) -> str:
    """The directory's name; a study's repeat directory (r0, r1, ...) is named with its point."""
    path = Path(root).resolve()
    return f"{path.parent.name}/{path.name}" if re.fullmatch(r"r\d+", path.name) else path.name
