"""The ASGI middleware dspark-serve adds to vLLM's app (vLLM's own `--middleware` option).

- `GET /dspark/ready`: the warmup gate GPUStack's health check probes. 200 only when the
  warmup finished and vLLM's own /health answers 200; otherwise 503 with the reason.
  Answered from memory (plus one bounded /health call), so always within 1 s.
- `GET /dspark/info`: knobs as applied, method and why, threshold semantics, warmup, tool-call
  options; secret values redacted (`redact.py`). When vLLM's `--api-key` is set it needs that
  key (`Authorization: Bearer KEY`, 401 otherwise); `/dspark/ready` never does.
- POST /v1/chat/completions and /v1/completions on a JSON replica: JSON by default
  (json_default.rewrite), legacy guided_* converted, hostile bodies and schemas refused with a
  400 naming the problem (`request_limits.py`: depth, size, left-recursive `$ref`, catastrophic
  patterns), schemas checked (400 if the grammar engine cannot compile them; tool parameters
  too when `tool_choice` makes them a grammar), `usage.dspark_stats` added to non-streamed
  responses, and every reply with a schema or judged tool calls (`tool_check`) checked before
  its end is delivered (non-streamed: whole, withheld with a 500; streamed: each choice's last
  content event waits for the check, an error event in its place when it fails —
  stream_check.py).
Everything else passes through untouched.
"""

import asyncio
import hmac
import json
import logging
import os
from typing import Any, Awaitable, Callable, Collection, Dict, List, Optional, Tuple

from gpustack_dspark import reply_check
from gpustack_dspark.worker import (json_default, request_limits, sampling_check, schema_check,
                                    state as worker_state, stream_check)

logger = logging.getLogger("gpustack_dspark.worker")

READY_PATH = "/dspark/ready"
INFO_PATH = "/dspark/info"
HEALTH_PROBE_TIMEOUT_S = 0.8
ANY_JSON: Dict[str, Any] = {}  # the empty schema: "any JSON value" (json_object replies)
MAX_BODY_BYTES = 32 * 1024 * 1024
# "0": refuse what vLLM's xgrammar backend refuses instead of relaxing it (the behaviour before
# issue 20; tests/bench/schema_bench.py compares both).
RELAX_ENV = "DSPARK_SCHEMA_RELAX"

Scope = Dict[str, Any]
Message = Dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


async def _send_json(send: Send, status: int, payload: Any, headers: Optional[List[Tuple[bytes, bytes]]] = None) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def openai_error(message: str, param: Optional[str] = None, status: int = 400) -> Dict[str, Any]:
    return {"error": {"message": message, "type": "BadRequestError", "param": param, "code": status}}


def dspark_stats(response: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """usage.dspark_stats from vLLM's per-request speculative metrics, if it reported them."""
    spec = ((response.get("metrics") or {}).get("speculative_decoding")
            if isinstance(response.get("metrics"), dict) else None)
    if not isinstance(spec, dict):
        return None
    drafted = int(spec.get("num_draft_tokens") or 0)
    accepted = int(spec.get("num_accepted_draft_tokens") or 0)
    return {
        "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
        "accepted_tokens": accepted,
        "drafted_tokens": drafted,
        "verify_steps": int(spec.get("num_spec_steps") or 0),
        "tokens_per_forward": round(float(spec.get("mean_acceptance_length") or 1.0), 4),
    }


class DSparkMiddleware:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = worker_state.current()
        path, method = scope.get("path", ""), scope.get("method", "GET")
        if path == READY_PATH:
            return await self._ready(state, scope, send)
        if path == INFO_PATH:
            if state is not None and state.api_keys and not _authorized(scope, state.api_keys):
                return await _send_json(send, 401, openai_error(
                    "/dspark/info needs this server's API key: send 'Authorization: Bearer <key>' "
                    "(the one given to --api-key)", status=401), [(b"www-authenticate", b"Bearer")])
            return await _send_json(send, 200, state.info() if state else {"phase": "unknown"})
        if state is not None and method == "POST" and path in json_default.JSON_PATHS and state.plan.enabled:
            return await self._completion(state, scope, receive, send)
        return await self.app(scope, receive, send)

    async def _ready(self, state: Optional[worker_state.WorkerState], scope: Scope, send: Send) -> None:
        if state is None:
            return await _send_json(send, 503, {"ready": False, "phase": "unknown",
                                                "reason": "dspark-serve did not start this server"})
        if state.phase != worker_state.READY:
            return await _send_json(send, 503, {"ready": False, "phase": state.phase, "reason": state.reason})
        healthy = await self._vllm_healthy(scope)
        if not healthy:
            return await _send_json(send, 503, {"ready": False, "phase": state.phase,
                                                "reason": "warm, but vLLM's /health does not answer 200"})
        return await _send_json(send, 200, {"ready": True, "phase": state.phase,
                                            "warmup_s": state.warmup.duration_s()})

    async def _vllm_healthy(self, scope: Scope) -> bool:
        """Ask vLLM's own /health route (in-process, no socket), bounded in time."""
        status: List[int] = []

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])

        # The probe's own scope keeps the app and server keys Starlette put on the real one.
        probe = {**scope, "method": "GET", "path": "/health", "raw_path": b"/health",
                 "query_string": b"", "headers": []}
        try:
            await asyncio.wait_for(self.app(probe, receive, send), HEALTH_PROBE_TIMEOUT_S)
        except Exception:
            return False
        return bool(status) and status[0] == 200

    async def _completion(self, state: worker_state.WorkerState, scope: Scope, receive: Receive, send: Send) -> None:
        raw = await _read_body(receive)
        if raw is None:
            return await _send_json(send, 413, openai_error(f"request body larger than {MAX_BODY_BYTES} bytes", status=413))
        try:
            body = json.loads(raw) if raw else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        except RecursionError:
            state.count("rejected")
            return await _send_json(send, 400, openai_error(
                f"the request body is nested too deeply to parse (at most {request_limits.MAX_BODY_DEPTH} "
                "levels allowed)"))
        if not isinstance(body, dict):  # vLLM answers malformed bodies itself
            return await self.app(scope, _replay(raw, receive), send)
        try:  # off the event loop: a large schema takes a few hundred ms to walk
            await asyncio.get_running_loop().run_in_executor(None, request_limits.check_body, body)
        except request_limits.LimitExceeded as e:
            state.count("rejected")
            return await _send_json(send, 400, openai_error(str(e)))
        if state.plan.speculative_config:
            refused = sampling_check.refused_with_speculation(body)
            if refused is not None:
                state.count("rejected")
                state.count("sampling_refused")
                return await _send_json(send, 400, openai_error(refused[1], param=refused[0]))

        schema = json_default.requested_schema(body)
        if state.json_default:
            try:
                rewritten = json_default.rewrite(scope["path"], body, state.default_schema)
            except json_default.RequestRejected as e:
                state.count("rejected")
                return await _send_json(send, 400, openai_error(str(e)))
            state.count({"injected": "json_injected", "converted": "legacy_converted"}.get(rewritten.action, "kept"))
            body, schema = rewritten.body, rewritten.schema
        else:
            legacy = [k for k in body if k.startswith("guided_")]
            if legacy:  # vLLM would ignore them and answer unconstrained
                state.count("rejected")
                return await _send_json(send, 400, openai_error(
                    f"{', '.join(sorted(legacy))} is not supported by this server; use structured_outputs "
                    "or response_format", param=legacy[0]))

        plan = None
        if schema is not None and schema is not state.default_schema:
            relax = os.environ.get(RELAX_ENV, "1") != "0"
            plan = await asyncio.get_running_loop().run_in_executor(
                None, schema_check.plan_engine, schema, state.grammar_engines, relax)
            if plan.problem:
                state.count("rejected")
                return await _send_json(send, 400, openai_error(f"the requested JSON schema is not usable: {plan.problem}",
                                                                param="response_format"))
            if plan.grammar_schema is not schema:
                body = json_default.with_schema(body, plan.grammar_schema)
            if plan.engine == "llguidance":
                state.count("engine_llguidance")
            if plan.dropped:
                # The grammar enforces the rest; the reply check below still validates against `schema`.
                state.count("relaxed")
                logger.info("schema served by %s without enforcing (reply still checked): %s",
                            plan.engine, ", ".join(plan.dropped[:5]))

        forced = grammar_tool_schemas(body)
        every_tool = ((state.plan.tool_calls or {}).get("strict") or {}).get("tools") == "all"
        forced_names = {name for _, name, _ in forced}
        strict = [t for t in strict_tool_schemas(body, every_tool) if t[1] not in forced_names]
        for where, _name, tool_schema in forced + strict:
            problem = await asyncio.get_running_loop().run_in_executor(None, schema_check.check_schema, tool_schema)
            if problem:
                state.count("rejected")
                why = "tool_choice" if (where, _name, tool_schema) in forced else "a strict tool"
                return await _send_json(send, 400, openai_error(
                    f"{where} is not usable as a grammar for {why}: {problem}", param="tools"))
        strict_forced_tools(body, forced_names)

        if schema is None and json_default.wants_json_object(body):
            schema = ANY_JSON
        new_raw = json.dumps(body).encode()
        tools = tool_check(body, every_tool)
        if body.get("stream"):
            if schema is None and tools is None:
                return await self.app(_with_length(scope, len(new_raw)), _replay(new_raw, receive), send)
            return await self._checked_stream(state, _with_length(scope, len(new_raw)), _replay(new_raw, receive),
                                              send, schema, tools)
        start, reply = await self._buffered(_with_length(scope, len(new_raw)), _replay(new_raw, receive))
        violation = schema_violation(start, reply, schema, tools)
        if plan is None and schema is state.default_schema and schema is not None:
            plan = schema_check.EnginePlan("xgrammar", schema)
        narrowed = None
        if violation and violation.tool is None and schema is not None:
            # A reply that satisfies several branches of a oneOf: the branch it matched, closed.
            narrowed = await asyncio.get_running_loop().run_in_executor(
                None, schema_check.narrowed_plan, schema, _first_content(reply), state.grammar_engines)
        if violation and (plan is not None or narrowed is not None):
            # One more attempt: the narrowed oneOf, else the other engine (greedy decoding would
            # repeat the same reply).
            other = narrowed or await asyncio.get_running_loop().run_in_executor(
                None, schema_check.second_plan, schema, plan, state.grammar_engines)
            if other is not None:
                state.count("second_attempts")
                if narrowed is not None:
                    state.count("oneof_narrowed")
                logger.warning("reply failed the schema check (%s); second attempt with %s%s", violation, other.engine,
                               " (oneOf narrowed)" if narrowed is not None else "")
                retry_raw = json.dumps(json_default.with_schema(body, other.grammar_schema)).encode()
                start2, reply2 = await self._buffered(_with_length(scope, len(retry_raw)), _replay(retry_raw, receive))
                if start2.get("status") == 200:
                    violation2 = schema_violation(start2, reply2, schema, tools)
                    if not violation2:
                        state.count("second_attempt_served")
                        if narrowed is not None:
                            state.count("oneof_narrowed_served")
                        start, reply, violation = start2, reply2, None
        if violation:
            state.count("schema_violations")
            logger.error("reply withheld: %s", violation)
            return await _send_json(send, 500, {"error": {
                "message": f"the reply does not validate against the requested schema ({violation}); "
                           "it was not delivered", "type": "SchemaViolationError", "param": None, "code": 500}})
        if start.get("type") != "http.response.start":  # vLLM's app answered nothing
            return await _send_json(send, 500, {"error": {"message": "the replica produced no answer",
                                                          "type": "InternalServerError", "param": None, "code": 500}})
        await send(start)
        await send({"type": "http.response.body", "body": reply})

    async def _checked_stream(self, state: worker_state.WorkerState, scope: Scope, receive: Receive, send: Send,
                              schema: Any, tools: Optional[Callable[[str, str], Optional[str]]]) -> None:
        """A streamed request with a schema or checked tools: every event goes out as vLLM sends
        it except each choice's latest content, which waits for the whole reply's check
        (stream_check.py)."""
        checker = stream_check.StreamCheck(None if schema is None else (lambda text: _problem(text, schema)), tools)
        streaming = False

        async def checked(message: Message) -> None:
            nonlocal streaming
            if message["type"] == "http.response.start":
                streaming = message.get("status") == 200
                return await send(message)
            if not streaming or message["type"] != "http.response.body":
                return await send(message)
            out = checker.feed(message.get("body", b""))
            if message.get("more_body", False):
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                return
            out += checker.finish()
            state.count("streams_checked")
            if checker.problem is not None:
                state.count("schema_violations")
                logger.error("end of a streamed reply withheld: %s", checker.problem)
            await send({"type": "http.response.body", "body": out, "more_body": False})

        await self.app(scope, receive, checked)

    async def _buffered(self, scope: Scope, receive: Receive) -> Tuple[Dict[str, Any], bytes]:
        """Run a non-streamed request through vLLM and keep its whole answer: (start, body with
        usage.dspark_stats added). The grammar engine does not enforce every keyword exactly
        (e.g. xgrammar 0.2.8 mis-converts some string patterns), so the reply is checked before
        anything is sent."""
        start: Dict[str, Any] = {}
        chunks: List[bytes] = []

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, capture)
        return start, _add_stats(start, b"".join(chunks))  # also fixes content-length in start


def grammar_tool_schemas(body: Dict[str, Any]) -> List[Tuple[str, Any, Any]]:
    """(where, name, parameters) of the tools vLLM turns into a grammar: every tool for
    tool_choice "required", the named one for a named tool_choice (for "auto" the model's text
    is parsed)."""
    tools = body.get("tools")
    if not isinstance(tools, list):
        return []
    choice = body.get("tool_choice")
    named = None
    if isinstance(choice, dict):
        named = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
        if named is None:
            return []
    elif choice != "required":
        return []
    out = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or function.get("parameters") is None:
            continue
        if named is None or function.get("name") == named:
            out.append((f"tools[{i}].function.parameters", function.get("name"), function["parameters"]))
    return out


def strict_tool_schemas(body: Dict[str, Any], every: bool = False) -> List[Tuple[str, Any, Any]]:
    """(where, name, parameters) of the tools marked `"strict": true` (with `every`: of every
    tool, `--dspark-strict-tools all`): their arguments are a grammar under any tool_choice."""
    tools = body.get("tools")
    out = []
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("parameters") is not None and (
                every or function.get("strict") is True):
            out.append((f"tools[{i}].function.parameters", function.get("name"), function["parameters"]))
    return out


def strict_forced_tools(body: Dict[str, Any], names: Collection[Any]) -> None:
    """Marks the tools a "required" or named tool_choice forces `"strict": true` where the
    request leaves `strict` out, in place: with a structural-tag parser (hermes, llama3_json, ...)
    vLLM 0.32 constrains only strict tools' arguments, where it used to constrain every forced
    call's; this keeps that promise (docs/worker.md, "Tool calls")."""
    for tool in body.get("tools") or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") in names and "strict" not in function:
            function["strict"] = True


def tool_check(body: Dict[str, Any], every: bool = False) -> Optional[Callable[[str, str], Optional[str]]]:
    """How a finished reply's tool calls are judged, or None when they are not: calls under a
    grammar (tool_choice "required" or named) must name one of those tools and carry arguments
    valid for its `parameters`; a call to a tool marked `"strict": true` (with `every`: to any
    tool) must carry valid arguments whatever the tool_choice."""
    tools = body.get("tools")
    if not isinstance(tools, list):
        return None
    constrained = {name: schema for _, name, schema in grammar_tool_schemas(body)}
    strict = {name: schema for _, name, schema in strict_tool_schemas(body, every)}
    if not constrained and not strict:
        return None

    def check(name: str, arguments: str) -> Optional[str]:
        if constrained and name not in constrained:
            return f"a tool call names {name!r}, not one of the tools tool_choice allows"
        schema = constrained.get(name, strict.get(name))
        problem = None if schema is None else _problem(arguments, schema)
        return None if problem is None else f"arguments of the call to {name}: {problem}"
    return check


def _authorized(scope: Scope, keys) -> bool:
    for name, value in scope.get("headers") or []:
        if name.lower() == b"authorization":
            given = value.decode("latin-1")
            scheme, _, token = given.partition(" ")
            if scheme.lower() != "bearer":
                return False
            return any(hmac.compare_digest(token.strip().encode(), key.encode()) for key in keys)
    return False


def _problem(content: str, schema: Any) -> Optional[str]:
    try:
        problem = reply_check.check(content, schema)  # the proxy's format check judges the same way
    except Exception as e:  # a checker problem must not eat a good reply
        logger.warning("schema check of a reply failed: %s", e)
        return None
    return None if problem is None else str(problem)


def _first_content(body: bytes) -> str:
    """The first choice's text of a non-streamed reply ("" when there is none)."""
    try:
        choice = (json.loads(body).get("choices") or [{}])[0]
        return (choice.get("message") or {}).get("content") or choice.get("text") or ""
    except Exception:
        return ""


class Violation(str):
    """Why a reply breaks its checks, and where: `tool` names the tool call whose arguments
    broke, None when the content broke the schema (only that is worth narrowing a oneOf for)."""
    tool: Optional[str] = None

    @classmethod
    def of_tool(cls, problem: str, tool: str) -> "Violation":
        out = cls(problem)
        out.tool = tool
        return out


def schema_violation(start: Dict[str, Any], body: bytes, schema: Optional[Any],
                     tools: Optional[Callable[[str, str], Optional[str]]] = None) -> Optional[Violation]:
    """Why a finished reply breaks `schema` or its tool calls break `tools` (`tool_check`);
    None when it validates, was cut by max_tokens, or there is nothing to check; each choice
    judged by `reply_check` (numbers exact)."""
    if (schema is None and tools is None) or start.get("status") != 200:
        return None
    try:
        choices = json.loads(body).get("choices") or []
    except Exception as e:  # a checker problem must not eat a good reply
        logger.warning("schema check of a reply failed: %s", e)
        return None
    for choice in choices:
        finish = choice.get("finish_reason") if isinstance(choice, dict) else None
        if finish not in ("stop", "tool_calls", "length"):
            continue
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        content = message.get("content") if "message" in choice else choice.get("text")
        if schema is not None and finish == "stop" and content is not None:
            problem = _problem(content, schema)
            if problem is not None:
                return Violation(problem)
        for call in (message.get("tool_calls") or []) if tools is not None else []:
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") or "" if isinstance(function, dict) else ""
            if isinstance(function, dict) and (finish != "length" or stream_check.complete_json(arguments)):
                problem = tools(str(function.get("name")), arguments)
                if problem is not None:
                    return Violation.of_tool(problem, str(function.get("name")))
    return None


def _add_stats(start: Dict[str, Any], body: bytes) -> bytes:
    headers = start.get("headers") or []
    is_json = any(k.lower() == b"content-type" and b"json" in v for k, v in headers)
    if start.get("status") != 200 or not is_json:
        return body
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return body
    stats = dspark_stats(payload) if isinstance(payload, dict) else None
    if stats is None:
        return body
    usage = payload.get("usage")
    if isinstance(usage, dict):
        usage["dspark_stats"] = stats
    new_body = json.dumps(payload).encode()
    start["headers"] = [(k, v) for k, v in headers if k.lower() != b"content-length"] + [
        (b"content-length", str(len(new_body)).encode())]
    return new_body


async def _read_body(receive: Receive) -> Optional[bytes]:
    parts: List[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        parts.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(parts)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # later calls: wait for the client's disconnect, as usual
    return replay


def _with_length(scope: Scope, length: int) -> Scope:
    headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
    headers.append((b"content-length", str(length).encode()))
    return {**scope, "headers": headers}
