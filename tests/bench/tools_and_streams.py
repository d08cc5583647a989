"""Benchmark: what strict tools under `tool_choice: "auto"` and checked streams cost, on real
vLLM (CPU), side by side in one run on one replica.

    .venv/bin/python -m tests.bench.tools_and_streams [--requests 48] [--concurrency 8] [--model expanded]

1. Tools under `auto`: the same requests (a weather and a status tool, prompts that ask for a
   call and some that only chat, temperature 0.8, a seed each) with `strict: true` on both tools
   — vLLM's structural tags constrain the reply to text or a call naming a tool with arguments
   by its schema — and with strict off (the model's own calls, parsed after the fact). Figures:
   output tok/s, P50/P99, tokens per target forward pass (vLLM's counters), calls, plain-text
   replies, calls that break their tool's schema.
2. Streams: order JSON requests streamed through the replica's reply check (every stream with a
   schema is checked: the last content event waits for the whole reply's judgement,
   worker/stream_check.py) against the same requests with `json_object` only (checked for JSON,
   not the schema) and not streamed. Figures: time to first content, total time, P99. The
   check's own cost per reply, without the model, is `tests.bench.format_check_cost`'s kind of
   figure: printed here from `stream_check.StreamCheck` on the replies this run received.

Figures, not assertions.
"""

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import httpx

from gpustack_dspark.bench.load import acceptance, percentile, spec_counters
from gpustack_dspark.bench.workloads import ORDER_SCHEMA, order_bodies
from gpustack_dspark.devstack.replica import SERVED_NAME, start_replica
from tests.bench.models import add_model_argument, resolve
from tests.bench.order_json import SAME_VLLM_ARGS

# The fixture was tuned on lower-case cities, a unit spelled out and statuses like "done": left
# free, its calls break these schemas; a tool marked strict keeps them to it (also used by
# tests/integration/test_request_path.py).
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima", "Oslo"]},
    "unit": {"type": "string", "enum": ["C", "F"]}}, "required": ["city", "unit"], "additionalProperties": False}
STATUS = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 1, "maximum": 999}, "status": {"type": "string", "enum": ["OPEN", "SHUT"]}},
    "required": ["id", "status"], "additionalProperties": False}
PROMPTS = ["What is the weather in paris?", "Weather in tokyo in celsius, please.", "Is it cold in oslo today?",
           "Set item 4521 to done.", "Mark 77 as closed.", "Hello, how can I help you today?",
           "What is the weather in lima?", "Set item 12 to open.", "Thanks for your order, it ships tomorrow."]


def tools(strict: bool) -> List[Dict[str, Any]]:
    return [{"type": "function", "function": {"name": name, "strict": strict, "parameters": parameters}}
            for name, parameters in (("get_weather", WEATHER), ("set_status", STATUS))]


def tool_bodies(count: int, strict: bool, max_tokens: int) -> List[Dict[str, Any]]:
    return [{"model": SERVED_NAME, "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
             "tools": tools(strict), "tool_choice": "auto", "max_tokens": max_tokens, "temperature": 0.8, "seed": i}
            for i in range(count)]


async def _send(base_url: str, bodies: List[Dict[str, Any]], concurrency: int) -> Tuple[float, List[Dict[str, Any]]]:
    """(wall seconds, one record per reply): latency, time to first content (streams), tokens,
    the reply's tool calls and content, finish reason."""
    sem = asyncio.Semaphore(concurrency)
    out: List[Dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
        async def one(body: Dict[str, Any]) -> None:
            async with sem:
                started = time.perf_counter()
                if not body.get("stream"):
                    r = await client.post("/v1/chat/completions", json=body)
                    data = r.json() if r.status_code == 200 else {}
                    choice = (data.get("choices") or [{}])[0]
                    message = choice.get("message") or {}
                    out.append({"status": r.status_code, "latency": time.perf_counter() - started, "ttft": math.nan,
                                "tokens": (data.get("usage") or {}).get("completion_tokens", 0),
                                "calls": [c["function"] for c in message.get("tool_calls") or []],
                                "content": message.get("content") or "", "finish": choice.get("finish_reason")})
                    return
                first, content, tokens, finish = math.nan, "", 0, None
                async with client.stream("POST", "/v1/chat/completions",
                                         json={**body, "stream_options": {"include_usage": True}}) as r:
                    async for line in r.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        event = json.loads(line[6:])
                        if event.get("usage"):
                            tokens = event["usage"].get("completion_tokens", 0)
                        for choice in event.get("choices") or []:
                            piece = (choice.get("delta") or {}).get("content")
                            if piece:
                                if math.isnan(first):
                                    first = time.perf_counter() - started
                                content += piece
                            finish = choice.get("finish_reason") or finish
                out.append({"status": r.status_code, "latency": time.perf_counter() - started, "ttft": first,
                            "tokens": tokens, "calls": [], "content": content, "finish": finish})

        started = time.perf_counter()
        await asyncio.gather(*(one(b) for b in bodies))
        return time.perf_counter() - started, out


def measure(base_url: str, bodies: List[Dict[str, Any]], concurrency: int) -> Tuple[Dict[str, float], List[Dict]]:
    before = spec_counters(httpx.get(f"{base_url}/metrics", timeout=10).text)
    wall, replies = asyncio.run(_send(base_url, bodies, concurrency))
    spec = acceptance(before, spec_counters(httpx.get(f"{base_url}/metrics", timeout=10).text))
    ok = [r for r in replies if r["status"] == 200]
    tokens = sum(r["tokens"] for r in ok)
    accepted = spec["accepted"]
    ttfts = [r["ttft"] for r in ok if not math.isnan(r["ttft"])]
    return {"tok_s": tokens / wall if wall else math.nan,
            "p50_ms": percentile([r["latency"] for r in ok], 50) * 1000,
            "p99_ms": percentile([r["latency"] for r in ok], 99) * 1000,
            "ttft_p50_ms": percentile(ttfts, 50) * 1000 if ttfts else math.nan,
            "ttft_p99_ms": percentile(ttfts, 99) * 1000 if ttfts else math.nan,
            "tokens_per_forward": tokens / (tokens - accepted) if tokens > accepted else math.nan,
            "failed": len(replies) - len(ok)}, ok


def broken_calls(replies: List[Dict], strict_tools: List[Dict]) -> Tuple[int, int, int]:
    """(calls, plain-text replies, calls that name no tool or break its schema) over the replies
    that ended by themselves (a reply cut by max_tokens carries no whole call)."""
    import jsonschema

    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in strict_tools}
    calls = text = broken = 0
    for reply in replies:
        if reply["finish"] == "length":
            continue
        text += not reply["calls"]
        for call in reply["calls"]:
            calls += 1
            try:
                jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])
            except (KeyError, ValueError, jsonschema.ValidationError):
                broken += 1
    return calls, text, broken


def check_cost_us(replies: List[Dict]) -> float:
    """Microseconds per reply of the replica's stream check on these replies' text, re-sent as
    one SSE event per 3 characters (the worker's check, without the model)."""
    from gpustack_dspark.worker import stream_check
    from gpustack_dspark.worker.middleware import _problem

    streams = []
    for reply in replies:
        text = reply["content"]
        events = [f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': text[i:i + 3]}}]})}\n\n".encode()
                  for i in range(0, len(text), 3)]
        events.append(b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')
        streams.append(events)
    started = time.perf_counter()
    for events in streams:
        check = stream_check.StreamCheck(lambda text: _problem(text, ORDER_SCHEMA), None)
        for event in events:
            check.feed(event)
        check.finish()
    return (time.perf_counter() - started) / max(1, len(streams)) * 1e6


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=48, help="requests per arm")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=160)
    add_model_argument(parser)
    args = parser.parse_args(argv)
    model, model_args = resolve(args.model)
    logs = Path(tempfile.mkdtemp(prefix="dspark-tools-bench-"))
    replica = start_replica(logs / "replica.log", ["--enable-dspark", "--dspark-warmup-requests", "2"]
                            + SAME_VLLM_ARGS + model_args, model=model)
    rows: List[Tuple[str, Dict[str, float], str]] = []
    try:
        replica.wait_ready(600)
        url = replica.base_url
        for strict in (True, False):
            figures, replies = measure(url, tool_bodies(args.requests, strict, args.max_tokens), args.concurrency)
            calls, text, broken = broken_calls(replies, tools(True))
            rows.append((f"tools auto, strict {'on' if strict else 'off'}", figures,
                         f"{calls} calls, {text} text, {broken} break the schema"))
            print(rows[-1], file=sys.stderr, flush=True)
        order = order_bodies(args.requests, args.max_tokens, 0.8, SERVED_NAME)
        for name, change in (("order JSON streamed, schema (checked)", {"stream": True}),
                             ("order JSON streamed, json_object", {"stream": True,
                                                                    "response_format": {"type": "json_object"}}),
                             ("order JSON not streamed, schema (checked)", {})):
            bodies = [{**body, **change, "seed": i} for i, body in enumerate(order)]
            figures, replies = measure(url, bodies, args.concurrency)
            note = f"check {check_cost_us(replies):.0f} us/reply" if name.startswith("order JSON streamed, schema") else ""
            rows.append((name, figures, note))
            print(rows[-1], file=sys.stderr, flush=True)
    finally:
        replica.stop()
    print(f"{args.requests} requests per arm, concurrency {args.concurrency}, max_tokens {args.max_tokens}, "
          f"temperature 0.8; model {model.name}; real vLLM 0.32 on this CPU")
    print(f"{'arm':44}{'tok/s':>8}{'P50 ms':>8}{'P99 ms':>8}{'TTFT50':>8}{'TTFT99':>8}{'tok/fwd':>8}{'fail':>5}  notes")
    for name, f, note in rows:
        print(f"{name:44}{f['tok_s']:8.1f}{f['p50_ms']:8.0f}{f['p99_ms']:8.0f}{f['ttft_p50_ms']:8.0f}"
              f"{f['ttft_p99_ms']:8.0f}{f['tokens_per_forward']:8.2f}{f['failed']:5d}  {note}")


if __name__ == "__main__":
    main()
