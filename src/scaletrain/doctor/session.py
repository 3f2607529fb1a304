"""One run of `scaletrain doctor` on one node: node 0 hosts the meeting and gathers; every other node
takes part and waits for node 0's verdict.

    node 0                                   node r
    listen on the rendezvous + probe ports   reach the rendezvous port (else the probe port, and stop there)
    wait (--timeout) for every node's facts  send its facts
    name the members                         read them
    answer clock round trips, in turn        measure its clock against node 0's
    barrier: token files written             write its token file in --out
    look for every token, measure links      look for every token, measure its links, in rounds
    gather results, check, print the table   send its results
    tell the verdict, wait for acks          print the verdict line, ack
"""

from __future__ import annotations

import sys
import time
import uuid
from dataclasses import dataclass

from scaletrain.distributed import hostfacts
from scaletrain.doctor import links, meet, shared_dir
from scaletrain.doctor.gathered import Gathered
from scaletrain.errors import UserError

BLOCKED_S = 2.0  # node 0's probe port open, its rendezvous port shut this long: the rendezvous port is blocked
LINGER_S = 15.0  # a node that reached nothing waits up to this long before exiting (see doctor/cli.py)
PHASE_S = 15.0  # node 0's bound on a live node's answer in each phase (clock, files, results)
LONG_S = 600.0  # the other nodes' bound on node 0 (whose own waits are all bounded; a dead node 0 is seen at once)
ACK_S = 5.0


@dataclass(frozen=True)
class Node:
    """This node's flags."""

    nnodes: int
    rank: int
    master_addr: str
    master_port: int
    probe_port: int | None
    local_addr: str | None
    timeout_s: float
    out: str


def say(text: str) -> None:
    print(f"doctor: {text}", file=sys.stderr, flush=True)


def run_node0(node: Node, facts: hostfacts.HostFacts) -> tuple[Gathered, list]:
    """Gather everything; returns (what was gathered, the boards to tell the verdict on)."""
    g = Gathered(node.nnodes, node.master_addr, node.master_port, node.timeout_s, facts={0: facts}, members=[0])
    try:
        board = meet.Board(meet.host(node.master_addr, node.master_port, PHASE_S))
    except UserError as e:
        g.master_error = str(e)
        return g, []
    probe = None
    if node.probe_port:
        try:
            probe = meet.Board(meet.host(node.master_addr, node.probe_port, PHASE_S))
            g.probe_port = node.probe_port
        except UserError:
            say(f"could not also listen on the probe port {node.probe_port}: a blocked rendezvous port will look "
                "like an unreachable host")
    session = uuid.uuid4().hex[:12]
    folder, created, err0 = _prepare_dir(node.out, session)
    if node.nnodes > 1:
        say(f"node 0 of {node.nnodes}: waiting up to {node.timeout_s:g} s (--timeout) for the other nodes at "
            f"{node.master_addr}:{node.master_port}")
    accepted, seen = _collect(board, probe, g, node.timeout_s)
    members = g.members
    info = {"members": members, "accepted": accepted, "session": session}
    board.put("members", info)
    rounds = links.pair_rounds(members)
    if len(members) > 1:
        n_pairs = sum(map(len, rounds))
        say(f"{len(members)} of {node.nnodes} nodes met; clocks, run directory, links ({n_pairs} pair"
            f"{'s' if n_pairs != 1 else ''} in {len(rounds)} round{'s' if len(rounds) != 1 else ''})")
    coord = meet.Coordinator(board, members, g.lost)
    meet.serve_clock(board, members, g.lost, PHASE_S)
    mine = _look_and_measure(board, 0, members, folder, node.out, err0, rounds,
                             barrier=lambda name, timeout: coord.barrier(name, timeout))
    mine["clock"] = {"offset_s": 0.0, "rtt_s": 0.0}
    results = {0: mine}
    for m in coord.live():
        if m != 0:
            try:
                results[m] = board.get(f"results/{m}", PHASE_S)
            except TimeoutError:
                g.lost[m] = "the gathering of results"
    _fill(g, results, rounds)
    _sweep(board, g, seen)
    shared_dir.remove(folder, node.out, created)
    return g, [b for b in (board, probe) if b is not None]


def _prepare_dir(out: str, session: str):
    try:
        folder, created = shared_dir.prepare(out, session)
    except OSError as e:
        return shared_dir.session_dir(out, session), False, f"{e.strerror or e}"
    return folder, created, shared_dir.write_token(folder, 0)


def _collect(board: meet.Board, probe: meet.Board | None, g: Gathered,
             timeout_s: float) -> tuple[dict[int, int], int]:
    """Wait until every rank has arrived (on either port) or the timeout passes; members are the first
    rendezvous arrival of each rank in range, the rest are strays. Returns ({arrival number: rank} of the
    members, the arrivals read)."""
    seen, pseen, accepted = 0, 0, {}
    deadline = time.monotonic() + timeout_s
    while True:
        for i, rec in meet.arrivals(board, seen):
            seen = i
            r = rec["rank"]
            if not 0 < r < g.nnodes or r in g.members:
                _stray(g, rec)
                continue
            g.members.append(r)
            g.facts[r] = hostfacts.HostFacts.from_dict(rec["facts"])
            accepted[i] = r
        if probe is not None:
            for i, rec in meet.arrivals(probe, pseen):
                pseen = i
                if 0 < rec["rank"] < g.nnodes and rec["rank"] not in g.facts:
                    g.probed.append(rec["rank"])
                    g.facts[rec["rank"]] = hostfacts.HostFacts.from_dict(rec["facts"])
        if len(g.facts) == g.nnodes:
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    g.members.sort()
    g.probed.sort()
    return accepted, seen


def _stray(g: Gathered, rec: dict) -> None:
    r, f = rec["rank"], rec["facts"]
    why = "is taken by another node" if 0 <= r < g.nnodes else f"is out of range for --nnodes {g.nnodes}"
    g.strays.append({"rank": r, "nnodes": f["nnodes"], "hostname": f["hostname"], "address": f["address"],
                     "why": why})


def _sweep(board: meet.Board, g: Gathered, seen: int) -> None:
    """Nodes that arrived after the members were named: a second node with a member's rank (started a
    little later than the first), or a node that came after the timeout."""
    for _, rec in meet.arrivals(board, seen):
        if 0 < rec["rank"] < g.nnodes and rec["rank"] not in g.facts:
            g.late.append(rec["rank"])
            g.facts[rec["rank"]] = hostfacts.HostFacts.from_dict(rec["facts"])
        else:
            _stray(g, rec)


def _look_and_measure(board: meet.Board, rank: int, members: list[int], folder, out: str, write_error: str | None,
                      rounds: list, barrier) -> dict:
    """A member's part after the clock: look for the others' tokens, then its pairs, round by round."""
    lost = barrier("written", PHASE_S)
    live = [m for m in members if m not in lost]
    sees = shared_dir.look(folder, live)
    rundir = {"path": out, "wrote": write_error is None, "error": write_error, "sees": sees,
              "free_bytes": shared_dir.free_bytes(out)}
    pairs = {}
    for k, round_pairs in enumerate(rounds):
        for a, b in round_pairs:
            if rank in (a, b):
                other = b if rank == a else a
                pairs[f"{a}-{b}"] = (links.not_run(a, b, f"node {other} was lost") if other in lost
                                     else links.measure_pair(board.store, a, b, rank))
        lost = barrier(f"round/{k}", links.round_timeout_s())
    return {"rundir": rundir, "pairs": pairs}


def _fill(g: Gathered, results: dict[int, dict], rounds: list) -> None:
    for r, res in results.items():
        if "clock" in res:
            g.clock[r] = res["clock"]
        g.rundir[r] = res["rundir"]
    for a, b in sorted(p for round_pairs in rounds for p in round_pairs):
        key = f"{a}-{b}"
        ra, rb = results.get(a, {}).get("pairs", {}).get(key), results.get(b, {}).get("pairs", {}).get(key)
        if ra is None and rb is None:
            g.pairs.append(links.not_run(a, b, "its nodes were lost"))
        else:
            g.pairs.append(links.merge(ra or rb, rb if ra else None))


def tell(boards: list, v: dict, g: Gathered) -> None:
    """Node 0: the verdict to every node that came (on either port), then a short wait for their acks, so
    that none is left asking a store that has gone."""
    for board in boards:
        board.put("verdict", v)
    deadline = time.monotonic() + ACK_S
    expected = [r for r in g.members if r != 0 and r not in g.lost]
    if boards:
        boards[0].wait([f"ack/{r}" for r in expected], deadline - time.monotonic())
    if len(boards) > 1 and g.probed:
        boards[1].wait([f"ack/{r}" for r in g.probed], deadline - time.monotonic())


def run_other(node: Node, facts: hostfacts.HostFacts) -> tuple[dict | None, str | None]:
    """A node other than 0: (node 0's verdict, or None when none came; this node's own problem, if any)."""
    reached, why = _reach(node)
    if reached == "nothing":
        return None, f"could not reach node 0 at {node.master_addr}:{node.master_port} within {node.timeout_s:g} s: {why}"
    if reached == "probe":
        board = meet.Board(meet.join(node.master_addr, node.probe_port, PHASE_S))
        meet.arrive(board, {"rank": node.rank, "facts": facts.to_dict()})
        v = board.get("verdict", LONG_S)
        board.put(f"ack/{node.rank}", 1)
        return v, (f"reached node 0's probe port {node.probe_port} but not the rendezvous port "
                   f"{node.master_addr}:{node.master_port}: {why}")
    board = meet.Board(meet.join(node.master_addr, node.master_port, PHASE_S))
    i = meet.arrive(board, {"rank": node.rank, "facts": facts.to_dict()})
    info = board.get("members", node.timeout_s + 30)
    if str(i) not in {str(k) for k in info["accepted"]}:  # JSON keys are strings
        v = board.get("verdict", LONG_S)
        board.put(f"ack/{node.rank}", 1)
        return v, f"node 0 did not count this node (--node-rank {node.rank} taken, out of range, or it came too late)"
    members = info["members"]
    clock = meet.measure_clock(board, node.rank, LONG_S)
    folder = shared_dir.session_dir(node.out, info["session"])
    err = shared_dir.write_token(folder, node.rank)
    res = _look_and_measure(board, node.rank, members, folder, node.out, err, links.pair_rounds(members),
                            barrier=lambda name, timeout: meet.member_barrier(board, name, node.rank, LONG_S))
    board.put(f"results/{node.rank}", {**res, "clock": clock})
    v = board.get("verdict", LONG_S)
    board.put(f"ack/{node.rank}", 1)
    return v, None


def _reach(node: Node) -> tuple[str, str | None]:
    """Try the rendezvous port until it opens or --timeout passes: ("rendezvous", None) once it opens.
    When node 0's probe port opens but the rendezvous port stays shut for BLOCKED_S, the rendezvous port
    is blocked on the way: ("probe", why). Else ("nothing", why)."""
    deadline = time.monotonic() + node.timeout_s
    probe_open_since = None
    while True:
        left = deadline - time.monotonic()
        why = meet.attempt(node.master_addr, node.master_port, min(2.0, max(left, 0.05)))
        if why is None:
            return "rendezvous", None
        if node.probe_port and meet.attempt(node.master_addr, node.probe_port, 0.5) is None:
            probe_open_since = probe_open_since or time.monotonic()
            if time.monotonic() - probe_open_since >= BLOCKED_S:
                return "probe", why
        if time.monotonic() >= deadline:
            return "nothing", why + (f"; nor node 0's probe port {node.probe_port}" if node.probe_port else "")
        time.sleep(0.25)
