"""scaletrain slurm."""
