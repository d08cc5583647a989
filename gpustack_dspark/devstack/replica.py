"""A DSpark replica run by hand: the real `dspark-serve` (real vLLM on CPU) from the worker
venv, on 127.0.0.1, serving the tiny fixture model. Used by tests, benchmarks and the demo.
"""

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import httpx

from gpustack_dspark.devstack.ports import free_port
from gpustack_dspark.devstack.processes import ManagedProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER_VENV = Path(os.environ.get("DSPARK_WORKER_VENV", REPO_ROOT / ".venv-worker"))
MODELS_DIR = REPO_ROOT / "fixtures" / "models"
TARGET_MODEL = MODELS_DIR / "tiny-order-llama"
DRAFT_MODEL = MODELS_DIR / "tiny-order-draft"
SERVED_NAME = "tiny-order"

# The fast, stable layout for vLLM on a 2-core CPU (shared/notes/vllm-cpu.md): in-process
# engine, eager mode, a small fixed KV cache.
CPU_VLLM_ARGS = ("--enforce-eager", "--dtype", "float32", "--max-model-len", "1024",
                 "--kv-cache-memory-bytes", "268435456")
CPU_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "TOKENIZERS_PARALLELISM": "false"}


def worker_python() -> Path:
    return WORKER_VENV / "bin" / "python"


def dspark_serve_bin() -> Path:
    return WORKER_VENV / "bin" / "dspark-serve"


def worker_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(CPU_ENV)
    env.update(extra or {})
    return env


@dataclass
class Replica:
    process: ManagedProcess
    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ready_status(self, timeout_s: float = 1.0) -> Optional[int]:
        try:
            return httpx.get(f"{self.base_url}/dspark/ready", timeout=timeout_s).status_code
        except httpx.HTTPError:
            return None

    def info(self) -> dict:
        return httpx.get(f"{self.base_url}/dspark/info", timeout=5).json()

    def wait_ready(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.process.alive():
                raise RuntimeError(f"dspark-serve exited ({self.process.proc.returncode}):\n{self.process.log_tail()}")
            if self.ready_status() == 200:
                return
            time.sleep(0.5)
        raise TimeoutError(f"dspark-serve not ready after {timeout_s} s:\n{self.process.log_tail()}")

    def stop(self, timeout_s: float = 30) -> None:
        self.process.stop(timeout_s)


def start_replica(log_path: Path, args: Sequence[str] = (), model: Path = TARGET_MODEL,
                  port: Optional[int] = None, cpu_layout: bool = True,
                  env: Optional[Dict[str, str]] = None) -> Replica:
    port = port or free_port()
    argv: List[str] = [str(dspark_serve_bin()), str(model), "--host", "127.0.0.1", "--port", str(port),
                       "--served-model-name", SERVED_NAME, *(CPU_VLLM_ARGS if cpu_layout else ()), *args]
    return Replica(ManagedProcess(argv, worker_env(env), log_path), port)
