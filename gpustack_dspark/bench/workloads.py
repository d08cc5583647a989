"""Request bodies for the load tools (pure): the built-in order-JSON workload and a
workload for any JSON schema."""

import json
from typing import Any, Dict, List

ORDER_SCHEMA = {
    "type": "object",
    "properties": {"user_id": {"type": "integer"}, "action": {"type": "string"},
                   "amount": {"type": "number"}, "timestamp": {"type": "string"}},
    "required": ["user_id", "action", "amount", "timestamp"],
    "additionalProperties": False,
}
ACTIONS = ("buy", "sell", "refund", "cancel")


def order_bodies(count: int, max_tokens: int, temperature: float, model: str) -> List[Dict[str, Any]]:
    return [order_body(i, max_tokens, temperature, model) for i in range(count)]


def order_body(i: int, max_tokens: int, temperature: float, model: str) -> Dict[str, Any]:
    prompt = (f"Create an order record for user {1000 + i}: {ACTIONS[i % len(ACTIONS)]} {10 + i * 1.5:.2f}. "
              f"Schema: {json.dumps(ORDER_SCHEMA, separators=(',', ':'))}")
    return _body(model, prompt, ORDER_SCHEMA, "order", max_tokens, temperature, i)


def schema_body(i: int, schema: Dict[str, Any], max_tokens: int, temperature: float, model: str) -> Dict[str, Any]:
    prompt = (f"Request {i}: generate one JSON value that follows this schema: "
              f"{json.dumps(schema, separators=(',', ':'))}")
    return _body(model, prompt, schema, "bench", max_tokens, temperature, i)


def _body(model: str, prompt: str, schema: Dict[str, Any], name: str, max_tokens: int, temperature: float,
          seed: int) -> Dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": temperature, "seed": seed,
            "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}}
