"""The run directory: where every file of a run lives, and the checks made before anything is written."""

from __future__ import annotations

import json
import os
import tempfile
import time
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

    def metrics(self, rank: int) -> Path:
        return self.root / f"metrics-rank{rank}.jsonl"


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
    return run


def _finished(run: RunDir) -> bool:
    """A summary that is not a failure marks a run that must not be overwritten."""
    try:
        return json.loads(run.summary.read_text()).get("status") != "failed"
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True


def create(run: RunDir) -> None:
    try:
        run.root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create run directory {run.root} ({e.strerror}): choose another --out") from None


def write_json_atomic(path: Path, obj: Any) -> None:
    """JSON to a temp file and rename, so readers never see half a file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def keep_epochs_before(path: Path, epoch: int) -> None:
    """On resume, drop records of epochs the checkpoint does not cover: they are about to be redone."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["epoch"] < epoch]
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write("".join(line + "\n" for line in kept))
    os.replace(tmp, path)
