"""predict.report: the prediction's page (table rows, plots, limits, basis) and its terminal table."""

from __future__ import annotations

import io

from PIL import Image
from rich.console import Console

from scaletrain.predict.report import print_prediction, write_prediction_report

CONFIG = {"model": "resnet20", "dataset": "synthetic", "batch_size": 64, "nnodes": 1, "workers": 0,
          "precision": "fp32", "strategy": "allreduce", "compress": "none", "ps_servers": 1, "image_size": 32,
          "threads": 1, "bucket_cap_mb": None}


def point(nproc: int, step: float, efficiency: float, limit: str) -> dict:
    phases = {"data_wait": 0.001, "h2d": 0.0, "forward": 0.3 * step, "backward": 0.5 * step,
              "comm_exposed": 0.15 * step, "optimizer": 0.03 * step, "other": 0.02 * step - 0.001}
    return {"id": f"nproc{nproc}", "axes": {"nproc": nproc}, "config": {**CONFIG, "nproc": nproc},
            "phases_s": phases, "step_time_s": step, "epoch_time_s": 50 * step / nproc, "steps_per_epoch": 50 // nproc,
            "samples_per_s": 64 * nproc / step, "speedup": efficiency * nproc, "efficiency": efficiency,
            "peak_memory_bytes": 300 * 2**20,
            "memory_bytes": {"parameters": 2**20, "gradients": 2**20, "optimizer": 2**20, "activations": 50 * 2**20,
                             "buckets": 2**20, "loader": 0, "baseline": 240 * 2**20},
            "comm": {"bytes_per_step": 1_077_736, "buckets": 3, "comm_total_s": 0.01, "comm_hidden_s": 0.005,
                     "overlap_ratio": 0.5},
            "layers": {"measured": 12, "regression": 30, "roofline": 0},
            "limit": limit, "limit_note": f"{limit}: a note for nproc {nproc}"}


def prediction(basis: str = "datasheet") -> dict:
    return {"format": 1, "kind": "prediction", "scaletrain_version": "0.1.0", "basis": basis,
            "basis_note": "Example X1 data sheet (peak 20 TFLOP/s, 25 GB/s)",
            "network": {"intra": {"alpha_s": 5e-6, "beta_s_per_byte": 4e-11}, "inter": None, "source": "data sheet"},
            "axes": {"nproc": [1, 2, 4], "batch_size": [64]},
            "regression": {"Conv2d/fp32/t1": {"cv_median_abs_error": 0.06, "points": 80}},
            "points": [point(1, 0.1, 1.0, "compute"), point(2, 0.11, 0.91, "compute"),
                       point(4, 0.14, 0.71, "communication")],
            "scaling": {"first_limit": "communication", "efficiency_below_80_at": 4, "efficiency_below_50_at": None,
                        "notes": ["the all-reduce of 1.0 MiB takes 10 ms at 4 processes"]}}


def test_the_page_has_every_point_the_plots_and_the_data_sheet_basis(tmp_path):
    path = write_prediction_report(prediction(), tmp_path / "out")
    assert path == tmp_path / "out" / "report.html"
    html = path.read_text()
    assert "Data-sheet prediction" in html and "Example X1 data sheet" in html
    assert "data sheet, not calibrated" in html  # the title says so too
    for pid in ("nproc1", "nproc2", "nproc4"):
        assert f"<td class=\"text\">{pid}</td>" in html
    assert "71%" in html and "4.00x" in html  # efficiency of nproc4, its ideal speedup (2.84 / 0.71)
    assert "communication limits scaling first" in html and "below 80% at 4 processes" in html
    assert "a note for nproc 4" in html and "the all-reduce of 1.0 MiB" in html
    assert "Conv2d/fp32/t1" in html
    for name in ("speedup.png", "phases-per-point.png"):
        with Image.open(tmp_path / "out" / "plots" / name) as im:
            assert im.format == "PNG"
    assert html.count("data:image/png;base64,") == 2


def test_a_calibrated_prediction_says_so_and_one_process_count_draws_no_speedup(tmp_path):
    pred = prediction("calibration")
    pred["points"] = pred["points"][:1]
    html = write_prediction_report(pred, tmp_path).read_text()
    assert "calibration measured on this machine" in html and "Data-sheet" not in html
    assert "speedup plot: not drawn" in html
    assert not (tmp_path / "plots" / "speedup.png").exists()


def test_the_terminal_table(tmp_path):
    buf = io.StringIO()
    print_prediction(prediction(), Console(file=buf, width=200))
    out = buf.getvalue()
    assert out.splitlines()[0].startswith("Data-sheet prediction")
    for pid_row in ("compute", "communication", "100.0 ms", "140.0 ms"):
        assert pid_row in out
    assert "Communication limits scaling first" in out


def test_a_calibrations_network_model_shows_each_exchanges_fit():
    """A calibration fits each exchange inside the node on its own (allreduce, ps, halo, ...): each gets its row."""
    from scaletrain.predict.report import basis_tables

    pred = prediction("calibration")
    pred["network"] = {"intra": {"allreduce": {"alpha_s": 6e-4, "beta_s_per_byte": 5e-10},
                                 "halo": {"alpha_s": 1.5e-3, "beta_s_per_byte": 7e-10}},
                       "inter": {"alpha_s": 5e-5, "beta_s_per_byte": 1e-9}, "source": "calibration (local commbench)"}
    rows = {r[0]: r for r in basis_tables(pred)[0].rows}
    assert set(rows) == {"intra-node allreduce", "intra-node halo", "inter-node"}
    assert rows["intra-node halo"][1] != rows["intra-node allreduce"][1] and "-" not in rows["intra-node halo"][2]
