"""Is the run directory shared and writable from every node? Each node writes a token file into a folder
of node 0's (`<out>/.doctor-<session>/node<r>`, atomically: temp file and rename, as a run's files are
written) and looks for every other node's. A network file system may show a new file late (attribute
caching), so the looking is retried for a few seconds."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from scaletrain.rundir import replace_atomic

LOOK_S = 5.0  # how long a node keeps looking for the others' files


def session_dir(out: str, session: str) -> Path:
    return Path(out) / f".doctor-{session}"


def prepare(out: str, session: str) -> tuple[Path, bool]:
    """Node 0: create --out if missing (as train would) and its session folder; returns (folder, created --out)."""
    root = Path(out)
    created = not root.exists()
    folder = session_dir(out, session)
    folder.mkdir(parents=True, exist_ok=True)
    return folder, created


def write_token(folder: Path, rank: int) -> str | None:
    """Write node<rank> atomically; None when written, else why not (this node is not in node 0's folder,
    or may not write there)."""
    try:
        replace_atomic(folder / f"node{rank}", lambda f: f.write(f"{rank}\n"), mode="w")
    except OSError as e:
        return f"{e.strerror or e}" + (f" ({folder} does not exist here)" if not folder.exists() else "")
    return None


def look(folder: Path, ranks: list[int], wait_s: float = LOOK_S) -> list[int]:
    """The ranks among `ranks` whose token this node sees, retrying until all are seen or wait_s passes."""
    deadline = time.monotonic() + wait_s
    while True:
        seen = [r for r in ranks if (folder / f"node{r}").is_file()]
        if len(seen) == len(ranks) or time.monotonic() >= deadline:
            return seen
        time.sleep(0.2)


def free_bytes(out: str) -> int | None:
    """Free space for an unprivileged user on the file system --out is (or would be) on."""
    path = Path(out).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def remove(folder: Path, out: str, created: bool) -> None:
    """Node 0, at the end: remove the session folder, and --out too when doctor created it and it is empty."""
    shutil.rmtree(folder, ignore_errors=True)
    if created:
        try:
            Path(out).rmdir()
        except OSError:
            pass
