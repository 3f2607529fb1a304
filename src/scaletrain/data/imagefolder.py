"""ImageNet-layout folders (PATH/{train,val}/<class>/<image>) decoded lazily with Pillow."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from scaletrain.data.collate import BadSample
from scaletrain.data.transforms import imagenet_train_transform, imagenet_val_transform
from scaletrain.errors import UserError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
DEFAULT_IMAGEFOLDER_SIZE = 224
# What a decode can throw on a bad file: OSError covers UnidentifiedImageError and truncation,
# the rest cover malformed headers and decompression bombs.
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)
# Pillow refuses images over 2 x 89.5 M pixels as decompression bombs; large-image training (pathology, remote
# sensing) is the point here, and a JPEG (at most 65,535 px a side) is decoded reduced when the run asks for less
LARGEST_PIXELS = 65535 * 65535
Image.MAX_IMAGE_PIXELS = max(Image.MAX_IMAGE_PIXELS or 0, LARGEST_PIXELS // 2)


class PathTable:
    """Many relative paths packed into one byte buffer plus offsets."""

    # Why not a list of str: with forked loader workers, touching Python objects bumps refcounts, which
    # copies their pages into every worker; two numpy arrays stay shared (matters at ImageNet's 1.3M files).
    def __init__(self, paths: list[str]):
        encoded = [p.encode("utf-8", "surrogateescape") for p in paths]
        self.offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=self.offsets[1:])
        self.blob = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> str:
        return self.blob[self.offsets[i]:self.offsets[i + 1]].tobytes().decode("utf-8", "surrogateescape")


def _list_dirs(path: Path) -> list[str]:
    """Sorted visible subdirectory names (hidden ones such as .ipynb_checkpoints are skipped)."""
    with os.scandir(path) as it:
        return sorted(e.name for e in it if e.is_dir() and not e.name.startswith("."))


def _list_images(path: Path) -> list[str]:
    """Sorted image file names in one class folder (sorted: scandir order is filesystem-dependent)."""
    with os.scandir(path) as it:
        return sorted(e.name for e in it
                      if e.name.lower().endswith(IMAGE_EXTENSIONS) and not e.name.startswith(".") and e.is_file())


def scan_split(root: Path, split: str, classes: list[str] | None) -> tuple[list[str], list[str], list[int]]:
    """(class names, relative paths, labels) for root/split; classes=None means define them from this split."""
    split_dir = root / split
    names = _list_dirs(split_dir)
    if not names:
        raise UserError(f"{split_dir} has no class folders: put each class's images in {split_dir}/<class>/")
    if classes is None:
        classes = names
    else:
        known = set(classes)
        extra = [n for n in names if n not in known]
        if extra:
            raise UserError(f"{split_dir} has class folder(s) {', '.join(extra[:5])} that {root / 'train'} lacks: "
                            f"val classes must be a subset of train classes; rename or remove them")
    index = {c: i for i, c in enumerate(classes)}
    paths: list[str] = []
    labels: list[int] = []
    for name in names:
        files = _list_images(split_dir / name)
        if not files:
            raise UserError(f"class folder {split_dir / name} has no images ({'/'.join(IMAGE_EXTENSIONS)}): "
                            f"add images or remove the folder")
        paths.extend(f"{split}/{name}/{f}" for f in files)
        labels.extend([index[name]] * len(files))
    return classes, paths, labels


class ImageFolderDataset(Dataset):
    """Decodes one image per __getitem__; an unreadable file yields BadSample instead of an exception."""

    def __init__(self, root: str | Path, paths: list[str], labels: list[int], classes: list[str],
                 transform: Callable, output_shape: tuple[int, ...]):
        self.root = str(root)
        self.paths = PathTable(paths)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.classes = list(classes)
        self.transform = transform
        self.output_shape = tuple(output_shape)

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, index: int) -> str:
        """Absolute-or-as-given path of item index."""
        return os.path.join(self.root, self.paths[index])

    def __getitem__(self, index: int):
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} images")
        path = self.path(index)
        try:
            with Image.open(path) as im:
                reduced(im, self.transform)
                # convert() forces the full decode here, inside the try: Image.open only reads the header,
                # so a truncated JPEG would otherwise fail later, outside our handling.
                img = im.convert("RGB")
        except UnidentifiedImageError:
            # Pillow's own message repeats the path, which the report already starts with.
            return BadSample(path, "not a recognisable image (corrupt, empty or wrong format)", self.output_shape)
        except _DECODE_ERRORS as e:
            return BadSample(path, f"{type(e).__name__}: {e}".replace("\n", " "), self.output_shape)
        # The transform runs outside the try so a bug in it surfaces as an error, not as "bad images".
        return self.transform(img), int(self.labels[index])


def reduced(im: Image.Image, transform: Callable) -> None:
    """A JPEG larger than the transform needs decoded at 1/2, 1/4 or 1/8 of its size (the format's DCT scaling,
    PIL's draft): an image many times the training size never is whole in memory. Other formats decode whole."""
    wanted = getattr(transform, "decode_size", None)
    size = wanted(*im.size) if wanted is not None and im.format == "JPEG" else None
    if size is not None and (size[0] < im.size[0] or size[1] < im.size[1]):
        im.draft("RGB", size)


def build_imagefolder(path: str, *, image_size: int | None = None, augment: bool = True):
    """(train, val, classes, image_size) for spec "imagefolder:PATH", validating the layout up front."""
    if not path:
        raise UserError("imagefolder needs a path: use --data imagefolder:PATH with PATH/train and PATH/val")
    root = Path(path).expanduser()
    if not root.exists():
        raise UserError(f"image folder {root} does not exist: check the path after 'imagefolder:'")
    if not root.is_dir():
        raise UserError(f"image folder {root} is a file, not a folder: give the folder holding train/ and val/")
    for split in ("train", "val"):
        if not (root / split).is_dir():
            raise UserError(f"{root} has no '{split}' subfolder: expected {root}/train/<class>/*.jpg and "
                            f"{root}/val/<class>/*.jpg")
    try:
        classes, train_paths, train_labels = scan_split(root, "train", None)
        _, val_paths, val_labels = scan_split(root, "val", classes)
    except OSError as e:
        raise UserError(f"cannot read image folder {root} ({e.strerror or e}): check its permissions") from None
    size = DEFAULT_IMAGEFOLDER_SIZE if image_size is None else int(image_size)
    shape = (3, size, size)
    train_tf = imagenet_train_transform(size) if augment else imagenet_val_transform(size)
    train = ImageFolderDataset(root, train_paths, train_labels, classes, train_tf, shape)
    val = ImageFolderDataset(root, val_paths, val_labels, classes, imagenet_val_transform(size), shape)
    return train, val, classes, size
