"""The run directory: where every file of a run lives, and the checks made before anything is written."""

from __future__ import annotations

import fnmatch
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain.errors import UserError


@dataclass(frozen=True)
class RunDir:
    """Paths of one run's files (see docs/run-directory.md)."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint.pt"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def epochs(self) -> Path:
        return self.root / "epochs.jsonl"

    @property
    def preempt(self) -> Path:
        """The preemption request: while it exists, the run checkpoints within 10 steps and ends (exit 75)."""
        return self.root / "preempt"

    def metrics(self, rank: int) -> Path:
        return self.root / f"metrics-rank{rank}.jsonl"

    def ps_server(self, server: int) -> Path:
        return self.root / f"ps-server{server}.json"


class StudyDir:
    """Paths of a study's files (see docs/study.md)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.spec = self.root / STUDY_SPEC
        self.results = self.root / STUDY_RESULTS

    def run(self, point_id: str, k: int) -> Path:
        return self.root / "points" / point_id / f"r{k}"

    def log(self, point_id: str, k: int) -> Path:
        # beside the run dir, not in it: train refuses an --out that already holds files of a run
        return self.root / "points" / point_id / f"r{k}.log"

    def relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()


# the result files of the other commands, in their --out (docs/run-directory.md)
STUDY_SPEC, STUDY_RESULTS = "study.toml", "study.json"
PREDICTION = "prediction.json"
PLAN = "plan.json"
VALIDATION = "validation.json"
SPLIT = "split.json"
GRAPH = "graph.json"
COMMBENCH = "commbench.json"


def default_out(model: str, dataset: str) -> str:
    name = f"{model}-{dataset}".replace(":", "_").replace("/", "_").replace(".", "_")[:60]
    return str(Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def check_out_dir(out: str, resume: bool) -> RunDir:
    """Refuse what would lose earlier work: a file as --out, a finished or started run without --resume."""
    run = RunDir(Path(out))
    if run.root.exists() and not run.root.is_dir():
        raise UserError(f"--out {out} is a file, not a directory: choose another --out")
    if resume:
        if not run.checkpoint.is_file():
            raise UserError(f"--resume: no checkpoint in {out}: run without --resume to start it, "
                            "or give the --out of the run to continue")
    elif run.checkpoint.exists() or _finished(run):
        raise UserError(f"--out {out} already holds a run: add --resume to continue it, or choose another --out")
    else:
        check_out(out, "training run")  # a run that never got as far as a checkpoint is started again
    if run.root.is_dir():
        _check_writable(run.root)
    return run


@dataclass(frozen=True)
class Kind:
    """A kind of result: the command that writes it, and the files (patterns) that only that command writes."""

    name: str
    command: str
    marks: tuple[str, ...]


# what each command leaves in its --out (docs/run-directory.md#whose-folder-is-it); a folder with none of these
# holds no result. Folders inside a result (a run's plots/, a study's points/ and prediction/) are not looked in.
KINDS = (Kind("training run", "train", ("config.toml", "summary.json", "epochs.jsonl", "checkpoint.pt",
                                        "trace.json", "metrics-rank*.jsonl")),
         Kind("study", "study", (STUDY_SPEC, STUDY_RESULTS)),
         Kind("prediction", "predict", (PREDICTION,)),
         Kind("plan", "plan", (PLAN, "plan.png")),  # (and report.html, which runs and studies have too)
         Kind("graph", "graph", (GRAPH, "graph.dot")),
         Kind("split", "split", (SPLIT,)),
         Kind("validation", "validate", (VALIDATION,)),
         Kind("commbench result", "commbench", (COMMBENCH, "rows.jsonl")))


def _held(folder: Path) -> dict[str, list[str]]:
    """Kind name -> the files in `folder` that mark it (several kinds when one command wrote into another's result)."""
    if not folder.is_dir():
        return {}
    names = sorted(p.name for p in folder.iterdir())
    held = {k.name: [n for n in names if any(fnmatch.fnmatchcase(n, m) for m in k.marks)] for k in KINDS}
    return {kind: found for kind, found in held.items() if found}


def kinds_in(folder: str | Path) -> list[str]:
    """The kinds of result `folder` holds, from the files each command writes ([] for none, or no folder)."""
    return list(_held(Path(folder)))


def check_out(out: str | Path, kind: str, flag: str = "--out") -> bool:
    """Refuse an --out folder that is a file, holds another kind of result or someone else's files; True when
    it holds a `kind` already (its command replaces or resumes it). Writes nothing: call it before anything."""
    assert kind in {k.name for k in KINDS}, kind
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {out} is a file, not a directory: choose another {flag}")
    if not path.is_dir() or not any(path.iterdir()):
        return False
    held = _held(path)
    for k in KINDS:
        if k.name in held and k.name != kind:
            raise UserError(f"{flag} {out} holds a {k.name} (scaletrain {k.command}: {', '.join(held[k.name][:3])}), "
                            f"not a {kind}: choose a new or empty folder for {flag}")
    if kind not in held:
        raise UserError(f"{flag} {out} is a folder with other files in it and holds no {kind}: choose a new or "
                        f"empty folder for {flag}")
    return True


def check_out_file(out: str | Path, kind: str, own: Callable[[Path], bool], flag: str = "--out") -> bool:
    """check_out for an --out that is one file: refuse a directory, a result's file or any file that `own`
    does not recognise as a `kind`; True when it holds one (replaced). Writes nothing."""
    path = Path(out)
    if path.is_dir():
        held = kinds_in(path)
        if held:
            raise UserError(f"{flag} {out} is a directory holding a {held[0]}, not a {kind} file: give a file path "
                            f"outside it, e.g. {path.parent / f'{kind}.json'}")
        raise UserError(f"{flag} {out} is a directory: give the {kind} file's path (e.g. {path / f'{kind}.json'})")
    if not path.exists():
        return False
    if own(path):
        return True
    held = kinds_in(path.parent)
    what = f"a file of a {held[0]} ({path.parent})" if held else "a file"
    raise UserError(f"{flag} {out} is {what}, not a {kind}: nothing replaces a file it did not write; give a new "
                    f"path for {flag}")


def _check_writable(folder: Path) -> None:
    """Try it (a temp file made and removed): permissions alone say nothing to root or on read-only mounts."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".write-check.", dir=folder)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise UserError(f"cannot write in {folder} ({e.strerror}): make it writable, or copy the run "
                        "elsewhere and point --out there") from None


def remove_stale_temps(run: RunDir) -> list[Path]:
    """Temp files that a process killed mid-write left beside checkpoint.pt or summary.json (their atomic
    writes never leave one otherwise); removed before a launch, when no rank of this run is writing."""
    stale = [p for p in run.root.glob(".*.tmp") if p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def read_summary(root: Path | str, strict: bool = True,
                 fix: str = "fix that value, or rerun the run") -> dict[str, Any] | None:
    """A run's summary.json, the one reader of it (train/summary.py is its one writer); None when the run wrote
    none. strict: its values checked against report/schema.SUMMARY, and a damaged file one line naming it and
    `fix`. Not strict (a launcher or a study polling runs that may be mid-write): None also when it cannot be
    read or holds no JSON object."""
    path = RunDir(Path(root)).summary
    if not strict:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None
    if not path.is_file():
        return None
    from scaletrain.report import schema

    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        where = f" ({e.msg}, line {e.lineno})" if isinstance(e, json.JSONDecodeError) else ""
        raise UserError(f"{path} is not valid JSON{where}: the file is damaged; {fix}") from None
    schema.check(data, schema.SUMMARY, str(path), fix)
    return data


def _finished(run: RunDir) -> bool:
    """A summary that is not a failure marks a run that must not be overwritten (one that cannot be read is
    kept too: it may be a finished run's, damaged)."""
    if not run.summary.exists():
        return False
    data = read_summary(run.root, strict=False)
    return data is None or data.get("status") != "failed"


def create(run: RunDir) -> None:
    try:
        run.root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create run directory {run.root} ({e.strerror}): choose another --out") from None


def write_json_atomic(path: Path, obj: Any) -> None:
    """JSON to a temp file and rename, so readers never see half a file."""
    replace_atomic(path, lambda f: f.write(json.dumps(obj, indent=2) + "\n"), mode="w")


def replace_atomic(path: Path, write, mode: str = "wb") -> None:
    """Write through `write(file)` into a temp file beside `path`, fsync, rename; no temp survives a failure."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; run files follow the umask like the rest
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class JsonlAppender:
    """A JSON-lines file open for appending: each `write` is one write call of whole lines (O_APPEND), so lines
    from several processes never interleave, and what a killed process had written stays whole. The one JSONL
    writer (metrics, epochs, restarts, commbench rows); about 10 us a line, no fsync."""

    def __init__(self, path: Path | str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)

    def write(self, *records: dict[str, Any]) -> None:
        os.write(self._fd, "".join(json.dumps(r) + "\n" for r in records).encode())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "JsonlAppender":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def append_jsonl(path: Path | str, *records: dict[str, Any]) -> None:
    """`records` at the end of the JSON-lines file `path`, in one write call."""
    with JsonlAppender(path) as out:
        out.write(*records)


def read_jsonl(path: Path, notes: list[str] | None = None) -> list[dict[str, Any]]:
    """JSON lines ([] for a missing file). A damaged line is one clear error; with `notes`, a cut-off
    last line (what a run killed mid-write leaves) is left out and said in `notes` instead."""
    path = Path(path)
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    out = []
    for i, line in enumerate(lines, 1):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if notes is not None and i == len(lines):
                notes.append(f"{path.name}: the last line was cut off (the run was killed mid-write) and is left out")
                continue
            raise UserError(f"{path} line {i} is not valid JSON: the file is damaged (a run killed mid-write "
                            "leaves a partial last line; delete that line)") from None
    return out


def keep_steps_before(path: Path, step: int) -> None:
    """On a resume from a checkpoint written mid-epoch, drop the step records it does not cover."""
    _keep(path, lambda record: record["step"] < step)


def keep_epochs_before(path: Path, epoch: int) -> None:
    """On resume, drop records of epochs the checkpoint does not cover: they are about to be redone."""
    _keep(path, lambda record: record["epoch"] < epoch)


def _keep(path: Path, wanted) -> None:
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if wanted(json.loads(line)):
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            # a line cut short by a killed process: only the uncovered part of the run can end that way
            continue
    replace_atomic(path, lambda f: f.write("".join(line + "\n" for line in kept)), mode="w")
