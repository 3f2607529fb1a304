"""Reports of runs and studies, rebuilt from their files: tables, PNG plots, one self-contained HTML page.

The builders are imported on first use: the trainer's console imports the package's modules it shares with the
report, and must not pull in matplotlib. Numbers as people read them: scaletrain/fmt.py."""

from __future__ import annotations

__all__ = ["write_run_report", "write_study_report"]


def __getattr__(name: str):
    if name in __all__:
        from scaletrain.report import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
