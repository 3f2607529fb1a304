"""Sharing one machine's cores among the testbed's hosts (pure): how many each gets, and which.

Hosts are namespaces of one machine, so they share its cores: left alone, every host's ranks would
size their threads for the whole machine, and H hosts x all cores would fight over the same cores.
By default each host gets max(1, cores // hosts) cores, and where they fit, its own CPUs:

    cpus 0 1 2 3 4 5 6 7, 3 hosts:  st-h0 0-1 | st-h1 2-3 | st-h2 4-5 | (6-7 unused)
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.errors import UserError


@dataclass(frozen=True)
class CoreShare:
    """Cores per host and, when they are pinned, each host's CPUs (None: not pinned)."""

    hosts: int
    machine_cpus: tuple[int, ...]
    per_host: int
    cpus: tuple[tuple[int, ...], ...] | None

    def env(self) -> dict[str, str]:
        """What every host's processes are told: SCALETRAIN_CORES, read by scaletrain.distributed.device.machine_cores()
        (the trainer's default --threads is that // its local ranks)."""
        return {"SCALETRAIN_CORES": str(self.per_host)}

    def describe(self) -> str:
        """One line saying the choice, e.g. `testbed: 2 hosts share 2 cores: 1 core per host (cpus 0 / 1)`."""
        cores = len(self.machine_cpus)
        where = (f"cpus {' / '.join(cpu_list(c) for c in self.cpus)}" if self.cpus is not None else
                 f"not pinned: {self.hosts} x {self.per_host} > {cores}, so hosts share cores")
        return (f"testbed: {self.hosts} hosts share {cores} core{'s' if cores != 1 else ''}: {self.per_host} "
                f"core{'s' if self.per_host != 1 else ''} per host ({where}); --cores-per-host to change")


def share_cores(machine_cpus: list[int] | tuple[int, ...], hosts: int, per_host: int | None = None) -> CoreShare:
    """max(1, cores // hosts) cores per host unless `per_host` says; disjoint CPU sets when hosts x
    per_host fit the machine's CPUs, else no pinning (each host still told its share)."""
    cpus = tuple(sorted(machine_cpus))
    if per_host is not None and per_host < 1:
        raise UserError(f"--cores-per-host must be at least 1 (got {per_host})")
    per = per_host or max(1, len(cpus) // hosts)
    pinned = (tuple(cpus[i * per:(i + 1) * per] for i in range(hosts)) if hosts * per <= len(cpus) else None)
    return CoreShare(hosts, cpus, per, pinned)


def cpu_list(cpus: tuple[int, ...]) -> str:
    """CPUs as ranges: (0, 1, 2, 5) -> `0-2,5`."""
    runs: list[list[int]] = []
    for cpu in cpus:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
