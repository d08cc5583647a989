"""Starts vLLM's OpenAI server in this process with the DSpark pieces around it.

This follows vLLM's own `run_server` (0.32: entrypoints/launchers/api_server/entry.py) step by
step, adding two things: a 503 "loading" responder on the socket while the engine loads, and
the warmup thread. Every vLLM name used comes from the vLLM seam (`worker/vllm_seam/`), which
knows where each supported series keeps it; the series is checked before anything starts.
"""

import contextlib
import io
import json
import logging
import os
import signal
from typing import Any, Dict, List, Optional

from gpustack_dspark.knobs import DSparkKnobs
from gpustack_dspark.translate import LaunchPlan
from gpustack_dspark.worker import metrics as worker_metrics, state as worker_state
from gpustack_dspark.worker.loading import LoadingResponder
from gpustack_dspark.worker.redact import is_secret_name, redact_argv, redact_text, secret_values
from gpustack_dspark.worker.fail import fail
from gpustack_dspark.worker.vllm_seam import installed_vllm_version, resolve, version_problem
from gpustack_dspark.worker.warmup import Warmup

logger = logging.getLogger("gpustack_dspark.worker")


__all__ = ["installed_vllm_version", "check_vllm_version", "parse_with_vllm", "check_speculative_config", "run_vllm"]


def check_vllm_version() -> None:
    problem = version_problem()
    if problem:
        fail(f"{problem} (its middleware and launcher follow those releases' internals)")


def parse_with_vllm(argv: List[str]):
    """vLLM's own parser and checks, with its multi-line usage errors turned into one line."""
    validate_parsed_serve_args = resolve("validate_parsed_serve_args")
    parser = resolve("make_arg_parser")(resolve("FlexibleArgumentParser")(prog="vllm"))
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            args = parser.parse_args(argv)
        validate_parsed_serve_args(args)
    except SystemExit:
        lines = [line for line in captured.getvalue().splitlines() if line.strip()]
        fail(f"vLLM rejects the arguments: {lines[-1] if lines else 'invalid arguments'}")
    except Exception as e:
        fail(f"vLLM rejects the arguments: {e}")
    return args


def check_speculative_config(plan: LaunchPlan) -> None:
    """Never pass vLLM a key it does not accept: compare with vLLM's SpeculativeConfig fields."""
    if not plan.speculative_config:
        return
    SpeculativeConfig = resolve("SpeculativeConfig")
    known = set(getattr(SpeculativeConfig, "__dataclass_fields__", {})) or set(
        getattr(SpeculativeConfig, "model_fields", {}))
    unknown = sorted(set(plan.speculative_config) - known)
    if unknown:
        fail(f"internal: speculative config keys {unknown} are not known to this vLLM")


def _api_keys(args) -> List[str]:
    keys = getattr(args, "api_key", None) or [os.environ.get("VLLM_API_KEY")]
    return [k for k in keys if k]


def _api_key(args) -> Optional[str]:
    keys = _api_keys(args)
    return keys[0] if keys else None


class _SecretFilter(logging.Filter):
    """Known secret values (the API keys) out of every record a handler writes, vLLM's own
    included (it logs its non-default arguments)."""

    def __init__(self, secrets: List[str]) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True
        redacted = redact_text(message, self.secrets)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


def _redact_logs(secrets: List[str]) -> None:
    if not secrets:
        return
    secret_filter = _SecretFilter(secrets)
    for name in (None, "vllm", "uvicorn", "uvicorn.access", "uvicorn.error"):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(secret_filter)


def _export_drafting_stats() -> None:
    """The engine process (spawned later, inheriting the environment) writes the layer's
    counters to this file; /metrics (through worker/metrics.py) and /dspark/info read it."""
    import tempfile

    from gpustack_dspark.worker.drafting.stats import STATS_FILE_ENV, metric_families, read_budget, read_counters

    os.environ[STATS_FILE_ENV] = os.path.join(tempfile.mkdtemp(prefix="dspark-drafting-"), "counters.json")

    def drafting_families():
        counters = read_counters()
        return metric_families(counters, worker_metrics.model_label(), read_budget()) if counters else ()

    worker_metrics.register_collector(drafting_families)


def run_vllm(knobs: DSparkKnobs, plan: LaunchPlan, default_schema: Optional[Dict[str, Any]],
             templates: List[Dict[str, Any]]) -> None:
    check_vllm_version()
    configure_logging_from_args = resolve("configure_logging_from_args")
    resolve("cli_env_setup")()
    args = parse_with_vllm(plan.vllm_argv)
    check_speculative_config(plan)
    configure_logging_from_args(args)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s [dspark] %(message)s")
    secrets = (_api_keys(args) + secret_values(plan.vllm_argv)
               + [v for k, v in os.environ.items() if v and is_secret_name(k)])
    _redact_logs(secrets)

    state = worker_state.WorkerState(plan=plan, knobs=knobs, default_schema=default_schema,
                                     served_model_name=(args.served_model_name or [None])[0],
                                     api_keys=tuple(_api_keys(args)))
    state.warmup.requests = knobs.warmup_requests
    state.warmup.concurrency = knobs.warmup_concurrency
    state.warmup.timeout_s = knobs.warmup_timeout
    worker_state.install(state)
    if plan.drafting_layer_on:
        _export_drafting_stats()
    try:  # metrics are a view: the replica serves without them
        worker_metrics.install()
    except Exception as e:
        logger.warning("DSpark metrics not registered: %s", e)

    logger.info(plan.startup_line())
    logger.info("DSpark method %s: %s", plan.method or "none", plan.method_reason or "DSpark disabled")
    for warning in plan.warnings:
        logger.warning(warning)
    for note in plan.notes:
        logger.info(note)
    logger.info("vLLM argv: %s", json.dumps(redact_argv(plan.vllm_argv)))

    host = args.host if args.host not in (None, "", "0.0.0.0", "::") else "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    Warmup(state, f"http://{host}:{args.port}", templates, api_key=_api_key(args)).start()

    import uvloop

    uvloop.run(_serve(args, state))


async def _serve(args, state: worker_state.WorkerState) -> None:
    setup_server, build_and_serve = resolve("setup_server"), resolve("build_and_serve")
    build_async_engine_client = resolve("build_async_engine_client")

    # As vLLM's run_server: SIGTERM during loading interrupts it (uvicorn takes over later).
    def interrupt(*_):
        raise KeyboardInterrupt("terminated")

    signal.signal(signal.SIGTERM, interrupt)
    listen_address, sock = setup_server(args, reuse_port=False)
    responder = LoadingResponder(sock, lambda: {"phase": state.phase, "reason": state.reason})
    responder.start()
    try:
        async with build_async_engine_client(args) as engine_client:
            responder.stop()
            state.move(worker_state.WARMING, "vLLM is starting its HTTP server")
            shutdown_task = await build_and_serve(engine_client, listen_address, sock, args)
        await shutdown_task
    finally:
        responder.stop()
        sock.close()
