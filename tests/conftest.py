"""Shared helpers: run the real `scaletrain` command (the path users take) and read its run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def scaletrain(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 600,
               module: str = "scaletrain") -> subprocess.CompletedProcess:
    """Run `python -m scaletrain ARGS` in a fresh process, as a user would from the shell."""
    full_env = {**os.environ, **(env or {})}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS"):
        full_env.pop(var, None)  # never let the test runner's environment turn a launch into a join
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd or ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(Path(run_dir) / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"


@pytest.fixture
def run_cli():
    return scaletrain
