"""The `scaletrain train` command a job runs on every node, spelt out from train settings."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from scaletrain.config.flags import as_flags

NODE_SET = ("nnodes", "node_rank", "master_addr", "master_port", "local_addr")
"""Set by the batch script from the allocation on every node; refused as train flags of `scaletrain slurm`."""
JOB_SET = ("out", "resume")
"""Set by the batch script: the run directory, and --resume on a start that finds a checkpoint."""


def train_flags(settings: Mapping[str, Any]) -> list[str]:
    """`--key value` for each setting (`--flag`/`--no-flag` for a switch), in the order given; None, and what
    the batch script sets on each node and start, are left out."""
    return as_flags(settings, skip=(*NODE_SET, *JOB_SET))


def train_argv(settings: Mapping[str, Any], config: str | None = None) -> list[str]:
    """This Python (the same environment on a shared file system) running `scaletrain train` with the settings
    (after `--config FILE`, which they override). A job's output is a file: its progress comes as plain lines
    there (console/progress.py), not as a bar."""
    flags = ["--config", config] if config else []
    return [sys.executable, "-m", "scaletrain", "train", *flags, *train_flags(settings)]
