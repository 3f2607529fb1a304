"""Shared helpers: run the real `scaletrain` command (the path users take), or a training's ranks in-process
(tests/multirank.py), and read the run directory either writes."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import settings

# no per-example deadline: a property test's examples take what the machine gives them (a loaded CI runner, the
# other half of `-n 2`), and a slow example is not a wrong one (one was flagged at 200 ms under a benchmark)
settings.register_profile("scaletrain", deadline=None)
settings.load_profile("scaletrain")

ROOT = Path(__file__).resolve().parents[1]
# the machine's calibration cache of this session, never the user's (before any rank pool starts); one per pytest
# worker (`make test` runs two), which would otherwise inherit the controller's and race on it. Made once per
# process: a test module's `from conftest import ...` runs this file again.
_CACHE_TAG = f"scaletrain-test-cache-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-"
if _CACHE_TAG not in os.environ.get("SCALETRAIN_CACHE", ""):
    os.environ["SCALETRAIN_CACHE"] = tempfile.mkdtemp(prefix=_CACHE_TAG)


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


def losses(run_dir: Path, rank: int = 0) -> list[float]:
    """A run's training losses, step by step, as rank `rank` recorded them."""
    from scaletrain.analysis import load_records

    return [r["loss"] for r in load_records(run_dir)[rank]]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(Path(run_dir) / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]


# Equivalence (2 ranks = 1 rank, a pipeline = the whole model, the ring = the engine's all-reduce) is proven in
# float64 (`--precision fp64`), where it is exact: the two runs differ only in the order of their sums, ~1e-16
# per operation, which 44 SGD steps grow to 5e-14 relative (LeNet-5, 2 ranks against 1, measured on AVX2;
# docs/strategies.md). In float32 the same differences grew to 2e-2 here, by amounts that depend on the CPU's
# kernels, so no float32 tolerance holds on every CPU. A real aggregation error is far above this tolerance: a
# gradient off by one part in a million (test_train_ddp's control) moves the weights by ~1e-7.
FP64 = ("--precision", "fp64")
EXACT = {"rtol": 1e-9, "atol": 1e-12}


def assert_same_weights(a: Path, b: Path, **tol: float) -> None:
    """The two runs' final weights agree to EXACT (or `tol`), tensor by tensor."""
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], **(tol or EXACT), msg=name)


def one_error_line(capsys, *needles: str, quiet: bool = False) -> str:
    """What an in-process command printed on bad input: one `error:` line holding `needles`, no traceback (and,
    with `quiet`, nothing on stdout)."""
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("error: ") and "Traceback" not in captured.err
    for needle in needles:
        assert needle in lines[0], lines[0]
    if quiet:
        assert not captured.out.strip(), captured.out
    return lines[0]


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"


@pytest.fixture
def run_cli():
    return scaletrain


@pytest.fixture(scope="module", params=["in-process", pytest.param("cli", marks=pytest.mark.slow)])
def launch(request):
    """`train(*ARGV)`: `scaletrain train ARGV`, its summary.json read back. In-process, its ranks are the pool's
    processes running train/worker.run (seconds); `cli` is the real command and elastic agent (slow)."""
    if request.param == "cli":
        def train(*argv: str) -> dict:
            assert_ok(scaletrain("train", *argv))
            return summary(Path(argv[argv.index("--out") + 1]))
    else:
        import multirank

        pool = request.getfixturevalue("ranks")

        def train(*argv: str) -> dict:
            multirank.train(pool, *argv)
            return summary(Path(argv[argv.index("--out") + 1]))
    return train


@pytest.fixture(scope="session")
def ranks():
    """Processes that run a function as the ranks of a gloo group (tests/multirank.py), shared by the session."""
    from multirank import Ranks

    pool = Ranks()
    yield pool
    pool.close()
