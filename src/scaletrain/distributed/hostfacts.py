"""What one host of a multi-node launch looks like to `scaletrain doctor`: its addresses and network
interfaces, the interface the collectives will use, its Python/torch/scaletrain versions, its GPUs.
Read here (under distributed/) because part of it is the environment (GLOO_SOCKET_IFNAME and friends)."""

from __future__ import annotations

import fcntl
import os
import platform
import socket
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path

from scaletrain.errors import UserError

# For tests only: pretend this host runs other versions, e.g. SCALETRAIN_FAKE_VERSION="torch=2.0.0" (a
# comma list of python=, torch=, scaletrain=, nccl=), so a version mismatch can be made on one host.
FAKE_VERSION_ENV = "SCALETRAIN_FAKE_VERSION"
FAKEABLE = ("python", "torch", "scaletrain", "nccl")
SYS_NET = Path("/sys/class/net")


@dataclass
class Interface:
    name: str
    address: str | None  # its primary IPv4 address
    up: bool
    speed_mbps: int | None  # what the driver reports; None for virtual interfaces that report none


@dataclass
class HostFacts:
    """One node's facts, as they travel to node 0 (JSON) and appear in `--json`."""

    rank: int
    nnodes: int
    hostname: str
    address: str | None  # the address the route to node 0 leaves from (or --local-addr)
    route_iface: str | None  # the interface of that route
    comm_iface: str | None  # the interface gloo's collectives bind to
    comm_address: str | None
    comm_source: str  # how it was chosen: "GLOO_SOCKET_IFNAME" or "hostname"
    nccl_iface: str | None  # NCCL_SOCKET_IFNAME as set (None: NCCL chooses)
    interfaces: list[Interface]
    python: str
    torch: str
    scaletrain: str
    gpus: int
    nccl: str | None  # NCCL's version where torch has it (CUDA builds), else None
    cuda_visible_devices: str | None
    faked: list[str] = field(default_factory=list)  # versions replaced by SCALETRAIN_FAKE_VERSION

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> HostFacts:
        return cls(**{**d, "interfaces": [Interface(**i) for i in d["interfaces"]]})

    def label(self) -> str:
        return f"node {self.rank} ({self.address or self.hostname})"


def gather(rank: int, nnodes: int, master_addr: str, master_port: int, local_addr: str | None) -> HostFacts:
    """This host's facts (no network traffic: the route is asked of the kernel, not tried)."""
    import torch

    import scaletrain

    interfaces = list_interfaces()
    by_address = {i.address: i.name for i in interfaces if i.address}
    source = local_addr or route_source(master_addr, master_port)
    gloo_if = (os.environ.get("GLOO_SOCKET_IFNAME") or "").split(",")[0].strip() or None
    if gloo_if:
        comm_iface, comm_source = gloo_if, "GLOO_SOCKET_IFNAME"
        comm_address = next((i.address for i in interfaces if i.name == gloo_if), None)
    else:  # gloo binds to the address the hostname resolves to
        comm_source, comm_address = "hostname", _resolve(socket.gethostname())
        comm_iface = _iface_of(comm_address, by_address)
    versions = {"python": platform.python_version(), "torch": torch.__version__, "scaletrain": scaletrain.__version__,
                "nccl": _nccl_version(torch)}
    fakes = fake_versions(os.environ.get(FAKE_VERSION_ENV, ""))
    versions.update(fakes)
    return HostFacts(rank=rank, nnodes=nnodes, hostname=socket.gethostname(), address=source,
                     route_iface=_iface_of(source, by_address), comm_iface=comm_iface, comm_address=comm_address,
                     comm_source=comm_source, nccl_iface=os.environ.get("NCCL_SOCKET_IFNAME") or None,
                     interfaces=interfaces, python=versions["python"], torch=versions["torch"],
                     scaletrain=versions["scaletrain"], gpus=torch.cuda.device_count(), nccl=versions["nccl"],
                     cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), faked=sorted(fakes))


def fake_versions(text: str) -> dict[str, str]:
    """SCALETRAIN_FAKE_VERSION (`torch=2.0.0,python=3.9.0`) as a dict; for tests that need a mismatch."""
    fakes = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or name.strip() not in FAKEABLE or not value.strip():
            raise UserError(f"{FAKE_VERSION_ENV}={text!r}: write NAME=VERSION items separated by commas, NAME one "
                            f"of {', '.join(FAKEABLE)} (e.g. torch=2.0.0); it exists for tests, unset it otherwise")
        fakes[name.strip()] = value.strip()
    return fakes


def route_source(addr: str, port: int) -> str | None:
    """The local address the kernel would send from to reach addr (a UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((addr, port))
            return s.getsockname()[0]
    except OSError:
        return None  # no route, or a name that does not resolve


def list_interfaces() -> list[Interface]:
    return [Interface(name, _ipv4(name), _is_up(name), _speed(name)) for _, name in socket.if_nameindex()]


def _ipv4(name: str) -> str | None:
    """The interface's primary IPv4 address (SIOCGIFADDR), None when it has none."""
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _is_up(name: str) -> bool:
    try:
        return bool(int((SYS_NET / name / "flags").read_text(), 16) & 1)  # IFF_UP
    except (OSError, ValueError):
        return False


def _speed(name: str) -> int | None:
    """Mb/s as the driver reports it; virtual interfaces report -1 or refuse to be read."""
    try:
        speed = int((SYS_NET / name / "speed").read_text())
    except (OSError, ValueError):
        return None
    return speed if speed > 0 else None


def _resolve(name: str) -> str | None:
    try:
        return socket.gethostbyname(name)
    except OSError:
        return None


def _iface_of(address: str | None, by_address: dict[str, str]) -> str | None:
    if address is None:
        return None
    if address.startswith("127."):
        return by_address.get(address, "lo")  # the whole of 127/8 is the loopback's
    return by_address.get(address)


def _nccl_version(torch) -> str | None:
    if not torch.cuda.is_available():
        return None
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
