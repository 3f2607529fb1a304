"""Tests for the image-folder dataset: layout validation, decoding, bad files, DataLoader workers."""

import pickle
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from scaletrain.data import BadSample, build_datasets, collate
from scaletrain.errors import UserError

CLASSES = ["cat", "dog", "emu"]


def _save(path, size, colour, fmt=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(sum(colour) + size[0])
    arr = np.clip(np.asarray(colour) + rng.integers(-20, 20, size=(size[1], size[0], 3)), 0, 255).astype(np.uint8)
    Image.fromarray(arr).save(path, format=fmt)


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "imgs"
    for k, name in enumerate(CLASSES):
        colour = [60 + 80 * k, 100, 200 - 60 * k]
        for i, ext in enumerate([".jpg", ".png", ".JPEG"]):
            _save(root / "train" / name / f"{i}{ext}", (40 + 7 * i, 30 + 5 * k), colour)
        for i in range(2):
            _save(root / "val" / name / f"v{i}.jpg", (33, 47), colour)
    (root / "train" / "cat" / "notes.txt").write_text("not an image")
    (root / "train" / ".cache").mkdir()
    return root


def test_scans_layout(tree):
    b = build_datasets(f"imagefolder:{tree}", image_size=24)
    assert (len(b.train), len(b.val), b.num_classes, b.in_channels, b.image_size) == (9, 6, 3, 3, 24)
    assert b.train.classes == CLASSES
    x, y = b.val[5]
    assert x.shape == (3, 24, 24) and x.dtype == torch.float32 and y == 2
    assert [b.train[i][1] for i in range(9)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert b.train.path(4).endswith("train/dog/1.png")


def test_default_size_is_224(tree):
    b = build_datasets(f"imagefolder:{tree}")
    assert b.image_size == 224 and b.val[0][0].shape == (3, 224, 224)


def test_val_may_lack_a_class(tree):
    shutil.rmtree(tree / "val" / "emu")
    b = build_datasets(f"imagefolder:{tree}", image_size=16)
    assert b.num_classes == 3 and len(b.val) == 4


@pytest.mark.parametrize("breakage,match", [
    (lambda r: shutil.rmtree(r), r"does not exist"),
    (lambda r: shutil.rmtree(r / "train"), r"has no 'train' subfolder"),
    (lambda r: shutil.rmtree(r / "val"), r"has no 'val' subfolder"),
    (lambda r: [shutil.rmtree(r / "train" / c) for c in CLASSES], r"train has no class folders"),
    (lambda r: [shutil.rmtree(r / "val" / c) for c in CLASSES], r"val has no class folders"),
    (lambda r: (r / "train" / "fox").mkdir(), r"class folder .*train/fox has no images"),
    (lambda r: _save(r / "val" / "yak" / "a.jpg", (8, 8), [1, 2, 3]), r"val has class folder\(s\) yak"),
])
def test_layout_errors(tree, breakage, match):
    breakage(tree)
    with pytest.raises(UserError, match=match) as info:
        build_datasets(f"imagefolder:{tree}")
    assert "\n" not in str(info.value) and ":" in str(info.value)


def test_path_is_a_file_and_missing_path(tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(UserError, match="is a file"):
        build_datasets(f"imagefolder:{f}")
    with pytest.raises(UserError, match="needs a path"):
        build_datasets("imagefolder:")


def test_truncated_jpeg_and_garbage_give_bad_samples(tree):
    good = tree / "train" / "dog" / "0.jpg"
    # Big and noisy so that cutting it in half lands in the entropy-coded scan data, past the headers:
    # that is the case Pillow only notices when the pixels are actually decoded.
    _save(good, (200, 150), [120, 120, 120])
    data = good.read_bytes()
    assert data.index(b"\xff\xda") < len(data) // 2  # start-of-scan marker is before the cut
    good.write_bytes(data[: len(data) // 2])
    (tree / "train" / "emu" / "9.png").write_bytes(b"definitely not a png" * 10)
    b = build_datasets(f"imagefolder:{tree}", image_size=16)
    items = [b.train[i] for i in range(len(b.train))]
    bad = [s for s in items if isinstance(s, BadSample)]
    assert sorted(s.path for s in bad) == sorted([str(good), str(tree / "train" / "emu" / "9.png")])
    assert all(s.reason and s.shape == (3, 16, 16) for s in bad)
    x, y, reports = collate(items)
    assert x.shape == (len(items) - 2, 3, 16, 16) and len(y) == len(items) - 2
    assert len(reports) == 2 and any(r.startswith(str(good) + ": ") for r in reports)
    x, y, reports = collate(bad)
    assert x.shape == (0, 3, 16, 16) and y.shape == (0,) and len(reports) == 2


def test_dataset_pickles(tree):
    b = build_datasets(f"imagefolder:{tree}", image_size=16)
    clone = pickle.loads(pickle.dumps(b.val))
    assert torch.equal(clone[3][0], b.val[3][0]) and clone.path(3) == b.val.path(3)


def test_train_augmentation_reproducible(tree):
    b = build_datasets(f"imagefolder:{tree}", image_size=16)
    torch.manual_seed(5)
    a = torch.stack([b.train[i][0] for i in range(9)])
    torch.manual_seed(5)
    assert torch.equal(a, torch.stack([b.train[i][0] for i in range(9)]))
    plain = build_datasets(f"imagefolder:{tree}", image_size=16, augment=False)
    assert not torch.equal(a, torch.stack([plain.train[i][0] for i in range(9)]))


def test_dataloader_workers_match_single_process(tree):
    (tree / "val" / "dog" / "v9.jpg").write_bytes(b"\xff\xd8\xff garbage")  # a bad file rides along
    b = build_datasets(f"imagefolder:{tree}", image_size=16)
    kw = dict(batch_size=4, shuffle=False, collate_fn=collate)
    single = list(DataLoader(b.val, num_workers=0, **kw))
    forked = list(DataLoader(b.val, num_workers=2, multiprocessing_context="fork", **kw))
    assert len(single) == len(forked) == 2
    for (x0, y0, r0), (x1, y1, r1) in zip(single, forked):
        assert torch.equal(x0, x1) and torch.equal(y0, y1) and r0 == r1
    assert sum(len(r) for _, _, r in forked) == 1 and sum(len(y) for _, y, _ in forked) == 6


def _one_image_tree(root, image: Image.Image, name: str):
    for split in ("train", "val"):
        (root / split / "a").mkdir(parents=True)
        image.save(root / split / "a" / name)
    return root


@pytest.mark.parametrize("name, received", [("big.jpg", (256, 256)), ("big.png", (2048, 2048))])
def test_a_large_jpeg_is_decoded_reduced_to_what_the_run_needs(tmp_path, name, received):
    """A 2048 px JPEG evaluated at 64 px (resized to 73 first) is decoded at 1/8 (256 px), never whole; a PNG has
    no reduced decode."""
    rng = np.random.default_rng(0)
    picture = Image.fromarray(rng.integers(0, 255, (2048, 2048, 3), dtype=np.uint8))
    _one_image_tree(tmp_path, picture, name)
    val = build_datasets(f"imagefolder:{tmp_path}", image_size=64, seed=0).val
    seen = []
    inner = val.transform

    def spy(img):
        seen.append(img.size)
        return inner(img)

    spy.decode_size = inner.decode_size
    val.transform = spy
    x, _ = val[0]
    assert seen == [received] and tuple(x.shape) == (3, 64, 64)


def test_a_train_crop_keeps_its_detail_after_the_reduced_decode():
    from scaletrain.data.transforms import RandomResizedCrop

    crop = RandomResizedCrop(224)
    for width, height in ((4096, 3072), (1000, 5000), (300, 300)):
        w, h = crop.decode_size(width, height)
        assert w <= width and h <= height
        # the least crop it may draw on the reduced image is still 224 px each way
        area = w * h * crop.scale[0]
        assert min(w, (area * crop.ratio[0]) ** 0.5) >= 224 - 1 or w == width
        assert min(h, (area / crop.ratio[1]) ** 0.5) >= 224 - 1 or h == height


def test_pillows_bomb_limit_lets_any_jpeg_open():
    from scaletrain.data import imagefolder

    assert 2 * Image.MAX_IMAGE_PIXELS >= imagefolder.LARGEST_PIXELS - 1  # (raised on import: Pillow refuses above 2x)
