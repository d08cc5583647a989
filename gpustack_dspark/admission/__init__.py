"""Admission: DSpark settings refused where GPUStack validates models, and replicas that fail
at start with a configuration error kept in error with their reason (server side)."""
