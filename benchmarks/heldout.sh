#!/bin/sh
# The held-out validation of docs/predict-validation.md: models the calibration never ran (its loop runs are
# refnet's), 1-2 ranks, batch 32/64, one thread per rank, 3 interleaved repeats (REPEATS).
#   sh benchmarks/heldout.sh study OUT              # the measured runs (about 12 min on 2 cores)
#   sh benchmarks/heldout.sh validate CAL STUDY OUT  # predict them from calibration CAL, validate (seconds)
# SAMPLES=6144 sh benchmarks/heldout.sh ...: longer runs (3x: about 25 min), the same for both commands
# REPEATS=6 sh benchmarks/heldout.sh study OUT: more interleaved rounds (2x: about 15 min), a lower noise floor
set -e
GRID="--model lenet5,resnet20 --nproc 1,2 --batch-size 32,64 --dataset synthetic --synthetic-samples ${SAMPLES:-2048}
      --image-size 32 --epochs 1 --no-augment --tensorboard off --eval-every 1"
ST=${SCALETRAIN:-.venv/bin/scaletrain}
case "$1" in
  study) $ST study $GRID --repeats ${REPEATS:-3} --out "$2" ;;
  validate) $ST predict --calibration "$2" $GRID --threads 1 --out "$4/prediction"
            $ST validate "$4/prediction" "$3" --out "$4/validation" ;;
  *) echo "usage: sh benchmarks/heldout.sh study OUT | validate CAL STUDY OUT" >&2; exit 2 ;;
esac
