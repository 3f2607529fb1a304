"""How well this machine reproduces its own ratios, beside the model's errors (docs/predict-validation.md).

    .venv/bin/python benchmarks/ratio_reproducibility.py VALIDATION_DIR...

Each VALIDATION_DIR is a `scaletrain validate` output (validation.json) of the same grid measured in another
study (e.g. `sh benchmarks/heldout.sh validate CAL runs/ho-sNN OUT`, then OUT/validation). Prints, between every
two studies, how far the same ratio measured twice differs; and per study, the errors of a leave-one-out oracle
(each ratio foretold by the other studies' measurements) beside the model's: a model that errs as little as the
oracle does as well as the machine's own repeatability allows. No runs: seconds."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scaletrain import fmt
from scaletrain.validate.ratios import reproducibility


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("validations", nargs="+", help="validate output folders (validation.json in each), 2 or more")
    args = ap.parse_args()
    if len(args.validations) < 2:
        ap.error("give two or more validations of the same grid")
    sets = {}
    for d in args.validations:
        path = Path(d) / "validation.json" if Path(d).is_dir() else Path(d)
        sets[str(d)] = json.loads(path.read_text())["ratios"]
    r = reproducibility(sets)
    b = r["between"]
    print(f"the same ratio measured in two studies: median |difference| {fmt.share(b['median'])}, "
          f"p90 {fmt.share(b['p90'])} ({b['count']} pairs)")
    print(f"{'study':48s} {'oracle median / p90':>22s} {'model median / p90':>22s}")
    for name, s in r["studies"].items():
        o, m = s["oracle"], s["model"]
        print(f"{name[-48:]:48s} {fmt.share(o['median']) + ' / ' + fmt.share(o['p90']):>22s} "
              f"{fmt.share(m['median']) + ' / ' + fmt.share(m['p90']):>22s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
