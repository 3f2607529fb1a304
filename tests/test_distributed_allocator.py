"""glibc malloc's thresholds fixed at start-up (distributed/allocator.py): under the steady policy an allocation of a
few MB is served from the heap, not from fresh mmap pages, once `settle()` ran; under lean it gets pages of its own
(given back when freed); the opt-out and the user's own variables are honoured. Each case runs in a fresh
interpreter: the thresholds are a process's."""

import json
import os
import subprocess
import sys

import pytest

from scaletrain.distributed import allocator

# How many bytes glibc serves from mmap for one 8 MiB malloc held alive (mallinfo2's hblkhd before and after),
# printed after settle()'s record.
PROBE = """
import ctypes, json
from scaletrain.distributed.allocator import settle

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
record = settle(POLICY)
before = libc.mallinfo2().hblkhd
held = libc.malloc(8 << 20)
print(json.dumps({"record": record, "mmapped": libc.mallinfo2().hblkhd - before}))
"""

pytestmark = pytest.mark.skipif(allocator._glibc() is None, reason="glibc only")


def _probe(policy: str | None = None, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k != allocator.OPT_OUT and k not in allocator.USER_VARIABLES
             and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", f"POLICY = {policy!r}\n" + PROBE], env={**clean, **env},
                         capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


def test_settled_a_step_sized_allocation_reuses_heap_memory():
    got = _probe()
    assert got["record"] == {"malloc": "glibc, thresholds fixed", "allocator": "steady",
                             "mmap_threshold_bytes": 32 * 2**20, "trim_threshold_bytes": 2**31 - 1}
    assert got["mmapped"] == 0


def test_lean_gives_a_step_sized_allocation_pages_of_its_own(monkeypatch):
    for name in ("GLIBC_TUNABLES", allocator.OPT_OUT, *allocator.USER_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    assert allocator.rank_environment("lean") == {"GLIBC_TUNABLES": allocator.HUGE_PAGES}
    assert allocator.rank_environment("steady") == allocator.rank_environment("auto") == {}
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert allocator.rank_environment("lean") == {}  # the user's own tunables win
    got = _probe("lean", GLIBC_TUNABLES=allocator.HUGE_PAGES)
    assert got["record"] == {"malloc": "glibc, thresholds fixed", "allocator": "lean", "mmap_threshold_bytes": 2**20,
                             "trim_threshold_bytes": 2**20, "huge_pages": True}
    assert got["mmapped"] >= 8 << 20
    assert allocator.retained_below("lean") == 2**20 and allocator.retained_below("auto") == 32 * 2**20


def test_the_opt_out_leaves_glibc_mapping_it_afresh():
    got = _probe(SCALETRAIN_MALLOC="default")
    assert got["record"] == {"malloc": "glibc defaults (SCALETRAIN_MALLOC=default)"}
    assert got["mmapped"] >= 8 << 20  # glibc's starting threshold is 128 KiB: the probe can fail


def test_the_users_own_thresholds_win():
    got = _probe(MALLOC_MMAP_THRESHOLD_="131072")
    assert got["record"] == {"malloc": "glibc, as set by MALLOC_MMAP_THRESHOLD_"}
    assert got["mmapped"] >= 8 << 20  # theirs, not ours


def test_settle_runs_once_per_process_and_again_when_the_policy_changes():
    first = allocator.settle()
    assert allocator.settle() is first and allocator.settle(first.get("allocator", "steady")) is first
    if "allocator" in first:  # (not under SCALETRAIN_MALLOC=default or the user's variables)
        try:
            other = "lean" if first["allocator"] == "steady" else "steady"
            assert allocator.settle(other)["allocator"] == other and allocator.settle() is allocator.settle(other)
        finally:
            allocator.settle(first["allocator"])
