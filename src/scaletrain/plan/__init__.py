"""`scaletrain plan`: the configuration to run, chosen by the performance model (docs/plan.md).

space.py lays out the candidates a request allows (strategy and layout, batch, loader workers, precision,
compression, activation checkpointing; the gradient bucket as the model finds it best), search.py prices them
through predict's one cost seam, keeps those within the memory budget and ranks them by time to train;
present.py shows the ranking (table, plot)."""
