"""Checked streams (worker/stream_check.py): everything passes at once but each choice's
latest content event; the whole reply is judged before that goes out."""

import json

from gpustack_dspark import reply_check
from gpustack_dspark.worker.stream_check import StreamCheck

SCHEMA = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}, "required": ["tags"]}


def _event(content=None, finish=None, index=0, role=None):
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    chunk = {"id": "c", "object": "chat.completion.chunk",
             "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


USAGE = b'data: {"id": "c", "choices": [], "usage": {"completion_tokens": 4}}\n\n'
DONE = b"data: [DONE]\n\n"


def _stream(pieces, finish="stop", index=0):
    events = [_event(role="assistant", content="", index=index)]
    events += [_event(p, index=index) for p in pieces[:-1]]
    events += [_event(pieces[-1], finish=finish, index=index), USAGE, DONE]
    return events


def _checker():
    return StreamCheck(lambda text: (lambda p: None if p is None else str(p))(reply_check.check(text, SCHEMA)))


def _contents(data: bytes):
    text = ""
    for line in data.decode().split("\n"):
        if line.startswith("data: {") and '"choices"' in line:
            for choice in json.loads(line[6:])["choices"]:
                text += (choice.get("delta") or {}).get("content") or ""
    return text


def test_a_valid_stream_goes_out_unchanged_and_its_last_content_only_at_the_end():
    events = _stream(['{"tags"', ': [1, ', '2]', '}'])
    whole = b"".join(events)
    for cut in (1, 7, 50, len(whole)):  # however vLLM's body messages split the bytes
        check = _checker()
        early = b"".join(check.feed(whole[i:i + cut]) for i in range(0, len(whole), cut))
        assert _contents(early) == '{"tags": [1, 2]'  # the document is not complete before the check
        assert early + check.finish() == whole and check.problem is None


def test_an_invalid_stream_ends_with_an_error_event_instead_of_its_last_part():
    check = _checker()
    early = b"".join(check.feed(e) for e in _stream(['{"tags"', ': [1, ', '1]', '}']))
    rest = check.finish()
    assert _contents(early + rest) == '{"tags": [1, 1]'
    error = json.loads(rest.split(b"\n\n")[0][6:])["error"]
    assert error["type"] == "SchemaViolationError" and "was not delivered" in error["message"]
    assert rest.endswith(b"data: [DONE]\n\n") and check.problem


def test_a_reply_cut_at_max_tokens_is_not_judged():
    check = _checker()
    data = b"".join(check.feed(e) for e in _stream(['{"tags"', ': [1, 1'], finish="length")) + check.finish()
    assert _contents(data) == '{"tags": [1, 1' and check.problem is None


def test_two_choices_are_judged_each_and_keep_their_own_order():
    events = [_event(role="assistant", content="", index=0), _event(role="assistant", content="", index=1)]
    for a, b in zip(['{"tags": [', '3]}'], ['{"tags": [', '4, 4]}']):
        events += [_event(a, index=0), _event(b, index=1)]
    events += [_event(finish="stop", index=0), _event(finish="stop", index=1), DONE]
    check = _checker()
    early = b"".join(check.feed(e) for e in events)
    rest = check.finish()
    assert b"SchemaViolationError" in rest and b"4, 4]}" not in early + rest
    good = [e for e in events if b'"index": 1' not in e]
    check = _checker()
    assert b"".join(check.feed(e) for e in good) + check.finish() == b"".join(good)


def test_completions_streams_carry_text():
    def text_event(text, finish=None):
        chunk = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"
    check = _checker()
    early = b"".join(check.feed(e) for e in [text_event('{"tags": [2, '), text_event("2]}", "stop"), DONE])
    rest = check.finish()
    assert b"2]}" not in early and b"SchemaViolationError" in rest


def _call_event(index=0, name=None, arguments=None, finish=None, call_id=None):
    function = {**({"name": name} if name else {}), **({"arguments": arguments} if arguments is not None else {})}
    call = {"index": 0, **({"id": call_id, "type": "function"} if call_id else {}), "function": function}
    chunk = {"id": "c", "choices": [{"index": index, "delta": {"tool_calls": [call]}, "finish_reason": finish}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def test_streamed_tool_call_arguments_are_judged_and_their_last_part_held():
    from gpustack_dspark.worker.middleware import tool_check

    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"user_id": {"type": "integer", "not": {"const": 1}}},
        "required": ["user_id"]}}}]
    judge = tool_check({"tools": tools, "tool_choice": "required"})

    def run(arguments_pieces, name="lookup", finish="tool_calls"):
        events = [_event(role="assistant", content=""), _call_event(name=name, arguments="", call_id="call_1")]
        events += [_call_event(arguments=a) for a in arguments_pieces]
        events += [_event(finish=finish), DONE]
        check = StreamCheck(None, judge)
        early = b"".join(check.feed(e) for e in events)
        return early, check.finish(), check

    early, rest, check = run(['{"user_id": ', '7}'])
    assert b"7}" not in early and b"7}" in rest and check.problem is None
    early, rest, check = run(['{"user_id": ', '1}'])
    assert b'"arguments": "1}"' not in early + rest and b"SchemaViolationError" in rest and "user_id" in check.problem
    _, rest, check = run(['{"user_id": ', '1}'], finish="length")  # whole before max_tokens: judged
    assert check.problem and b"SchemaViolationError" in rest
    _, rest, check = run(['{"user_id": ', '1'], finish="length")  # cut inside the arguments: not judged
    assert check.problem is None and rest.endswith(DONE)
    _, rest, check = run(['{"user_id": 7}'], name="drop_tables")
    assert "'drop_tables', not one of the tools" in check.problem
    assert tool_check({"tools": tools, "tool_choice": "auto"}) is None  # parsed text: nothing constrains it
    strict = [{**tools[0], "function": {**tools[0]["function"], "strict": True}}]
    assert tool_check({"tools": strict, "tool_choice": "auto"})("lookup", '{"user_id": 1}')
    assert tool_check({"tools": strict, "tool_choice": "auto"})("other", "{}") is None  # not a strict tool


def test_forced_tools_are_marked_strict_unless_the_request_says_and_all_judges_every_tool():
    from gpustack_dspark.worker.middleware import strict_forced_tools, strict_tool_schemas, tool_check

    params = {"type": "object", "properties": {"user_id": {"type": "integer"}}, "required": ["user_id"]}
    body = {"tool_choice": "required", "tools": [
        {"type": "function", "function": {"name": "a", "parameters": params}},
        {"type": "function", "function": {"name": "b", "parameters": params, "strict": False}},
        {"type": "function", "function": {"name": "c", "parameters": params}}]}
    strict_forced_tools(body, {"a", "b"})
    assert [t["function"].get("strict") for t in body["tools"]] == [True, False, None]
    assert [name for _, name, _ in strict_tool_schemas(body)] == ["a"]
    assert [name for _, name, _ in strict_tool_schemas(body, every=True)] == ["a", "b", "c"]
    auto = {"tools": body["tools"], "tool_choice": "auto"}
    assert tool_check(auto)("c", '{"user_id": "x"}') is None  # not strict: parsed text, not judged
    assert "arguments of the call to c" in tool_check(auto, every=True)("c", '{"user_id": "x"}')
