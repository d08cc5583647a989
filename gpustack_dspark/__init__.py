"""gpustack-dspark: a GPUStack extension that serves JSON-heavy LLM workloads fast and valid."""

__version__ = "0.1.0"
