"""vLLM's offline engine (the `LLM` class, in-process, the CPU layout of devstack/replica.py) for
what needs no HTTP server: greedy token ids of several models on the same prompts, and the step
time of one model as a function of batch x positions.

Runs in the worker venv (vLLM), one JSON request on stdin, one JSON answer on stdout; the callers
(tests/integration/test_expanded_model.py, tests/bench/expanded_check.py, tests/bench/step_time.py)
run in the project venv and use `run_offline()`. One process loads the models one after the
other: vLLM is imported once, which is most of a CPU replica's start (cheaper than a
`dspark-serve` per model for a CI test).

    {"command": "greedy", "models": [DIR, ...], "prompts": [[message, ...], ...], "max_tokens": N}
      -> {"tokens": {DIR: [[id, ...], ...]}, "seconds": {DIR: s}}
    {"command": "step_time", "model": DIR, "batches": [..], "positions": [..], "context": N, "repeats": R}
      -> {"rows": [{"batch", "positions", "ms", "ms_all": [..], "cached": ..}], "block_size": N}
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple


def run_offline(request: Dict[str, Any], timeout_s: float = 900, log: Optional[Path] = None) -> Dict[str, Any]:
    """Runs one request in the worker venv (project-venv side)."""
    from gpustack_dspark.devstack.replica import REPO_ROOT, worker_env, worker_python

    proc = subprocess.run([str(worker_python()), "-m", "tests.bench.vllm_offline"], input=json.dumps(request),
                          capture_output=True, text=True, cwd=REPO_ROOT, env=worker_env(), timeout=timeout_s)
    if log is not None:
        log.write_text(proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"vllm_offline {request['command']} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------- worker-venv side


def _engine(model: str, max_num_batched_tokens: int = 2048, max_num_seqs: int = 64,
            kv_cache_bytes: int = 1 << 30, prefix_caching: bool = False):
    from vllm import LLM

    return LLM(model=model, enforce_eager=True, dtype="float32", max_model_len=1024,
               kv_cache_memory_bytes=kv_cache_bytes, max_num_batched_tokens=max_num_batched_tokens,
               max_num_seqs=max_num_seqs, enable_prefix_caching=prefix_caching, seed=0)


def _release(llm) -> None:
    """Frees an engine's weights and KV cache before the next model loads. vLLM's own
    `cleanup_dist_env_and_memory()` is not called: it tears down the parallel groups, which the
    next in-process engine of vLLM 0.32 then finds missing instead of creating again."""
    import gc

    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def greedy(models: List[str], prompts: List[List[Dict[str, str]]], max_tokens: int) -> Dict[str, Any]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    tokens, seconds = {}, {}
    for model in models:
        start = time.perf_counter()
        llm = _engine(model, kv_cache_bytes=256 << 20)
        outputs = llm.chat(prompts, params, use_tqdm=False)
        tokens[model] = [list(o.outputs[0].token_ids) for o in outputs]
        seconds[model] = round(time.perf_counter() - start, 2)
        _release(llm)
    return {"tokens": tokens, "seconds": seconds}


def step_time(model: str, batches: List[int], positions: List[int], context: int, repeats: int) -> Dict[str, Any]:
    """One engine step of `batch` sequences that each compute `positions` new tokens on top of a
    cached context of `context` tokens (prefix caching: the shape of a verify step of
    positions - 1 drafts; positions 1 is a decode step). Timed around `LLMEngine.step()` (in
    process, so it includes the scheduler, the forward, sampling and output processing)."""
    from vllm import SamplingParams

    most = max(batches) * max(positions)
    llm = _engine(model, max_num_batched_tokens=max(most, context + max(positions), 256),
                  max_num_seqs=max(batches), kv_cache_bytes=2 << 30, prefix_caching=True)
    engine = llm.llm_engine
    block = llm.llm_engine.vllm_config.cache_config.block_size
    context = max(block, context // block * block)  # whole blocks: only those are cached
    vocab = 2000
    prefix = [(7 * i + 11) % vocab + 5 for i in range(context)]
    params = SamplingParams(temperature=0.0, max_tokens=1)
    serial = [0]

    def one_step(batch: int, n: int) -> Tuple[float, List[int]]:
        for b in range(batch):
            serial[0] += 1
            tail = [(serial[0] * 31 + j * 17 + b) % vocab + 5 for j in range(n)]
            engine.add_request(f"r{serial[0]}", {"prompt_token_ids": prefix + tail}, params)
        start = time.perf_counter()
        outs = engine.step()
        took = time.perf_counter() - start
        if len(outs) != batch:  # not all in one step: the cell would time something else
            raise RuntimeError(f"batch {batch} x positions {n}: {len(outs)} requests finished in the first step")
        cached = [o.num_cached_tokens for o in outs if getattr(o, "num_cached_tokens", None) is not None]
        while engine.has_unfinished_requests():
            outs += engine.step()
        return took, cached

    engine.add_request("warm", {"prompt_token_ids": prefix + [5]}, params)  # caches the context
    while engine.has_unfinished_requests():
        engine.step()
    cells = [(batch, n) for batch in batches for n in positions]
    for batch, n in cells:  # every shape once, uncounted: first-use costs out of the figures
        one_step(batch, n)
    times: Dict[tuple, List[float]] = {cell: [] for cell in cells}
    cached: Dict[tuple, List[int]] = {cell: [] for cell in cells}
    for _ in range(repeats):  # round-robin over the cells: drift on a shared CPU hits them all alike
        for cell in cells:
            took, got = one_step(*cell)
            times[cell].append(took * 1000)
            cached[cell] += got
    rows = []
    for (batch, n) in cells:
        ms = sorted(times[(batch, n)])
        hits = cached[(batch, n)]
        rows.append({"batch": batch, "positions": n, "ms": round(ms[len(ms) // 2], 3),
                     "ms_all": [round(t, 3) for t in ms],
                     "cached": round(sum(hits) / len(hits), 1) if hits else None})
        print(f"batch {batch} positions {n}: {rows[-1]['ms']} ms", file=sys.stderr, flush=True)
    _release(llm)
    return {"rows": rows, "block_size": block, "context": context}


def main() -> None:
    request = json.loads(sys.stdin.read())
    command = request.pop("command")
    answer = {"greedy": greedy, "step_time": step_time}[command](**request)
    sys.stdout.flush()
    os.write(1, ("\n" + json.dumps(answer) + "\n").encode())


if __name__ == "__main__":
    main()
