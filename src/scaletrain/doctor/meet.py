"""How the nodes of `scaletrain doctor` meet and talk: torch's TCPStore on node 0 (the rendezvous port, and
a probe port beside it), JSON under keys, barriers that node 0 coordinates, and the clock round trips.

Every wait is bounded. Node 0 waits on the others with short bounds and names whoever does not answer;
the others wait on node 0 alone, so a dead node never leaves a live one waiting for it.

    keys  arrivals, arrival/<i>     every node that connected, in order (its facts)
          members                   who takes part, decided by node 0
          bar/<name>/<rank>, bar/<name>/go     node-0-coordinated barriers
          clock/turn/<r>, clock/req/<r>/<k>, clock/resp/<r>/<k>
          results/<rank>, verdict, ack/<rank>
"""

from __future__ import annotations

import errno
import json
import socket
import time
from datetime import timedelta

from scaletrain.distributed.launch.preflight import check_port
from scaletrain.errors import UserError

CLOCK_SAMPLES = 5


class Board:
    """A store with JSON values and bounded waits."""

    def __init__(self, store):
        self.store = store

    def put(self, key: str, value) -> None:
        self.store.set(key, json.dumps(value))

    def wait(self, keys: list[str], timeout_s: float) -> bool:
        """True when every key is there within the timeout."""
        if not keys:
            return True
        try:
            self.store.wait(keys, timedelta(seconds=max(0.001, timeout_s)))
            return True
        except RuntimeError as e:  # DistStoreError on a timeout; or the store's connection is gone
            if _store_gone(e):
                raise
            return False

    def get(self, key: str, timeout_s: float):
        """The value of key, once it is set; TimeoutError after timeout_s."""
        if not self.wait([key], timeout_s):
            raise TimeoutError(f"no {key} within {timeout_s:g} s")
        return json.loads(self.store.get(key))

    def has(self, key: str) -> bool:
        return self.store.check([key])

    def count(self, key: str, add: int = 0) -> int:
        return self.store.add(key, add)


def _store_gone(e: Exception) -> bool:
    text = str(e).lower()
    return "timeout" not in text and "timed out" not in text


def host(addr: str, port: int, timeout_s: float):
    """Node 0's store server at addr:port; UserError (one line) when it cannot listen there."""
    import torch.distributed as dist

    check_port(addr, port)
    try:
        return dist.TCPStore(addr, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))
    except RuntimeError as e:
        raise UserError(f"node 0 could not listen on {addr}:{port}: {str(e).splitlines()[0]}") from None


def attempt(addr: str, port: int, timeout_s: float) -> str | None:
    """One TCP connection to addr:port: None when it opens, else why not (refused: nothing listens; timed
    out: dropped on the way; ...)."""
    try:
        with socket.create_connection((addr, port), timeout=max(0.05, timeout_s)):
            return None
    except socket.gaierror:
        return f"{addr} does not resolve"
    except OSError as e:
        return _why(e)


def _why(e: OSError) -> str:
    if isinstance(e, TimeoutError) or e.errno == errno.ETIMEDOUT:
        return "timed out (packets dropped on the way: a firewall, or no such host)"
    if e.errno == errno.ECONNREFUSED:
        return "connection refused (nothing listens there yet)"
    if e.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
        return "no route to it"
    return f"{e.strerror or e} (a local firewall or route rule?)"


def join(addr: str, port: int, timeout_s: float):
    """A client of node 0's store once reach() has seen the port open."""
    import torch.distributed as dist

    return dist.TCPStore(addr, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))


def arrive(board: Board, record: dict) -> int:
    """Register this node (its facts and flags); returns its arrival number."""
    i = board.count("arrivals", 1)
    board.put(f"arrival/{i}", record)
    return i


def arrivals(board: Board, seen: int) -> list[tuple[int, dict]]:
    """Arrivals after the first `seen`, as (number, record); a record still being written is left for later."""
    out = []
    for i in range(seen + 1, board.count("arrivals") + 1):
        if not board.has(f"arrival/{i}"):
            break
        out.append((i, json.loads(board.store.get(f"arrival/{i}"))))
    return out


class Coordinator:
    """Node 0's side of the barriers: wait (bounded) for the live members, then release them, telling them
    who is lost. Members call `Member.barrier`, which waits on node 0 alone."""

    def __init__(self, board: Board, members: list[int], lost: dict[int, str]):
        self.board, self.members, self.lost = board, members, lost

    def live(self) -> list[int]:
        return [m for m in self.members if m not in self.lost]

    def barrier(self, name: str, timeout_s: float) -> list[int]:
        """Returns the ranks given up on (as `member_barrier` does)."""
        deadline = time.monotonic() + timeout_s
        for m in self.live():
            if m != 0 and not self.board.wait([f"bar/{name}/{m}"], deadline - time.monotonic()):
                self.lost[m] = name
        self.board.put(f"bar/{name}/go", sorted(self.lost))
        return sorted(self.lost)


def member_barrier(board: Board, name: str, rank: int, timeout_s: float) -> list[int]:
    """A member's side of a barrier; returns the ranks node 0 has given up on."""
    board.put(f"bar/{name}/{rank}", 1)
    return board.get(f"bar/{name}/go", timeout_s)


def serve_clock(board: Board, members: list[int], lost: dict[int, str], timeout_s: float) -> None:
    """Node 0 answers each member's clock requests with its own time, one member at a time (so that a
    round trip is never stretched by another member's turn)."""
    for r in members:
        if r == 0 or r in lost:
            continue
        board.put(f"clock/turn/{r}", 1)
        for k in range(CLOCK_SAMPLES):
            if not board.wait([f"clock/req/{r}/{k}"], timeout_s):
                lost[r] = "the clock check"
                break
            board.put(f"clock/resp/{r}/{k}", time.time())


def measure_clock(board: Board, rank: int, timeout_s: float) -> dict:
    """This node's clock minus node 0's: node 0's time against the middle of the round trip that fetched it,
    from the sample with the shortest round trip (the error is at most half of it)."""
    board.get(f"clock/turn/{rank}", timeout_s)
    samples = []
    for k in range(CLOCK_SAMPLES):
        t0 = time.time()
        board.put(f"clock/req/{rank}/{k}", 1)
        theirs = board.get(f"clock/resp/{rank}/{k}", timeout_s)
        t1 = time.time()
        samples.append((t1 - t0, (t0 + t1) / 2 - theirs))
    rtt, offset = min(samples)
    return {"offset_s": offset, "rtt_s": rtt}
