"""`scaletrain watch`: a live view of a run from its run directory (reader, state, terminal, html; docs/watch.md)."""
