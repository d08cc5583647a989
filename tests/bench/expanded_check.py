"""Does the benchmark model answer like the fixture? Greedy token agreement of an expanded model
(devstack/expanded_model.py) with the fixture on the benchmarks' prompts, in real vLLM (CPU).

    .venv/bin/python -m tests.bench.expanded_check [--model expanded|DIR] [--max-tokens 128]

The expansion is exact in real arithmetic; in floats the wider matmuls sum in another order, so
a rare near-tie between the two best tokens can flip and the replies part from there. Printed
per workload (the order-JSON prompts of bench.drafting / sweep / budget_trace, bench.drafting's
fixed-schema prompts, budget_trace's free-text prompts; greedy, no grammar, so the model alone
decides every token): identical replies, and token agreement = the tokens before each reply's
first difference / the fixture's tokens (a token after a difference counts as disagreeing,
whatever it is). The bar is 99.5 %. The CI test (tests/integration/test_expanded_model.py)
requires identity on a few prompts with a small expansion.
"""

import argparse
import sys
from typing import Dict, List, Sequence

from gpustack_dspark.bench.workloads import order_bodies
from gpustack_dspark.devstack.replica import TARGET_MODEL

BAR = 0.995


def agreement(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]]) -> Dict[str, float]:
    """Pure: identical replies and the share of the reference's tokens before each first difference."""
    if len(reference) != len(other):
        raise ValueError(f"replies {len(other)}: expected {len(reference)}, one per prompt")
    agreed = total = identical = 0
    first_differences: List[int] = []
    for ref, got in zip(reference, other):
        common = 0
        while common < min(len(ref), len(got)) and ref[common] == got[common]:
            common += 1
        identical += list(ref) == list(got)
        if list(ref) != list(got):
            first_differences.append(common)
        agreed += min(common, len(ref))
        total += len(ref)
    return {"prompts": len(reference), "identical": identical, "tokens": total, "agreed": agreed,
            "rate": agreed / total if total else 1.0, "first_differences": first_differences}


def prompts(count: int) -> Dict[str, List[List[Dict[str, str]]]]:
    from tests.bench.budget_trace import Contents
    from tests.bench.drafting import fixed_schema_bodies

    return {"order JSON": [b["messages"] for b in order_bodies(count, 1, 0.0, "m")],
            "fixed schema (book_flight)": [b["messages"] for b in fixed_schema_bodies(count, 1, 0.0)],
            "free text": [Contents(0, 0, False).body({"kind": "text", "index": i})["messages"]
                          for i in range(count)]}


def main(argv=None) -> int:
    from tests.bench.models import add_model_argument, resolve
    from tests.bench.vllm_offline import run_offline

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_argument(parser)
    parser.set_defaults(model="expanded")
    parser.add_argument("--prompts", type=int, default=48, help="prompts per workload (default 48)")
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    model, _ = resolve(args.model)
    workloads = prompts(args.prompts)
    flat = [p for ps in workloads.values() for p in ps]
    out = run_offline({"command": "greedy", "models": [str(TARGET_MODEL), str(model)], "prompts": flat,
                       "max_tokens": args.max_tokens}, timeout_s=3600)
    reference, other = out["tokens"][str(TARGET_MODEL)], out["tokens"][str(model)]
    print(f"{model} against {TARGET_MODEL.name}: greedy, no grammar, max_tokens {args.max_tokens}; "
          f"seconds (load + generate) {out['seconds']}")
    print(f"{'workload':30}{'identical':>12}{'tokens':>9}{'agreed':>9}{'agreement':>11}  first differences at")
    start, results = 0, []
    for name, ps in workloads.items():
        got = agreement(reference[start:start + len(ps)], other[start:start + len(ps)])
        start += len(ps)
        results.append(got)
        print(f"{name:30}{got['identical']:>6}/{got['prompts']:<5}{got['tokens']:9}{got['agreed']:9}"
              f"{100 * got['rate']:10.2f}%  {got['first_differences'] or '-'}")
    whole = agreement(reference, other)
    print(f"{'all':30}{whole['identical']:>6}/{whole['prompts']:<5}{whole['tokens']:9}{whole['agreed']:9}"
          f"{100 * whole['rate']:10.2f}%  (bar {100 * BAR:.1f}%)")
    return 0 if whole["rate"] >= BAR else 1


if __name__ == "__main__":
    sys.exit(main())
