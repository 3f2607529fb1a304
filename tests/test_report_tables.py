"""report.tables: the numbers each table shows, and their rich rendering."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from scaletrain.grid import Grid, rich_table
from scaletrain.report import compare, tables
from scaletrain.report.load import load_run, load_study, overview

DATA = Path(__file__).parent / "data"

ANALYSIS = {  # hand-made: two ranks, two phases, so every cell can be checked by hand
    "phases_mean_s": {"forward": 0.010, "backward": 0.030}, "step_time_mean_s": 0.040,
    "comm_total_mean_s": 0.012, "comm_hidden_mean_s": 0.009, "overlap_ratio": 0.75, "bytes_sent_per_step": 2 * 2**20,
    "ranks": [{"rank": 0, "phases_mean_s": {"forward": 0.008, "backward": 0.032}, "step_time_mean_s": 0.040,
               "step_time_p50_s": 0.039, "step_time_p90_s": 0.041, "step_time_max_s": 0.050,
               "peak_memory_bytes": 2**30},
              {"rank": 1, "phases_mean_s": {"forward": 0.012, "backward": 0.028}, "step_time_mean_s": 0.040,
               "step_time_p50_s": 0.040, "step_time_p90_s": 0.042, "step_time_max_s": 0.061,
               "peak_memory_bytes": None}],
    "stragglers": {"steps_compared": 8, "spread_mean_s": 0.003, "slowest_counts": {"1": 6, "0": 2},
                   "repeated": [{"rank": 1, "share": 0.75, "lag_mean_s": 0.005}]},
    "memory_kind": "cuda",
    "diagnosis": [{"kind": "straggler", "share": 0.125, "message": "rank 1 is late", "lever": "look at rank 1"}],
}


def text(grid: Grid) -> str:
    console = Console(record=True, width=160, file=io.StringIO())
    console.print(rich_table(grid))
    return console.export_text()


def test_phases_per_rank_and_mean():
    g = tables.run_phases(ANALYSIS)
    assert g.columns == ["phase", "rank 0", "rank 1", "mean", "share of step"]
    assert g.rows == [["forward", "8.0 ms (20%)", "12.0 ms (30%)", "10.0 ms", "25.0%"],
                      ["backward", "32.0 ms (80%)", "28.0 ms (70%)", "30.0 ms", "75.0%"],
                      ["step time", "40.0 ms", "40.0 ms", "40.0 ms", "100.0%"]]
    assert "32.0 ms (80%)" in text(g)
    assert text(tables.run_phases({})).startswith("where a step's time goes (steady-state means): phases were not")


def test_phases_not_recorded_says_so():
    g = tables.run_phases({"phases_mean_s": None, "ranks": []})
    assert g.rows == [] and "--profile off" in g.note
    assert "--profile off" in tables.run_communication({}).note
    assert "phases were not recorded" in tables.diagnosis([], profiled=False).note


def test_communication_ranks_and_diagnosis():
    comm = dict(tables.run_communication(ANALYSIS).rows)
    assert comm["overlap ratio"].startswith("75.0% of the communication is hidden")
    assert comm["exposed (the step waits)"] == "-" and comm["bytes sent per rank"] == "2.0 MiB"
    assert "single process" in tables.run_communication({"comm_total_mean_s": 0.0}).note
    ranks = tables.run_ranks(ANALYSIS)
    assert ranks.columns[-1] == "peak memory (GPU, allocator peak)"
    assert ranks.rows[0] == ["0", "40.0 ms", "39.0 ms", "41.0 ms", "50.0 ms", "2/8 steps", "1.0 GiB"]
    assert ranks.rows[1][5:] == ["6/8 steps", "not recorded"]
    assert "3.0 ms per step" in ranks.note and "rank 1 is repeatedly last: slowest in 75% of steps" in ranks.note
    no_memory = {**ANALYSIS, "ranks": [{**r, "peak_memory_bytes": None} for r in ANALYSIS["ranks"]]}
    g = tables.run_ranks(no_memory)
    assert g.columns[-1] == "slowest in" and g.note.endswith("peak memory was not recorded")
    assert tables.diagnosis(ANALYSIS["diagnosis"]).rows == [["straggler", "12%", "rank 1 is late", "look at rank 1"]]


def test_run_summary_of_a_fixture():
    run = load_run(DATA / "run-a")
    rows = dict(tables.run_summary(overview(run), run.analysis_source).rows)
    assert rows["ranks x batch"] == "2 x 32 = 64" and rows["top-1"] == "91.00%"
    assert rows["device"] == "cpu (gloo)" and rows["samples/s (steady state)"] == "877/s"
    assert rows["step time (steady mean)"] == "73.0 ms" and rows["epochs"] == "2/2"
    assert rows["epoch time"] == "0.49 s, median of 2 epochs"


def test_study_points_table():
    study = load_study(DATA / "study-a")
    g = tables.study_points(study.points, study.axes)
    assert g.columns[:4] == ["nproc", "workers", "threads/rank", "epoch time"]
    # threads per rank: not recorded by these runs, and no --threads given: "?", never a made-up number
    assert g.rows[0] == ["1", "0", "?", "0:00:40", "40.00", "1.00x", "1.00x", "100%", "90.0%", "baseline"]
    assert g.rows[2][:8] == ["2", "0", "?", "0:00:22", "22.00", "1.82x", "2.00x", "91%"]
    assert g.rows[5] == ["4", "2", "?", "-", "-", "-", "4.00x", "-", "-", "failed"]  # shown, not dropped
    assert "nproc4-workers2 failed: rank 3 exited with code 1" in g.note


def test_study_phases_and_diagnosis():
    study = load_study(DATA / "study-a")
    phases = tables.study_phases(study.points)
    assert phases.rows[0][0] == "nproc1-workers0" and phases.rows[0][1] == "30.0 ms (33%)"
    assert phases.rows[5][-2:] == ["failed", "-"]
    diag = tables.study_diagnosis(study.points)
    assert diag.rows[0][:2] == ["nproc1-workers0", "input-bound (33%)"] and diag.rows[5][1] == "failed"


def test_compare_tables():
    a, b = overview(load_run(DATA / "run-a")), overview(load_run(DATA / "run-b"))
    g = tables.compare_runs(compare.compare_runs(a, b))
    backward = next(r for r in g.rows if r[0] == "backward")
    assert backward == ["backward", "41.2 ms", "23.9 ms", "-17.3 ms", "-42.0%"]
    assert next(r for r in g.rows if r[0] == "top-1")[3] == "+1.0 pt"
    sa, sb = load_study(DATA / "study-a"), load_study(DATA / "study-b")
    sg = tables.compare_studies(compare.compare_studies(sa.points, sb.points, sa.axes))
    assert sg.rows[3][:6] == ["2", "2", "16.00 s", "14.00 s", "-12.5%", "1.88x"]
    assert sg.rows[5][-1] == "A: failed (rank 3 exited with code 1: RuntimeError: out of memory)"
    assert "efficiency B" in text(sg)


def flagged_study_points() -> list[dict]:
    """study-a, as if nproc2-workers0 had run 11x faster than its baseline, with threads per rank recorded."""
    points = load_study(DATA / "study-a").points
    for p in points:
        p["threads_per_rank"], p["cpu_cores"] = (2 if p["axes"]["nproc"] == 1 else 1), 2
    points[2].update(epoch_time_s=40.0 / 11.02, speedup=11.02, efficiency=5.51)
    return points


def test_study_points_flag_efficiency_above_one_and_list_threads():
    points = flagged_study_points()
    g = tables.study_points(points, ["nproc", "workers"])
    assert [r[2] for r in g.rows] == ["2", "2", "1", "1", "1", "1"]
    assert g.rows[2][-1] == "above ideal: see below" and g.rows[3][-1] == ""
    flags = tables.study_flags(points)
    assert len(flags.rows) == 1
    point, efficiency, threads, message = flags.rows[0]
    assert (point, efficiency, threads) == ("nproc2-workers0", "5.51", "1 (2)")
    assert message.startswith("efficiency 5.51 above 1.0 at nproc=2, workers=0 (speedup 11.02x, ideal 2.00x): "
                              "not a real speedup — the baseline (nproc=1, workers=0) ran 2 threads/rank vs 1 here")
    assert tables.study_flags(load_study(DATA / "study-a").points).rows == []


def test_run_summary_lists_threads_per_rank():
    ov = overview(load_run(DATA / "run-a"))
    rows = {r[0]: r[1] for r in tables.run_summary(ov, "x").rows}
    assert rows["threads per rank"] == "unknown (not recorded by this run, and --threads was not set)"
    rows = {r[0]: r[1] for r in tables.run_summary({**ov, "threads_per_rank": 1, "cpu_cores": 2,
                                                    "threads_recorded": True}, "x").rows}
    assert rows["threads per rank"] == "1, 2 cores shared by the node's ranks"
    rows = {r[0]: r[1] for r in tables.run_summary({**ov, "threads_per_rank": None, "device": "cuda"}, "x").rows}
    assert rows["threads per rank"] == "- (GPU run)"


def test_compare_config_grid():
    g = tables.compare_config({"config": [("nproc", 1, 2), ("threads", None, 1), ("threads_per_rank", None, 1),
                                          ("nproc (axis)", [1, 2], [1, 2, 4]), ("augment", True, False)]})
    assert g.rows == [["nproc", "1", "2"], ["threads", "not set", "1"], ["threads_per_rank", "not recorded", "1"],
                      ["nproc (axis)", "1, 2", "1, 2, 4"], ["augment", "true", "false"]]
    assert tables.compare_config({"config": []}).note == "none: A and B ran with the same configuration"
