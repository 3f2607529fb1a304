"""Cost formulas, pure where they can be: wire bytes per strategy, the alpha-beta network model and its
fit, FLOPs and parameters per model, and memory footprints. The base the performance model grows on."""
