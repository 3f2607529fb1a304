"""A plan without a fixed image size: the largest square side the chosen configuration, and each layout of the same
ranks that holds less per rank (checkpointing, FSDP, a pipeline of every rank, spatial tiles, tiles in pipeline
stages), trains within the plan's memory budget, by the one memory model (predict/largest.py: meta-device walks,
nothing allocated, a few seconds)."""

from __future__ import annotations

from typing import Any, Callable


def largest_sides(plan: dict[str, Any], device_type: str,
                  progress: Callable[[str, int, int | None], None] = lambda *a: None) -> list[dict[str, Any]]:
    """largest-side rows (predict/largest.Largest.to_dict) of the chosen candidate's layout and its alternatives,
    at its batch, within the plan's budget per device; [] with no budget or nothing chosen."""
    from scaletrain.config import TrainConfig
    from scaletrain.models import build_model
    from scaletrain.predict.largest import largest_sides as sides
    from scaletrain.predict.points import data_facts

    budget, ranked = plan["memory_budget_bytes"], plan["ranked"]
    if not budget or not ranked:
        return []
    from scaletrain.config import applies

    # the other layouts replace its strategy: settings only its own takes (the bucket, compression) go back to none
    own = {k: applies.defaults()[k] for k in ("bucket_cap_mb", "compress")}
    cfg = TrainConfig.from_dict({**ranked[0]["config"], **own})
    facts = data_facts(cfg.data.dataset, None, cfg.data.synthetic_samples, cfg.data.synthetic_classes)

    def build(c, side: int):
        return lambda: build_model(c.model.name, num_classes=facts["classes"], in_channels=facts["channels"],
                                   image_size=side, stem=c.model.stem, width=c.model.width)

    return [r.to_dict() for r in sides(cfg, build, facts["channels"], budget, device_type, progress=progress)]


def sides_grid(plan: dict[str, Any]):
    """The rows as predict --image-size max shows them."""
    from scaletrain import fmt
    from scaletrain.predict.largest import Largest, largest_table

    rows = [Largest(r["layout"], r["largest_side"], r["bytes_per_rank"], r["why"], r["allocator"])
            for r in plan["largest_sides"]]
    c = plan["ranked"][0]
    return largest_table(rows, fmt.size(plan["memory_budget_bytes"]),
                         f"the chosen configuration, batch {c['config']['batch_size']} per replica, as given, and "
                         "the layouts of the same ranks that hold less")
