"""Checkpoints: written atomically, loadable with weights_only=True, carrying every RNG state."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scaletrain.errors import UserError
from scaletrain.rundir import RunDir, replace_atomic

FORMAT = 1


def rng_state() -> dict[str, Any]:
    """This process's RNG states in types that weights_only loading accepts (tensors, ints, tuples)."""
    np_kind, np_keys, np_pos, np_gauss, np_cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": (np_kind, torch.from_numpy(np_keys.astype(np.int64)), int(np_pos), int(np_gauss), float(np_cached)),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, gauss, cached))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_atomic(obj: Any, path: Path) -> None:
    """torch.save to a temp file in the same folder, fsync, then rename: a crash never leaves half a file."""
    replace_atomic(Path(path), lambda f: torch.save(obj, f))


def load(path: Path, mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint with weights_only=True (no arbitrary code runs from the file).

    mmap=True maps tensors lazily: cheap when only the recorded config is needed.
    """
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise UserError(f"no checkpoint at {path}: start without --resume, or point --out at a run "
                        "that has one") from None
    except Exception as e:  # unpickling errors come in many types
        raise UserError(f"checkpoint {path} cannot be read ({type(e).__name__}): it is damaged or "
                        "not a scaletrain checkpoint; start a new run with another --out") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise UserError(f"{path} is not a scaletrain checkpoint (format {FORMAT}): start a new run with another --out")
    return ckpt


def check_compatible(ckpt: dict[str, Any], model: str, dataset: str, path: Path) -> None:
    """A checkpoint may only continue the same model on the same data."""
    old = ckpt["config"]
    if old["model"] != model:
        raise UserError(f"checkpoint {path} was written for model '{old['model']}', not '{model}': "
                        f"resume with --model {old['model']} or start a new run with another --out")
    if old["dataset"] != dataset:
        raise UserError(f"checkpoint {path} was written for dataset '{old['dataset']}', not '{dataset}': "
                        f"resume with --dataset {old['dataset']} or start a new run with another --out")


# Settings a checkpoint's weights and optimizer state depend on: a resume may not change them. Everything
# else (epochs, lr and its schedule, batch size, nproc, workers, ...) takes this invocation's value.
IDENTITY = ("model", "dataset", "image_size", "stem", "width", "synthetic_samples", "synthetic_classes",
            "optimizer", "strategy", "ps_servers", "compress")


def identity_changes(saved: dict[str, Any], wanted: dict[str, Any], default_size) -> list[str]:
    """`--width 2 (the run has 1.0)` for each IDENTITY setting that differs; image_size compared resolved."""
    changes = []
    for key in IDENTITY:
        old, new = saved.get(key), wanted.get(key)
        if key == "image_size":
            old = old or default_size(saved.get("dataset", ""))
            new = new or default_size(wanted.get("dataset", ""))
        if key in saved and old != new:
            changes.append(f"--{key.replace('_', '-')} {new} (the run has {old})")
    return changes


def check_resume(ckpt: dict[str, Any], wanted: dict[str, Any], path: Path, default_size) -> None:
    """Refuse, before anything is written, a resume that changes what the checkpoint was trained as."""
    changes = identity_changes(ckpt["config"], wanted, default_size)
    was, now = ckpt["config"].get("strategy"), wanted.get("strategy")
    if was and now and _state_keys(was) != _state_keys(now):
        changes.append(f"--strategy {was} to {now} (the checkpoint's optimizer state is keyed by parameter "
                       f"{_state_keys(was)}, {now}'s by {_state_keys(now)})")
    if changes:
        raise UserError(f"--resume cannot change {'; '.join(changes)}: resume with the run's own settings "
                        f"(see {RunDir(Path(path).parent).config}), or start a new run with another --out")


def _state_keys(strategy: str) -> str:
    from scaletrain.comm.registry import STRATEGIES, strategy_class

    return strategy_class(strategy).optimizer_state_keys if strategy in STRATEGIES else "positions"
