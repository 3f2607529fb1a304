"""Starting the workers of `scaletrain train`: pre-flight checks, the elastic agent on this node, one agent
per rank (isolated), or joining a launch that torchrun or srun already made (external)."""
