"""Building, inspecting and removing the virtual cluster with `ip` and `tc` (root only)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from scaletrain.distributed.env import testbed_state_path
from scaletrain.errors import UserError
from scaletrain.rundir import write_json_atomic
from scaletrain.testbed.plan import IFACE, SWITCH, Testbed, down_commands, has_delay, ours, up_commands

STATE = testbed_state_path()


def require_root() -> None:
    if os.geteuid() != 0:
        raise UserError("scaletrain testbed needs root (it creates network namespaces): run it as root, "
                        "e.g. with sudo")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise UserError(f"scaletrain testbed needs the `{tool}` command: install iproute2")


def _run(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def namespaces() -> list[str]:
    """Names of this machine's network namespaces."""
    out = _run(["ip", "netns", "list"])
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def up(tb: Testbed) -> None:
    """Build the testbed; on any failure remove what was built and say what failed."""
    require_root()
    existing = ours(namespaces())
    if existing:
        raise UserError(f"a testbed (or part of one) is already up: namespaces {', '.join(existing)}: "
                        "run `scaletrain testbed down` to remove it first")
    try:
        for argv in up_commands(tb):
            if argv[:3] == ["ip", "netns", "add"] and argv[3] != SWITCH and has_delay(tb.delay):
                _require_netem()
            _run(argv)
        STATE.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(STATE, tb.to_dict())
    except BaseException as e:  # also Ctrl-C: never leave half a testbed behind
        down()
        if isinstance(e, RuntimeError):
            raise UserError(f"could not build the testbed: {e}") from None
        raise


def _require_netem() -> None:
    """netem (the only qdisc that delays) is a kernel module some kernels lack: probe it in the switch."""
    probe = subprocess.run(["tc", "-n", SWITCH, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise UserError("this kernel has no netem qdisc (sch_netem), so links cannot be delayed: use --delay 0 "
                        "(links are then rate-limited with a token bucket)")
    subprocess.run(["tc", "-n", SWITCH, "qdisc", "del", "dev", "lo", "root"], capture_output=True)


def down() -> list[str]:
    """Delete every testbed namespace (by name, with or without a state file); returns what was removed."""
    require_root()
    removed = ours(namespaces())
    # hosts first, the switch (with the bridge) last; errors for already-gone ones are ignored
    for argv in down_commands(sorted(removed, key=lambda ns: ns == SWITCH)):
        subprocess.run(argv, capture_output=True)
    STATE.unlink(missing_ok=True)
    left = ours(namespaces())
    if left:
        raise UserError(f"could not remove namespaces {', '.join(left)}: a process may still run in them; "
                        "stop it and run `scaletrain testbed down` again")
    return removed


def current() -> Testbed | None:
    """The testbed that is up (from its state file), or None; a half-built one is an error."""
    present = ours(namespaces())
    if not STATE.is_file():
        if present:
            raise UserError(f"namespaces {', '.join(present)} exist without a testbed record (a half-built "
                            "or foreign testbed): run `scaletrain testbed down` to clean up")
        return None
    data = json.loads(STATE.read_text())
    tb = Testbed(data["hosts"], data["rate"], data["delay"])
    missing = [ns for ns in tb.namespaces() if ns not in present]
    if missing:
        raise UserError(f"the testbed is half there (missing {', '.join(missing)}): run `scaletrain testbed "
                        "down`, then `testbed up` again")
    return tb


def tx_bytes(tb: Testbed) -> dict[str, int]:
    """Bytes each host has sent on its link (the interface's own counter)."""
    return {tb.host(i): int(_run(["ip", "netns", "exec", tb.host(i), "cat",
                                  f"/sys/class/net/{IFACE}/statistics/tx_bytes"]).strip())
            for i in range(tb.hosts)}


def qdisc(tb: Testbed, i: int) -> str:
    return _run(["tc", "-n", tb.host(i), "qdisc", "show", "dev", IFACE]).strip().splitlines()[0]
