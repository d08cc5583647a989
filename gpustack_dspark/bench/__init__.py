"""Load generation and benchmarks (talk to replicas or GPUStack over HTTP only)."""
