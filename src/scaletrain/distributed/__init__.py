"""Distributed identity and launching: who a process is (rank), where it runs (device), its process
group, how failures are told (failure), the C allocator's thresholds every process fixes at its start
(allocator), and `launch/` (the agents that start the workers)."""
