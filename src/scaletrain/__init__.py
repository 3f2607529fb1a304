"""scaletrain: train vision models across processes, GPUs and nodes, and see why a job scales as it does."""

__version__ = "0.1.0"
