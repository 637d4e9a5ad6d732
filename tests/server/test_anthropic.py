"""The Anthropic-compatible endpoints (/v1/messages, /v1/messages/count_tokens) through the official `anthropic`
SDK: messages, the stream's event sequence, thinking, count_tokens, tool results, stop sequences, system prompts,
prefix reuse and the error envelope. The SDK has no temperature parameter: the server runs with --temp 0."""
import json

import anthropic
import pytest

from helpers import anthropic_client

SERVER_ARGS = ["--ctx", "8192", "--temp", "0"]
MODEL = "claude-sonnet-4-5"  # any name is served; answers carry the served id
SERVED = "tern-tiny"
Q = [{"role": "user", "content": "Tell me a fortune about the sea."}]
NO_THINK = {"type": "disabled"}


@pytest.fixture(scope="module")
def client(server):
    return anthropic_client(server)


def text_of(msg):
    return "".join(b.text for b in msg.content if b.type == "text")


def thinking_of(msg):
    return "".join(b.thinking for b in msg.content if b.type == "thinking")


def collect_stream(events):
    """Checks the stream's grammar and returns (blocks: [(type, text)], message_delta event, message_start event)."""
    types = [e.type for e in events]
    assert types[0] == "message_start", types
    assert types[-1] == "message_stop", types
    assert types[-2] == "message_delta", types
    assert types.count("message_start") == types.count("message_delta") == types.count("message_stop") == 1
    blocks, open_index = [], None
    for e in events[1:-2]:
        if e.type == "ping":
            continue
        if e.type == "content_block_start":
            assert open_index is None, "a block started before the previous one stopped"
            assert e.index == len(blocks)
            open_index = e.index
            blocks.append([e.content_block.type, ""])
        elif e.type == "content_block_delta":
            assert e.index == open_index
            d = e.delta
            if d.type == "text_delta":
                assert blocks[-1][0] == "text"
                blocks[-1][1] += d.text
            elif d.type == "thinking_delta":
                assert blocks[-1][0] == "thinking"
                blocks[-1][1] += d.thinking
            elif d.type == "input_json_delta":
                assert blocks[-1][0] == "tool_use"
                blocks[-1][1] += d.partial_json
            else:
                assert d.type == "signature_delta", d.type
        elif e.type == "content_block_stop":
            assert e.index == open_index
            open_index = None
        else:
            raise AssertionError(f"unexpected event {e.type} in {types}")
    assert open_index is None, "a block was never stopped"
    return [tuple(b) for b in blocks], events[-2], events[0]


def test_messages_non_stream(client):
    r = client.messages.create(model=MODEL, max_tokens=60, messages=Q)
    assert r.type == "message" and r.role == "assistant"
    assert r.model == SERVED
    assert [b.type for b in r.content] == ["thinking", "text"], r.content
    assert thinking_of(r) and text_of(r)
    assert r.stop_reason in ("end_turn", "max_tokens")
    assert r.usage.output_tokens > 0
    assert r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) > 0


def test_messages_stream(client):
    ref = client.messages.create(model=MODEL, max_tokens=60, messages=Q)
    events = list(client.messages.create(model=MODEL, max_tokens=60, messages=Q, stream=True))
    blocks, delta, start = collect_stream(events)
    assert [t for t, _ in blocks] == ["thinking", "text"]
    assert blocks[0][1] == thinking_of(ref)
    assert blocks[1][1] == text_of(ref)
    assert delta.delta.stop_reason == ref.stop_reason
    assert delta.usage.output_tokens == ref.usage.output_tokens
    assert start.message.content == [] and start.message.stop_reason is None
    assert start.message.model == SERVED
    n_text_deltas = sum(1 for e in events if e.type == "content_block_delta" and e.delta.type in
                        ("text_delta", "thinking_delta"))
    assert n_text_deltas <= delta.usage.output_tokens


def test_messages_stream_helper(client):
    ref = client.messages.create(model=MODEL, max_tokens=40, messages=Q, thinking=NO_THINK)
    with client.messages.stream(model=MODEL, max_tokens=40, messages=Q, thinking=NO_THINK) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == text_of(ref) == text_of(final)
    assert final.stop_reason == ref.stop_reason


@pytest.mark.parametrize("stream", [False, True])
def test_thinking_disabled(client, stream):
    if stream:
        blocks, _, _ = collect_stream(list(client.messages.create(model=MODEL, max_tokens=40, messages=Q,
                                                                  thinking=NO_THINK, stream=True)))
        assert [t for t, _ in blocks] == ["text"]
    else:
        r = client.messages.create(model=MODEL, max_tokens=40, messages=Q, thinking=NO_THINK)
        assert [b.type for b in r.content] == ["text"]


def test_max_tokens_stop_reason(client):
    r = client.messages.create(model=MODEL, max_tokens=9, messages=Q)
    assert r.stop_reason == "max_tokens"
    assert r.usage.output_tokens == 9


def test_beta_endpoint(client):
    r = client.beta.messages.create(model=MODEL, max_tokens=20, messages=Q, thinking=NO_THINK)
    assert text_of(r)


# ---- count_tokens ----------------------------------------------------------------------------------------------

TOOLS = [{"name": "get_weather", "description": "The weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


@pytest.mark.parametrize("kw", [
    {},
    {"system": "You are terse."},
    {"tools": TOOLS},
    {"thinking": NO_THINK},
], ids=["plain", "system", "tools", "no-think"])
def test_count_tokens_matches_usage(client, kw):
    msgs = [{"role": "user", "content": "Count me: a fortune about count tokens " + json.dumps(kw)}]
    n = client.messages.count_tokens(model=MODEL, messages=msgs, **kw).input_tokens
    r = client.messages.create(model=MODEL, max_tokens=3, messages=msgs, **kw)
    assert n > 0
    assert n == r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0)


# ---- tools -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_tool_result_turn(client, stream):
    msgs = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "Sunny, 21 C"},
            {"type": "text", "text": "Thanks. Summarize."},
        ]},
    ]
    if stream:
        blocks, delta, _ = collect_stream(list(client.messages.create(model=MODEL, max_tokens=60, messages=msgs,
                                                                      tools=TOOLS, stream=True)))
        assert blocks
        assert delta.delta.stop_reason in ("end_turn", "max_tokens", "tool_use")
    else:
        r = client.messages.create(model=MODEL, max_tokens=60, messages=msgs, tools=TOOLS)
        assert r.content
        assert r.stop_reason in ("end_turn", "max_tokens", "tool_use")
        for b in r.content:
            if b.type == "tool_use":
                assert b.id and b.name == "get_weather" and isinstance(b.input, dict)


def test_unanswered_tool_use_is_400(client):
    msgs = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_02", "name": "get_weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": "And now?"},
    ]
    with pytest.raises(anthropic.BadRequestError) as ei:
        client.messages.create(model=MODEL, max_tokens=10, messages=msgs, tools=TOOLS)
    assert ei.value.body["type"] == "error"
    assert ei.value.body["error"]["type"] == "invalid_request_error"


# ---- stop sequences ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequences(client, stream):
    full = text_of(client.messages.create(model=MODEL, max_tokens=80, messages=Q, thinking=NO_THINK))
    words = [w for w in full.split() if len(w) >= 3 and full.index(w) > 0]
    assert words, full
    stop = words[len(words) // 2]
    kw = dict(model=MODEL, max_tokens=80, messages=Q, thinking=NO_THINK, stop_sequences=[stop, "@@never@@"])
    if stream:
        blocks, delta, _ = collect_stream(list(client.messages.create(stream=True, **kw)))
        text = "".join(t for k, t in blocks if k == "text")
        reason, seq = delta.delta.stop_reason, delta.delta.stop_sequence
    else:
        r = client.messages.create(**kw)
        text, reason, seq = text_of(r), r.stop_reason, r.stop_sequence
    assert reason == "stop_sequence"
    assert seq == stop
    assert stop not in text
    assert text == full[:full.index(stop)]


# ---- system ------------------------------------------------------------------------------------------------------


def test_system_string_and_blocks(client):
    blocks = [{"type": "text", "text": "You are a fortune teller."}, {"type": "text", "text": "Be brief."}]
    joined = "You are a fortune teller.\n\nBe brief."
    a = client.messages.create(model=MODEL, max_tokens=40, messages=Q, system=joined)
    b = client.messages.create(model=MODEL, max_tokens=40, messages=Q, system=blocks)
    c = client.messages.create(model=MODEL, max_tokens=40, messages=Q)
    assert a.usage.input_tokens + a.usage.cache_read_input_tokens == \
        b.usage.input_tokens + b.usage.cache_read_input_tokens
    assert a.usage.input_tokens + a.usage.cache_read_input_tokens > \
        c.usage.input_tokens + c.usage.cache_read_input_tokens
    assert text_of(a) == text_of(b)
    na = client.messages.count_tokens(model=MODEL, messages=Q, system=joined).input_tokens
    nb = client.messages.count_tokens(model=MODEL, messages=Q, system=blocks).input_tokens
    assert na == nb


def test_system_message_in_messages(client):
    """anthropic's MessageParam includes SystemMessageParam ({"role": "system", "content": str | text blocks}), and
    Claude Code sends one after the user's turn (its environment notes); the server must take it."""
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
        {"role": "system", "content": [{"type": "text", "text": "# Environment\nPlatform: linux"}]},
    ]
    r = client.messages.create(model=MODEL, max_tokens=20, messages=msgs, thinking=NO_THINK)
    assert r.content and r.usage.output_tokens > 0
    n = client.messages.count_tokens(model=MODEL, messages=msgs, thinking=NO_THINK).input_tokens
    assert n == r.usage.input_tokens + r.usage.cache_read_input_tokens


# ---- reuse -------------------------------------------------------------------------------------------------------


def test_multi_turn_reuse_is_exact(client, start_server):
    turn1 = [{"role": "user", "content": "Tell me a fortune about the stars."}]
    r1 = client.messages.create(model=MODEL, max_tokens=60, messages=turn1, system="You tell fortunes.")
    content = [b.model_dump(exclude_none=True) for b in r1.content]
    turn2 = turn1 + [{"role": "assistant", "content": content}, {"role": "user", "content": "Another one."}]
    warm = client.messages.create(model=MODEL, max_tokens=60, messages=turn2, system="You tell fortunes.")
    cold_client = anthropic_client(start_server(*SERVER_ARGS))
    cold = cold_client.messages.create(model=MODEL, max_tokens=60, messages=turn2, system="You tell fortunes.")
    assert warm.usage.cache_read_input_tokens > 0
    assert cold.usage.cache_read_input_tokens == 0
    assert warm.usage.input_tokens + warm.usage.cache_read_input_tokens == cold.usage.input_tokens
    assert text_of(warm) == text_of(cold)
    assert thinking_of(warm) == thinking_of(cold)


# ---- errors ------------------------------------------------------------------------------------------------------


def test_error_envelope_max_tokens_missing(server):
    r = server.post("/v1/messages", {"model": MODEL, "messages": Q})
    assert r.status == 400
    body = r.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]


def test_error_envelope_sdk(client):
    with pytest.raises(anthropic.BadRequestError) as ei:
        client.messages.create(model=MODEL, max_tokens=10, messages=[])
    assert ei.value.status_code == 400
    assert ei.value.body["type"] == "error"
    assert ei.value.body["error"]["type"] == "invalid_request_error"


def test_error_envelope_count_tokens(server):
    r = server.post("/v1/messages/count_tokens", {"model": MODEL, "messages": "nope"})
    assert r.status == 400
    assert r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_tool_choice_without_tools_is_400(client):
    """tool_choice any (enforced by constrained decoding, tests/server/test_structured.py) needs tools."""
    with pytest.raises(anthropic.BadRequestError) as ei:
        client.messages.create(model=MODEL, max_tokens=10, messages=Q, tool_choice={"type": "any"})
    assert ei.value.body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("method,path,status", [("GET", "/v1/messages", 405), ("PUT", "/v1/messages/count_tokens", 405),
                                                ("POST", "/v1/messages/batches", 404)])
def test_routing_errors_use_anthropic_envelope(server, method, path, status):
    """/v1/messages* answer errors in Anthropic's envelope, routing errors included."""
    r = server.request(method, path, body={"model": MODEL, "max_tokens": 3, "messages": Q})
    assert r.status == status, r
    body = r.json()
    assert body.get("type") == "error" and isinstance(body.get("error"), dict), body
    assert body["error"].get("type") and body["error"].get("message"), body
