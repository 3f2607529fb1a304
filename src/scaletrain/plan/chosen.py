"""`scaletrain train --plan DIR`: the settings of the configuration a plan chose (or its K-th), as a layer of the
run's settings between --config and the flags given (docs/plan.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scaletrain.errors import UserError

PLANNED = ("model", "image_size", "nproc", "nnodes", "strategy", "stages", "spatial", "microbatches", "batch_size",
           "workers", "precision", "compress", "checkpoint_activations", "threads", "dataset", "synthetic_samples",
           "epochs")
"""What a plan decides or was asked for; the rest (where the nodes meet, the optimizer, ...) stays the run's."""


def planned_settings(where: str, rank: int | None = None) -> dict[str, Any]:
    """The settings of candidate `rank` of the plan in `where` (its folder or plan.json), with the gradient bucket
    the plan priced it at. None: the chosen one, which is the measured fastest where `plan --validate` re-ranked
    the top candidates beyond the spread of their rounds, else the predicted fastest."""
    from scaletrain.plan.present import read_plan

    path = Path(where)
    root = path.parent if path.name == "plan.json" else path
    if not (root / "plan.json").is_file():
        raise UserError(f"--plan {where}: no plan.json there: make one with scaletrain plan --out {where}")
    plan = read_plan(root)
    ranked = plan["ranked"]
    rank = chosen_rank(plan) if rank is None else rank
    if not 1 <= rank <= len(ranked):
        raise UserError(f"--plan-rank {rank}: the plan in {root} ranks {len(ranked)} candidate(s) within its budget: "
                        f"give 1 to {len(ranked)}" if ranked else f"--plan {where}: no candidate of the plan fits its "
                        "memory budget: plan again with more memory or fewer samples per device")
    return settings_of(ranked[rank - 1])


def settings_of(c: dict[str, Any]) -> dict[str, Any]:
    """A ranked candidate's settings as train takes them, with the gradient bucket it was priced at."""
    from scaletrain.config import applies

    # (the candidate's config holds every setting at some value: those of another strategy left out)
    settings = applies.applicable({k: c["config"][k] for k in PLANNED if c["config"].get(k) is not None})
    if settings.get("dataset") != "synthetic":
        settings.pop("synthetic_samples", None)
    if c.get("bucket_cap_mb") is not None:
        settings["bucket_cap_mb"] = c["bucket_cap_mb"]
    return settings


def chosen_rank(plan: dict[str, Any]) -> int:
    """The predicted rank of the configuration to run: the validation's measured best when it beat the model's
    choice by more than the two's spreads over rounds (a difference the rounds cannot tell from noise keeps the
    model's)."""
    v = plan.get("validation") or {}
    if v.get("best") and v.get("best_by_beyond_spread"):
        return next(c["rank"] for c in plan["ranked"] if c["id"] == v["best"])
    return 1
