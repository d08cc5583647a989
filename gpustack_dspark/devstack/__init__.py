"""A local GPUStack stack on one machine, on loopback only: PostgreSQL, a GPUStack server
with this plugin, and CPU workers. Used by the tests and by `make demo`; never imported by
the server plugin or the worker image.
"""
