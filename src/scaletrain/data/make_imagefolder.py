"""Write a real dataset out as an ImageNet-layout JPEG folder, to exercise the image-folder path end to end."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

from scaletrain.data.digits import DIGITS_CLASSES, DIGITS_MAX, load_digits_split
from scaletrain.errors import UserError

SOURCES = ("digits",)
JPEG_MAX_SIDE = 65535  # the format's 16-bit dimensions
_MAX_ROTATION_DEG = 8.0  # digits stay legible (a 6 does not become a 9) under small rotations


def _check_image_fits(image_size: int) -> None:
    """One image in memory: the digit resized, its shifted copy and the encoder's rows (8-bit grayscale each)."""
    from scaletrain import fmt
    from scaletrain.perf.footprint import available_bytes

    need, available = 3 * image_size ** 2, available_bytes("cpu")
    if available is not None and need > available:
        raise UserError(f"--image-size {image_size} needs {fmt.size(need)} of memory per image, and "
                        f"{fmt.size(available)} is available: use a smaller --image-size")


def _check_out(out: Path) -> None:
    """Refuse to overwrite anything the user already has."""
    if out.is_file() or (out.exists() and not out.is_dir()):
        raise UserError(f"{out} already exists and is a file: choose a new --out")
    if out.is_dir() and any(out.iterdir()):
        raise UserError(f"{out} already exists and is not empty: choose a new --out or delete it")


def _make_tmp_sibling(out: Path) -> Path:
    """A fresh sibling folder to build in, so the final rename is the only step that touches out."""
    out.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = out.parent / f"{out.name}.tmp-{secrets.token_hex(4)}"
        try:
            # mkdir (not mkdtemp) so the folder gets the user's normal permissions, not 0700.
            tmp.mkdir()
            return tmp
        except FileExistsError:
            continue


def _digit_image(raw: np.ndarray, image_size: int) -> Image.Image:
    """An 8x8 0..16 digit as an image_size x image_size grayscale PIL image."""
    arr = np.clip(np.rint(raw * (255.0 / DIGITS_MAX)), 0, 255).astype(np.uint8)
    # A 2-D uint8 array becomes a mode "L" image.
    return Image.fromarray(arr).resize((image_size, image_size), Image.Resampling.BILINEAR)


def _jitter(img: Image.Image, rng: np.random.Generator, max_shift: float) -> Image.Image:
    """A small random rotation + shift, black fill, so copies of one digit differ."""
    angle = float(rng.uniform(-_MAX_ROTATION_DEG, _MAX_ROTATION_DEG))
    dx, dy = (float(v) for v in rng.uniform(-max_shift, max_shift, size=2))
    return img.rotate(angle, resample=Image.Resampling.BILINEAR, translate=(dx, dy), fillcolor=0)


def check_request(*, source: str, out: str | Path, image_size: int, copies: int, seed: int, quality: int) -> Path:
    """Every check of a make-imagefolder request, before anything is written (or a progress bar shown): the
    folder to create."""
    if source not in SOURCES:
        raise UserError(f"unknown source '{source}' for make-imagefolder: use one of {', '.join(SOURCES)}")
    if int(image_size) < 8:
        raise UserError(f"--image-size {image_size} is too small: use 8 or more")
    if int(image_size) > JPEG_MAX_SIDE:
        raise UserError(f"--image-size {image_size} is more than a JPEG can hold ({JPEG_MAX_SIDE} pixels a side): "
                        "use a smaller one")
    _check_image_fits(int(image_size))
    if int(copies) < 1:
        raise UserError(f"--copies {copies} must be at least 1")
    if not 1 <= int(quality) <= 100:
        raise UserError(f"--quality {quality} must be between 1 and 100")
    if not 0 <= int(seed) < 2 ** 32:
        raise UserError(f"--seed must be in 0..{2 ** 32 - 1} (got {seed})")
    out = Path(out).expanduser()
    _check_out(out)
    return out


def write_imagefolder(*, source: str, out: str | Path, image_size: int = 64, copies: int = 1, seed: int = 0,
                      quality: int = 90, progress: Callable[[int, int], None] | None = None) -> dict:
    """Write source's train/val split as out/{train,val}/<class>/<idx>_<copy>.jpg; return the counts."""
    out = check_request(source=source, out=out, image_size=image_size, copies=copies, seed=seed, quality=quality)

    train, val = load_digits_split()
    total = len(train.labels) * copies + len(val.labels)
    rng = np.random.default_rng(seed)
    max_shift = max(1.0, image_size * 0.05)
    tmp = _make_tmp_sibling(out)
    done = 0
    if progress is not None:
        progress(0, total)
    try:
        for split, data, n_copies in (("train", train, copies), ("val", val, 1)):
            for c in range(DIGITS_CLASSES):
                (tmp / split / str(c)).mkdir(parents=True)
            for raw, label, idx in zip(data.images, data.labels, data.indices):
                base = _digit_image(raw, image_size)
                for k in range(n_copies):
                    # Copy 0 is the clean digit, so copies=1 gives train images like the (clean) val ones.
                    img = base if k == 0 else _jitter(base, rng, max_shift)
                    img.save(tmp / split / str(int(label)) / f"{int(idx)}_{k}.jpg", quality=int(quality))
                    done += 1
                    if progress is not None:
                        progress(done, total)
        # Checked again just before the rename: something may have appeared at out while we were writing.
        _check_out(out)
        if out.is_dir():
            out.rmdir()
        os.rename(tmp, out)
    except BaseException:
        # BaseException so Ctrl-C also leaves no half-written tree behind.
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"train": len(train.labels) * copies, "val": len(val.labels), "classes": DIGITS_CLASSES, "path": str(out)}
