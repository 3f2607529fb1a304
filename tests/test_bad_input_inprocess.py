"""Bad input found before anything is spawned or written: one line naming the problem and the fix, exit 2,
nothing lost (in-process through main(); the same cases from the command line are in test_bad_input.py, slow).
Bad images found while training: their rank's error, or skipped and counted (ranks in-process)."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

import pytest

import multirank
from conftest import one_error_line, summary
from scaletrain.cli import main
from scaletrain.data import write_imagefolder


def fingerprint(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory, ranks) -> Path:
    """A finished run that no failing command may touch (its rank in-process: tests/multirank.py)."""
    out = tmp_path_factory.mktemp("earlier") / "run"
    multirank.train(ranks, "--model", "mlp", "--epochs", "1", "--no-progress", "--out", str(out))
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("folders")
    (base / "empty").mkdir()
    (base / "no_images" / "train" / "a").mkdir(parents=True)
    (base / "no_images" / "train" / "b").mkdir(parents=True)
    (base / "no_images" / "val" / "a").mkdir(parents=True)
    write_imagefolder(source="digits", out=base / "imgs", image_size=16)
    (base / "imgs" / "train" / "b").mkdir()  # a class folder without images
    corrupt = base / "corrupt"
    write_imagefolder(source="digits", out=corrupt, image_size=16)
    victim = sorted((corrupt / "train" / "3").iterdir())[0]
    victim.write_bytes(victim.read_bytes()[:200])  # a truncated JPEG
    (corrupt / "train" / "7" / "garbage.jpg").write_bytes(b"this is not a JPEG at all")
    (base / "a_file").write_text("not a directory")
    (base / "bad.toml").write_text("epochs = = 3\n")
    (base / "misspelt.toml").write_text('model = "mlp"\nlerning_rate = 0.1\n')
    return {"base": base, "victim": victim}


CASES = {
    "unknown model": (["--model", "resnt20"], ["unknown model 'resnt20'", "resnet20"]),
    "unknown dataset": (["--dataset", "cifar"], ["unknown dataset 'cifar'", "digits"]),
    "factory does not import": (["--model", "no_such_pkg.mod:make"], ["cannot import", "PYTHONPATH"]),
    "missing image folder": (["--dataset", "imagefolder:{base}/nowhere"], ["does not exist"]),
    "empty image folder": (["--dataset", "imagefolder:{base}/empty"], ["train"]),
    "class folder without images": (["--dataset", "imagefolder:{base}/imgs"], ["no images", "b"]),
    "no images at all": (["--dataset", "imagefolder:{base}/no_images"], ["no images"]),
    "batch size below 1": (["--batch-size", "0"], ["--batch-size", "at least 1"]),
    "epochs below 1": (["--epochs", "0"], ["--epochs", "at least 1"]),
    "nproc below 1": (["--nproc", "0"], ["--nproc", "at least 1"]),
    "more GPUs than exist": (["--device", "cuda", "--nproc", "2"], ["no CUDA GPU", "--device cpu"]),
    "fp16 on cpu": (["--precision", "fp16"], ["fp16", "bf16"]),
    "unparsable toml": (["--config", "{base}/bad.toml"], ["bad.toml", "not valid TOML"]),
    "misspelt toml key": (["--config", "{base}/misspelt.toml"], ["lerning_rate", "did you mean 'lr'"]),
    "output dir is a file": (["--out", "{base}/a_file"], ["is a file", "--out"]),
    "resume without checkpoint": (["--resume", "--out", "{base}/never_ran"], ["no checkpoint", "--resume"]),
}


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


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_gives_one_line_and_loses_nothing(case, earlier_run, folders, capsys):
    args, needles = CASES[case]
    args = [a.format(base=folders["base"]) for a in args]
    before = fingerprint(earlier_run)
    if "--out" not in args:
        args += ["--out", str(folders["base"] / f"out-{case.replace(' ', '_')}")]
    assert main(["train", "--no-progress", *args]) == 2
    one_error_line(capsys, *needles)
    assert fingerprint(earlier_run) == before
    if case != "output dir is a file":
        assert not Path(args[args.index("--out") + 1]).exists(), "a refused run must not create its directory"


def test_existing_run_is_not_overwritten_without_resume(earlier_run, capsys):
    before = fingerprint(earlier_run)
    assert main(["train", "--model", "mlp", "--out", str(earlier_run)]) == 2
    one_error_line(capsys, "already holds a run", "--resume")
    assert fingerprint(earlier_run) == before


def test_resume_from_a_checkpoint_of_another_model(earlier_run, capsys):
    before = fingerprint(earlier_run)
    assert main(["train", "--resume", "--model", "lenet5", "--out", str(earlier_run)]) == 2
    one_error_line(capsys, "--resume cannot change --model lenet5 (the run has mlp)")
    assert fingerprint(earlier_run) == before


def test_master_port_already_in_use(tmp_path, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["train", "--nproc", "2", "--master-port", str(port), "--out", str(tmp_path / "r")]) == 2
    one_error_line(capsys, f"port {port}", "--master-port")
    assert not (tmp_path / "r").exists()


def _rank_error(rank, world, cfg_dict):
    """A rank of the run, returning the bad-input error it stops with (None if it finishes)."""
    from scaletrain.errors import UserError

    try:
        multirank.train_rank(rank, world, cfg_dict)
    except UserError as e:
        return str(e)
    return None


def test_corrupt_jpeg_stops_the_rank_naming_it(folders, tmp_path, ranks):
    cfg = multirank.train_config("--dataset", f"imagefolder:{folders['base']}/corrupt", "--image-size", "16",
                                 "--model", "lenet5", "--epochs", "1", "--out", str(tmp_path / "r"))
    (tmp_path / "r").mkdir()
    [message] = ranks.run(_rank_error, 1, cfg.to_dict())
    assert message is not None and message.startswith("unreadable image ") and "--bad-images skip" in message
    assert "garbage.jpg" in message or folders["victim"].name in message


def test_bad_images_skip_finishes_and_counts_them(folders, tmp_path, ranks):
    out = tmp_path / "r"
    multirank.train(ranks, "--dataset", f"imagefolder:{folders['base']}/corrupt", "--image-size", "16",
                    "--model", "lenet5", "--epochs", "1", "--batch-size", "128", "--nproc", "2",
                    "--bad-images", "skip", "--out", str(out))
    s = summary(out)
    assert s["status"] == "completed"
    # one epoch with drop_last may leave a bad file in the dropped tail: at least one, at most both
    assert 1 <= s["bad_images_skipped"] <= 2
    assert {Path(p).name for p in s["bad_images"]} <= {"garbage.jpg", folders["victim"].name}
