"""Cost formulas, pure where they can be: wire bytes per strategy (wire), the alpha-beta network model and
its fit (alphabeta), FLOPs and parameters per model (flops) and per layer (layers), and memory footprints
(footprint), DDP's buckets (buckets), the fx layer graph (graph) and data-sheet hardware profiles (hardware).
The base the performance model (predict/) grows on; see docs/perf.md."""
