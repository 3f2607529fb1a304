"""Cost formulas, pure where they can be: wire bytes per strategy (wire), the alpha-beta network model and
its fit (alphabeta), FLOPs and parameters per model (flops) and per layer (layers), and memory footprints
(footprint), DDP's buckets (buckets), the fx layer graph (graph) and data-sheet hardware profiles (hardware);
and glibc malloc's thresholds, fixed in every process so that a step's time does not depend on its past (allocator).
The base the performance model (predict/) grows on; see docs/perf.md."""
