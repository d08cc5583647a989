"""Let GPUStack's own metrics collection scrape DSpark replicas.

GPUStack 2.3's worker scrapes the `/metrics` of every RUNNING instance on it whose backend
has an entry under `runtime_mapping` in the metrics config it reads from the server
(`GET /v2/metrics/config`: the data dir's `custom_metrics_config.yaml`, else GPUStack's
built-in file). It re-exports them with model/instance labels on the worker exporter:
`/metrics` (mapped families, renamed `gpustack:*`) and `/metrics/raw` (every family under its
own name). The built-in file maps `vLLM`, `SGLang`, `MindIE` — not `DSpark-custom`, whose
replicas would then never be scraped.

So the plugin adds, to that one response, a `DSpark-custom` entry: vLLM's mapping (a DSpark
replica is vLLM) plus the replica's `dspark_*` families under their own names. An entry the
operator wrote for `DSpark-custom` in their custom file is left exactly as it is. The file on
disk is never touched.

`MetricsCollection` is the feature that mounts the rewrite on GPUStack's app.
"""

import copy
import json
import logging
from typing import Any, Dict, Tuple

from gpustack_dspark.asgi_rewrite import GetResponseRewrite, with_length

from gpustack_dspark.drafting_metrics import BUDGET_GAUGES
from gpustack_dspark.drafting_metrics import METRICS as DRAFTING_METRICS
from gpustack_dspark.feature import Context, Feature, On

logger = logging.getLogger(__name__)

CONFIG_PATH = "/v2/metrics/config"
VLLM_RUNTIME = "vLLM"

# The replica's families (worker/metrics.py) as GPUStack unified-metric declarations.
DSPARK_FAMILIES: Dict[str, Dict[str, str]] = {
    "dspark_warmup_state": {"type": "Gauge", "description": "DSpark replica warmup phase (1 = current phase)"},
    "dspark_warmup_duration_seconds": {"type": "Gauge", "description": "DSpark replica warmup duration, seconds"},
    "dspark_warmup_requests": {"type": "Counter", "description": "DSpark warmup requests by outcome"},
    "dspark_requests": {"type": "Counter", "description": "Completion requests seen by the DSpark middleware"},
    "dspark_schema_violations": {"type": "Counter", "description": "DSpark replies withheld for breaking the schema"},
    "dspark_grammar_requests": {"type": "Counter",
                                "description": "DSpark schema requests by grammar engine outcome (llguidance, "
                                               "not_enforced, second_attempt, second_attempt_served, stream_checked)"},
    # The drafting layer's counters (worker/drafting/stats.py).
    **{name[: -len("_total")]: {"type": "Counter", "description": help_text}
       for name, help_text, _ in DRAFTING_METRICS},
    # The speculation budget's gauges (present while it is on).
    **{name: {"type": "Gauge", "description": help_text} for name, help_text in BUDGET_GAUGES.values()},
}


def with_dspark_runtime(config: Dict[str, Any], backend_name: str) -> Dict[str, Any]:
    """The config with a `backend_name` runtime entry added (pure; input unchanged)."""
    mapping = config.get("runtime_mapping")
    if not isinstance(mapping, dict) or backend_name in mapping:
        return config
    out = copy.deepcopy(config)
    vllm = out["runtime_mapping"].get(VLLM_RUNTIME)
    entry: Dict[str, Any] = copy.deepcopy(vllm) if isinstance(vllm, dict) else {}
    star = entry.setdefault("*", {})
    for name in DSPARK_FAMILIES:
        star.setdefault(name, name)
    out["runtime_mapping"][backend_name] = entry
    families = out.setdefault("gpustack_metrics", {})
    if isinstance(families, dict):
        for name, declaration in DSPARK_FAMILIES.items():
            families.setdefault(name, dict(declaration))
    return out


class MetricsConfigMiddleware(GetResponseRewrite):
    """Rewrites the JSON body of `GET /v2/metrics/config`; everything else passes through.
    On any problem the original response goes out unchanged."""

    def __init__(self, app, backend_name: str) -> None:
        super().__init__(app, CONFIG_PATH, self._rewrite)
        self.backend_name = backend_name

    def _rewrite(self, start: Dict[str, Any], body: bytes) -> Tuple[list, bytes]:
        headers = list(start.get("headers") or [])
        if start.get("status") != 200:
            return headers, body
        try:
            config = json.loads(body)
            if not isinstance(config, dict):
                return headers, body
            new_body = json.dumps(with_dspark_runtime(config, self.backend_name)).encode()
        except Exception as e:
            logger.warning("DSpark could not add its runtime to GPUStack's metrics config: %s", e)
            return headers, body
        return with_length(headers, new_body), new_body


class MetricsCollection(Feature):
    name = "metrics_collection"
    when_off = "GPUStack's workers will not scrape DSpark replicas"

    def __init__(self, backend_name: str) -> None:
        self.backend_name = backend_name

    def start(self, ctx: Context) -> On:
        ctx.app.add_middleware(MetricsConfigMiddleware, backend_name=self.backend_name)
        return On({"runtime": self.backend_name})
