"""Bad input found before anything is spawned or written: one line naming the problem and the fix, exit 2
(in-process through main(); the end-to-end variants are in test_bad_input.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaletrain.cli import main


def one_error_line(capsys, *needles: str) -> str:
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("error: ") and "Traceback" not in captured.err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("argv, needle", [
    (["train", "--batch-size", "abc"], "argument --batch-size: invalid int value: 'abc'"),
    (["train", "--no-such-flag"], "unrecognized arguments: --no-such-flag: see `scaletrain train --help`"),
    (["study", "--out", "x", "--colour", "1,2"], "see `scaletrain study --help`"),
    ([], "the following arguments are required"),
])
def test_argparse_errors_are_one_line(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    one_error_line(capsys, needle)


@pytest.mark.parametrize("flag, value", [("--weight-decay", "-1"), ("--momentum", "1.5"), ("--seed", "-1"),
                                         ("--lr", "inf"), ("--timeout", "0"), ("--width", "nan"),
                                         ("--bucket-cap-mb", "inf"), ("--inject", "data=inf")])
def test_impossible_numbers_are_refused(flag, value, tmp_path, capsys):
    assert main(["train", flag, value, "--out", str(tmp_path / "r")]) == 2
    one_error_line(capsys, flag)
    assert not (tmp_path / "r").exists()


def test_a_wrong_type_in_the_config_file_is_reported_even_when_a_flag_overrides_it(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('epochs = "three"\n')
    assert main(["train", "--config", str(cfg), "--epochs", "3", "--out", str(tmp_path / "r")]) == 2
    one_error_line(capsys, "'epochs' must be a int", "three")


def test_an_image_size_that_cannot_fit_in_memory_is_refused_before_allocating(tmp_path, capsys):
    assert main(["train", "--image-size", "100000", "--out", str(tmp_path / "r")]) == 2
    one_error_line(capsys, "TiB of memory", "lower --image-size (now 100000)")


def test_a_model_too_big_for_memory_is_refused_from_its_meta_estimate(tmp_path, capsys):
    assert main(["train", "--model", "mlp", "--dataset", "synthetic", "--image-size", "8000",
                 "--out", str(tmp_path / "r")]) == 2
    one_error_line(capsys, "parameters and optimizer state")


def test_more_ranks_than_batches_is_refused_before_spawning(tmp_path, capsys):
    assert main(["train", "--model", "lenet5", "--nproc", "64", "--out", str(tmp_path / "r")]) == 2
    one_error_line(capsys, "--batch-size 64 x 64 training ranks", "1437 training samples")
    assert not (tmp_path / "r").exists()


def test_a_master_addr_that_is_not_this_machine(tmp_path, capsys):
    assert main(["train", "--model", "mlp", "--master-addr", "10.255.255.1", "--out", str(tmp_path / "r")]) == 2
    one_error_line(capsys, "--master-addr 10.255.255.1 is not an address of this machine")
    assert not (tmp_path / "r").exists()


def test_an_out_folder_holding_other_files_is_refused(tmp_path, capsys):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "holiday.jpg").write_bytes(b"not ours")
    assert main(["train", "--model", "mlp", "--out", str(folder)]) == 2
    one_error_line(capsys, "is a folder with other files in it")
    assert [p.name for p in folder.iterdir()] == ["holiday.jpg"]


@pytest.mark.parametrize("spec", ["kill-rank=5:3", "slow-rank=2:0.1", "stop-rank=9:1"])
def test_an_injection_for_a_rank_that_does_not_exist(spec, tmp_path, capsys):
    assert main(["train", "--model", "mlp", "--nproc", "2", "--inject", spec, "--out", str(tmp_path / "r")]) == 2
    one_error_line(capsys, "there are only 2 ranks (0..1)")
