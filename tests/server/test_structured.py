"""Structured output end to end: every schema of tests/fixtures/schemas sampled 20 times at temperature 1.0 through
response_format, each answer parsed and validated with the `jsonschema` package; the other forms (json_object,
Responses text.format, Anthropic output_config.format, GBNF grammars, the SDK's parse helper); tool calls forced by
tool_choice through the official openai and anthropic SDKs, streamed and not, with a round trip to an answer; the
reasoning before a constrained answer; and the 400s for what cannot be enforced, in each API's own error format.

Each schema's max_tokens comes from tests/fixtures/schema_budgets.json, which the C suite checks is enough for the
grammar to end (the grammar then steers every answer to end within it)."""
import concurrent.futures as cf
import json
from pathlib import Path

import anthropic
import jsonschema
import openai
import pytest

from helpers import REPO, anthropic_client, openai_client

SERVER_ARGS = ["--ctx", "4096", "--slots", "16", "--max-seqs", "16"]
MODEL = "tern-tiny"
SAMPLES = 20
SCHEMA_DIR = REPO / "tests" / "fixtures" / "schemas"
SCHEMAS = sorted(p.name for p in SCHEMA_DIR.glob("*.json"))
BUDGETS = json.loads((REPO / "tests" / "fixtures" / "schema_budgets.json").read_text())
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def load_schema(name):
    return json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))


def validate(instance, schema):
    jsonschema.validators.validator_for(schema)(schema).validate(instance)


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


@pytest.fixture(scope="module")
def aclient(server):
    return anthropic_client(server)


# ---- the schema suite ------------------------------------------------------------------------------------------


def test_suite_is_large():
    assert len(SCHEMAS) >= 50
    assert set(SCHEMAS) == set(BUDGETS), "every schema needs a budget"
    for name in SCHEMAS:
        jsonschema.validators.validator_for(load_schema(name)).check_schema(load_schema(name))


def _sample(server, name, i):
    """One answer under the schema: the first samples of each schema reason first, the rest answer directly."""
    think = i < 3
    body = {"messages": [{"role": "user", "content": f"Give an example of '{name[:-5]}' as JSON."}],
            "max_tokens": BUDGETS[name], "temperature": 1.0, "seed": 1000 + i,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": name[:-5], "strict": True, "schema": load_schema(name)}}}
    if not think:
        body.update(NO_THINK)
    r = server.post("/v1/chat/completions", body, timeout=600)
    return name, i, think, r


@pytest.fixture(scope="module")
def suite_answers(server):
    """Every schema's samples, run 16 at a time (the server steps them together)."""
    jobs = [(name, i) for i in range(SAMPLES) for name in SCHEMAS]
    out = {}
    with cf.ThreadPoolExecutor(16) as ex:
        for name, i, think, r in ex.map(lambda a: _sample(server, *a), jobs):
            out.setdefault(name, []).append((i, think, r))
    return out


@pytest.mark.parametrize("name", SCHEMAS)
def test_schema_samples_validate(suite_answers, name):
    schema, problems = load_schema(name), []
    answers = suite_answers[name]
    assert len(answers) == SAMPLES
    for i, think, r in answers:
        if r.status != 200:
            problems.append(f"sample {i}: HTTP {r.status} {r.body[:300]!r}")
            continue
        choice = r.json()["choices"][0]
        content = choice["message"]["content"]
        try:
            validate(json.loads(content), schema)
        except (ValueError, jsonschema.ValidationError) as e:
            problems.append(f"sample {i} (thinking {think}, finish {choice['finish_reason']}): {str(e)[:200]}: "
                            f"{content!r:.300}")
            continue
        if choice["finish_reason"] != "stop":
            problems.append(f"sample {i}: finish_reason {choice['finish_reason']}")
    assert not problems, f"{len(problems)} of {SAMPLES} samples of {name} failed:\n" + "\n".join(problems[:5])


# ---- the other forms -------------------------------------------------------------------------------------------

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2}},
          "required": ["name", "age", "tags"], "additionalProperties": False}


@pytest.mark.parametrize("stream", [False, True])
def test_chat_json_schema_stream_and_not(client, stream):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "A person, please."}], temperature=1.0, seed=7,
              max_tokens=48, response_format={"type": "json_schema", "json_schema": {"name": "person", "strict": True,
                                                                                    "schema": PERSON}},
              extra_body=NO_THINK)
    if stream:
        content = "".join(c.delta.content or "" for ch in client.chat.completions.create(stream=True, **kw)
                          for c in ch.choices)
    else:
        content = client.chat.completions.create(**kw).choices[0].message.content
    validate(json.loads(content), PERSON)


def test_chat_json_object(client):
    for seed in range(4):
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Some JSON."}],
                                           temperature=1.0, seed=seed, max_tokens=40,
                                           response_format={"type": "json_object"}, extra_body=NO_THINK)
        assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_sdk_parse_helper(client):
    """The SDK's parse() sends a strict schema made from a pydantic model and parses the answer back into it."""
    pydantic = pytest.importorskip("pydantic")

    class Verse(pydantic.BaseModel):
        book: str
        chapter: int
        kept: bool

    r = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "A verse."}],
                                      temperature=1.0, seed=3, max_tokens=40, response_format=Verse,
                                      extra_body=NO_THINK)
    assert isinstance(r.choices[0].message.parsed, Verse)


def test_reasoning_then_constrained_answer(client):
    """With thinking on the model reasons freely, then the answer follows the schema."""
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "A person, please."}], temperature=1.0, seed=11,
        max_tokens=80, response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
        extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    m = r.choices[0].message
    assert m.reasoning_content
    validate(json.loads(m.content), PERSON)
    assert r.usage.completion_tokens_details.reasoning_tokens > 0


@pytest.mark.parametrize("stream", [False, True])
def test_responses_text_format(client, stream):
    kw = dict(model=MODEL, input="A person, please.", temperature=1.0, max_output_tokens=60,
              reasoning={"effort": "none"},
              text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}})
    if stream:
        events = list(client.responses.create(stream=True, **kw))
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        final = events[-1].response
    else:
        final = client.responses.create(**kw)
        text = final.output_text
    validate(json.loads(text), PERSON)
    assert final.text.format.type == "json_schema"
    r = client.responses.create(model=MODEL, input="JSON.", temperature=1.0, max_output_tokens=40,
                                reasoning={"effort": "none"}, text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(r.output_text), dict)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_output_format(aclient, stream):
    kw = dict(model=MODEL, max_tokens=60, messages=[{"role": "user", "content": "A person."}],
              thinking={"type": "disabled"},
              extra_body={"output_config": {"format": {"type": "json_schema", "schema": PERSON}}})
    if stream:
        with aclient.messages.stream(**kw) as s:
            msg = s.get_final_message()
    else:
        msg = aclient.messages.create(**kw)
    validate(json.loads("".join(b.text for b in msg.content if b.type == "text")), PERSON)


GBNF = r'''
root   ::= answer ("; " answer){0,2}
answer ::= ("yes" | "no" | "maybe") " " [a-z]{2,6}
'''


def test_gbnf_grammar_chat_and_completions(server):
    import re
    pattern = re.compile(r"(yes|no|maybe) [a-z]{2,6}(; (yes|no|maybe) [a-z]{2,6}){0,2}")
    for seed in range(3):
        r = server.post("/v1/completions", {"prompt": "Q: Is it so?\nA:", "max_tokens": 30, "temperature": 1.0,
                                            "seed": seed, "grammar": GBNF})
        assert r.status == 200, r
        assert pattern.fullmatch(r.json()["choices"][0]["text"]), r.json()
        r = server.post("/v1/chat/completions", dict(messages=[{"role": "user", "content": "Is it so?"}],
                                                     max_tokens=30, temperature=1.0, seed=seed, grammar=GBNF,
                                                     **NO_THINK))
        assert r.status == 200, r
        assert pattern.fullmatch(r.json()["choices"][0]["message"]["content"]), r.json()


# ---- forced tool calls ---------------------------------------------------------------------------------------------

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"type": "string", "enum": ["C", "F"]},
    "coords": {"$ref": "#/$defs/pt"}, "alerts": {"type": "boolean"}},
    "required": ["city", "days"], "$defs": {"pt": {"type": "object", "properties": {
        "lat": {"type": "number"}, "lon": {"type": "number"}}, "required": ["lat", "lon"]}}}
CLOCK = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "JST"]}},
         "required": ["zone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Time", "parameters": CLOCK}}]
SCHEMA_OF = {"get_weather": WEATHER, "get_time": CLOCK}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def stream_calls(chunks):
    """Tool calls assembled from a chat stream: [(id, name, arguments)], and the finish reason."""
    calls, finish = {}, None
    for ch in chunks:
        for c in ch.choices:
            finish = c.finish_reason or finish
            for tc in c.delta.tool_calls or []:
                cur = calls.setdefault(tc.index, ["", "", ""])
                cur[0] = tc.id or cur[0]
                cur[1] = (tc.function.name or cur[1]) if tc.function else cur[1]
                cur[2] += (tc.function.arguments or "") if tc.function else ""
    return [tuple(v) for _, v in sorted(calls.items())], finish


@pytest.mark.parametrize("think", [False, True], ids=["no-think", "think"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("choice", ["required", "named"])
def test_openai_forced_tool_call(client, stream, choice, think):
    tc = "required" if choice == "required" else {"type": "function", "function": {"name": "get_time"}}
    kw = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=tc, temperature=1.0, seed=5, max_tokens=96,
              extra_body={"chat_template_kwargs": {"enable_thinking": think}})
    if stream:
        calls, finish = stream_calls(client.chat.completions.create(stream=True, **kw))
    else:
        r = client.chat.completions.create(**kw)
        finish = r.choices[0].finish_reason
        calls = [(c.id, c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls or []]
    assert finish == "tool_calls"
    assert calls
    for cid, name, args in calls:
        assert cid.startswith("call_")
        assert name in SCHEMA_OF and (choice == "required" or name == "get_time")
        validate(json.loads(args), SCHEMA_OF[name])


def test_openai_single_call_when_not_parallel(client):
    for seed in range(3):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, temperature=1.0, seed=seed, max_tokens=96,
                                           extra_body=NO_THINK)
        assert len(r.choices[0].message.tool_calls) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_openai_round_trip(client, stream):
    """A forced call, its result sent back, and the answer that follows."""
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                       temperature=1.0, seed=9, max_tokens=96, extra_body=NO_THINK)
    m = r.choices[0].message
    msgs = ASK + [{"role": "assistant", "content": m.content, "tool_calls": [c.model_dump() for c in m.tool_calls]}]
    msgs += [{"role": "tool", "tool_call_id": c.id, "content": "Sunny, 21 C"} for c in m.tool_calls]
    kw = dict(model=MODEL, messages=msgs, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=40,
              extra_body=NO_THINK)
    if stream:
        answer = "".join(c.delta.content or "" for ch in client.chat.completions.create(stream=True, **kw)
                         for c in ch.choices)
    else:
        answer = client.chat.completions.create(**kw).choices[0].message.content
    assert answer


@pytest.mark.parametrize("stream", [False, True])
def test_responses_forced_tool_call_round_trip(client, stream):
    tools = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
              "parameters": t["function"]["parameters"]} for t in TOOLS]
    kw = dict(model=MODEL, input="What time is it in Tokyo?", tools=tools,
              tool_choice={"type": "function", "name": "get_time"}, temperature=1.0, max_output_tokens=96,
              reasoning={"effort": "none"})
    if stream:
        out = list(client.responses.create(stream=True, **kw))[-1].response.output
    else:
        out = client.responses.create(**kw).output
    calls = [o for o in out if o.type == "function_call"]
    assert calls and all(c.name == "get_time" for c in calls)
    for c in calls:
        validate(json.loads(c.arguments), CLOCK)
    items = [{"role": "user", "content": "What time is it in Tokyo?"}]
    items += [{"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments} for c in calls]
    items += [{"type": "function_call_output", "call_id": c.call_id, "output": "09:00"} for c in calls]
    r = client.responses.create(model=MODEL, input=items, tools=tools, temperature=0, max_output_tokens=40,
                                reasoning={"effort": "none"})
    assert r.output_text


ATOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
           "input_schema": t["function"]["parameters"]} for t in TOOLS]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}], ids=["any", "tool"])
def test_anthropic_forced_tool_use(aclient, stream, choice):
    kw = dict(model=MODEL, max_tokens=96, messages=ASK, tools=ATOOLS, tool_choice=choice,
              thinking={"type": "disabled"})
    if stream:
        with aclient.messages.stream(**kw) as s:
            msg = s.get_final_message()
    else:
        msg = aclient.messages.create(**kw)
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert uses and msg.stop_reason == "tool_use"
    for u in uses:
        assert u.id.startswith("toolu_")
        assert choice["type"] == "any" or u.name == "get_weather"
        validate(u.input, SCHEMA_OF[u.name])
    msgs = ASK + [{"role": "assistant", "content": [b.model_dump() for b in msg.content]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "Sunny"}
                                               for u in uses]}]
    answer = aclient.messages.create(model=MODEL, max_tokens=40, messages=msgs, tools=ATOOLS,
                                     thinking={"type": "disabled"})
    assert any(b.type == "text" and b.text for b in answer.content)


def test_anthropic_single_tool_use(aclient):
    msg = aclient.messages.create(model=MODEL, max_tokens=96, messages=ASK, tools=ATOOLS,
                                  tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                  thinking={"type": "disabled"})
    assert len([b for b in msg.content if b.type == "tool_use"]) == 1


# ---- what cannot be enforced: 400 naming it --------------------------------------------------------------------


def _fmt(schema):
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


CHAT_400 = [
    ("response_format", "pattern", {"response_format": _fmt({"type": "string", "pattern": "^a+$"})}),
    ("response_format", "format", {"response_format": _fmt({"type": "object", "properties": {
        "when": {"type": "string", "format": "date-time"}}})}),
    ("response_format", "minLength", {"response_format": _fmt({"type": "string", "minLength": 3})}),
    ("response_format", "minimum", {"response_format": _fmt({"type": "integer", "minimum": 0})}),
    ("response_format", "uniqueItems", {"response_format": _fmt({"type": "array", "uniqueItems": True})}),
    ("response_format", "schema", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
    ("response_format", "type", {"response_format": {"type": "yaml"}}),
    ("grammar", "line 1", {"grammar": "root ::= (\"a\""}),
    ("grammar", "undefined", {"grammar": "root ::= undefined"}),
    ("grammar", "both", {"grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}}),
    ("tool_choice", "no tools", {"tool_choice": "required"}),
    ("tool_choice", "nowhere", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nowhere"}}}),
    ("tool_choice", "maxLength", {"tool_choice": "required", "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"s": {"type": "string", "maxLength": 9}}}}}]}),
    ("ignore_eos", "ignore_eos", {"ignore_eos": True, "response_format": {"type": "json_object"}}),
    ("tools", "pattern", {"response_format": {"type": "json_object"}, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"s": {"type": "string", "pattern": "x"}}}}}]}),
]


@pytest.mark.parametrize("param,needle,extra", CHAT_400, ids=[f"{p}-{n}" for p, n, _ in CHAT_400])
def test_chat_400_names_what_cannot_be_enforced(client, param, needle, extra):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                       extra_body=extra)
    assert ei.value.param == param, ei.value.body
    assert needle.split()[0] in ei.value.body["message"] or needle in ei.value.body["message"], ei.value.body
    assert ei.value.type == "invalid_request_error"


def test_responses_400(client):
    with pytest.raises(openai.BadRequestError) as ei:
        client.responses.create(model=MODEL, input="hi", max_output_tokens=5, text={"format": {
            "type": "json_schema", "name": "x", "schema": {"type": "number", "multipleOf": 2}}})
    assert ei.value.param == "text.format" and "multipleOf" in ei.value.body["message"]
    with pytest.raises(openai.BadRequestError) as ei:
        client.responses.create(model=MODEL, input="hi", max_output_tokens=5, tool_choice="required")
    assert ei.value.param == "tool_choice"


@pytest.mark.parametrize("extra,needle", [
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "string", "format": "email"}}}},
     "format"),
    ({"tools": [{"name": "f", "input_schema": {"type": "object", "properties": {
        "n": {"type": "integer", "exclusiveMaximum": 5}}}}], "tool_choice": {"type": "any"}}, "exclusiveMaximum"),
    ({"tool_choice": {"type": "tool", "name": "missing"}, "tools": ATOOLS}, "missing"),
], ids=["output_config-format", "tool-exclusiveMaximum", "tool-missing"])
def test_anthropic_400(aclient, extra, needle):
    with pytest.raises(anthropic.BadRequestError) as ei:
        aclient.messages.create(model=MODEL, max_tokens=5, messages=ASK, extra_body=extra)
    assert ei.value.body["type"] == "error"
    assert ei.value.body["error"]["type"] == "invalid_request_error"
    assert needle in ei.value.body["error"]["message"], ei.value.body
