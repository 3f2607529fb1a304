"""The checks of `scaletrain doctor`: pure functions over what node 0 gathered, each returning table rows
(docs/doctor.md says what each measures, its threshold and its fix)."""

from __future__ import annotations

from collections import Counter

from scaletrain import fmt
from scaletrain.doctor.gathered import Check, Expect, Gathered

ORDER = ("reachable", "rendezvous port", "node ranks", "interface", "versions", "clock", "run directory",
         "free disk", "GPUs and NCCL", "link")


def evaluate(g: Gathered, expect: Expect) -> list[Check]:
    """Every check, in the order of the table."""
    return [*reachable(g), *rendezvous_port(g), *node_ranks(g), *interface(g, expect), *versions(g),
            *clock(g, expect), *run_directory(g), *free_disk(g, expect), *gpus(g, expect), *link(g, expect)]


def worst(checks: list[Check]) -> str:
    return max((c.status for c in checks), key=("pass", "warn", "fail").index, default="pass")


def exit_code(checks: list[Check]) -> int:
    return 1 if worst(checks) == "fail" else 0


def _nodes(g: Gathered, ranks) -> str:
    ranks = sorted(ranks)
    return ", ".join(g.label(r) for r in ranks) if ranks else "-"


def _all(g: Gathered, ranks) -> str:
    n = len(list(ranks))
    return f"all {n}" if n == g.nnodes else f"{n} of {g.nnodes}"


def _start_hint(g: Gathered, missing: list[int]) -> str:
    rank = missing[0] if len(missing) == 1 else "R"
    return (f"start {'it' if len(missing) == 1 else 'each, R its rank'} (scaletrain doctor --nnodes {g.nnodes} "
            f"--node-rank {rank} --master-addr {g.master_addr} --master-port {g.master_port})")


def _not_measured(check: str, why: str) -> Check:
    """A check with nothing to measure says so (a warning: the failure that caused it has its own row)."""
    return Check(check, "warn", "-", f"not measured: {why}", "see the failing rows above")


def reachable(g: Gathered) -> list[Check]:
    """Every node reached node 0, on either port, within the timeout, and kept answering."""
    if g.master_error:
        return []  # nobody could come: the rendezvous row says why
    came = set(g.members) | set(g.probed)
    missing = [r for r in range(g.nnodes) if r not in came and r not in g.late]
    rows = []
    if g.late:
        rows.append(Check("reachable", "fail", _nodes(g, g.late),
                          f"reached node 0 after the --timeout of {g.timeout_s:g} s, when the others had started",
                          "start every node within --timeout of node 0, or raise --timeout"))
    if missing:
        rows.append(Check("reachable", "fail", _nodes(g, missing),
                          f"never reached node 0 at {g.master_addr} within {g.timeout_s:g} s",
                          f"{_start_hint(g, missing)} and check it reaches {g.master_addr} (address, route, "
                          "firewall)"))
    if g.lost:
        rows.append(Check("reachable", "fail", _nodes(g, g.lost),
                          "; ".join(f"stopped answering during {what}" for what in sorted(set(g.lost.values()))),
                          "see that node's own output: it crashed, was killed, or lost its network"))
    return rows or [Check("reachable", "pass", _all(g, came), f"every node reached node 0 at {g.master_addr}")]


def rendezvous_port(g: Gathered) -> list[Check]:
    """Node 0 can host the rendezvous, and every node reached its port (not only the probe port)."""
    where = f"{g.master_addr}:{g.master_port}"
    if g.master_error:
        return [Check("rendezvous port", "fail", "node 0", g.master_error,
                      "give node 0 a free --master-port and, as --master-addr, its own address that the others reach")]
    if g.probed:
        return [Check("rendezvous port", "fail", _nodes(g, g.probed),
                      f"reached node 0 on port {g.probe_port} but not the rendezvous port {where}",
                      f"open TCP port {g.master_port} on node 0 to the other nodes (firewall), or pick an open "
                      "--master-port")]
    if len(g.members) < g.nnodes and g.probe_port is None:
        return [Check("rendezvous port", "warn", _nodes(g, set(range(g.nnodes)) - set(g.members)),
                      "not reached; node 0 could not listen on a second port, so a blocked port and an "
                      "unreachable host look the same", "see the reachable row")]
    return [Check("rendezvous port", "pass", _all(g, g.members), f"{where} reached")]


def node_ranks(g: Gathered) -> list[Check]:
    """Every node has its own --node-rank in 0..nnodes-1 and the same --nnodes as node 0."""
    rows = []
    if g.strays:
        rows.append(Check("node ranks", "fail", ", ".join(f"{s.get('address') or s.get('hostname')}" for s in g.strays),
                          "; ".join(f"--node-rank {s['rank']} {s['why']}" for s in g.strays),
                          "give each node its own --node-rank, 0 to --nnodes - 1"))
    other = {r: f.nnodes for r, f in g.facts.items() if f.nnodes != g.nnodes}
    if other:
        rows.append(Check("node ranks", "fail", _nodes(g, other),
                          ", ".join(f"--nnodes {n}" for n in other.values()) + f", node 0 has --nnodes {g.nnodes}",
                          "run every node with the same --nnodes"))
    return rows or [Check("node ranks", "pass", _all(g, g.facts), f"ranks 0..{g.nnodes - 1} of --nnodes {g.nnodes}, "
                                                                  "each once")]


def interface(g: Gathered, expect: Expect) -> list[Check]:
    """The interface gloo's collectives bind to: it exists, others can reach it, it is the one routing
    to node 0, and no faster interface is up beside it."""
    loopback_job = g.master_addr.startswith("127.") or g.master_addr == "localhost"
    fails, warns, used = [], [], {}  # used: what the pass row says, each once
    for r, f in sorted(g.facts.items()):
        speeds = {i.name: i.speed_mbps for i in f.interfaces}
        speed = f"{speeds[f.comm_iface]} Mb/s" if speeds.get(f.comm_iface) else "speed not reported"
        used.setdefault(f"{f.comm_iface} ({f.comm_source}), {speed}")
        if f.comm_address is None:
            what = (f"GLOO_SOCKET_IFNAME={f.comm_iface} has no IPv4 address here" if f.comm_source == "GLOO_SOCKET_IFNAME"
                    else f"the hostname {f.hostname} resolves to no address of this host")
            fails.append(Check("interface", "fail", g.label(r), what,
                               f"set GLOO_SOCKET_IFNAME={f.route_iface or 'IFACE'} (the interface that reaches node 0)"))
            continue
        if not next((i.up for i in f.interfaces if i.name == f.comm_iface), True):
            fails.append(Check("interface", "fail", g.label(r), f"{f.comm_iface} (the collectives') is down",
                               f"bring it up (ip link set {f.comm_iface} up) or set GLOO_SOCKET_IFNAME to one that is"))
            continue
        if f.comm_address.startswith("127.") and not loopback_job:
            fails.append(Check("interface", "fail", g.label(r),
                               f"collectives would bind to {f.comm_address} (loopback: the hostname resolves to it)",
                               f"set GLOO_SOCKET_IFNAME={f.route_iface or 'IFACE'} and NCCL_SOCKET_IFNAME likewise, "
                               "or fix /etc/hosts"))
            continue
        if not loopback_job and f.route_iface and f.comm_iface != f.route_iface:
            warns.append(Check("interface", "warn", g.label(r),
                               f"collectives on {f.comm_iface}, the route to node 0 leaves on {f.route_iface}",
                               f"set GLOO_SOCKET_IFNAME={f.route_iface} if that is the fast network"))
        mine = speeds.get(f.comm_iface)
        faster = [i for i in f.interfaces if i.up and i.address and not i.address.startswith("127.")
                  and i.speed_mbps and mine and i.speed_mbps > mine]
        if faster:
            best = max(faster, key=lambda i: i.speed_mbps)
            warns.append(Check("interface", "warn", g.label(r),
                               f"{best.name} ({best.speed_mbps} Mb/s) is up beside {f.comm_iface} ({mine} Mb/s)",
                               f"set GLOO_SOCKET_IFNAME={best.name} (and NCCL_SOCKET_IFNAME) if the other nodes "
                               "reach it"))
        if expect.gpus_per_node and f.nccl_iface and f.nccl_iface != f.comm_iface:
            warns.append(Check("interface", "warn", g.label(r),
                               f"NCCL_SOCKET_IFNAME={f.nccl_iface}, gloo on {f.comm_iface}",
                               "name the same interface in both, or check NCCL reaches the others on it"))
    if fails or warns:
        return fails + warns
    return [Check("interface", "pass", _all(g, g.facts), "; ".join(used) or "-")]


def _differing(g: Gathered, key) -> tuple[str, dict[int, str]] | None:
    """The most common value of key(facts) and the nodes that differ from it (None when all agree)."""
    values = {r: v for r, v in ((r, key(f)) for r, f in g.facts.items()) if v is not None}  # None: not there to compare
    common = Counter(values.values()).most_common()
    if len(common) <= 1:
        return None
    # the majority, ties broken by node 0's value
    top = max(common, key=lambda vc: (vc[1], vc[0] == values.get(0)))[0]
    return top, {r: v for r, v in values.items() if v != top}


def versions(g: Gathered) -> list[Check]:
    """Python (major.minor must agree, a differing patch level is a warning), torch, scaletrain and, where
    present, NCCL must be the same on every node."""
    python_minor = _differing(g, lambda f: ".".join(f.python.split(".")[:2]))
    compared = (("python", lambda f: f.python, "fail" if python_minor else "warn"), ("torch", lambda f: f.torch, "fail"),
                ("scaletrain", lambda f: f.scaletrain, "fail"), ("nccl", lambda f: f.nccl, "fail"))
    rows = []
    for name, key, status in compared:
        diff = _differing(g, key)
        if diff is None:
            continue
        top, odd = diff
        value = "; ".join(f"{name} {v} on {g.label(r)}" for r, v in sorted(odd.items())) + f"; {top} elsewhere"
        if any(name in g.facts[r].faked for r in odd):
            value += " (faked by SCALETRAIN_FAKE_VERSION)"
        rows.append(Check("versions", status, _nodes(g, odd), value,
                          f"install the same {name} on every node (one environment or container image for all): "
                          f"{top}"))
    if rows:
        return rows
    f = g.facts.get(0) or next(iter(g.facts.values()), None)
    if f is None:
        return []
    nccl = f", nccl {f.nccl}" if f.nccl else ""
    return [Check("versions", "pass", _all(g, g.facts), f"python {f.python}, torch {f.torch}, scaletrain "
                                                        f"{f.scaletrain}{nccl}")]


def clock(g: Gathered, expect: Expect) -> list[Check]:
    """Every member's clock within the tolerance of node 0's (offset from store round trips)."""
    if not g.clock:
        return [_not_measured("clock", "no node took part")]
    tol = expect.clock_tolerance_s
    off = {r: c for r, c in g.clock.items() if abs(c["offset_s"]) > tol}
    if off:
        return [Check("clock", "fail", _nodes(g, off),
                      "; ".join(f"{fmt.span(c['offset_s'], '+')} from node 0" for c in off.values())
                      + f" (tolerance {tol:g} s)",
                      "synchronise the clocks (chrony or ntpd: `chronyc tracking` shows the offset)")]
    others = {r: c for r, c in g.clock.items() if r != 0}
    if not others:
        return [Check("clock", "pass", _all(g, g.clock), "one node: no clock to compare")]
    r, c = max(others.items(), key=lambda rc: abs(rc[1]["offset_s"]))
    return [Check("clock", "pass", _all(g, g.clock),
                  f"largest offset {fmt.span(c['offset_s'], '+')} ({g.label(r)}, +/- {fmt.span(c['rtt_s'] / 2)}), "
                  f"tolerance {tol:g} s")]


def run_directory(g: Gathered) -> list[Check]:
    """--out is writable by every member and every member sees every other member's file (shared)."""
    if not g.rundir:
        return [_not_measured("run directory", "no node took part")]
    path = g.rundir.get(0, next(iter(g.rundir.values())))["path"]
    unwritable = {r: d for r, d in g.rundir.items() if not d["wrote"] and (r == 0 or 0 in d["sees"])}
    present = [r for r, d in g.rundir.items() if d["wrote"]]
    unshared = {r: [o for o in present if o not in d["sees"]] for r, d in g.rundir.items()
                if r not in unwritable and any(o not in d["sees"] for o in present)}
    rows = []
    if unwritable:
        rows.append(Check("run directory", "fail", _nodes(g, unwritable),
                          "; ".join(f"cannot write {path}: {d['error']}" for d in unwritable.values()),
                          "make --out writable from every node (permissions, a read-only mount), or choose another"))
    if unshared:
        rows.append(Check("run directory", "fail", _nodes(g, unshared),
                          "; ".join(f"does not see the files of {', '.join(f'node {o}' for o in miss)} in {path}"
                                    for miss in unshared.values()),
                          "put --out on a file system every node mounts at the same path (NFS, Lustre, GPFS)"))
    return rows or [Check("run directory", "pass", _all(g, g.rundir),
                          f"{path}: every node wrote a file and saw every other node's")]


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def free_disk(g: Gathered, expect: Expect) -> list[Check]:
    """Free space on --out's file system, as each member sees it, against --min-free-gb."""
    free = {r: d["free_bytes"] for r, d in g.rundir.items() if d.get("free_bytes") is not None}
    if not free:
        return [_not_measured("free disk", "no node took part")]
    low = {r: b for r, b in free.items() if b < expect.min_free_bytes}
    if low:
        return [Check("free disk", "fail", _nodes(g, low),
                      "; ".join(f"{_gb(b)} free" for b in low.values()) + f" (< {_gb(expect.min_free_bytes)})",
                      "free space on --out's file system (old runs, checkpoints), or choose another --out")]
    r, b = min(free.items(), key=lambda rb: rb[1])
    return [Check("free disk", "pass", _all(g, free), f"least {_gb(b)} free ({g.label(r)}), "
                                                      f"at least {_gb(expect.min_free_bytes)} asked")]


def gpus(g: Gathered, expect: Expect) -> list[Check]:
    """With --gpus-per-node N: N GPUs visible and NCCL in torch on every node; without: a report only."""
    if not g.facts:
        return []
    want = expect.gpus_per_node
    counts = {r: f.gpus for r, f in g.facts.items()}
    if not want:
        seen = sorted(set(counts.values()))
        value = "no GPU (none expected)" if seen == [0] else (
            f"{' / '.join(map(str, seen))} GPUs per node (not checked: --gpus-per-node N to)")
        return [Check("GPUs and NCCL", "pass", _all(g, counts), value)]
    rows = []
    short = {r: c for r, c in counts.items() if c < want}
    if short:
        rows.append(Check("GPUs and NCCL", "fail", _nodes(g, short),
                          "; ".join(f"{c} GPU{'s' if c != 1 else ''} visible "
                                    f"(CUDA_VISIBLE_DEVICES={g.facts[r].cuda_visible_devices or 'unset'})"
                                    for r, c in short.items()) + f", {want} expected",
                          "check the driver (nvidia-smi), CUDA_VISIBLE_DEVICES and a CUDA build of torch"))
    no_nccl = [r for r, f in g.facts.items() if f.nccl is None and r not in short]
    if no_nccl:
        rows.append(Check("GPUs and NCCL", "fail", _nodes(g, no_nccl), "torch has no NCCL here",
                          "install a CUDA build of torch (make TORCH=... setup)"))
    return rows or [Check("GPUs and NCCL", "pass", _all(g, counts),
                          f"{want} GPUs per node, NCCL {g.facts[min(g.facts)].nccl}")]


def _mbit(bytes_per_s: float) -> str:
    return f"{bytes_per_s * 8 / 1e6:,.0f} Mbit/s" if bytes_per_s * 8 >= 1e7 else f"{bytes_per_s * 8 / 1e6:.2f} Mbit/s"


def blame(failed: set[tuple[int, int]], members: list[int]) -> list[int]:
    """Nodes each of whose pairs failed, when some pairs passed (with 3+ nodes one bad link shows as
    every pair through it failing; with 2 nodes, or every pair failing, no single node is to blame)."""
    if len(members) < 3 or len(failed) == len(members) * (len(members) - 1) // 2:
        return []
    return [m for m in members if all(tuple(sorted((m, o))) in failed for o in members if o != m)]


def link(g: Gathered, expect: Expect) -> list[Check]:
    """Each pair's all-reduce bus bandwidth against a fraction of --link-rate (or of the fastest pair);
    a pair that could not connect or finish fails."""
    if g.nnodes == 1:
        return [Check("link", "pass", "all 1", "one node: no pairs to measure")]
    if len(g.members) < 2:
        return [_not_measured("link", "fewer than 2 nodes met")]
    ran = [p for p in g.pairs if p["status"] != "not-run"]
    measured = [p for p in ran if p["status"] == "ok"]
    if expect.link_bytes_per_s:
        ref, ref_name = expect.link_bytes_per_s, f"--link-rate {expect.link_rate}"
    else:
        ref = max((p["bytes_per_s"] for p in measured), default=None)
        ref_name = "the fastest pair (no --link-rate given)"
    floor = expect.min_link_fraction * ref if ref else None
    bad = {(p["a"], p["b"]): p for p in ran if p["status"] != "ok" or p["bytes_per_s"] < floor}
    rows = []
    suspects = blame(set(bad), sorted(set(g.members) - set(g.lost)))
    groups = [([s], [p for k, p in bad.items() if s in k]) for s in suspects]
    groups += [(list(k), [p]) for k, p in bad.items() if not any(s in k for s in suspects)]
    for nodes, pairs in groups:
        rows.append(_pair_row(g, nodes, pairs, ref, ref_name, expect))
    unrun = [p for p in g.pairs if p["status"] == "not-run"]
    if unrun:
        rows.append(Check("link", "fail", ", ".join(f"{p['a']}-{p['b']}" for p in unrun), "not measured: a node "
                          "stopped answering before its turn", "see the reachable row"))
    if rows:
        return rows
    if not measured:
        return [_not_measured("link", "no pair was measured")]
    slow = min(measured, key=lambda p: p["bytes_per_s"])
    return [Check("link", "pass", f"{len(measured)} pair{'s' if len(measured) != 1 else ''}",
                  f"slowest node {slow['a']} - node {slow['b']}: {_mbit(slow['bytes_per_s'])} "
                  f"({slow['bytes_per_s'] / ref:.0%} of {ref_name}; fails below {expect.min_link_fraction:.0%})")]


def _pair_row(g: Gathered, nodes: list[int], pairs: list[dict], ref, ref_name: str, expect: Expect) -> Check:
    hosts = _nodes(g, nodes) if len(nodes) == 1 else " - ".join(g.label(n) for n in nodes)
    parts, fix = [], None
    unconnected = [p for p in pairs if p["status"] == "no-connection"]
    for p in sorted(pairs, key=lambda p: (p["a"], p["b"])):
        other = f"with node {p['b'] if p['a'] == nodes[0] else p['a']}" if len(nodes) == 1 else "between them"
        if p["status"] == "no-connection":
            parts.append(f"could not connect {other}")
        elif p["status"] == "timeout":
            parts.append(f"all-reduce of {p['bytes'] / 2**20:g} MiB did not finish {other} ({p.get('error') or 'timeout'})")
        else:
            parts.append(f"{_mbit(p['bytes_per_s'])} {other} ({p['bytes_per_s'] / ref:.0%})")
    value = "; ".join(parts) + (f"; fails below {expect.min_link_fraction:.0%} of {ref_name}" if ref else "")
    if unconnected:
        fix = ("allow all TCP between the nodes, not only --master-port (gloo and NCCL listen on random ports), "
               "and check GLOO_SOCKET_IFNAME names an interface the nodes reach each other on")
    elif len(nodes) == 1:
        fix = (f"check node {nodes[0]}'s link: port speed and cable (ethtool), the interface the collectives "
               "use (GLOO_SOCKET_IFNAME), other traffic on it")
    else:
        fix = ("check the links between these nodes (ethtool, the switch), the interface the collectives use "
               "(GLOO_SOCKET_IFNAME), and that --link-rate is what the network offers")
    return Check("link", "fail", hosts, value, fix)
