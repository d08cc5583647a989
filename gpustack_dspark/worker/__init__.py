"""Runs inside the DSpark backend image, next to vLLM: the `dspark-serve` launcher, the
JSON-default middleware and the warmup gate. Never imports the server-side modules."""
