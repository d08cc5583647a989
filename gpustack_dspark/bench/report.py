"""Figures of a bench run and their text / JSON / CSV forms (pure)."""

import csv
import io
import json
import math
from typing import Any, Dict, List, Optional

from gpustack_dspark.bench.load import percentile
from gpustack_dspark.bench.runner import TargetRun

# (key, label, format) in the order the text table shows them.
ROWS = (
    ("output_tok_s", "output tok/s", "{:.1f}"),
    ("request_s", "requests/s", "{:.2f}"),
    ("latency_p50_s", "latency P50 s", "{:.3f}"),
    ("latency_p90_s", "latency P90 s", "{:.3f}"),
    ("latency_p99_s", "latency P99 s", "{:.3f}"),
    ("ttft_p50_s", "TTFT P50 s", "{:.3f}"),
    ("ttft_p90_s", "TTFT P90 s", "{:.3f}"),
    ("ttft_p99_s", "TTFT P99 s", "{:.3f}"),
    ("format_error_rate", "format-error rate", "{:.3f}"),
    ("field_accuracy", "fields right", "{:.3f}"),
    ("acceptance_rate", "acceptance rate", "{:.3f}"),
    ("tokens_per_forward", "tokens per forward", "{:.2f}"),
    ("requests", "requests", "{:d}"),
    ("failed", "failed", "{:d}"),
    ("output_tokens", "output tokens", "{:d}"),
    ("wall_s", "wall s", "{:.2f}"),
)
# Ratios B/A printed by --compare: B divided by A for each figure (P99 0.5 = half the latency).
RATIO_KEYS = ("output_tok_s", "request_s", "latency_p50_s", "latency_p99_s", "ttft_p50_s", "ttft_p99_s",
              "acceptance_rate", "tokens_per_forward")


def _num(value: float) -> Optional[float]:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else round(value, 6)


def figures(run: TargetRun) -> Dict[str, Any]:
    stats = run.stats
    ok = stats.ok
    latencies = [r.latency_s for r in ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    errors = sorted({r.error for r in stats.results if r.status != 200})
    out: Dict[str, Any] = {
        "target": run.target, "model": run.model,
        "requests": len(stats.results), "failed": len(stats.results) - len(ok),
        "wall_s": _num(stats.wall_s), "output_tokens": stats.output_tokens,
        "output_tok_s": _num(stats.tokens_per_s),
        "request_s": _num(len(ok) / stats.wall_s if stats.wall_s > 0 else math.nan),
        "format_errors": stats.format_errors, "format_error_rate": _num(stats.format_error_rate) if ok else None,
        "truncated": stats.truncated,
        "acceptance_rate": _num(run.spec.get("acceptance_rate", math.nan)),
        "tokens_per_forward": _num(run.spec.get("tokens_per_verify", math.nan)),
        "drafted_tokens": _num(run.spec.get("drafted", math.nan)),
        "accepted_tokens": _num(run.spec.get("accepted", math.nan)),
        "metrics_source": run.metrics_source,
        "errors": errors[:3],
    }
    for q in (50, 90, 99):
        out[f"latency_p{q}_s"] = _num(percentile(latencies, q))
        out[f"ttft_p{q}_s"] = _num(percentile(ttfts, q))
    return out


def ratios(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Optional[float]]:
    out: Dict[str, Optional[float]] = {}
    for key in RATIO_KEYS:
        x, y = a.get(key), b.get(key)
        out[key] = round(y / x, 4) if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x else None
    return out


def as_json(runs: List[Dict[str, Any]], settings: Dict[str, Any]) -> str:
    out: Dict[str, Any] = {"settings": settings, "targets": runs}
    if len(runs) == 2:
        out["ratios_b_over_a"] = ratios(runs[0], runs[1])
    return json.dumps(out, indent=2)


def as_csv(runs: List[Dict[str, Any]]) -> str:
    keys = ["target", "model"] + [k for k, _l, _f in ROWS] + ["format_errors", "truncated", "drafted_tokens", "accepted_tokens"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=keys, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for run in runs:
        writer.writerow({k: ("" if run.get(k) is None else run.get(k)) for k in keys})
    if len(runs) == 2:
        writer.writerow({"target": "ratio B/A", **{k: ("" if v is None else v) for k, v in ratios(*runs).items()}})
    return buffer.getvalue()


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "n/a"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def as_text(runs: List[Dict[str, Any]], settings: Dict[str, Any]) -> str:
    lines = [f"gpustack-dspark bench: {settings['workload']}, concurrency {settings['concurrency']}, "
             f"{settings['limit']}, max_tokens {settings['max_tokens']}, temperature {settings['temperature']}, "
             f"{'streamed' if settings['stream'] else 'not streamed'}"]
    names = ["A", "B"] if len(runs) == 2 else [""]
    for name, run in zip(names, runs):
        lines.append(f"{name + ': ' if name else 'target: '}{run['target']} (model {run['model']})")
    header = f"{'':22}" + "".join(f"{n or 'value':>14}" for n in names) + (f"{'B/A':>10}" if len(runs) == 2 else "")
    lines.append(header)
    ratio = ratios(*runs) if len(runs) == 2 else {}
    for key, label, fmt in ROWS:
        row = f"{label:22}" + "".join(f"{_cell(run.get(key), fmt):>14}" for run in runs)
        if len(runs) == 2:
            row += f"{_cell(ratio.get(key), '{:.2f}') if key in ratio else '':>10}"
        lines.append(row)
    for name, run in zip(names, runs):
        if run["acceptance_rate"] is None:
            lines.append(f"{name + ': ' if name else ''}acceptance: {run['metrics_source']}")
        for error in run["errors"]:
            lines.append(f"{name + ': ' if name else ''}failed request: {error}")
    return "\n".join(lines)
