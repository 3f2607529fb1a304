"""Tests for write_imagefolder (digits -> ImageNet-layout JPEG folder) and `scaletrain make-imagefolder`."""

import numpy as np
import pytest
from PIL import Image

from scaletrain.cli import main
from scaletrain.data import build_datasets, write_imagefolder
from scaletrain.data.digits import load_digits_split
from scaletrain.errors import UserError


def _tree(path):
    return sorted((str(p.relative_to(path)), p.read_bytes() if p.is_file() else None) for p in path.rglob("*"))


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("mk") / "digits_if"
    calls = []
    info = write_imagefolder(source="digits", out=out, image_size=16, copies=2, seed=1,
                             progress=lambda d, t: calls.append((d, t)))
    return out, info, calls


def test_counts_and_layout(written):
    out, info, _ = written
    assert info == {"train": 2 * 1437, "val": 360, "classes": 10, "path": str(out)}
    assert len(list((out / "train").rglob("*.jpg"))) == 2874
    assert len(list((out / "val").rglob("*.jpg"))) == 360
    _, val = load_digits_split()
    expect = {f"{d}/{i}_0.jpg" for d, i in zip(val.labels, val.indices)}
    assert {str(p.relative_to(out / "val")) for p in (out / "val").rglob("*.jpg")} == expect
    with Image.open(next((out / "val").rglob("*.jpg"))) as im:
        assert im.size == (16, 16)
    assert not list(out.parent.glob("*.tmp-*"))


def test_loads_as_imagefolder(written):
    out, _, _ = written
    b = build_datasets(f"imagefolder:{out}", image_size=32)
    assert (len(b.train), len(b.val), b.num_classes) == (2874, 360, 10)
    assert b.train.classes == [str(d) for d in range(10)]
    assert b.val[0][0].shape == (3, 32, 32)


def test_copies_differ_and_progress_reported(written):
    out, _, calls = written
    a = np.asarray(Image.open(out / "train" / "0" / "0_0.jpg"), dtype=float)
    b = np.asarray(Image.open(out / "train" / "0" / "0_1.jpg"), dtype=float)
    assert np.abs(a - b).mean() > 3
    total = 2874 + 360
    assert calls[0] == (0, total) and calls[-1] == (total, total)
    assert [d for d, _ in calls] == list(range(total + 1))


def test_images_are_the_digits(written):
    # Clean copies are upsampled digits: pooling back to 8x8 matches the source closely.
    out, _, _ = written
    train, _ = load_digits_split()
    i, label = int(train.indices[0]), int(train.labels[0])
    img = np.asarray(Image.open(out / "train" / str(label) / f"{i}_0.jpg"), dtype=float)
    pooled = img.reshape(8, 2, 8, 2).mean((1, 3))
    assert np.corrcoef(pooled.ravel(), train.images[0].ravel())[0, 1] > 0.9


def test_deterministic_given_seed(tmp_path, written):
    out, _, _ = written
    again = tmp_path / "again"
    write_imagefolder(source="digits", out=again, image_size=16, copies=2, seed=1)
    name = "train/5/" + sorted(p.name for p in (out / "train" / "5").glob("*_1.jpg"))[0]
    assert (again / name).read_bytes() == (out / name).read_bytes()


def test_refuses_non_empty_dir_and_leaves_it_untouched(tmp_path):
    out = tmp_path / "busy"
    (out / "train").mkdir(parents=True)
    (out / "keep.txt").write_text("mine")
    before = _tree(out)
    with pytest.raises(UserError, match="already exists and is not empty: choose a new --out or delete it"):
        write_imagefolder(source="digits", out=out, image_size=8)
    assert _tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy"]


def test_refuses_file_and_unknown_source(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(UserError, match="is a file"):
        write_imagefolder(source="digits", out=f)
    with pytest.raises(UserError, match="unknown source 'cifar'"):
        write_imagefolder(source="cifar", out=tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_empty_existing_dir_is_fine(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    assert write_imagefolder(source="digits", out=out, image_size=8)["val"] == 360
    assert (out / "val").is_dir()


def test_failure_midway_leaves_nothing(tmp_path):
    def explode(done, total):
        if done == 100:
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_imagefolder(source="digits", out=tmp_path / "half", image_size=8, progress=explode)
    assert list(tmp_path.iterdir()) == []


def test_the_command_writes_the_folder_and_says_how_to_train_on_it(tmp_path, capsys):
    out = tmp_path / "imgs"
    assert main(["make-imagefolder", "--out", str(out), "--image-size", "8", "--quality", "50"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"writing JPEGs to {out} ...\nwriting JPEGs to {out}: 1/1797, ")  # in a log: lines
    assert f"wrote 1437 training and 360 validation images of 10 classes to {out}" in printed
    assert f"scaletrain train --dataset imagefolder:{out} --image-size 8" in printed
    assert len(list((out / "train").rglob("*.jpg"))) == 1437 and len(list((out / "val").rglob("*.jpg"))) == 360
    assert Image.open(next((out / "val").rglob("*.jpg"))).size == (8, 8)


@pytest.mark.parametrize("flag, value, message", [("--image-size", "4", "--image-size 4 is too small: use 8 or more"),
                                                  ("--copies", "0", "--copies 0 must be at least 1"),
                                                  ("--quality", "101", "--quality 101 must be between 1 and 100")])
def test_the_command_refuses_impossible_settings_in_one_line(tmp_path, capsys, flag, value, message):
    assert main(["make-imagefolder", "--out", str(tmp_path / "x"), flag, value]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {message}\n"
    assert not (tmp_path / "x").exists()
