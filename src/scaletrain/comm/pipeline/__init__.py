"""`--strategy pipeline`: the strategy (strategy.py, torch) and its settings (options.py, no torch)."""
