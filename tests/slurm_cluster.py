"""A real SLURM on this machine for the tests: munged with its own key, slurmctld and one slurmd per host,
each a foreground daemon this process starts and stops by PID. Nothing outside its temp dir is touched
(ports are picked free, SLURM_CONF points at its own slurm.conf); where it cannot run, `SkipCluster`
says why in one line (the daemon's last log line when one fails)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

NEEDED = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "squeue", "scancel")
PARTITION = "debug"
START_TIMEOUT_S = 60.0
REQUEUE_SETTLE_S = 5.0


class SkipCluster(Exception):
    """Why no cluster can run here, in one line."""


@dataclass(frozen=True)
class Host:
    """A slurmd: its node name and address, and the command prefix that runs a process on it (a testbed
    host's `ip netns exec st-hN`; nothing for this machine)."""

    name: str
    addr: str
    prefix: tuple[str, ...] = ()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _last_line(path: Path, fallback: str = "") -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    return lines[-1] if lines else fallback or f"(nothing in {path.name})"


def missing_tools() -> list[str]:
    return [t for t in NEEDED if shutil.which(t) is None]


def node_line(name: str) -> str:
    """This machine's real layout as `slurmd -C` reports it (CPUs, sockets, cores, threads, memory)."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30).stdout
    first = next((line for line in out.splitlines() if line.startswith("NodeName=")), None)
    if first is None:
        raise SkipCluster(f"`slurmd -C` printed no node line: {out.strip()[:200]}")
    return re.sub(r"^NodeName=\S+", f"NodeName={name}", first.strip())


@dataclass
class Cluster:
    """A running SLURM: `env` (SLURM_CONF) for every client command; the hosts' daemons run until stop()."""

    root: Path
    hosts: Sequence[Host]
    partition: str = PARTITION
    procs: list[tuple[str, subprocess.Popen, Path]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- set-up ---------------------------------------------------------------------------------------------

    def write_conf(self, layout: str, extra: str = "") -> None:
        r = self.root
        for d in ("state", "spool"):
            (r / d).mkdir(exist_ok=True)
        nodes = "\n".join(f"{layout.replace('NodeName=X', f'NodeName={h.name}')} NodeAddr={h.addr} State=UNKNOWN"
                          for h in self.hosts)
        names = ",".join(h.name for h in self.hosts)
        # slurmctld must run on the machine its SlurmctldHost names (the first host's namespace shares its name)
        self.conf.write_text(f"""\
ClusterName=scaletrain-test
SlurmctldHost={socket.gethostname()}({self.hosts[0].addr})
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r / 'munge.sock'}
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}/%n
SlurmctldPidFile={r / 'slurmctld.pid'}
SlurmdPidFile={r / 'slurmd-%n.pid'}
SlurmctldLogFile={r / 'slurmctld.log'}
SlurmdLogFile={r / 'slurmd-%n.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=15
MinJobAge=3600
SlurmdTimeout=60
{extra}
{nodes}
PartitionName={self.partition} Nodes={names} Default=YES MaxTime=INFINITE State=UP
""")

    def _start(self, name: str, argv: list[str], log: Path, prefix: Sequence[str] = ()) -> None:
        out = open(self.root / f"{name}.out", "w")
        proc = subprocess.Popen([*prefix, *argv], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=self.env, start_new_session=True)
        out.close()
        self.procs.append((name, proc, log))

    def _check_alive(self) -> None:
        for name, proc, log in self.procs:
            if proc.poll() is not None:
                raise SkipCluster(f"{name} exited with {proc.returncode} at start: "
                                  f"{_last_line(log, _last_line(self.root / f'{name}.out'))}")

    def start(self) -> None:
        r = self.root
        key = r / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._start("munged", ["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={r / 'munge.sock'}",
                               f"--pid-file={r / 'munged.pid'}", f"--seed-file={r / 'munged.seed'}",
                               f"--log-file={r / 'munged.log'}"], r / "munged.out")  # -F: it logs to stderr
        self._wait(lambda: (r / "munge.sock").exists(), "munged's socket", r / "munged.out")
        ctld = self.hosts[0]
        self._start("slurmctld", ["slurmctld", "-D", "-i"], r / "slurmctld.log", ctld.prefix)
        self._wait(lambda: self.client(["scontrol", "ping"], check=False).returncode == 0, "slurmctld",
                   r / "slurmctld.log")
        for h in self.hosts:
            self._start(f"slurmd-{h.name}", ["slurmd", "-D", "-N", h.name], r / f"slurmd-{h.name}.log", h.prefix)
        self._wait(self._all_idle, "the nodes idle in sinfo", r / f"slurmd-{self.hosts[-1].name}.log")

    def _all_idle(self) -> bool:
        out = self.client(["sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout
        states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
        return all(states.get(h.name) == "idle" for h in self.hosts)

    def _wait(self, ready, what: str, log: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            self._check_alive()
            if ready():
                return
            time.sleep(0.5)
        raise SkipCluster(f"{what} not ready within {START_TIMEOUT_S:g} s: {_last_line(log)}")

    # -- use ------------------------------------------------------------------------------------------------

    def client(self, argv: list[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """A SLURM client command, where the controller is reached (the first host)."""
        proc = subprocess.run([*self.hosts[0].prefix, *argv], capture_output=True, text=True, env=self.env,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job`'s fields (JobState, Reason, Restarts, ExitCode, ...)."""
        out = self.client(["scontrol", "show", "job", "-o", job_id]).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait_job(self, job_id: str, until: Sequence[str] = ("COMPLETED",), deadline_s: float = 300,
                 release: bool = True, stop_at=None) -> dict[str, str]:
        """Poll until the job's state is one of `until` (or a final state), or `stop_at(fields)` is true.
        A requeued job waits for a BeginTime about 2 minutes ahead; `release` moves it to now."""
        final = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                 "DEADLINE", "PREEMPTED"}
        end = time.monotonic() + deadline_s
        fields: dict[str, str] = {}
        held_since = None
        while time.monotonic() < end:
            fields = self.job(job_id)
            state = fields.get("JobState", "")
            if state in until or state in final or (stop_at is not None and stop_at(fields)):
                return fields
            held = state == "PENDING" and fields.get("Reason") == "BeginTime"
            held_since = (held_since or time.monotonic()) if held else None
            # not at once: slurmd refuses a start whose credential dates from the second the requeue revoked
            # the last one ("Job credential revoked"); SLURM's own delay is there for that
            if release and held and time.monotonic() - held_since > REQUEUE_SETTLE_S and self._all_idle():
                self.client(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=False)
            time.sleep(1)
        self.client(["scancel", job_id], check=False)
        raise AssertionError(f"job {job_id} not {'/'.join(until)} within {deadline_s:g} s: {fields}")

    def cancel_all(self, deadline_s: float = 60) -> None:
        """Cancel every job of this cluster and wait until the queue is empty (their processes gone)."""
        out = self.client(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
        if out:
            self.client(["scancel", *out], check=False)
        end = time.monotonic() + deadline_s
        while time.monotonic() < end and self.client(["squeue", "-h", "-o", "%i"], check=False).stdout.strip():
            time.sleep(1)

    # -- tear-down ------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Every daemon this cluster started, by PID, last started first: SIGTERM, SIGKILL after 15 s."""
        for _, proc, _ in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(15)
        self.procs.clear()


def start_cluster(root: Path, hosts: Sequence[Host] | None = None) -> Cluster:
    """Start munged, slurmctld and a slurmd per host (this machine alone by default); SkipCluster when they
    cannot run. On any failure what was started is stopped again."""
    if os.geteuid() != 0:
        raise SkipCluster("the SLURM tests start munged, slurmctld and slurmd as root: run `make test-slurm` as root")
    missing = missing_tools()
    if missing:
        raise SkipCluster(f"SLURM is not installed ({', '.join(missing)} missing): `make test-slurm` installs "
                          "slurmctld, slurmd, slurm-client and munge")
    if hosts is None:
        name = socket.gethostname()
        try:
            socket.gethostbyname(name)
        except OSError:
            raise SkipCluster(f"this machine's name {name!r} does not resolve: the node would not be found") from None
        hosts = [Host(name, "127.0.0.1")]
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # munged wants its socket's folder reachable by all
    cluster = Cluster(root, hosts)
    try:
        cluster.write_conf(node_line("X"))
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


# -- two hosts: network namespaces joined by a shaped link, one slurmd in each ---------------------------------

NETNS_PREFIX = "stsl-"
"""This test's own namespaces (not the testbed's st-*, which another run may be using)."""
IFACE = "eth0"


def _ip(*argv: str) -> None:
    proc = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise SkipCluster(f"`ip {' '.join(argv)}` failed: {proc.stderr.strip()}")


@contextlib.contextmanager
def two_hosts(rate: str = "1gbit") -> Iterator[list[Host]]:
    """Hosts h0 (10.78.0.1) and h1 (10.78.0.2) as network namespaces, joined by one veth link shaped like a
    testbed link in both directions (scaletrain.testbed.plan.shape); deleted again on the way out, also on
    failure. Processes enter them with nsenter, which (unlike `ip netns exec`) keeps /sys and its cgroups,
    which slurmd needs."""
    from scaletrain.testbed.plan import shape

    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("nsenter") is None:
        raise SkipCluster("two SLURM hosts need root, iproute2 and nsenter")
    names = [f"{NETNS_PREFIX}h0", f"{NETNS_PREFIX}h1"]
    existing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    if set(names) & set(existing):
        raise SkipCluster(f"namespaces {' '.join(names)} exist already (an earlier run killed before its clean-up?): "
                          f"`ip netns delete {' '.join(names)}`")
    hosts = [Host(f"h{i}", f"10.78.0.{i + 1}", ("nsenter", f"--net=/run/netns/{ns}")) for i, ns in enumerate(names)]
    try:
        for ns in names:
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", names[0], "link", "add", IFACE, "type", "veth", "peer", "name", IFACE, "netns", names[1])
        for ns, h in zip(names, hosts):
            _ip("-n", ns, "addr", "add", f"{h.addr}/24", "dev", IFACE)
            _ip("-n", ns, "link", "set", IFACE, "up")
            subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", IFACE, "root", *shape(rate, "0ms")], check=True,
                           capture_output=True, timeout=30)
        yield hosts
    finally:
        for ns in names:
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=30)


def tx_bytes(host: Host) -> int:
    """Bytes the host has sent over its link (the interface's own counter)."""
    ns = host.prefix[-1].rsplit("/", 1)[-1]  # `ip netns exec` mounts the namespace's own /sys, nsenter does not
    out = subprocess.run(["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{IFACE}/statistics/tx_bytes"],
                         capture_output=True, text=True, timeout=30).stdout
    return int(out.strip() or 0)
