"""`dspark-serve --config FILE`: the server config YAML operators of DSpark-style runtimes
already write, mapped onto the same knobs and vLLM arguments (pure: dict -> argv).

    model: {path: /models/m, name: my-model}
    server: {host: 10.0.0.5, port: 8000}
    engine:
      max_model_len: 8192
      continuous_batching: {max_batch_size: 64}
      speculative_decoding: {enabled: true, strategy: dspark, speculative_length: 5,
                             accept_threshold: 0.7, draft_model: /models/draft}
      grammar: json              # or off
      schema: ./order.schema.json
    resources: {gpu_memory_utilization: 0.9}
    enable_metrics: true

Unknown keys are errors (with the nearest valid key).
"""

from typing import Any, Dict, List, Mapping, Tuple

from gpustack_dspark.knobs import KnobError, nearest

# path -> (flag, kind); kind: value | switch | negated-switch
_LEAVES: Dict[Tuple[str, ...], Tuple[str, str]] = {
    ("model", "path"): ("MODEL", "value"),
    ("model", "name"): ("--served-model-name", "value"),
    ("server", "host"): ("--host", "value"),
    ("server", "port"): ("--port", "value"),
    ("engine", "max_model_len"): ("--max-model-len", "value"),
    ("engine", "continuous_batching", "max_batch_size"): ("--max-num-seqs", "value"),
    ("engine", "speculative_decoding", "enabled"): ("--enable-dspark", "switch"),
    ("engine", "speculative_decoding", "strategy"): ("--dspark-method", "value"),
    ("engine", "speculative_decoding", "speculative_length"): ("--dspark-speculative-length", "value"),
    ("engine", "speculative_decoding", "num_speculative_tokens"): ("--dspark-speculative-length", "value"),
    ("engine", "speculative_decoding", "accept_threshold"): ("--dspark-accept-threshold", "value"),
    ("engine", "speculative_decoding", "draft_model"): ("--dspark-draft-model", "value"),
    ("engine", "grammar"): ("--dspark-grammar-mode", "value"),
    ("engine", "schema"): ("--dspark-schema", "value"),
    ("resources", "gpu_memory_utilization"): ("--gpu-memory-utilization", "value"),
    ("enable_metrics",): ("--disable-log-stats", "negated-switch"),
}
_SECTIONS = {path[:i] for path in _LEAVES for i in range(1, len(path))}


def config_to_argv(doc: Any, source: str = "--config") -> List[str]:
    """The argv (MODEL first when given) that the config file means."""
    if not isinstance(doc, Mapping):
        raise KnobError(source, type(doc).__name__, "a mapping with model/server/engine/resources keys")
    argv: List[str] = []
    model: List[str] = []
    _walk(doc, (), argv, model, source)
    return model + argv


def _walk(node: Mapping, prefix: Tuple[str, ...], argv: List[str], model: List[str], source: str) -> None:
    for key, value in node.items():
        path = prefix + (str(key),)
        dotted = ".".join(path)
        if path in _LEAVES:
            flag, kind = _LEAVES[path]
            if kind == "value":
                if isinstance(value, (dict, list)) or value is None:
                    raise KnobError(f"{source}: {dotted}", value, "a single value")
                if flag == "MODEL":
                    model.append(str(value))
                else:
                    argv.append(f"{flag}={value}")
            else:
                if not isinstance(value, bool):
                    raise KnobError(f"{source}: {dotted}", value, "true|false")
                if value == (kind == "switch"):
                    argv.append(flag)
            continue
        if path in _SECTIONS:
            if not isinstance(value, Mapping):
                raise KnobError(f"{source}: {dotted}", value, "a mapping")
            _walk(value, path, argv, model, source)
            continue
        siblings = sorted({p[len(prefix)] for p in list(_LEAVES) + list(_SECTIONS)
                           if len(p) > len(prefix) and p[:len(prefix)] == prefix})
        hint = nearest(str(key), siblings)
        raise KnobError(f"{source}: {dotted}", value, ", ".join(siblings),
                        f"unknown key; did you mean {hint}?" if hint else "unknown key")
