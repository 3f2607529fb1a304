"""Console rendering of a training run: the progress bar and the summary tables (sinks the loop is handed)."""
