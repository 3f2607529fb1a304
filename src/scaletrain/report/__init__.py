"""Reports of runs and studies, rebuilt from their files: tables, PNG plots, one self-contained HTML page."""

from scaletrain.report.build import write_run_report, write_study_report

__all__ = ["write_run_report", "write_study_report"]
