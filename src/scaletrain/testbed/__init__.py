"""A virtual cluster on one machine: network namespaces joined by shaped links (see docs/testbed.md)."""
