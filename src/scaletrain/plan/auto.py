"""`scaletrain train --plan auto`: plan the run's own request on this machine's calibration, then run the choice.

The settings the run gives (flags, --config) fix their axes: `--strategy ring` searches ring alone, `--batch-size
64` that batch; what it leaves open (strategy, batch, workers, precision, compression, checkpointing) the plan
chooses. One node only: every node of a multi-node launch would plan on its own, and nodes that chose apart would
not meet; plan once (`scaletrain plan --out DIR`) and give every node `--plan DIR`."""

from __future__ import annotations

import argparse
from typing import Any

from scaletrain.errors import UserError


def auto_settings(given: dict[str, Any], config_file: str | None, rank: int | None = None) -> dict[str, Any]:
    """The settings of the auto plan's chosen candidate (or its `rank`-th) for the run that `given` (the flags)
    and `config_file` describe, priced on this machine's calibration (made with --quick the first time)."""
    from scaletrain.config import resolve_train_config
    from scaletrain.config.io import load_toml
    from scaletrain.console.phase import phase
    from scaletrain.plan.chosen import settings_of
    from scaletrain.plan.present import describe
    from scaletrain.plan.search import search
    from scaletrain.plan.space import ONLY, Request
    from scaletrain.predict.cli import load_basis, network_from
    from scaletrain.predict.shapes import for_calibration

    fixed = {**(load_toml(config_file) if config_file else {}), **given}
    cfg = resolve_train_config(given, config_file)  # the run as given: its model, ranks, data, epochs
    if cfg.launch.nnodes > 1:
        raise UserError(f"--plan auto plans one node, and this run has --nnodes {cfg.launch.nnodes}: every node would "
                        "plan on its own and nodes that chose apart would not meet; plan once with `scaletrain plan "
                        f"--nodes {cfg.launch.nnodes} ... --out DIR` and give every node --plan DIR")
    req = Request(model=cfg.model.name, nodes=1, nproc=cfg.launch.nproc,
                  image_size=cfg.data.image_size if "image_size" in fixed else None, dataset=cfg.data.dataset,
                  synthetic_samples=cfg.data.synthetic_samples, epochs=cfg.optim.epochs,
                  batch_sizes=(cfg.optim.batch_size,) if "batch_size" in fixed else (),
                  only={axis: (fixed[axis],) for axis in ONLY if axis in fixed},  # given: that axis fixed
                  priced_top=max(5, rank or 1))
    cal, hw, basis = load_basis(argparse.Namespace(hardware=None, calibration=None, loader=None))
    network = network_from(argparse.Namespace(network=None, link=None, latency=None), cal, hw)
    with phase("plan auto: pricing every candidate", eta=False) as update:
        plan = search(req, cal, network, hw, basis, shapes=for_calibration(cal, "auto"), progress=update)
    ranked = plan["ranked"]
    if not ranked:
        why = plan["skipped_why"][0]["reason"] if plan["skipped_why"] else "none fits this machine's memory"
        raise UserError(f"--plan auto: no candidate to run ({why}): give the settings yourself, or plan with "
                        "`scaletrain plan` to see every candidate")
    rank = rank or 1
    if not 1 <= rank <= len(ranked):
        raise UserError(f"--plan-rank {rank}: the auto plan ranks {len(ranked)} candidate(s): give 1 to {len(ranked)}")
    c = ranked[rank - 1]
    print(f"plan auto: #{rank} of {plan['priced']} candidates priced in {plan['search_s']:.1f} s: {describe(c)}, "
          f"{c['samples_per_s']:,.0f} samples/s predicted ({basis}); `scaletrain plan` shows them all", flush=True)
    return settings_of(c)
