"""`gpustack-dspark sweep`'s pure parts: the grid, its table, the best setting per load, the
model-YAML change that applies it, and the curve (PNG).

A setting is (speculative length, accept threshold); length 0 is no speculation (`dspark-serve`
without `--enable-dspark`, as `bench.drafting` measures it; the requests carry their schema)
and `auto` is the drafting layer's per-step budget. Each setting is measured at every concurrency level. The
sweep measures and recommends; on a scratch replica it changes nothing on a deployment, and on a
running deployment (`--deployment`, cli/sweep_rolling.py) it changes one replica at a time and
puts the deployment's own backend parameters back at the end (docs/drafting.md).
"""

import csv
import io
import json
import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

Length = Union[int, str]  # 0..16 or "auto"
AUTO = "auto"
MAX_GRID = 200  # settings x concurrency levels: one run is bounded

COLUMNS = ("length", "threshold", "concurrency", "requests", "failed", "goodput_tok_s", "output_tok_s",
           "latency_p50_s", "latency_p99_s", "ttft_p50_s", "acceptance_rate", "tokens_per_forward",
           "format_errors")


class GridError(ValueError):
    """A bad grid argument: str() is the one line the CLI prints."""


def parse_lengths(text: str) -> List[Length]:
    """`0,2,4,8,auto` or ranges `2-12` -> [0, 2, 4, 8, 'auto'] (sorted, unique, auto last)."""
    where = "--lengths"
    found: List[Length] = []
    for part in _parts(where, text):
        if part.lower() == AUTO:
            found.append(AUTO)
            continue
        low, dash, high = part.partition("-")
        try:
            values = range(int(low), int(high) + 1) if dash else [int(part)]
        except ValueError:
            raise GridError(f"{where}: {part!r} is not allowed; allowed: integers 0-16, ranges like 2-8, auto") from None
        for value in values:
            if not 0 <= value <= 16:
                raise GridError(f"{where}: {value} is not allowed; allowed: integers 0-16, ranges like 2-8, auto")
            found.append(value)
        if dash and not values:
            raise GridError(f"{where}: {part!r} is an empty range; allowed: low-high with low <= high")
    numbers = sorted({v for v in found if v != AUTO})
    return [*numbers, *([AUTO] if AUTO in found else [])]


def parse_thresholds(text: str) -> List[float]:
    where = "--thresholds"
    out = []
    for part in _parts(where, text):
        try:
            value = float(part)
        except ValueError:
            value = math.nan
        if not (0.0 < value < 1.0):
            raise GridError(f"{where}: {part!r} is not allowed; allowed: numbers 0 < x < 1, comma-separated")
        out.append(value)
    return sorted(set(out))


def parse_concurrency(text: str) -> List[int]:
    where = "--concurrency"
    out = []
    for part in _parts(where, text):
        try:
            value = int(part)
        except ValueError:
            value = 0
        if not 1 <= value <= 1024:
            raise GridError(f"{where}: {part!r} is not allowed; allowed: integers 1-1024, comma-separated")
        out.append(value)
    return sorted(set(out))


def _parts(where: str, text: str) -> List[str]:
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p for p in parts):
        raise GridError(f"{where}: {text!r} is not allowed; allowed: a comma-separated list without empty items")
    return parts


@dataclass(frozen=True)
class Setting:
    length: Length
    threshold: Optional[float]  # None where it does not apply (length 0)

    @property
    def label(self) -> str:
        if self.length == 0:
            return "no speculation"
        tail = f", threshold {self.threshold:g}" if self.threshold is not None else ""
        return f"length {self.length}{tail}"

    def serve_args(self) -> List[str]:
        """dspark-serve arguments of this setting (on top of the sweep's own)."""
        if self.length == 0:
            return []
        args = ["--enable-dspark", f"--dspark-speculative-length={self.length}"]
        if self.threshold is not None:
            args.append(f"--dspark-accept-threshold={self.threshold:g}")
        return args


def grid(lengths: Sequence[Length], thresholds: Sequence[float], concurrency: Sequence[int]) -> List[Setting]:
    settings = []
    for length in lengths:
        if length == 0:
            settings.append(Setting(0, None))
        else:
            settings += [Setting(length, t) for t in (thresholds or [None])]
    if len(settings) * max(len(concurrency), 1) > MAX_GRID:
        raise GridError(f"the grid has {len(settings) * len(concurrency)} cells; allowed: at most {MAX_GRID} "
                        "(fewer --lengths, --thresholds or --concurrency levels)")
    return settings


SWEPT_FLAGS = ("--dspark-speculative-length", "--dspark-accept-threshold", "--dspark-speculative-max")


def deployment_parameters(backend_parameters: Optional[Sequence[str]], setting: Setting) -> List[str]:
    """A running deployment's backend parameters with one setting's knobs in place of its own
    (everything else kept where it stands; console/editor.edit_knobs, the knob parsers' messages).
    Length 0 is refused: it turns DSpark off on a replica that serves live traffic, and with it
    the JSON default that replica's clients rely on (a scratch replica measures it)."""
    from gpustack_dspark.console.editor import edit_knobs

    if setting.length == 0:
        raise GridError("--lengths 0: no speculation would turn DSpark off on a replica that serves live traffic "
                        "(its clients lose the JSON default); measure it on a scratch replica (--model-path)")
    wanted: Dict[str, Optional[str]] = {"--dspark-speculative-length": str(setting.length)}
    if setting.threshold is not None:
        wanted["--dspark-accept-threshold"] = f"{setting.threshold:g}"
    if setting.length != AUTO:
        wanted["--dspark-speculative-max"] = None  # only allowed with auto
    edit = edit_knobs(backend_parameters, wanted)
    if edit.errors:
        raise GridError("; ".join(edit.errors.values()))
    return edit.backend_parameters


def shows_setting(info: Optional[Dict[str, Any]], setting: Setting) -> bool:
    """Whether a replica's /dspark/info says it runs this setting (not the parameters it had)."""
    if not info or info.get("phase") != "ready" or not info.get("enabled"):
        return False
    knobs = info.get("knobs") or {}
    if str(knobs.get("speculative_length")) != str(setting.length) and info.get("speculative_length") != setting.length:
        return False
    return setting.threshold is None or setting.threshold in (knobs.get("accept_threshold"), info.get("accept_threshold"))


@dataclass
class Row:
    length: Length
    threshold: Optional[float]
    concurrency: int
    requests: int
    failed: int
    goodput_tok_s: float     # output tokens of replies that passed the format check, per second
    output_tok_s: float
    latency_p50_s: Optional[float]
    latency_p99_s: Optional[float]
    ttft_p50_s: Optional[float]
    acceptance_rate: Optional[float]
    tokens_per_forward: Optional[float]
    format_errors: int


def goodput(stats, check) -> float:
    """Output tokens of the replies that passed the format check, per second of the run
    (`stats`: bench.load.RunStats)."""
    good = sum(r.output_tokens for r in stats.ok if check(r.content))
    return good / stats.wall_s if stats.wall_s > 0 else 0.0


def row_of(setting: Setting, concurrency: int, figures: Dict[str, Any], goodput: float) -> Row:
    return Row(setting.length, setting.threshold, concurrency, int(figures["requests"]), int(figures["failed"]),
               round(goodput, 3), round(figures.get("output_tok_s") or 0.0, 3), figures.get("latency_p50_s"),
               figures.get("latency_p99_s"), figures.get("ttft_p50_s"), figures.get("acceptance_rate"),
               figures.get("tokens_per_forward"), int(figures.get("format_errors") or 0))


def best_per_load(rows: Sequence[Row]) -> Dict[int, Row]:
    """The highest-goodput row per concurrency (ties: the shorter length, then lower threshold)."""
    best: Dict[int, Row] = {}
    for row in rows:
        current = best.get(row.concurrency)
        if current is None or _key(row) > _key(current):
            best[row.concurrency] = row
    return dict(sorted(best.items()))


def _key(row: Row) -> Tuple[float, float, float]:
    length = 17 if row.length == AUTO else int(row.length)
    return (row.goodput_tok_s, -length, -(row.threshold or 0.0))


def recommendation(rows: Sequence[Row]) -> Dict[str, Any]:
    """The setting to apply and the model-YAML change (docs/models-yaml.md) that applies it."""
    best = best_per_load(rows)
    if not best:
        return {"setting": None, "why": "no measurements", "yaml": ""}
    winners = {(r.length, r.threshold) for r in best.values()}
    if len(winners) == 1:
        length, threshold = next(iter(winners))
        why = f"the same setting is best at every measured concurrency ({', '.join(map(str, best))})"
    else:
        length, threshold = AUTO, None
        lengths = sorted({int(r.length) for r in best.values() if r.length != AUTO})
        why = ("the best setting moves with the load ("
               + "; ".join(f"concurrency {c}: {_label(r)}" for c, r in best.items())
               + "): auto lets the drafting layer choose per step"
               + (f", up to {max(lengths)}" if lengths else ""))
    if length == 0:
        yaml = ("dspark:\n  # speculation loses at every measured load here; auto turns it off per step\n"
                "  speculative_length: auto\n")
        return {"setting": {"speculative_length": 0}, "why": why, "yaml": yaml}
    lines = ["dspark:", f"  speculative_length: {length}"]
    if length == AUTO:
        tops = [int(r.length) for r in best.values() if r.length not in (0, AUTO)]
        if tops and max(tops) != 8:
            lines.append(f"  speculative_max: {max(tops)}")
    if threshold is not None:
        lines.append(f"  accept_threshold: {threshold:g}")
    return {"setting": {"speculative_length": length, "accept_threshold": threshold}, "why": why,
            "yaml": "\n".join(lines) + "\n"}


def batch_size_table(rows: Sequence[Row], max_batch: int = 1024) -> Optional[List[List[int]]]:
    """vLLM's `num_speculative_tokens_per_batch_size` for the GPU methods whose drafts do not pass
    the drafting layer (mtp, eagle3, draft_model on CUDA): per measured concurrency the best
    fixed length (0 = no speculation; `auto` rows are left out), as inclusive batch-size ranges
    split at the geometric mean of neighbouring levels, the first from 1, the last to
    `max_batch`. None without fixed-length measurements."""
    best: Dict[int, Row] = {}
    for row in rows:
        if row.length == AUTO:
            continue
        current = best.get(row.concurrency)
        if current is None or _key(row) > _key(current):
            best[row.concurrency] = row
    levels = sorted(best)
    if not levels:
        return None
    table, start = [], 1
    for i, level in enumerate(levels):
        end = max_batch if i == len(levels) - 1 else max(start, int(math.sqrt(level * levels[i + 1])))
        table.append([start, end, int(best[level].length)])
        start = end + 1
    merged: List[List[int]] = []
    for entry in table:  # neighbouring ranges with the same k become one
        if merged and merged[-1][2] == entry[2]:
            merged[-1][1] = entry[1]
        else:
            merged.append(entry)
    return merged


def _label(row: Row) -> str:
    return Setting(row.length, row.threshold).label + f" ({row.goodput_tok_s:g} tok/s)"


def as_csv(rows: Sequence[Row]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in asdict(row).items()})
    return out.getvalue()


def as_json(rows: Sequence[Row], described: Dict[str, Any]) -> str:
    return json.dumps({"settings": described, "rows": [asdict(r) for r in rows],
                       "best_per_concurrency": {str(c): asdict(r) for c, r in best_per_load(rows).items()},
                       "recommendation": recommendation(rows),
                       # For mtp / eagle3 / draft_model on CUDA (speculative config field).
                       "vllm_num_speculative_tokens_per_batch_size": batch_size_table(rows)}, indent=2)


def as_text(rows: Sequence[Row]) -> str:
    header = ("length", "thresh", "conc", "goodput", "tok/s", "p50 s", "p99 s", "accept", "tok/fwd", "fmt err",
              "failed")
    lines = ["  ".join(f"{h:>8}" for h in header)]
    for r in rows:
        cells = (r.length, "-" if r.threshold is None else f"{r.threshold:g}", r.concurrency, r.goodput_tok_s,
                 r.output_tok_s, r.latency_p50_s, r.latency_p99_s, r.acceptance_rate, r.tokens_per_forward,
                 r.format_errors, r.failed)
        lines.append("  ".join(f"{_fmt(c):>8}" for c in cells))
    rec = recommendation(rows)
    lines += ["", "best per concurrency:"]
    lines += [f"  {c}: {_label(r)}" for c, r in best_per_load(rows).items()]
    lines += ["", f"recommendation: {rec['why']}", "model YAML:", *("  " + l for l in rec["yaml"].splitlines())]
    table = batch_size_table(rows)
    if table:
        lines += ["", "for GPU methods without the drafting layer (mtp, eagle3, draft_model on CUDA), vLLM's",
                  f"  num_speculative_tokens_per_batch_size: {json.dumps(table)}"]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def plot(rows: Sequence[Row], path: str, title: str = "gpustack-dspark sweep") -> None:
    """Goodput against speculative length, one curve per (concurrency, threshold); `auto`
    as a dashed line of the same colour; no speculation is length 0 of every curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    levels = sorted({r.concurrency for r in rows})
    thresholds = sorted({r.threshold for r in rows if r.threshold is not None and r.length != AUTO}) or [None]
    for i, level in enumerate(levels):
        colour = colours[i % len(colours)]
        at = [r for r in rows if r.concurrency == level]
        none = [r for r in at if r.length == 0]
        for j, threshold in enumerate(thresholds):
            points = sorted((int(r.length), r.goodput_tok_s) for r in at
                            if r.length not in (0, AUTO) and r.threshold == threshold)
            points = [(0, none[0].goodput_tok_s)] + points if none else points
            if points:
                xs, ys = zip(*points)
                label = f"concurrency {level}" + (f", threshold {threshold:g}" if threshold is not None
                                                  and len(thresholds) > 1 else "")
                ax.plot(xs, ys, marker="o", color=colour, linestyle=("-", "-.", ":")[j % 3], label=label)
        for r in at:
            if r.length == AUTO:
                ax.axhline(r.goodput_tok_s, color=colour, linestyle="--", linewidth=1,
                           label=f"concurrency {level}: auto")
    ax.set_xlabel("speculative length (0 = no speculation)")
    ax.set_ylabel("goodput (valid output tokens / s)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
