"""Distributed identity and launching: who a process is (rank), where it runs (device), its process
group, how failures are told (failure), and `launch/` (the agents that start the workers)."""
