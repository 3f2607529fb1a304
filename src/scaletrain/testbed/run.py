"""Running a command on every testbed host at once: one launch agent per host, torchrun-style."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time

from scaletrain.distributed.env import child_env
from scaletrain.errors import UserError
from scaletrain.testbed.cores import CoreShare
from scaletrain.testbed.plan import IFACE, Testbed

MULTI_NODE = ("train", "commbench", "doctor")  # scaletrain commands that take --nnodes/--node-rank


def resolve_command(command: list[str]) -> list[str]:
    """The command as every host runs it. A bare `scaletrain` is the one this command was started from (this
    Python's `-m scaletrain`: `.venv/bin/scaletrain` is then found without being on PATH, and no other
    scaletrain on PATH is taken for it); any other program must be on PATH or a path to an executable,
    refused here rather than failing to start on every host."""
    if command[0] == "scaletrain":
        return [sys.executable, "-m", "scaletrain", *command[1:]]
    if shutil.which(command[0]) is None:
        raise UserError(f"testbed run: `{command[0]}` is neither a program on PATH nor an executable file: give "
                        "its full path (or install it)")
    return list(command)


def host_command(tb: Testbed, i: int, command: list[str], port: int) -> list[str]:
    """The argv host i runs: `ip netns exec`, and for scaletrain train/commbench its node flags."""
    argv = list(command)
    if _scaletrain_subcommand(argv) in MULTI_NODE:
        argv += ["--nnodes", str(tb.hosts), "--node-rank", str(i), "--master-addr", tb.address(0),
                 "--master-port", str(port), "--local-addr", tb.address(i)]
    return ["ip", "netns", "exec", tb.host(i), *argv]


def _scaletrain_subcommand(argv: list[str]) -> str | None:
    for j, word in enumerate(argv):
        if os.path.basename(word) == "scaletrain" or (word == "-m" and j + 1 < len(argv) and argv[j + 1] == "scaletrain"):
            rest = argv[j + 1:] if word != "-m" else argv[j + 2:]
            return rest[0] if rest else None
    return None


def host_env(tb: Testbed, i: int, share: CoreShare | None = None) -> dict[str, str]:
    """Collectives must use the testbed link, not whatever the hostname resolves to; with `share`, the
    host's processes are told their share of the cores (SCALETRAIN_CORES)."""
    env = child_env()
    return {**env, "GLOO_SOCKET_IFNAME": IFACE, "NCCL_SOCKET_IFNAME": IFACE, "TP_SOCKET_IFNAME": IFACE,
            "SCALETRAIN_TESTBED_HOST": str(i), "SCALETRAIN_TESTBED_HOSTS": str(tb.hosts),
            "SCALETRAIN_TESTBED_MASTER": tb.address(0), **(share.env() if share else {})}


def run_on_hosts(tb: Testbed, command: list[str], share: CoreShare | None = None) -> int:
    """Start the command on every host, wait; when one fails (or on Ctrl-C) stop the others. Exit code of
    the first failure, else 0. With `share`, each host is told its cores, and pinned to its CPUs where
    the share has them (its processes inherit the affinity)."""
    port = random.randint(20000, 59000)
    procs = [subprocess.Popen(host_command(tb, i, command, port), env=host_env(tb, i, share), start_new_session=True,
                              preexec_fn=_pin(share.cpus[i]) if share and share.cpus else None)
             for i in range(tb.hosts)]
    code = 0
    try:
        while any(p.poll() is None for p in procs):
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed:
                code = failed[0]
                break
            time.sleep(0.1)
        else:
            code = next((p.returncode for p in procs if p.returncode), 0)
    except KeyboardInterrupt:
        code = 130
    finally:
        _stop(procs)
    return code


def _pin(cpus: tuple[int, ...]):
    """Runs in the child between fork and exec: this host's processes only get these CPUs."""
    return lambda: os.sched_setaffinity(0, cpus)


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each host's process group (it runs in its own session), SIGKILL what is left after 10 s."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
