"""Cost of the proxy's JSON format check (routing/format_check.py) per reply, on this machine.

    .venv/bin/python -m tests.bench.format_check_cost [--replies 2000]

Prints microseconds per non-streamed order-JSON reply (parse + schema validation) and per
streamed reply (3-character deltas, one SSE event each). The check runs after the reply's
last byte went to the client, so this is event-loop time, not added latency.
"""

import argparse
import json
import time

from gpustack_dspark.bench.workloads import ORDER_SCHEMA
from gpustack_dspark.routing import format_check as fc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replies", type=int, default=2000)
    args = parser.parse_args()
    content = json.dumps({"user_id": 1001, "action": "buy", "amount": 11.5, "timestamp": "2026-01-01T00:00:00Z"})
    body = json.dumps({"id": "x", "choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": content}}], "usage": {"completion_tokens": 40}}).encode()
    events = [f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': content[i:i + 3]}}]})}\n\n".encode()
              for i in range(0, len(content), 3)]
    events.append(b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')
    fc.check_body(body, ORDER_SCHEMA)  # the validator is compiled once and cached
    started = time.perf_counter()
    for _ in range(args.replies):
        assert fc.check_body(body, ORDER_SCHEMA) == fc.OK
    per_body = (time.perf_counter() - started) / args.replies * 1e6
    started = time.perf_counter()
    for _ in range(args.replies):
        check = fc.StreamCheck(ORDER_SCHEMA)
        for event in events:
            check.feed(event)
        assert check.result() == fc.OK
    per_stream = (time.perf_counter() - started) / args.replies * 1e6
    print(f"non-streamed reply ({len(body)} bytes): {per_body:.0f} us")
    print(f"streamed reply ({len(events)} events): {per_stream:.0f} us ({per_stream / len(events):.1f} us per event)")


if __name__ == "__main__":
    main()
