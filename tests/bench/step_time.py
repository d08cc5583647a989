"""The step-time curve of a model in vLLM (CPU): T(batch, positions), printed and plotted.

    .venv/bin/python -m tests.bench.step_time [--model expanded] [--batches 1,2,4,8,16]
        [--positions 1,2,3,5,9] [--context 256] [--repeats 7] [--out step_time.png]

Why: speculative decoding trades verify cost against steps saved, and the trade is set by how a
step's time grows with the tokens it computes. A verify step of k drafts computes k + 1
positions per sequence; on a real model at batch 1 that costs little more than one position
(the weights are read once per step either way), and at batch 8-16 it grows with the tokens
(compute dominates). On the fixture model a step is framework overhead, flat in both; the
expanded model (devstack/expanded_model.py) must show the real shape before its figures mean
anything.

Measured with vLLM's offline engine (tests/bench/vllm_offline.py, the CPU layout of the
replicas): `batch` requests whose prompts share a `context`-token prefix already in the prefix
cache and add `positions` new tokens each, so one engine step computes batch x positions tokens
attending to context + positions, as a verify step does. Timed around `LLMEngine.step()`
(scheduler, forward, sampling, output processing), median of --repeats. The table has the
milliseconds and T(b, p) / T(b, 1); the PNG has T against positions per batch and against
tokens per step. A shared CPU moves these figures: compare only cells of one run.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List


def ints(text: str, what: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"--{what} {text!r}: comma-separated positive integers") from None
    if not values or min(values) < 1:
        raise SystemExit(f"--{what} {text!r}: comma-separated positive integers")
    return sorted(set(values))


def table(rows: List[Dict]) -> str:
    """Pure: milliseconds per (batch, positions), and each row's ratio to its first column."""
    batches = sorted({r["batch"] for r in rows})
    positions = sorted({r["positions"] for r in rows})
    ms = {(r["batch"], r["positions"]): r["ms"] for r in rows}
    lines = ["T(batch, positions), ms per engine step" + " " * 4 + f"| T / T(b, {positions[0]})",
             "batch " + "".join(f"{p:>8}" for p in positions) + "  | " + "".join(f"{p:>7}" for p in positions)]
    for b in batches:
        base = ms.get((b, positions[0]))
        cells = "".join(f"{ms[(b, p)]:8.1f}" if (b, p) in ms else f"{'-':>8}" for p in positions)
        ratios = "".join(f"{ms[(b, p)] / base:7.2f}" if (b, p) in ms and base else f"{'-':>7}" for p in positions)
        lines.append(f"{b:5} {cells}  | {ratios}")
    return "\n".join(lines)


def plot(rows: List[Dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for b in sorted({r["batch"] for r in rows}):
        mine = sorted((r for r in rows if r["batch"] == b), key=lambda r: r["positions"])
        left.plot([r["positions"] for r in mine], [r["ms"] for r in mine], marker="o", label=f"batch {b}")
        right.plot([b * r["positions"] for r in mine], [r["ms"] for r in mine], marker="o", label=f"batch {b}")
    left.set(xlabel="positions per sequence (drafts + 1)", ylabel="ms per engine step", title=title)
    right.set(xlabel="tokens per step (batch x positions)", ylabel="ms per engine step", xscale="log",
              title="the same, against tokens")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    from tests.bench.models import add_model_argument, resolve
    from tests.bench.vllm_offline import run_offline

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_argument(parser)
    parser.add_argument("--batches", default="1,2,4,8,16")
    parser.add_argument("--positions", default="1,2,3,5,9")
    parser.add_argument("--context", type=int, default=256, help="cached tokens each sequence attends to")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("step_time.png"))
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if not 1 <= args.context <= 768:
        raise SystemExit(f"--context {args.context}: between 1 and 768 (max-model-len 1024 less the positions)")
    if args.repeats < 1:
        raise SystemExit(f"--repeats {args.repeats}: at least 1")
    model, _ = resolve(args.model)
    found = run_offline({"command": "step_time", "model": str(model), "batches": ints(args.batches, "batches"),
                         "positions": ints(args.positions, "positions"), "context": args.context,
                         "repeats": args.repeats}, timeout_s=3600)
    config = json.loads((model / "config.json").read_text())
    shape = (f"hidden {config['hidden_size']}, {config['num_hidden_layers']} layers, "
             f"intermediate {config['intermediate_size']}")
    print(f"{model.name} ({shape}); context {found['context']} cached tokens (block size {found['block_size']}); "
          f"median of {args.repeats}; vLLM offline engine, CPU layout")
    print(table(found["rows"]))
    uncached = [r for r in found["rows"] if r["cached"] is not None and r["cached"] < found["context"]]
    if uncached:
        print(f"warning: {len(uncached)} cells found less than the context in the prefix cache "
              f"(their steps computed the context too)", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({"model": str(model), "shape": shape, **found}, indent=1))
    plot(found["rows"], args.out, f"step time: {model.name.split('-s0-')[0]}")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
