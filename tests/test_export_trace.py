"""The merged Chrome/Perfetto trace: one process per rank, one track per phase, one clock."""

import json

import pytest

from scaletrain.analysis import load_records
from scaletrain.export.trace import TRACKS, trace_events, write_trace
from scaletrain.profiler import PHASES
from test_analysis import RECORDED


def test_every_rank_is_a_process_with_a_track_per_phase():
    trace = trace_events(load_records(RECORDED))
    names = {(e["pid"], e["args"]["name"]) for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names == {(rank, track) for rank in (0, 1) for track in TRACKS}


def test_phase_events_tile_each_step():
    records = load_records(RECORDED)
    trace = trace_events(records)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == 1 and e["name"] in PHASES
             and e["args"]["step"] == 5]
    step = next(e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == 1 and e["name"] == "step"
                and e["args"]["step"] == 5)
    spans.sort(key=lambda e: e["ts"])
    assert spans[0]["ts"] == pytest.approx(step["ts"], abs=0.01)
    for a, b in zip(spans, spans[1:]):
        assert a["ts"] + a["dur"] == pytest.approx(b["ts"], abs=0.01)
    assert spans[-1]["ts"] + spans[-1]["dur"] == pytest.approx(step["ts"] + step["dur"], abs=1)


def test_ranks_share_one_clock():
    trace = trace_events(load_records(RECORDED))
    firsts = {pid: min(e["ts"] for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == pid)
              for pid in (0, 1)}
    assert min(firsts.values()) == 0
    assert max(firsts.values()) < 50_000  # both ranks start their first step within 50 ms of each other


def test_bucket_reductions_have_their_own_track(tmp_path):
    path = write_trace(load_records(RECORDED), tmp_path / "trace.json")
    events = json.loads(path.read_text())["traceEvents"]
    comm_tid = TRACKS.index("comm")
    assert sum(1 for e in events if e["ph"] == "X" and e.get("tid") == comm_tid) == 44  # one bucket x 22 steps x 2
