"""scaletrain from Python: a run, a study and a prediction, with the flags' settings as keyword arguments,
and their results as typed values (docs/api.md).

    python examples/api_example.py --out runs/api-example      # a minute or two on a 2-core CPU

In a notebook the same calls go in a cell as they are; in a script they go under
`if __name__ == "__main__":` (the workers re-run the script's top level: see the end of this file).
"""

from __future__ import annotations

import argparse

import scaletrain.api as st
from scaletrain import fmt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs/api-example", help="folder for the run, the study and the prediction")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--calibration", help="for the prediction (default: this machine's, measured the first "
                                              "time: a few minutes)")
    args = parser.parse_args()
    common = dict(model="lenet5", dataset="digits", epochs=args.epochs, batch_size=64)

    # one run: every keyword is a flag of `scaletrain train` (or its TOML key); a bad one raises st.UserError
    run = st.train(**common, nproc=2, progress=False, out=f"{args.out}/run")
    print(f"\n{run.model} on {run.world_size} processes: top-1 {fmt.share(run.top1)}, "
          f"{fmt.rate(run.samples_per_s, 'samples')}, a step {fmt.duration(run.step_time_mean_s)}")
    for rank in run.ranks:  # where each rank's step goes
        phases = ", ".join(f"{name} {fmt.duration(s)}" for name, s in (rank.phases_mean_s or {}).items())
        print(f"  rank {rank.rank}: {phases}")
    for finding in run.diagnosis:
        print(f"  {finding.kind}: {finding.message}")

    # a study: a list is an axis, one value a fixed setting (as in a study TOML); rerunning resumes it
    study = st.study(f"{args.out}/study", **common, nproc=[1, 2])
    for point in study.points:
        print(f"{point.id}: {point.status}, {fmt.rate(point.samples_per_s, 'samples')}, "
              f"speedup {fmt.factor(point.speedup)}, efficiency {fmt.share(point.efficiency)}")

    # a prediction of larger grids, from a calibration of this machine
    prediction = st.predict(f"{args.out}/prediction", **common, nproc=[1, 2, 4, 8], calibration=args.calibration)
    for point in prediction.points:
        print(f"predicted {point.id}: a step {fmt.duration(point.step_time_s)}, limit {point.limit}")

    # any run, study or prediction directory reads back the same way, later or elsewhere
    assert st.load_run(run.path) == run
    print(f"\nstudy of {len(study.points)} points: {study.path}; failed: {[p.id for p in study.failed] or 'none'}")


if __name__ == "__main__":  # the workers that st.train starts re-run this file's top level: keep launches here
    main()
