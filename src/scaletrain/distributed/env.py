"""The process environment: the one place outside rank.py and device.py that reads or sets it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

# what torchrun and srun set in a worker: with these present, `scaletrain train` joins instead of launching
JOIN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS")


def child_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment (or `environ`) without the variables that would turn a launch into a join."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k not in JOIN_VARS}


def quiet_torch_cpp_logs() -> None:
    """c10d's C++ log lines (a page of stack frames for a node that cannot connect yet) would bury our
    one-line errors; torch reads the level when it loads, so call this before anything imports torch.
    Set TORCH_CPP_LOG_LEVEL=WARNING to see them."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")


def testbed_state_path() -> Path:
    """Where `scaletrain testbed up` records the hosts it built ($SCALETRAIN_TESTBED_STATE overrides)."""
    return Path(os.environ.get("SCALETRAIN_TESTBED_STATE", "/run/scaletrain-testbed.json"))


def cache_dir() -> Path:
    """scaletrain's per-user cache (the machine's calibration): `$XDG_CACHE_HOME/scaletrain`, else
    `~/.cache/scaletrain`; `$SCALETRAIN_CACHE` overrides both (tests, shared clusters)."""
    if os.environ.get("SCALETRAIN_CACHE"):
        return Path(os.environ["SCALETRAIN_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "scaletrain"


def agent_store() -> tuple[str, int, int] | None:
    """(host, port, restart attempt) of the elastic agent's store that this worker's ranks meet in, or None
    when the agent shares none (then rank 0 hosts a store of its own: env://)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
            int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0))
