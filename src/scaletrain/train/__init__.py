"""The training worker: build (data, model), the loop, the optimizer and its schedule, evaluation,
checkpoints, and summary.json (the one writer of it)."""
