"""What node 0 has gathered from every node, what the user expects, and a check's result: plain data,
so the checks are pure functions over it and tests build it by hand."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from scaletrain.distributed.hostfacts import HostFacts

STATUSES = ("pass", "warn", "fail")


@dataclass(frozen=True)
class Expect:
    """The thresholds the measurements are held to (from the flags)."""

    link_rate: str | None = None
    """--link-rate as given (e.g. 1gbit); None: pairs are compared with the fastest pair."""
    link_bytes_per_s: float | None = None
    min_link_fraction: float = 0.3
    """A pair fails below this fraction of the declared rate (or of the fastest pair)."""
    clock_tolerance_s: float = 1.0
    min_free_bytes: int = 1_000_000_000
    gpus_per_node: int = 0
    """0: none expected (a node without GPUs passes); N: every node must see N GPUs, and NCCL."""


@dataclass
class Gathered:
    """Everything the checks look at. Node ranks key every dict; each measurement is missing for a node
    that never took part in it (it did not come, or stopped answering)."""

    nnodes: int
    master_addr: str
    master_port: int
    timeout_s: float
    probe_port: int | None = None
    """The second port node 0 listened on, to tell a blocked rendezvous port from an unreachable host
    (None: it could not listen there, so the two cannot be told apart)."""
    master_error: str | None = None
    """Node 0 could not host the rendezvous (port in use, an address that is not its own)."""
    facts: dict[int, HostFacts] = field(default_factory=dict)
    members: list[int] = field(default_factory=list)
    """Nodes that reached the rendezvous port within the timeout: the ones measured."""
    probed: list[int] = field(default_factory=list)
    """Nodes that reached node 0 only on the probe port (their facts came that way)."""
    late: list[int] = field(default_factory=list)
    """Nodes that reached the rendezvous port after the timeout, when the others had started without them."""
    strays: list[dict] = field(default_factory=list)
    """Nodes whose --node-rank was taken or out of range: {rank, nnodes, hostname, address, why}."""
    lost: dict[int, str] = field(default_factory=dict)
    """Members that stopped answering, and during what."""
    clock: dict[int, dict] = field(default_factory=dict)
    """{offset_s, rtt_s}: the node's clock minus node 0's, from the best of a few store round trips."""
    rundir: dict[int, dict] = field(default_factory=dict)
    """{path, wrote, error, sees: [ranks whose file it saw], free_bytes}."""
    pairs: list[dict] = field(default_factory=list)
    """{a, b, status: ok|no-connection|timeout|not-run, bytes, seconds: [..], bytes_per_s, error}."""

    def label(self, rank: int) -> str:
        facts = self.facts.get(rank)
        return facts.label() if facts else f"node {rank}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["facts"] = {str(r): f.to_dict() for r, f in sorted(self.facts.items())}
        for key in ("lost", "clock", "rundir"):
            d[key] = {str(r): v for r, v in sorted(d[key].items())}
        return d


@dataclass
class Check:
    """One row of the table: a check, the hosts it concerns, pass/warn/fail, what was measured, the fix."""

    check: str
    status: str
    hosts: str
    value: str
    fix: str | None = None

    def __post_init__(self) -> None:
        assert self.status in STATUSES, self.status
