"""What a run, a study and a prediction left in their directories, as typed values (docs/api.md).

Read by the readers `scaletrain report` and `validate` use (report/load.py, validate/load.py): the same
checks, the same analysis recomputed from the metrics files, the same one-line UserError for a directory
that is not what it should be. The dataclasses are frozen; their dicts are the files' own values.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from scaletrain.errors import UserError


@dataclass(frozen=True)
class Epoch:
    """One line of epochs.jsonl; evaluation fields are None for an epoch that was not evaluated."""

    epoch: int
    epoch_time_s: float | None = None
    train_loss: float | None = None
    lr: float | None = None
    top1: float | None = None
    top5: float | None = None
    val_loss: float | None = None


@dataclass(frozen=True)
class Finding:
    """One line of the diagnosis: what limits the run, its share of a step, and the lever to try."""

    kind: str
    message: str
    share: float | None = None
    lever: str | None = None


@dataclass(frozen=True)
class RankStats:
    """One rank's steady-state step: its phases (None when the run was not profiled) and times."""

    rank: int
    phases_mean_s: dict[str, float] | None = None
    step_time_mean_s: float | None = None
    step_time_p90_s: float | None = None
    step_time_max_s: float | None = None
    slowest_share: float | None = None
    peak_memory_bytes: float | None = None


@dataclass(frozen=True)
class Run:
    """A run directory: its headline numbers, phases per rank, epochs, diagnosis, config and summary.json.

    Numbers come from summary.json where the run wrote one, else from its metrics files (an unfinished run);
    the phases, ranks and diagnosis are recomputed from the metrics files, as `scaletrain report` shows them."""

    path: Path
    status: str
    """completed, stopped, preempted, failed, or unfinished (no summary.json yet)."""
    error: str | None
    model: str | None
    dataset: str | None
    world_size: int
    global_batch: int | None
    precision: str | None
    device: str | None
    top1: float | None
    """Top-1 accuracy of the last evaluation (0..1)."""
    samples_per_s: float | None
    epoch_time_s: float | None
    """The median of its epochs' times."""
    step_time_mean_s: float | None
    phases_mean_s: dict[str, float] | None
    """Where a step's time goes (data_wait, forward, backward, ...), mean over ranks; None when not profiled."""
    overlap_ratio: float | None
    ranks: tuple[RankStats, ...] = field(repr=False)
    diagnosis: tuple[Finding, ...] = field(repr=False)
    epochs: tuple[Epoch, ...] = field(repr=False)
    epochs_planned: int | None = field(repr=False)
    config: dict[str, Any] = field(repr=False)
    """config.toml: the resolved settings."""
    summary: dict[str, Any] = field(repr=False)
    """summary.json as written ({} when the run wrote none)."""
    notes: tuple[str, ...] = field(repr=False)
    """What reading found missing or cut off (an unfinished run, a half-written last line)."""


@dataclass(frozen=True)
class StudyPoint:
    """One point of a study (study.json): its axis values, outcome, scaling numbers and run directories."""

    id: str
    axes: dict[str, Any]
    status: str
    """completed, failed or pending."""
    error: str | None
    epoch_time_s: float | None
    samples_per_s: float | None
    speedup: float | None
    efficiency: float | None
    top1: float | None
    phases_mean_s: dict[str, float] | None = field(repr=False)
    overlap_ratio: float | None = field(repr=False)
    epoch_time_std_s: float | None = field(repr=False)
    ideal_speedup: float | None = field(repr=False)
    diagnosis: tuple[Finding, ...] = field(repr=False)
    runs: tuple[Path, ...] = field(repr=False)
    """Its repeats' run directories; `load_run(point.runs[0])` reads one."""
    config: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class Study:
    """A study directory: its axes (each axis's values in order), fixed settings and points in grid order."""

    path: Path
    axes: dict[str, tuple[Any, ...]]
    points: tuple[StudyPoint, ...]
    repeats: int | None = field(repr=False)
    train: dict[str, Any] = field(repr=False)
    """The fixed settings of every point (study.toml's [train])."""

    @property
    def failed(self) -> tuple[StudyPoint, ...]:
        return tuple(p for p in self.points if p.status == "failed")

    def point(self, **axes: Any) -> StudyPoint:
        """The one point with these axis values (`study.point(nproc=2, workers=0)`)."""
        found = [p for p in self.points if all(p.axes.get(k) == v for k, v in axes.items())]
        if len(found) != 1:
            given = ", ".join(f"{k}={v!r}" for k, v in axes.items())
            what = "no point" if not found else f"{len(found)} points ({', '.join(p.id for p in found)})"
            raise UserError(f"{what} of {self.path} with {given}: give one value of each axis that varies "
                            f"({', '.join(f'{a}: {list(v)}' for a, v in self.axes.items())})")
        return found[0]


@dataclass(frozen=True)
class PredictedPoint:
    """One predicted point (prediction.json): step phases and times, scaling, memory, and the limit met."""

    id: str
    axes: dict[str, Any]
    step_time_s: float
    epoch_time_s: float | None
    samples_per_s: float | None
    speedup: float | None
    efficiency: float | None
    peak_memory_bytes: float | None
    limit: str | None
    phases_s: dict[str, float] | None = field(repr=False)
    config: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class Prediction:
    """A prediction: its points, what it rests on (`basis`), where scaling stops, and the whole file."""

    path: Path
    basis: str | None
    points: tuple[PredictedPoint, ...]
    scaling: dict[str, Any] = field(repr=False)
    notes: tuple[str, ...] = field(repr=False)
    data: dict[str, Any] = field(repr=False)
    """prediction.json as written."""


def _pick(cls, data: dict[str, Any], **given: Any):
    """`cls` from the keys of `data` its fields name (absent keys are None), `given` taking precedence."""
    return cls(**{f.name: given[f.name] if f.name in given else data.get(f.name) for f in fields(cls)})


def _findings(items: list[dict[str, Any]] | None) -> tuple[Finding, ...]:
    return tuple(_pick(Finding, f) for f in items or [])


def load_run(path: str | Path) -> Run:
    """The run in `path` (a `scaletrain train --out` directory, or a study's points/<id>/r<k>)."""
    from scaletrain.report.load import load_run as read, overview

    run = read(path)
    o = overview(run)
    return _pick(Run, o, path=Path(run.root), epoch_time_s=o["epoch_time_median_s"],
                 ranks=tuple(_pick(RankStats, r) for r in run.analysis.get("ranks") or []),
                 diagnosis=_findings(run.analysis.get("diagnosis")),
                 epochs=tuple(_pick(Epoch, e) for e in run.epochs), config=dict(run.config),
                 summary=dict(run.summary or {}), notes=tuple(run.notes))


def load_study(path: str | Path) -> Study:
    """The study in `path` (a `scaletrain study --out` directory), its points in grid order."""
    from scaletrain.report.load import axis_values, load_study as read

    study = read(path)
    root = Path(study.root)
    points = tuple(_pick(StudyPoint, p, axes=dict(p.get("axes") or {}), diagnosis=_findings(p.get("diagnosis")),
                         runs=tuple(root / r for r in p.get("runs") or []), config=dict(p.get("config") or {}))
                   for p in study.points)
    return Study(path=root, axes={a: tuple(axis_values(study, a)) for a in study.axes}, points=points,
                 repeats=study.spec.get("repeats"), train=dict(study.spec.get("train") or {}))


def load_prediction(path: str | Path) -> Prediction:
    """The prediction in `path` (a `scaletrain predict --out` directory, or its prediction.json)."""
    from scaletrain.validate.load import load_prediction as read, prediction_path

    data = read(path)
    return Prediction(path=prediction_path(path), basis=data.get("basis_note"),
                      points=tuple(_pick(PredictedPoint, p) for p in data["points"]),
                      scaling=dict(data.get("scaling") or {}), notes=tuple(data.get("notes") or ()), data=data)
