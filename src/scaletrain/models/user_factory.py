"""Loading a user model given as `package.module:factory`."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

from scaletrain.errors import UserError

# The only arguments scaletrain knows how to supply; a factory receives those it declares.
OFFERED = ("num_classes", "in_channels", "image_size")


def _one_line(text: str) -> str:
    """Collapse a possibly multi-line exception message so the CLI still prints one line."""
    return " ".join(str(text).split())


def _load(spec: str) -> Callable[..., Any]:
    """Import the module and look up the (possibly dotted) attribute named after the colon."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UserError(f"model '{spec}' is not of the form package.module:factory: give both parts around ':'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure is the user's to fix, so report it in one line
        raise UserError(
            f"cannot import module '{module_name}' for model '{spec}' ({type(exc).__name__}: {_one_line(exc)}): "
            "check the spelling and that its folder is on PYTHONPATH"
        ) from exc
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise UserError(
                f"module '{module_name}' has no attribute '{attr}' (model '{spec}'): "
                "check the name after ':' and that the module defines it"
            )
        target = getattr(target, part)
    if not callable(target):
        raise UserError(
            f"'{spec}' is a {type(target).__name__}, not callable: "
            "point at a function or class that returns a torch.nn.Module"
        )
    return target


def _kwargs_for(factory: Callable[..., Any], spec: str, offered: dict[str, int]) -> dict[str, int]:
    """The offered keyword arguments the factory's signature accepts (all of them with **kwargs)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return dict(offered)  # no introspectable signature (some builtins): offer everything
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return dict(offered)
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    missing = [p.name for p in params
               if p.default is p.empty and p.name not in offered
               and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if missing:
        raise UserError(
            f"factory '{spec}' requires {', '.join(repr(m) for m in missing)}, which scaletrain does not pass: "
            f"give {'them defaults' if len(missing) > 1 else 'it a default'} "
            f"(a factory may take any of {', '.join(OFFERED)})"
        )
    return {k: v for k, v in offered.items() if k in named}


def build_user_model(spec: str, *, num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """Call the factory named by `spec` with the arguments it accepts; check it returns an nn.Module."""
    factory = _load(spec)
    offered = {"num_classes": num_classes, "in_channels": in_channels, "image_size": image_size}
    # Exceptions raised inside the factory are bugs in user code: let them carry their traceback.
    model = factory(**_kwargs_for(factory, spec, offered))
    if not isinstance(model, nn.Module):
        raise UserError(
            f"factory '{spec}' returned a {type(model).__name__}, not a torch.nn.Module: make it return the model"
        )
    return model
