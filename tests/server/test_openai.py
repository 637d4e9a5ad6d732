"""The OpenAI-compatible endpoints through the official `openai` SDK: chat completions, completions, responses,
models; usage, logprobs, stop strings, seeds, prefix reuse across turns, thinking, tools, and the 400s for the
fields that would change the output but are not supported."""
import subprocess

import openai
import pytest

from helpers import REPO, openai_client, tern_bin

SERVER_ARGS = ["--ctx", "8192"]
MODEL = "tern-tiny"
Q = "Tell me a fortune about the sea."


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def chat(client, text=Q, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 40)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}], **kw)


def stream_chat(client, messages, **kw):
    """Streams a chat completion; returns (content, reasoning, finish_reason, usage, n_content_chunks, chunks)."""
    kw.setdefault("temperature", 0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, stream=True,
                                                 stream_options={"include_usage": True}, **kw))
    content, reasoning, finish, usage, n = "", "", None, None, 0
    for ch in chunks:
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            d = c.delta
            if d.content:
                content += d.content
                n += 1
            rc = getattr(d, "reasoning_content", None)
            if rc:
                reasoning += rc
            if c.finish_reason:
                assert finish is None, "two chunks carry a finish_reason"
                finish = c.finish_reason
    return content, reasoning, finish, usage, n, chunks


def check_usage(u):
    assert u is not None
    assert u.prompt_tokens > 0
    assert u.completion_tokens > 0
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens


# ---- chat completions ------------------------------------------------------------------------------------------


def test_chat_non_stream(client):
    r = chat(client)
    assert r.object == "chat.completion"
    assert r.model == MODEL
    c = r.choices[0]
    assert c.index == 0
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str)
    assert c.finish_reason in ("stop", "length")
    assert r.choices[0].message.reasoning_content, "thinking is on by default: reasoning_content expected"
    check_usage(r.usage)
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_answers_carry_the_served_model_id(client):
    r = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert r.model == MODEL
    c = client.completions.create(model="davinci", prompt="hi", max_tokens=3)
    assert c.model == MODEL
    assert client.responses.create(model="gpt-5", input="hi", max_output_tokens=3).model == MODEL
    chunks = list(client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=3, stream=True))
    assert {ch.model for ch in chunks} == {MODEL}


def test_chat_stream_matches_non_stream(client):
    msgs = [{"role": "user", "content": "Say something about the wind."}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=60)
    content, reasoning, finish, usage, n, chunks = stream_chat(client, msgs, max_tokens=60)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert len({ch.id for ch in chunks}) == 1, "every chunk of a stream carries the same id"
    assert content == r.choices[0].message.content
    assert reasoning == (r.choices[0].message.reasoning_content or "")
    assert finish == r.choices[0].finish_reason
    check_usage(usage)
    assert usage.completion_tokens == r.usage.completion_tokens
    assert usage.prompt_tokens == r.usage.prompt_tokens
    assert n <= usage.completion_tokens
    assert chunks[-1].usage is not None and chunks[-1].choices == []


@pytest.mark.parametrize("stream", [False, True])
def test_chat_length_limit(client, stream):
    if stream:
        _, _, finish, usage, n, _ = stream_chat(client, [{"role": "user", "content": Q}], max_tokens=7)
    else:
        r = chat(client, max_tokens=7)
        finish, usage = r.choices[0].finish_reason, r.usage
    assert finish == "length"
    assert usage.completion_tokens == 7
    check_usage(usage)


def test_chat_max_completion_tokens(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": Q}], temperature=0,
                                       max_completion_tokens=5)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5


def test_chat_stream_without_usage(client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": Q}],
                                                 temperature=0, max_tokens=5, stream=True))
    assert all(ch.usage is None for ch in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


# ---- completions -----------------------------------------------------------------------------------------------

PROMPT = "And God said,"


def tokenize(text):
    out = subprocess.run([str(tern_bin()), "tokenize", text], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [int(x) for x in out.stdout.split()]


def test_completions_string_prompt(client):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].text
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12
    check_usage(r.usage)


def test_completions_default_max_tokens_is_16(client):
    r = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0)
    assert 0 < r.usage.completion_tokens <= 16


def test_completions_token_ids_equal_text(client):
    ids = tokenize(PROMPT)
    assert ids
    a = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    b = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0)
    c = client.completions.create(model=MODEL, prompt=[ids], max_tokens=12, temperature=0)
    assert b.usage.prompt_tokens == len(ids) == a.usage.prompt_tokens
    assert a.choices[0].text == b.choices[0].text == c.choices[0].text


def test_completions_stream(client):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    n = sum(1 for c in chunks if c.choices and c.choices[0].text)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = chunks[-1].usage
    assert text == r.choices[0].text
    assert finish == ["length"]
    check_usage(usage)
    assert usage.completion_tokens == 20
    assert n <= usage.completion_tokens


# ---- logprobs --------------------------------------------------------------------------------------------------


def check_top(entries, chosen_token, chosen_lp, k, greedy):
    assert len(entries) == k
    lps = [lp for _, lp in entries]
    assert all(lp <= 0 for lp in lps)
    assert lps == sorted(lps, reverse=True), f"top_logprobs not sorted: {entries}"
    if greedy:
        assert entries[0][1] == pytest.approx(chosen_lp, abs=1e-6), (chosen_token, entries)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs(client, stream):
    kw = dict(temperature=0, max_tokens=30, logprobs=True, top_logprobs=3)
    if stream:
        msgs = [{"role": "user", "content": Q}]
        chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, stream=True,
                                                     stream_options={"include_usage": True}, **kw))
        entries = [t for ch in chunks for c in ch.choices if c.logprobs and c.logprobs.content
                   for t in c.logprobs.content]
        usage = chunks[-1].usage
    else:
        r = chat(client, **kw)
        entries, usage = r.choices[0].logprobs.content, r.usage
    assert len(entries) == usage.completion_tokens == 30
    for t in entries:
        assert t.logprob <= 0
        assert bytes(t.bytes) == t.token.encode("utf-8") or "\ufffd" in t.token
        check_top([(x.token, x.logprob) for x in t.top_logprobs], t.token, t.logprob, 3, greedy=True)


def test_completions_logprobs(client):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=15, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    n = r.usage.completion_tokens
    assert n == 15
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for tok, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert l <= 0
        check_top(list(top.items()), tok, l, 2, greedy=True)


def test_completions_logprobs_stream(client):
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0, logprobs=1,
                                            stream=True))
    toks = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert len(toks) == 10
    assert "".join(toks) == text


# ---- stop strings ----------------------------------------------------------------------------------------------


def pick_stop(text, avoid=""):
    """A word of text (not at its start) that does not occur in `avoid`."""
    words = [w for w in text.split() if len(w) >= 3 and w not in avoid and text.index(w) > 0]
    assert words, f"no stop word candidate in {text!r}"
    return words[len(words) // 2]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_stop_string(client, stream):
    full = chat(client, max_tokens=80)
    content, reasoning = full.choices[0].message.content, full.choices[0].message.reasoning_content or ""
    stop = pick_stop(content, avoid=reasoning)
    if stream:
        text, _, finish, usage, _, _ = stream_chat(client, [{"role": "user", "content": Q}], max_tokens=80,
                                                   stop=[stop, "@@never@@"])
    else:
        r = chat(client, max_tokens=80, stop=[stop, "@@never@@"])
        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
    assert stop not in text
    assert finish == "stop"
    assert text == content[:content.index(stop)]


@pytest.mark.parametrize("stream", [False, True])
def test_completions_stop_string(client, stream):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0).choices[0].text
    stop = pick_stop(full)
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stop=stop)
    if stream:
        chunks = list(client.completions.create(stream=True, **kw))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason][-1]
    else:
        r = client.completions.create(**kw)
        text, finish = r.choices[0].text, r.choices[0].finish_reason
    assert stop not in text
    assert finish == "stop"
    assert text == full[:full.index(stop)]


# ---- seeds -----------------------------------------------------------------------------------------------------


def test_seed_reproducible(client):
    def run(seed):
        return chat(client, temperature=0.8, seed=seed, max_tokens=30,
                    extra_body={"chat_template_kwargs": {"enable_thinking": False}}).choices[0].message.content

    a, b = run(1234), run(1234)
    assert a == b
    others = {run(s) for s in (1, 2, 3, 4)}
    assert len(others | {a}) > 1, "different seeds gave the same text every time: is the seed used?"


def test_completions_seed_reproducible(client):
    def run(seed):
        return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=25, temperature=0.8,
                                         seed=seed).choices[0].text

    assert run(99) == run(99)
    assert len({run(s) for s in (5, 6, 7, 8)}) > 1


# ---- multi-turn reuse ------------------------------------------------------------------------------------------

TURN1 = "Tell me a fortune about the moon."
TURN2 = "Another one, please."


def chat_turn2_messages(client):
    msgs = [{"role": "system", "content": "You tell fortunes."}, {"role": "user", "content": TURN1}]
    r1 = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=60)
    m = r1.choices[0].message
    reply = {"role": "assistant", "content": m.content}
    if m.reasoning_content:
        reply["reasoning_content"] = m.reasoning_content
    return msgs + [reply, {"role": "user", "content": TURN2}]


@pytest.fixture
def cold_client(start_server):
    """A client of a fresh server (nothing kept), started with the same options."""
    return openai_client(start_server(*SERVER_ARGS))


def test_chat_multi_turn_reuse_is_exact(client, cold_client):
    msgs2 = chat_turn2_messages(client)
    warm = client.chat.completions.create(model=MODEL, messages=msgs2, temperature=0, max_tokens=60)
    cold = cold_client.chat.completions.create(model=MODEL, messages=msgs2, temperature=0, max_tokens=60)
    assert warm.usage.prompt_tokens_details.cached_tokens > 0
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert warm.usage.prompt_tokens == cold.usage.prompt_tokens
    assert warm.choices[0].message.content == cold.choices[0].message.content
    assert warm.choices[0].message.reasoning_content == cold.choices[0].message.reasoning_content
    assert warm.usage.completion_tokens == cold.usage.completion_tokens


def responses_turn2_input(r1):
    """Turn 2 as a full input: turn 1's user message, turn 1's output items, the new user message."""
    items = [{"role": "user", "content": TURN1}]
    for o in r1.output:
        items.append(o.model_dump(exclude_none=True))
    items.append({"role": "user", "content": TURN2})
    return items


RESP_KW = dict(model=MODEL, temperature=0, max_output_tokens=60, instructions="You tell fortunes.")


def test_responses_multi_turn_reuse_is_exact(client, cold_client):
    # warm, by previous_response_id
    r1 = client.responses.create(input=TURN1, **RESP_KW)
    warm_prev = client.responses.create(input=TURN2, previous_response_id=r1.id, **RESP_KW)
    # warm, the whole conversation sent again
    full = responses_turn2_input(r1)
    warm_full = client.responses.create(input=full, **RESP_KW)
    # cold: a fresh server, the whole conversation
    cold = cold_client.responses.create(input=full, **RESP_KW)
    assert cold.usage.input_tokens_details.cached_tokens == 0
    assert warm_prev.usage.input_tokens_details.cached_tokens > 0
    assert warm_full.usage.input_tokens_details.cached_tokens > 0
    assert warm_prev.usage.input_tokens == warm_full.usage.input_tokens == cold.usage.input_tokens
    assert warm_prev.output_text == cold.output_text
    assert warm_full.output_text == cold.output_text
    assert warm_prev.previous_response_id == r1.id


def test_responses_store_false_is_not_kept(client):
    r1 = client.responses.create(input=TURN1, store=False, **RESP_KW)
    assert r1.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.create(input=TURN2, previous_response_id=r1.id, **RESP_KW)


def test_responses_unknown_previous_id_is_404(client):
    with pytest.raises(openai.NotFoundError) as ei:
        client.responses.create(input="hi", previous_response_id="resp_doesnotexist", **RESP_KW)
    assert ei.value.param == "previous_response_id"


# ---- responses -------------------------------------------------------------------------------------------------


def test_responses_non_stream(client):
    r = client.responses.create(model=MODEL, input="Tell me a fortune.", temperature=0, max_output_tokens=50)
    assert r.object == "response"
    assert r.status in ("completed", "incomplete")
    types = [o.type for o in r.output]
    assert "reasoning" in types, types
    assert types[-1] == "message"
    assert isinstance(r.output_text, str) and r.output_text
    u = r.usage
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert u.output_tokens > 0 and u.input_tokens > 0
    if r.status == "incomplete":
        assert u.output_tokens == 50
        assert r.incomplete_details.reason == "max_output_tokens"


def test_responses_stream(client):
    kw = dict(model=MODEL, input="Tell me a fortune about rain.", temperature=0, max_output_tokens=80)
    ref = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    types = [e.type for e in events]
    assert types[0] == "response.created"
    assert types[1] == "response.in_progress"
    assert types[-1] in ("response.completed", "response.incomplete")
    assert types.count(types[-1]) == 1
    for t in ("response.output_item.added", "response.content_part.added", "response.output_text.delta",
              "response.output_text.done", "response.content_part.done", "response.output_item.done",
              "response.reasoning_text.delta"):
        assert t in types, (t, types)
    seq = [e.sequence_number for e in events]
    assert seq == list(range(seq[0], seq[0] + len(seq)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = [e.text for e in events if e.type == "response.output_text.done"]
    final = events[-1].response
    assert done == [deltas]
    assert final.output_text == deltas
    assert deltas == ref.output_text
    assert final.usage.output_tokens == ref.usage.output_tokens
    assert final.usage.total_tokens == final.usage.input_tokens + final.usage.output_tokens
    n_deltas = sum(1 for t in types if t.endswith("_text.delta"))
    assert n_deltas <= final.usage.output_tokens


def test_responses_length_is_incomplete(client):
    r = client.responses.create(model=MODEL, input="Tell me a fortune.", temperature=0, max_output_tokens=16)
    assert r.status == "incomplete"
    assert r.usage.output_tokens == 16


# ---- models ----------------------------------------------------------------------------------------------------


def test_models(client):
    ms = list(client.models.list())
    assert [m.id for m in ms] == [MODEL, MODEL + "-fast"]
    m = client.models.retrieve(MODEL)
    assert m.id == MODEL and m.object == "model"


# ---- thinking --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("off", [{"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
                                 {"reasoning_effort": "none"}], ids=["enable_thinking", "reasoning_effort"])
def test_thinking_off(client, off):
    r = chat(client, **off)
    assert getattr(r.choices[0].message, "reasoning_content", None) in (None, "")
    assert r.choices[0].message.content
    assert r.usage.completion_tokens_details.reasoning_tokens == 0
    content, reasoning, _, _, _, _ = stream_chat(client, [{"role": "user", "content": Q}], max_tokens=40, **off)
    assert reasoning == ""
    assert content == r.choices[0].message.content


def test_thinking_on_explicit(client):
    r = chat(client, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert r.choices[0].message.reasoning_content
    _, reasoning, _, _, _, _ = stream_chat(client, [{"role": "user", "content": Q}], max_tokens=40)
    assert reasoning == r.choices[0].message.reasoning_content


def test_responses_reasoning_none(client):
    r = client.responses.create(model=MODEL, input="Tell me a fortune.", temperature=0, max_output_tokens=40,
                                reasoning={"effort": "none"})
    assert [o.type for o in r.output] == ["message"]
    events = list(client.responses.create(model=MODEL, input="Tell me a fortune.", temperature=0,
                                          max_output_tokens=40, reasoning={"effort": "none"}, stream=True))
    assert not any(e.type.startswith("response.reasoning") for e in events)


# ---- tools -----------------------------------------------------------------------------------------------------

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_tool_result_turn(client, stream):
    msgs = [
        {"role": "user", "content": "What is the weather in Paris and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "Rain, 14 C"},
    ]
    if stream:
        content, _, finish, usage, _, chunks = stream_chat(client, msgs, tools=TOOLS, max_tokens=60)
        calls = [tc for ch in chunks for c in ch.choices if c.delta.tool_calls for tc in c.delta.tool_calls]
    else:
        r = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, temperature=0, max_tokens=60)
        m = r.choices[0].message
        content, finish, usage, calls = m.content, r.choices[0].finish_reason, r.usage, m.tool_calls or []
    assert finish in ("stop", "length", "tool_calls")
    assert content or calls
    check_usage(usage)
    if calls and not stream:
        for c in calls:
            assert c.id and c.function.name == "get_weather"


def test_responses_function_call_output_turn(client):
    tools = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
              "parameters": TOOLS[0]["function"]["parameters"]}]
    items = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": "call_9", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "call_9", "output": "Sunny, 21 C"},
    ]
    r = client.responses.create(model=MODEL, input=items, tools=tools, temperature=0, max_output_tokens=60)
    assert r.status in ("completed", "incomplete")
    assert r.output


# ---- unsupported fields: 400 naming them -----------------------------------------------------------------------

CHAT_UNSUPPORTED = [
    ("n", {"n": 2}),
    ("logit_bias", {"logit_bias": {"100": 5}}),
    ("response_format", {"response_format": {"type": "json_schema",
                                             "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a"}}}}),
    ("tool_choice", {"tool_choice": "required"}),
    ("functions", {"functions": [{"name": "f", "parameters": {"type": "object"}}]}),
    ("modalities", {"modalities": ["text", "audio"]}),
    ("audio", {"audio": {"voice": "alloy", "format": "wav"}}),
    ("web_search_options", {"web_search_options": {}}),
]


@pytest.mark.parametrize("param,extra", CHAT_UNSUPPORTED, ids=[f"{p}-{i}" for i, (p, _) in enumerate(CHAT_UNSUPPORTED)])
def test_chat_unsupported_field_400(client, param, extra):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                       extra_body=extra)
    e = ei.value
    assert e.status_code == 400
    assert e.param == param, e.body
    assert e.type == "invalid_request_error"


COMPLETIONS_UNSUPPORTED = [
    ("echo", {"echo": True}),
    ("n", {"n": 3}),
    ("best_of", {"best_of": 2}),
    ("suffix", {"suffix": "Amen."}),
    ("logit_bias", {"logit_bias": {"5": -100}}),
]


@pytest.mark.parametrize("param,extra", COMPLETIONS_UNSUPPORTED, ids=[p for p, _ in COMPLETIONS_UNSUPPORTED])
def test_completions_unsupported_field_400(client, param, extra):
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, extra_body=extra)
    assert ei.value.param == param, ei.value.body


RESPONSES_UNSUPPORTED = [
    ("background", {"background": True}),
    ("text.format", {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "integer",
                                                                                          "maximum": 3}}}}),
    ("tool_choice", {"tool_choice": "required"}),
    ("conversation", {"conversation": "conv_123"}),
    ("prompt", {"prompt": {"id": "pmpt_1"}}),
    ("max_tool_calls", {"max_tool_calls": 3}),
]


@pytest.mark.parametrize("param,extra", RESPONSES_UNSUPPORTED, ids=[p for p, _ in RESPONSES_UNSUPPORTED])
def test_responses_unsupported_field_400(client, param, extra):
    with pytest.raises(openai.BadRequestError) as ei:
        client.responses.create(model=MODEL, input="hi", max_output_tokens=5, extra_body=extra)
    assert ei.value.param == param, ei.value.body


def test_unknown_fields_are_ignored(client):
    r = chat(client, max_tokens=5, extra_body={"frobnicate": {"x": [1, 2]}, "user": "u-1", "metadata": {"a": "b"}})
    assert r.usage.completion_tokens == 5


def test_the_request_log_names_the_response(server, client):
    """Each finished request's log line carries the id the client got and why it ended."""
    r = chat(client, max_tokens=3)
    s = client.chat.completions.create(model="tern-tiny", messages=[{"role": "user", "content": Q}], max_tokens=2,
                                       stream=True)
    sid = [c.id for c in s][0]
    log = server.stderr()
    assert f"tern serve: chat {r.id} length, prompt " in log, log[-2000:]
    assert f"tern serve: chat {sid} length, prompt " in log, log[-2000:]
