"""Bad input to the prediction and performance commands (predict, graph, split, commbench): one line naming
the problem and the fix, exit 2, nothing written, found before a calibration is read, a model traced or a
process spawned (in-process through main(); a calibration made up in tests/predict_fixtures.py)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from predict_fixtures import fake_calibration
from scaletrain.cli import main
from scaletrain.predict import calibration

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cal_file(tmp_path_factory) -> Path:
    return calibration.save(fake_calibration(), tmp_path_factory.mktemp("cal") / "cal.json")


def one_error_line(capsys, *needles: str) -> str:
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("error: ") and "Traceback" not in captured.err + captured.out
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def predict(out: Path, *flags: str, cal: Path | None = None) -> int:
    return main(["predict", "--out", str(out), "--dataset", "synthetic", "--synthetic-samples", "512",
                 "--model", "lenet5", *(["--calibration", str(cal)] if cal else []), *flags])


REFUSED = {
    "global batch of 0": (["--global-batch", "0"], ["--global-batch 0", "at least 1"]),
    "global batch the trainers do not divide": (["--nproc", "1,2", "--global-batch", "7"],
                                                ["--global-batch 7", "2 trainers", "6 or 8"]),
    "global batch beside a batch size": (["--global-batch", "64", "--batch-size", "32"],
                                         ["--global-batch", "--batch-size"]),
    "shared cores of 0": (["--shared-cores", "0"], ["--shared-cores 0", "at least 1"]),
    "latency that does not parse": (["--link", "1gbit", "--latency", "1.2.3ms"], ["--latency '1.2.3ms'"]),
    "latency without a link": (["--latency=-1ms"], ["--latency -1ms", "--link"]),
    "rate that does not parse": (["--link", "1.2.3gbit"], ["--link '1.2.3gbit'", "1gbit"]),
    "network beside a link": (["--network", "cb.json", "--link", "1gbit"], ["--network", "--link"]),
    "more trainers than batches": (["--nnodes", "100000"], ["100000 trainers", "training samples"]),
    "more stages than processes": (["--strategy", "pipeline", "--nproc", "2", "--stages", "3"],
                                   ["no trainer", "--strategy pipeline"]),
    "powersgd": (["--nproc", "2", "--compress", "powersgd:2"], ["--compress powersgd:2"]),
    "a batch larger than the data": (["--batch-size", "100000000"], ["--batch-size 100000000"]),
    "a hardware profile beside a calibration": (["--hardware", "dgx-a100-80gb"], ["--hardware", "--calibration"]),
}


@pytest.mark.parametrize("case", REFUSED)
def test_predict_refuses_in_one_line(case, cal_file, tmp_path, capsys):
    flags, words = REFUSED[case]
    assert predict(tmp_path / "p", *flags, cal=cal_file) == 2
    one_error_line(capsys, *words)
    assert not (tmp_path / "p").exists()


HARDWARE = {  # refused before any calibration is read or made (no --calibration: the cache is never touched)
    "a training config given as the profile": (["--hardware", str(ROOT / "configs" / "demo.toml")],
                                               ["training config", "--config"]),
    "more processes per node than its GPUs": (["--hardware", "dgx-a100-80gb", "--nproc", "9"],
                                              ["--nproc 9", "8 GPUs"]),
    "a speed probe of a machine not here": (["--hardware", "dgx-a100-80gb", "--probe", "on"],
                                            ["--probe on", "--hardware"]),
    "testbed cores on a data sheet": (["--hardware", "dgx-a100-80gb", "--shared-cores", "2"],
                                      ["--shared-cores", "--hardware"]),
}


@pytest.mark.parametrize("case", HARDWARE)
def test_predict_on_a_data_sheet_refuses_in_one_line(case, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "cache"))
    flags, words = HARDWARE[case]
    assert predict(tmp_path / "p", *flags) == 2
    one_error_line(capsys, *words)
    assert not (tmp_path / "p").exists() and not (tmp_path / "cache").exists()


@pytest.fixture(scope="module")
def auto_buckets(cal_file, tmp_path_factory) -> tuple[dict, str]:
    """A prediction with --bucket-cap-mb auto, and what it printed to a pipe (not a terminal)."""
    out = tmp_path_factory.mktemp("auto") / "p"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert predict(out, "--nproc", "2", "--bucket-cap-mb", "auto", cal=cal_file) == 0
    return json.loads((out / "prediction.json").read_text()), printed.getvalue()


def test_bucket_cap_auto_is_predicted_at_the_cap_auto_chooses(auto_buckets):
    prediction, _ = auto_buckets
    two = prediction["points"][0]
    assert two["config"]["bucket_cap_mb"] == "auto"
    assert two["comm"]["overlap_ratio"] == two["comm"]["best_overlap_ratio"]
    assert any("--bucket-cap-mb auto" in n for n in prediction["notes"])


def test_a_table_printed_to_a_pipe_keeps_every_column(auto_buckets):
    _, printed = auto_buckets
    header = next(line for line in printed.splitlines() if "nproc" in line and "step" in line)
    for column in ("speedup", "ideal", "efficiency", "limit"):
        assert column in printed, printed
    assert len(header) > 80  # wider than rich's default for a file, and whole


def test_bucket_cap_auto_keeps_ddps_default_under_powersgd_in_training(cal_file, tmp_path, monkeypatch):
    from scaletrain.config import build_config
    from scaletrain.predict import auto_bucket

    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path))
    calibration.save(fake_calibration(), calibration.cache_path())
    cfg = build_config({}, {"model": "lenet5", "dataset": "synthetic", "nproc": 2, "compress": "powersgd:2",
                            "bucket_cap_mb": "auto"})
    cap, info = auto_bucket.choose(cfg, 1e-4, 1e-9)
    assert cap is None and "PowerSGD" in info["reason"]


def test_one_rate_parser_reads_bits_with_or_without_per_second():
    from scaletrain.errors import UserError
    from scaletrain.predict.cli import parse_rate

    assert parse_rate("10Gbit/s") == parse_rate("10gbit") == parse_rate("1e1gbit") == 10e9 / 8
    for bad, words in (("1.2.3gbit", "--link '1.2.3gbit'"), ("1gbps", "'bps' is bytes per second to tc")):
        with pytest.raises(UserError, match=words):
            parse_rate(bad)


def test_graph_refuses_what_this_machine_cannot_trace(tmp_path, capsys):
    assert main(["graph", "--model", "lenet5", "--out", str(tmp_path / "g"), "--batch-size", "100000000"]) == 2
    one_error_line(capsys, "--batch-size 100000000")
    assert main(["graph", "--model", "lenet5", "--out", str(tmp_path / "g"), "--image-size", "100000"]) == 2
    one_error_line(capsys, "--image-size 100000")
    assert not (tmp_path / "g").exists()


@pytest.mark.parametrize("flags, words", [
    (["--batch-size", "100000000"], ["--batch-size 100000000"]),
    (["--image-size", "100000"], ["--image-size 100000"]),
    (["--batch-size", "0"], ["--batch-size 0", "at least 1"]),
    (["--link", "1.2.3gbit"], ["--link '1.2.3gbit'"]),
])
def test_split_refuses_in_one_line_before_measuring(flags, words, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "cache"))
    code = main(["split", "--model", "lenet5", "--stages", "2", "--costs", "measured", "--out", str(tmp_path / "s"),
                 *flags])
    assert code == 2
    one_error_line(capsys, *words)
    assert not (tmp_path / "s").exists()


def test_commbench_refuses_more_ranks_than_the_machine_holds_before_spawning(tmp_path, capsys, monkeypatch):
    from scaletrain.commbench import cli

    def spawned(*_a, **_k):
        raise AssertionError("500 ranks were spawned")

    monkeypatch.setattr(cli, "_launch", spawned)
    assert main(["commbench", "--nproc", "500", "--sizes", "1K", "--out", str(tmp_path / "cb")]) == 2
    one_error_line(capsys, "--nproc 500", "or fewer")
    assert not (tmp_path / "cb").exists()
