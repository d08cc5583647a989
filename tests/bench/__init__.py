"""The repository's experiments: benchmarks run by hand, whose figures are in the docs.

Not tests (pytest collects nothing here) and not in the wheel: they start real servers,
replicas and the test stand-ins (`tests/support/`). Run from the repository root, e.g.
`.venv/bin/python -m tests.bench.routing_compare`. The benchmark library the
`gpustack-dspark` CLI uses (`load`, `workloads`, `runner`, `report`, `sweep`) stays in
`gpustack_dspark/bench/`.
"""
