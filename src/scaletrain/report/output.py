"""Where reports go: refuse an unusable location up front, and turn a failed write into one line.

Permissions alone cannot say whether a place is writable (root passes every access check, yet cannot
write into /proc), so the checks create and remove a temporary file where the output will go.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from scaletrain.errors import UserError


def _probe(folder: Path) -> str | None:
    """None when a file can be created in `folder`, else why not (the system's words)."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return "permission denied"
    try:
        fd, tmp = tempfile.mkstemp(prefix=".scaletrain-probe.", dir=folder)
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    Path(tmp).unlink(missing_ok=True)
    return None


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_page_path(path: str | Path, flag: str) -> Path:
    """A file path a page can be written to (its folder exists and takes files), else a UserError."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{flag} {path} is a directory: give a file path such as {path / 'compare.html'}")
    folder = path.absolute().parent
    if not folder.is_dir():
        blocker = _nearest_existing(folder)
        if blocker.exists() and not blocker.is_dir():
            raise UserError(f"{flag} {path}: {blocker} is a file, not a folder; write the page elsewhere")
        raise UserError(f"{flag} {path}: its folder does not exist; create it or write the page elsewhere")
    why = _probe(folder)
    if why:
        raise UserError(f"{flag} {path}: cannot create a file in {folder} ({why}); write the page elsewhere")
    return path


def check_report_dir(root: Path, page: str, plots: str) -> None:
    """ROOT/page and ROOT/plots/ can be (re)written: say so before anything is drawn, not half-way."""
    fix = "copy the directory somewhere you can write and report the copy"
    if (root / page).is_dir():
        raise UserError(f"cannot write {root / page}: it is a directory; move it away, or {fix}")
    if (root / plots).exists() and not (root / plots).is_dir():
        raise UserError(f"cannot write {root / plots}/: it is a file; move it away, or {fix}")
    for folder in (root, root / plots):
        why = _probe(folder) if folder.is_dir() else None
        if why:
            raise UserError(f"cannot write {page} and {plots}/ in {root} ({why}): {fix}")


@contextlib.contextmanager
def writing(target: str | Path) -> Iterator[None]:
    """A write that fails after the checks (disk full, a folder removed meanwhile) is one line, not a traceback."""
    try:
        yield
    except OSError as e:
        where = f" ({e.filename})" if e.filename else ""
        raise UserError(f"cannot write {target}{where}: {e.strerror or e}; free space or write elsewhere") from None
