"""`scaletrain make-imagefolder`: a JPEG image folder (train/ val/) written from real data."""

from __future__ import annotations

import argparse

from scaletrain.command import Command


def add_make_imagefolder_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", default="digits", help="where the images come from (default: digits)")
    p.add_argument("--out", required=True, help="folder to create (must not exist or be empty)")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--copies", type=int, default=1, help="shifted copies of each training image")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quality", type=int, default=90, help="JPEG quality")


def run_make_imagefolder(args: argparse.Namespace) -> int:
    from scaletrain.console.phase import phase
    from scaletrain.data import write_imagefolder
    from scaletrain.data.make_imagefolder import check_request

    check_request(source=args.source, out=args.out, image_size=args.image_size, copies=args.copies, seed=args.seed,
                  quality=args.quality)  # before the progress bar: a refusal is its line alone
    with phase(f"writing JPEGs to {args.out}") as update:
        result = write_imagefolder(source=args.source, out=args.out, image_size=args.image_size,
                                   copies=args.copies, seed=args.seed, quality=args.quality,
                                   progress=lambda done, total: update("", done, total))
    print(f"wrote {result['train']} training and {result['val']} validation images of {result['classes']} "
          f"classes to {result['path']}\ntrain on it with:  scaletrain train --dataset imagefolder:{result['path']} "
          f"--image-size {args.image_size}")
    return 0


COMMANDS = (
    Command("make-imagefolder", "write a JPEG image folder (train/ val/) from real data",
            add_make_imagefolder_args, run_make_imagefolder),
)
