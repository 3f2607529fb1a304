"""What a virtual cluster is made of, as data: names, addresses and the `ip`/`tc` commands (pure).

    namespace st-sw:   bridge st-br ── veth st-p0 ─┐   ... one port per host
    namespace st-h0:   eth0 10.77.0.1/24 ──────────┘   (the other end of st-p0)
    namespace st-h1:   eth0 10.77.0.2/24 ── st-p1 ── st-br

Every link is shaped in both directions: `tc` on a host's eth0 limits what it sends, `tc` on its
switch port limits what it receives (netem with a delay, a token bucket without one). Nothing is created outside the namespaces named here, so
tearing down is deleting them.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from scaletrain.errors import UserError

PREFIX = "st-"
SWITCH = f"{PREFIX}sw"
BRIDGE = f"{PREFIX}br"
SUBNET = "10.77.0"
IFACE = "eth0"
BUCKET_S = 0.25e-3  # a token bucket's depth in seconds at the link's rate (shape)
BUCKET_MIN_BYTES = 4096


@dataclass(frozen=True)
class Testbed:
    hosts: int
    rate: str
    delay: str

    def host(self, i: int) -> str:
        return f"{PREFIX}h{i}"

    def port(self, i: int) -> str:
        return f"{PREFIX}p{i}"

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def namespaces(self) -> list[str]:
        return [SWITCH, *(self.host(i) for i in range(self.hosts))]

    def to_dict(self) -> dict:
        return {**asdict(self), "namespaces": self.namespaces(),
                "addresses": {self.host(i): self.address(i) for i in range(self.hosts)}}


_DELAY = re.compile(r"^\d+(\.\d+)?(us|ms|s)$")


def make_testbed(hosts: int, rate: str, delay: str) -> Testbed:
    if not 2 <= hosts <= 32:
        raise UserError(f"--hosts must be 2..32 (got {hosts})")
    rate_bytes(rate)
    rate = re.sub(r"\s+", "", rate).lower()  # as tc reads it
    if not _DELAY.match(delay):
        raise UserError(f"--delay {delay!r} is not a tc time: write e.g. 0.2ms, 50us")
    return Testbed(hosts, rate, delay)


def rate_bytes(rate: str, flag: str = "--rate") -> float:
    """--rate (tc's bits per second: `1gbit`, `100mbit`) in bytes per second, by the one rate parser."""
    from scaletrain.units import parse_rate

    return parse_rate(rate, flag)


def has_delay(delay: str) -> bool:
    return float(re.match(r"[\d.]+", delay).group(0)) > 0


def shape(rate: str, delay: str) -> list[str]:
    """The qdisc of one direction of a link: netem when there is a delay to add (rate too), otherwise a
    token bucket (tbf, in every kernel) with a 50 ms queue and a bucket as small as keeps the rate: 0.25 ms at
    the rate, at least 4 KB. A link idle between steps fills its bucket, and the next message's first bucketful
    passes at the speed of memory: a wire has no such credit (a 4 ms bucket made a parameter server's 2 x 248 KB
    exchange over 200 Mbit/s 30% faster than the rate; a 4 KB one at 1 Gbit/s held it to 67% of the rate)."""
    if has_delay(delay):
        return ["netem", "delay", delay, "rate", rate, "limit", "10000"]
    burst = max(BUCKET_MIN_BYTES, int(rate_bytes(rate) * BUCKET_S))
    return ["tbf", "rate", rate, "burst", str(burst), "latency", "50ms"]


def up_commands(tb: Testbed) -> list[list[str]]:
    """The commands that build the testbed, in order (each `ip`/`tc` argv)."""
    cmds = [["ip", "netns", "add", SWITCH],
            ["ip", "-n", SWITCH, "link", "add", "name", BRIDGE, "type", "bridge"],
            ["ip", "-n", SWITCH, "link", "set", BRIDGE, "up"]]
    for i in range(tb.hosts):
        host, port = tb.host(i), tb.port(i)
        cmds += [
            ["ip", "netns", "add", host],
            ["ip", "-n", host, "link", "set", "lo", "up"],
            ["ip", "-n", SWITCH, "link", "add", "name", port, "type", "veth", "peer", "name", IFACE, "netns", host],
            ["ip", "-n", SWITCH, "link", "set", port, "master", BRIDGE],
            ["ip", "-n", SWITCH, "link", "set", port, "up"],
            ["ip", "-n", host, "addr", "add", f"{tb.address(i)}/24", "dev", IFACE],
            ["ip", "-n", host, "link", "set", IFACE, "up"],
            ["tc", "-n", host, "qdisc", "add", "dev", IFACE, "root", *shape(tb.rate, tb.delay)],
            ["tc", "-n", SWITCH, "qdisc", "add", "dev", port, "root", *shape(tb.rate, tb.delay)],
        ]
    return cmds


def down_commands(namespaces: list[str]) -> list[list[str]]:
    """Deleting a namespace deletes its interfaces, the veth peers and the bridge with them."""
    return [["ip", "netns", "delete", ns] for ns in namespaces]


def ours(namespaces: list[str]) -> list[str]:
    """The namespaces on this machine that a testbed made (by name)."""
    return [ns for ns in namespaces if ns == SWITCH or re.fullmatch(rf"{PREFIX}h\d+", ns)]
