"""The DSpark backend's name, versions and health path (pure constants).

Kept apart from backend.py (server side: registration) so the CLI, which must not import
the server side, names the backend from the same source when it writes model documents.
"""

from gpustack_dspark.versions import SUPPORTED_VLLM_VERSION

BACKEND_NAME = "DSpark-custom"
CUDA_VERSION = f"{SUPPORTED_VLLM_VERSION}-cuda-custom"
CPU_VERSION = f"{SUPPORTED_VLLM_VERSION}-cpu-custom"
# Served by the DSpark worker (dspark-serve): 503 until vLLM is healthy and warmup is done.
HEALTH_CHECK_PATH = "/dspark/ready"
