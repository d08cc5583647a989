"""Scheduler policy for DSpark replicas (runs inside the GPUStack server)."""
