"""Hardware profiles: a node as its data sheet describes it, and compute priced by a roofline (docs/perf.md).

`scaletrain predict --hardware FILE` prices a step on a machine the user does not have from a small TOML
file instead of a calibration measured on the machine (profiles/*.toml ship for common nodes):

    format = 1
    name = "DGX A100 80GB"
    source = "NVIDIA A100 datasheet, DGX A100 datasheet"     # what the numbers rest on
    [device]                       kind = "cuda" | "cpu", count (per node), memory_bytes,
                                   memory_bandwidth_bytes_per_s
    [device.peak_flops]            per device, dense (no sparsity): fp32, tf32, bf16, fp16 (those it has)
    [efficiency]                   optional fractions of peak reached in practice, in (0, 1]:
                                   compute (fp32), tf32, tensor (fp16/bf16), memory, network, host_link
                                   (defaults: Efficiency, fitted to published ResNet-50 throughputs)
    [links]                        intra_node_bytes_per_s (per device, per direction),
                                   inter_node_bytes_per_s (per node, its NICs together),
                                   intra_node_latency_s, inter_node_latency_s
    [host]                         optional: cpu_cores (physical, per node), pcie_bytes_per_s (one
                                   device's link to the host, per direction: the batch's copy),
                                   loader_samples_per_s_per_core (one core's rate through read, decode,
                                   augment and collate at the run's image size: `calibrate --only loader`)

Kernels doing F FLOPs and moving B bytes of device memory take (`roofline_time`)

    t = max(F / (peak_flops[precision] x its efficiency), B / (memory_bandwidth x memory)) + kernels x launch

and a link moving S bytes t = alpha + S beta, beta = 1 / (bytes_per_s x network) (`link`, the alpha and
beta of perf/alphabeta.py). The efficiencies are fitted to published throughputs of one model on two GPU
generations, not measured on the machine; `describe` says so.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from scaletrain.errors import UserError

FORMAT = 1
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
KINDS = ("cuda", "cpu")
# What one kernel costs beyond its roofline time, whatever its size: on CUDA the launch and eager
# dispatch of a small kernel (~5 us); on a CPU the eager dispatch of an op (a few us). Orders of
# magnitude, not measurements; a calibration measures the real figure.
LAUNCH_OVERHEAD_S = {"cuda": 5e-6, "cpu": 2e-6}


@dataclass(frozen=True, kw_only=True)
class Efficiency:
    """Fractions of the data sheet's peaks reached in practice, each in (0, 1].

    The defaults are fitted (benchmarks/fit_datasheet.py, 2026-11-25) to NVIDIA's published ResNet-50 v1.5
    training throughputs on one A100 (TF32, AMP) and one V100 (FP32, AMP) (perf/published/): the FLOP rates
    an eager PyTorch step reaches per unit, with its memory-bound ops at `memory` of the bandwidth. `compute`
    near 1 reflects cuDNN's Winograd 3x3 convolutions, which do fewer multiplies than the FLOPs counted; TF32
    in NCHW reaches under a third of its peak. `network` is not fitted (no published figure isolates it)."""

    compute: float = 0.98  # of the fp32 peak FLOP/s (CUDA cores, or a CPU's vector units): convolutions, matmuls
    tf32: float = 0.29  # of the TF32 tensor-core peak (fp32 convolutions on a CUDA device that has TF32)
    tensor: float = 1.0  # of the fp16/bf16 tensor-core peak (autocast on a CUDA device)
    memory: float = 0.67  # of memory bandwidth: normalisation, activations, pooling, additions, the optimizer
    network: float = 0.8  # of link bandwidth: NCCL's bus bandwidth on large messages
    # of the host link (PCIe): a batch's copy from pinned host memory, fitted to the copies of ResNet-50's
    # batches on one H200 (2026-11-26, 14 runs: 47.8 GB/s of PCIe Gen5 x16's 64; tests/data/gpu-h200-*)
    host_link: float = 0.75


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """One node of `count` identical devices, as its profile describes it (SI units)."""

    name: str
    source: str  # the data sheets the numbers rest on
    kind: str  # "cuda" or "cpu"
    count: int  # devices per node
    memory_bytes: int  # per device
    memory_bandwidth_bytes_per_s: float  # per device
    peak_flops: dict[str, float] = field(hash=False)  # per device, dense, by precision
    efficiency: Efficiency = Efficiency()
    intra_node_bytes_per_s: float  # per device, per direction
    intra_node_latency_s: float
    inter_node_bytes_per_s: float  # per node: the sum of its NICs
    inter_node_latency_s: float
    cpu_cores: int | None = None  # physical, per node; None: the profile does not say
    loader_samples_per_s_per_core: float | None = None  # the input pipeline's rate on one core; None: unpriced
    pcie_bytes_per_s: float | None = None  # one device's host link, per direction; None: the copy unpriced

    def supports(self, precision: str) -> bool:
        return precision in self.peak_flops


# The file's fields, table by table: key -> (check, what it is, default). The checks: "str" a non-empty
# string, "int" a positive integer, "num" a positive number, "time" a number >= 0, "frac" a number in
# (0, 1]. _REQUIRED marks a key without a default; None leaves an optional value out.
_REQUIRED = object()
_FIELDS: dict[str, dict[str, tuple[str, str, Any]]] = {
    "": {"format": ("int", f"format = {FORMAT}", _REQUIRED), "name": ("str", "the node's name", _REQUIRED),
         "source": ("str", "the data sheets the numbers come from", _REQUIRED)},
    "device": {"kind": ("str", "'cuda' or 'cpu'", _REQUIRED), "count": ("int", "devices per node", _REQUIRED),
               "memory_bytes": ("num", "bytes per device", _REQUIRED),
               "memory_bandwidth_bytes_per_s": ("num", "bytes per second", _REQUIRED)},
    "device.peak_flops": {p: ("num", "FLOP/s per device, dense", None) for p in PRECISIONS},
    "efficiency": {k: ("frac", "the fraction of peak reached", getattr(Efficiency(), k))
                   for k in ("compute", "tf32", "tensor", "memory", "network", "host_link")},
    "links": {"intra_node_bytes_per_s": ("num", "bytes per second per device, per direction", _REQUIRED),
              "intra_node_latency_s": ("time", "seconds", _REQUIRED),
              "inter_node_bytes_per_s": ("num", "bytes per second per node", _REQUIRED),
              "inter_node_latency_s": ("time", "seconds", _REQUIRED)},
    "host": {"cpu_cores": ("int", "physical cores per node", None),
             "pcie_bytes_per_s": ("num", "bytes per second between the host and one device, per direction", None),
             "loader_samples_per_s_per_core": ("num", "samples per second one core reads, decodes and augments",
                                               None)},
}
_OPTIONAL_TABLES = ("efficiency", "host")


def _profiles_dir() -> resources.abc.Traversable:
    # through importlib.resources, so the profiles are found in an installed wheel as in the source tree
    return resources.files("scaletrain.perf").joinpath("profiles")


def shipped_profiles() -> list[str]:
    """The names of the profiles that ship with scaletrain (file stems), sorted."""
    return sorted(p.name.removesuffix(".toml") for p in _profiles_dir().iterdir() if p.name.endswith(".toml"))


def load_hardware(path_or_name: str) -> Hardware:
    """A profile from a TOML file, or a shipped profile by name (`dgx-a100-80gb`); bad input is one line."""
    path = Path(path_or_name)
    if path.is_file():
        where, text = str(path_or_name), _read(path)
    elif (name := str(path_or_name).removesuffix(".toml")) in shipped_profiles():
        where, text = f"{name}.toml", _profiles_dir().joinpath(f"{name}.toml").read_text()
    else:
        raise UserError(f"hardware profile {path_or_name} is neither a file nor a shipped profile: give the path "
                        f"of a TOML file or one of {', '.join(shipped_profiles())}")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{where} is not valid TOML ({_one_line(e)}): fix that line") from None
    return parse_hardware(data, where)


def parse_hardware(data: dict[str, Any], where: str = "hardware profile") -> Hardware:
    """A profile from its parsed TOML; `where` (the file) starts every message."""
    # the format first: another format's keys would otherwise read as unknown or missing ones
    fmt = _value(data, "format", _FIELDS[""]["format"], f"{where}: format")
    if fmt != FORMAT:
        raise UserError(f"{where}: format = {fmt} is not one this scaletrain reads: write format = {FORMAT} "
                        "(docs/perf.md)")
    top, device, peaks, efficiency, links, host = (_table(data, t, where) for t in
                                                    ("", "device", "device.peak_flops", "efficiency", "links", "host"))
    if device["kind"] not in KINDS:
        raise UserError(f"{where}: [device] kind = {_shown(device['kind'])} is not one of {', '.join(KINDS)}: "
                        "write kind = \"cuda\" or \"cpu\"")
    peaks = {p: float(v) for p, v in peaks.items() if v is not None}
    if not peaks:
        raise UserError(f"{where}: [device.peak_flops] lists no precision: add one of {', '.join(PRECISIONS)} "
                        "(FLOP/s per device, dense)")
    return Hardware(name=top["name"], source=top["source"], kind=device["kind"], count=device["count"],
                    memory_bytes=int(device["memory_bytes"]),
                    memory_bandwidth_bytes_per_s=float(device["memory_bandwidth_bytes_per_s"]), peak_flops=peaks,
                    efficiency=Efficiency(**{k: float(v) for k, v in efficiency.items()}),
                    intra_node_bytes_per_s=float(links["intra_node_bytes_per_s"]),
                    intra_node_latency_s=float(links["intra_node_latency_s"]),
                    inter_node_bytes_per_s=float(links["inter_node_bytes_per_s"]),
                    inter_node_latency_s=float(links["inter_node_latency_s"]), cpu_cores=host["cpu_cores"],
                    loader_samples_per_s_per_core=host["loader_samples_per_s_per_core"],
                    pcie_bytes_per_s=host["pcie_bytes_per_s"])


def roofline_time(flops: float, bytes_moved: float, hw: Hardware, precision: str, kernels: int = 1) -> float:
    """Seconds for `kernels` kernels on one device doing `flops` FLOPs and moving `bytes_moved` bytes of
    its memory in all, at `precision`: the slower of compute and memory at the profile's efficiencies, plus
    `LAUNCH_OVERHEAD_S` per kernel. (Pricing kernels together takes the max of their sums, which is at most
    the sum of their maxes: group kernels with the same bound.)"""
    if not hw.supports(precision):
        raise UserError(f"{hw.name} has no {precision} peak in its profile: use one of {', '.join(hw.peak_flops)}")
    if flops < 0 or bytes_moved < 0 or kernels < 0:
        raise ValueError("flops, bytes_moved and kernels must be >= 0")
    compute_s = flops / (hw.peak_flops[precision] * compute_efficiency(hw, precision))
    memory_s = bytes_moved / (hw.memory_bandwidth_bytes_per_s * hw.efficiency.memory)
    return max(compute_s, memory_s) + kernels * LAUNCH_OVERHEAD_S[hw.kind]


def compute_efficiency(hw: Hardware, precision: str) -> float:
    """The fraction of `precision`'s peak reached: on a CUDA device TF32's or the 16-bit tensor cores', else
    (fp32, or any precision on a CPU) the fp32 units'."""
    if hw.kind != "cuda" or precision == "fp32":
        return hw.efficiency.compute
    return hw.efficiency.tf32 if precision == "tf32" else hw.efficiency.tensor


def host_copy_time(nbytes: float, hw: Hardware) -> float | None:
    """Seconds to copy `nbytes` from the host's (pinned) memory to one device over its host link, one
    transfer; None where the profile gives no link (a CPU "device" copies nothing: 0)."""
    if hw.kind != "cuda":
        return 0.0
    if hw.pcie_bytes_per_s is None:
        return None
    return nbytes / (hw.pcie_bytes_per_s * hw.efficiency.host_link) + LAUNCH_OVERHEAD_S[hw.kind]


def link(hw: Hardware, inter_node: bool) -> tuple[float, float]:
    """(alpha_s, beta_s_per_byte) of the link between two devices of one node, or between nodes."""
    if inter_node:
        return hw.inter_node_latency_s, 1.0 / (hw.inter_node_bytes_per_s * hw.efficiency.network)
    return hw.intra_node_latency_s, 1.0 / (hw.intra_node_bytes_per_s * hw.efficiency.network)


def describe(hw: Hardware) -> str:
    """One line saying what a prediction from this profile rests on."""
    e = hw.efficiency
    fitted = " (fitted to published ResNet-50 throughputs)" if e == Efficiency() else ""
    return (f"data sheet: {hw.name} ({hw.source}), roofline at {e.compute:.0%} of the fp32 peak, {e.tf32:.0%} of "
            f"TF32's, {e.tensor:.0%} of fp16/bf16's, {e.memory:.0%} of memory bandwidth{fitted}, links at "
            f"{e.network:.0%}, the host link at {e.host_link:.0%}: not a measurement of this machine")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path} cannot be read as text ({_one_line(e)}): give a TOML hardware profile") from None


def _shown(value: Any) -> str:
    """A value as the file would write it (true, 1e+12, "4"), for messages."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):  # short, but still a float: 1e+12, 4.0
        return f"{value:g}" if any(c in f"{value:g}" for c in ".en") else f"{value:.1f}"
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


def _table(data: dict[str, Any], table: str, where: str) -> dict[str, Any]:
    """One table's values, checked against _FIELDS (an optional table may be absent)."""
    raw: Any = data
    for part in table.split(".") if table else ():
        if part not in raw:
            if table in _OPTIONAL_TABLES:
                raw = {}
                break
            raise UserError(f"{where}: the [{table}] table is missing: add it ({', '.join(_FIELDS[table])})")
        raw = raw[part]
        if not isinstance(raw, dict):
            raise UserError(f"{where}: {table} must be a [{table}] table, not a value: write it as a table")
    fields = _FIELDS[table]
    label = f"[{table}] " if table else ""
    subtables = [k.rpartition(".")[2] for k in _FIELDS if k and k.rpartition(".")[0] == table]
    unknown = [k for k in raw if k not in fields and k not in subtables]
    if unknown:
        known = [*fields, *(f"[{table}.{t}]" if table else f"[{t}]" for t in subtables)]
        raise UserError(f"{where}: {label}has an unknown key '{unknown[0]}': the keys are {', '.join(known)}")
    return {key: _value(raw, key, spec, f"{where}: {label}{key}") for key, spec in fields.items()}


def _value(raw: dict[str, Any], key: str, spec: tuple[str, str, Any], named: str) -> Any:
    check, what, default = spec
    if key not in raw:
        if default is _REQUIRED:
            raise UserError(f"{named} is missing: add it ({what})")
        return default
    value = raw[key]
    if check == "str":
        if not isinstance(value, str) or not value.strip():
            raise UserError(f"{named} = {_shown(value)} must be a non-empty string ({what}): quote it")
        return value
    number = (int,) if check == "int" else (int, float)
    if isinstance(value, bool) or not isinstance(value, number) or not math.isfinite(value):
        kind = "an integer" if check == "int" else "a number"
        raise UserError(f"{named} = {_shown(value)} must be {kind} ({what}): write a bare number")
    if check == "frac" and not 0 < value <= 1:
        raise UserError(f"{named} = {_shown(value)} must be in (0, 1] ({what}), e.g. {default}")
    if check == "time" and value < 0:
        raise UserError(f"{named} = {_shown(value)} must be >= 0 ({what})")
    if check in ("int", "num") and value <= 0:
        raise UserError(f"{named} = {_shown(value)} must be > 0 ({what})")
    return value
