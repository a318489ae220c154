"""SPMD passes: sharding propagation and partitioning."""
