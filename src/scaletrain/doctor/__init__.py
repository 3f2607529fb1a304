"""scaletrain doctor."""
