"""Faults injected into a real GPUStack server process by the tests.

Loaded through the devstack's sitecustomize (DSPARK_SITECUSTOMIZE_EXTRA) before GPUStack
starts; DSPARK_TEST_FAULT picks the fault. Nothing here runs outside the tests.
"""

import os

FAULT = os.environ.get("DSPARK_TEST_FAULT", "")

if FAULT == "gpustack-version":
    from gpustack_dspark import versions

    versions.installed_gpustack_version = lambda: "2.2.0"

elif FAULT == "database-unreachable":
    from gpustack_dspark import backend, plugin

    async def _unreachable(settings):
        raise ConnectionRefusedError("[Errno 111] connection to the database refused (injected by the tests)")

    backend.register_backend = _unreachable

    from gpustack_dspark.console import sampler

    async def _no_deployments():
        raise ConnectionRefusedError("[Errno 111] connection to the database refused (injected by the tests)")

    sampler.read_deployments = _no_deployments
    plugin.REGISTRATION_ATTEMPTS = 2
    plugin.REGISTRATION_FIRST_DELAY_S = 0.1

elif FAULT == "init-crash":
    from gpustack_dspark import plugin

    def _crash(self, app, cfg):
        raise RuntimeError("wiring exploded (injected by the tests)")

    plugin.DSparkPlugin._wire = _crash
