"""A growing JSON-lines file read a little at a time: only the bytes written since the last read.

A run appends to its files while we read them, and a rank's 64 KiB write buffer cuts lines anywhere:
the bytes after the last newline are kept until the rest of their line arrives. A file replaced by
another (a resume rewrites metrics files atomically) or made shorter is read again from its start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHUNK = 4 << 20  # bytes read at once: a long file's first read is parsed a chunk at a time, not held whole


@dataclass
class JsonlTail:
    """The complete new lines of `path` on each `read()` (at most CHUNK bytes of them: `behind` says whether
    more is there to read); on the first read, from `skip_to` bytes before the end."""

    path: Path
    skip_to: int | None = None  # on the first read start this many bytes before the end (None: the start)
    damaged: int = 0  # complete lines that were not valid JSON (left out)
    mtime: float | None = None  # the file's modification time at the last read
    behind: bool = False  # the file held more than the last read took
    _offset: int = 0
    _pending: bytes = b""
    _ident: tuple[int, int] | None = None
    _first: bool = field(default=True, repr=False)

    def read(self) -> tuple[list[dict[str, Any]], bool]:
        """(new records, whether the file was replaced or cut since the last read: start over)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return [], False
        ident = (st.st_dev, st.st_ino)
        restarted = self._ident is not None and (ident != self._ident or st.st_size < self._offset)
        if restarted:
            self._offset, self._pending, self.damaged = 0, b"", 0
        self._ident, self.mtime = ident, st.st_mtime
        cut_head = False
        if self._first and self.skip_to is not None and st.st_size > self.skip_to:
            self._offset, cut_head = st.st_size - self.skip_to, True  # the first line read is a fragment
        self._first = False
        self.behind = st.st_size - self._offset > CHUNK
        if st.st_size == self._offset:
            return [], restarted
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read(min(CHUNK, st.st_size - self._offset))  # what exists now; more may come meanwhile
        if cut_head:  # drop the fragment before the first newline (none: one long line; read it all)
            start = data.find(b"\n") + 1
            if start == 0:
                self._offset = 0
                return self.read()
            self._offset += start
            data = data[start:]
        self._offset += len(data)
        lines = (self._pending + data).split(b"\n")
        self._pending = lines.pop()  # b"" when the data ended with a newline, else a line being written
        records = []
        for line in lines:
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except ValueError:
                self.damaged += 1
        return records, restarted

    @property
    def partial(self) -> bool:
        """A last line without its newline yet: being written, or cut off by a killed process."""
        return bool(self._pending.strip())
