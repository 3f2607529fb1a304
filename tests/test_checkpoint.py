"""Tests for checkpoints: RNG capture, atomic writes, safe loading and compatibility checks."""

from __future__ import annotations

import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from scaletrain.train import checkpoint
from scaletrain.train.checkpoint import FORMAT, check_compatible, load, rng_state, save_atomic, set_rng_state
from scaletrain.errors import UserError


def draw() -> tuple:
    """A few values from every stream, including the cached-gaussian paths of numpy and random."""
    return (torch.rand(5).tolist(), torch.randn(3).tolist(), np.random.rand(4).tolist(),
            np.random.standard_normal(3).tolist(), [random.random() for _ in range(4)], random.gauss(0, 1),
            random.randrange(10**9))


def listing(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


# ------------------------------------------------------------------ RNG state

def test_rng_state_restores_every_stream_exactly():
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    draw()  # leave half-used gaussian caches behind
    state = rng_state()
    first = draw()
    assert draw() != first  # the streams do move on
    set_rng_state(state)
    assert draw() == first


def test_rng_state_survives_a_weights_only_checkpoint(tmp_path):
    torch.manual_seed(5), np.random.seed(6), random.seed(7)
    random.gauss(0, 1), np.random.standard_normal()
    path = tmp_path / "ckpt.pt"
    save_atomic({"format": FORMAT, "rng": [rng_state()]}, path)
    first = draw()
    set_rng_state(load(path)["rng"][0])
    assert draw() == first


def test_each_stream_is_restored_independently():
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    state = rng_state()
    t, n, r = torch.rand(2).tolist(), np.random.rand(2).tolist(), random.random()
    # disturb all three differently, then restore
    torch.rand(7), np.random.rand(11), random.random(), random.random()
    set_rng_state(state)
    assert torch.rand(2).tolist() == t
    assert np.random.rand(2).tolist() == n
    assert random.random() == r


# ------------------------------------------------------------------ save_atomic

def test_save_atomic_writes_a_loadable_file_and_no_temp(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_atomic({"format": FORMAT, "w": torch.arange(6.0)}, path)
    assert listing(tmp_path) == ["checkpoint.pt"]
    assert torch.equal(load(path)["w"], torch.arange(6.0))
    assert torch.equal(load(path, mmap=True)["w"], torch.arange(6.0))


def test_save_atomic_replaces_by_rename(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_atomic({"format": FORMAT, "v": torch.tensor([1.0])}, path)
    old_inode = path.stat().st_ino
    with open(path, "rb") as old:
        save_atomic({"format": FORMAT, "v": torch.tensor([2.0])}, path)
        # a reader that opened the old file still reads the whole old file
        assert torch.load(old, weights_only=True)["v"].item() == 1.0
    assert path.stat().st_ino != old_inode
    assert load(path)["v"].item() == 2.0
    assert listing(tmp_path) == ["checkpoint.pt"]


def test_failed_save_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_atomic({"format": FORMAT, "v": torch.tensor([1.0])}, path)
    before = path.read_bytes()
    with pytest.raises(Exception):  # a lambda cannot be pickled (the type varies by Python version)
        save_atomic({"format": FORMAT, "v": torch.tensor([2.0]), "bad": lambda: 0}, path)
    assert path.read_bytes() == before
    assert listing(tmp_path) == ["checkpoint.pt"]


def test_failed_first_save_leaves_nothing(tmp_path):
    with pytest.raises(Exception):
        save_atomic({"bad": lambda: 0}, tmp_path / "checkpoint.pt")
    assert listing(tmp_path) == []


# ------------------------------------------------------------------ load

def _record(path: str) -> str:
    Path(path).write_text("code ran")
    return "payload"


class Payload:
    """Unpickling this runs _record: exactly what weights_only=True must refuse to do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return _record, (self.marker,)


def test_load_refuses_arbitrary_pickled_objects_without_running_them(tmp_path):
    path, marker = tmp_path / "evil.pt", tmp_path / "marker"
    torch.save({"format": FORMAT, "x": Payload(str(marker))}, path)
    with pytest.raises(UserError, match="cannot be read"):
        load(path)
    assert not marker.exists()
    # control: an unrestricted load would have run the code
    assert torch.load(path, weights_only=False)["x"] == "payload"
    assert marker.exists()


def test_load_refuses_a_plain_pickle_too(tmp_path):
    path, marker = tmp_path / "evil.pkl", tmp_path / "marker"
    path.write_bytes(pickle.dumps({"format": FORMAT, "x": Payload(str(marker))}, protocol=2))
    with pytest.raises(UserError):
        load(path)
    assert not marker.exists()


def test_load_missing_file_mentions_resume(tmp_path):
    with pytest.raises(UserError) as e:
        load(tmp_path / "checkpoint.pt")
    assert "--resume" in str(e.value) and "checkpoint.pt" in str(e.value)


def test_load_garbage_is_a_user_error(tmp_path):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"\x00not a checkpoint at all" * 10)
    with pytest.raises(UserError, match="cannot be read"):
        load(path)


@pytest.mark.parametrize("obj", [{"model": {}}, {"format": FORMAT + 1}, [1, 2], torch.zeros(2)])
def test_load_rejects_objects_that_are_not_scaletrain_checkpoints(tmp_path, obj):
    path = tmp_path / "checkpoint.pt"
    torch.save(obj, path)
    with pytest.raises(UserError, match="not a scaletrain checkpoint"):
        load(path)


# ------------------------------------------------------------------ check_compatible

def ckpt_for(model="resnet20", dataset="digits") -> dict:
    return {"format": FORMAT, "config": {"model": model, "dataset": dataset}}


def test_compatible_checkpoint_passes():
    assert check_compatible(ckpt_for(), "resnet20", "digits", Path("c.pt")) is None


def test_other_model_is_named():
    with pytest.raises(UserError) as e:
        check_compatible(ckpt_for("resnet20"), "vgg11", "digits", Path("run/c.pt"))
    msg = str(e.value)
    assert "'resnet20'" in msg and "'vgg11'" in msg and "--model resnet20" in msg and "run/c.pt" in msg


def test_other_dataset_is_named():
    with pytest.raises(UserError) as e:
        check_compatible(ckpt_for(dataset="synthetic"), "resnet20", "digits", Path("c.pt"))
    msg = str(e.value)
    assert "'synthetic'" in msg and "--dataset synthetic" in msg


def test_format_constant_is_what_load_accepts(tmp_path):
    path = tmp_path / "c.pt"
    torch.save({"format": checkpoint.FORMAT, "epoch": 3}, path)
    assert load(path)["epoch"] == 3
