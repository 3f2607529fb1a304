"""Differences between two runs or two studies, as data (pure functions; the verdict is one sentence).

First what was asked for differently (the configuration), then what was measured differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scaletrain import fmt
from scaletrain.report.series import PHASE_LABELS, phase_names


@dataclass(frozen=True)
class Row:
    """One measure of A and B; kind says how to format it (see fmt.value)."""

    label: str
    kind: str
    a: float | None
    b: float | None
    phase: str | None = None

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def relative(self) -> float | None:
        return None if self.delta is None or not self.a else self.delta / self.a


PER_RUN_SETTINGS = ("out", "resume", "progress", "stop_after")
"""Settings that differ between any two runs by construction (where they were written): never a difference."""
SUMMARY_FACTS = ("threads_per_rank", "cpu_cores", "backend", "torch_version", "scaletrain_version")
"""What a run's summary.json records of how it ran, beyond its config.toml."""
FROM_SUMMARY = ("model", "dataset", "precision", "device")
"""Settings read from summary.json when a run has no config.toml."""


def run_settings(config: dict[str, Any], summary: dict[str, Any] | None) -> dict[str, Any]:
    """A run's configuration: config.toml (or summary.json's copy of it), then what summary.json says of the run."""
    s = summary or {}
    settings = {k: v for k, v in config.items() if k not in PER_RUN_SETTINGS} or \
        {k: s[k] for k in FROM_SUMMARY if s.get(k) is not None}
    if "nproc" not in settings and s.get("world_size") is not None:
        settings["world_size"] = s["world_size"]
    return {**settings, **{k: s[k] for k in SUMMARY_FACTS if s.get(k) is not None}}


def study_settings(points: list[dict[str, Any]], spec: dict[str, Any]) -> dict[str, Any]:
    """A study's configuration: each axis with its values, the settings every point shares, and repeats."""
    axes: dict[str, list[Any]] = {a: list(v) for a, v in (spec.get("axes") or {}).items()}
    for p in points:
        for a, v in p.get("axes", {}).items():
            if v not in axes.setdefault(a, []):
                axes[a].append(v)
    configs = [p.get("config") or {} for p in points]
    shared = {k: v for k, v in (configs[0] if configs else {}).items()
              if k not in axes and k not in PER_RUN_SETTINGS and all(c.get(k) == v for c in configs)}
    if not configs:
        shared = {k: v for k, v in (spec.get("train") or {}).items() if k not in PER_RUN_SETTINGS}
    repeats = {"repeats": spec["repeats"]} if spec.get("repeats") is not None else {}
    return {**{f"{a} (axis)": v for a, v in axes.items()}, **shared, **repeats}


def config_differences(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(setting, A's value, B's value) for every setting that differs; a setting one side lacks is None there."""
    return [(k, a.get(k), b.get(k)) for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]


def compare_runs(a: dict[str, Any], b: dict[str, Any],
                 settings: tuple[dict[str, Any], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Side by side from two run overviews (load.overview): every phase mean, then the headline numbers.

    With `settings` (run_settings of A and B), `config` lists what was configured differently."""
    pa, pb = a.get("phases_mean_s"), b.get("phases_mean_s")
    rows = [Row(PHASE_LABELS.get(p, p), "time", (pa or {}).get(p), (pb or {}).get(p), phase=p)
            for p in phase_names([pa, pb])]
    rows += [
        Row("step time (mean)", "time", a.get("step_time_mean_s"), b.get("step_time_mean_s")),
        Row("samples/s (steady)", "rate", a.get("samples_per_s"), b.get("samples_per_s")),
        Row("epoch time (median)", "seconds", a.get("epoch_time_median_s"), b.get("epoch_time_median_s")),
        Row("overlap ratio", "share", a.get("overlap_ratio"), b.get("overlap_ratio")),
        Row("top-1", "share", a.get("top1"), b.get("top1")),
    ]
    largest = _largest_phase_change(rows)
    return {"kind": "runs", "a": a["name"], "b": b["name"], "rows": rows,
            "config": config_differences(*settings) if settings else None,
            "largest_phase": largest.phase if largest else None, "verdict": _run_verdict(rows, largest, pa, pb)}


def _largest_phase_change(rows: list[Row]) -> Row | None:
    changed = [r for r in rows if r.phase and r.delta is not None]
    return max(changed, key=lambda r: abs(r.delta)) if changed else None


def _run_verdict(rows: list[Row], largest: Row | None, pa: dict | None, pb: dict | None) -> str:
    if pa is None or pb is None:
        missing = " and ".join(n for n, p in (("A", pa), ("B", pb)) if p is None)
        step = next(r for r in rows if r.label == "step time (mean)")
        return (f"phases were not recorded in {missing} (--profile off), so no phase can be named; step time: "
                f"{fmt.duration(step.a)} -> {fmt.duration(step.b)} ({fmt.change(step.relative, 0)})")
    if largest is None or largest.delta == 0:
        return "no phase changed: every phase takes the same time per step in A and B"
    how = fmt.change(largest.relative, 0) if largest.relative is not None else "from zero"
    return (f"{largest.label}: {fmt.duration(largest.a)} -> {fmt.duration(largest.b)} per step ({how}), "
            "the largest change")


def _key(axes: dict[str, Any]) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in axes.items()))


def compare_studies(a_points: list[dict], b_points: list[dict], axes: list[str],
                    settings: tuple[dict[str, Any], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Points matched by their axis values: epoch time, speedup and efficiency of A and B side by side.

    With `settings` (study_settings of A and B), `config` lists what was configured differently."""
    b_by_key = {_key(p.get("axes", {})): p for p in b_points}
    matched: set[tuple] = set()
    rows = []
    for pa in a_points:
        key = _key(pa.get("axes", {}))
        pb = b_by_key.get(key)
        matched.add(key)
        rows.append(_point_row(pa, pb))
    rows += [_point_row(None, pb) for pb in b_points if _key(pb.get("axes", {})) not in matched]
    return {"kind": "studies", "axes": axes, "rows": rows,
            "config": config_differences(*settings) if settings else None, "verdict": _study_verdict(rows)}


def _point_row(pa: dict | None, pb: dict | None) -> dict[str, Any]:
    some = pa or pb
    assert some is not None
    return {
        "axes": some.get("axes", {}),
        "status": (pa or {}).get("status", "absent"), "status_b": (pb or {}).get("status", "absent"),
        "error_a": (pa or {}).get("error"), "error_b": (pb or {}).get("error"),
        "epoch_time": Row("epoch time", "seconds", (pa or {}).get("epoch_time_s"), (pb or {}).get("epoch_time_s")),
        "speedup": Row("speedup", "factor", (pa or {}).get("speedup"), (pb or {}).get("speedup")),
        "efficiency": Row("efficiency", "share", (pa or {}).get("efficiency"), (pb or {}).get("efficiency")),
    }


def _study_verdict(rows: list[dict]) -> str:
    both = [r for r in rows if r["epoch_time"].relative is not None]
    only_a = sum(1 for r in rows if r["status_b"] == "absent")
    only_b = sum(1 for r in rows if r["status"] == "absent")
    extra = "".join(f"; {n} point{'s' if n != 1 else ''} only in {side}"
                    for side, n in (("A", only_a), ("B", only_b)) if n)
    if not both:
        return "no point has an epoch time in both studies" + extra
    top = max(both, key=lambda r: abs(r["epoch_time"].relative))
    t = top["epoch_time"]
    where = ", ".join(f"{k}={v}" for k, v in top["axes"].items())
    return (f"{where}: epoch time {fmt.value('seconds', t.a)} -> {fmt.value('seconds', t.b)} "
            f"({fmt.change(t.relative, 0)}), the largest change" + extra)
