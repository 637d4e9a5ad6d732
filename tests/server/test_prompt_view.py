"""Views of a conversation (src/server/prompt_view.c): the fast view a request gets by naming the model
"<id>-fast" (no system, developer or tool messages, no tools or tool calls, no <system-reminder> blocks), and
the concise system prompt of `tern serve --concise`. Each is checked by its prompt's token count against a
request that sends the view itself, so a token more or less fails."""
import re

from helpers import REPO

SERVER_ARGS = ["--ctx", "4096", "--seed", "5", "--max-tokens", "2"]

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
REMINDER = "<system-reminder>\nThe user's files changed; re-read them before you answer.\n</system-reminder>"


def prompt_tokens(server, body):
    r = server.post("/v1/chat/completions", dict(body, max_tokens=1))
    assert r.status == 200, r
    return r.json()["usage"]["prompt_tokens"]


def count(server, body):
    r = server.post("/v1/messages/count_tokens", body)
    assert r.status == 200, r
    return r.json()["input_tokens"]


def test_models_lists_the_fast_name(server):
    ids = [m["id"] for m in server.get("/v1/models").json()["data"]]
    assert ids == ["tern-tiny", "tern-tiny-fast"], ids
    assert server.get("/v1/models/tern-tiny-fast").json()["id"] == "tern-tiny-fast"


def test_fast_view_chat(server):
    sent = [{"role": "system", "content": "You are an agent. " * 40},
            {"role": "user", "content": "What is the weather in Paris?\n" + REMINDER},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
            {"role": "assistant", "content": "It is sunny."},
            {"role": "user", "content": [{"type": "text", "text": REMINDER}, {"type": "text", "text": "And Rome?"}]}]
    view = [{"role": "user", "content": "What is the weather in Paris?\n"},
            {"role": "assistant", "content": "It is sunny."},
            {"role": "user", "content": [{"type": "text", "text": "And Rome?"}]}]
    fast = prompt_tokens(server, {"model": "tern-tiny-fast", "messages": sent, "tools": TOOLS})
    assert fast == prompt_tokens(server, {"messages": view})
    assert fast < prompt_tokens(server, {"messages": sent, "tools": TOOLS}) - 100

    # a forced tool call has no tools to call in the fast view: the answer is text
    r = server.post("/v1/chat/completions", {"model": "tern-tiny-fast", "messages": sent, "tools": TOOLS,
                                             "tool_choice": "required", "max_tokens": 4})
    assert r.status == 200 and not r.json()["choices"][0]["message"].get("tool_calls"), r


def test_fast_view_keeps_what_would_be_empty(server):
    # a user turn that is only a reminder keeps it
    only = [{"role": "user", "content": REMINDER}]
    assert prompt_tokens(server, {"model": "tern-tiny-fast", "messages": only}) == prompt_tokens(server, {"messages": only})
    parts = [{"role": "user", "content": [{"type": "text", "text": REMINDER}]}]
    assert prompt_tokens(server, {"model": "tern-tiny-fast", "messages": parts}) == prompt_tokens(server, {"messages": parts})
    # an unclosed reminder is text, not a block
    open_tag = [{"role": "user", "content": "Look: <system-reminder> stays"}]
    assert (prompt_tokens(server, {"model": "tern-tiny-fast", "messages": open_tag}) ==
            prompt_tokens(server, {"messages": open_tag}))


def test_fast_view_drops_turns_of_reminders(server):
    # an agent's next turn: its tool call answered, the result arriving with a reminder; the view keeps the question
    sent = [{"role": "user", "content": "Fix the bug."},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
            {"role": "user", "content": REMINDER}]
    fast = prompt_tokens(server, {"model": "tern-tiny-fast", "messages": sent, "tools": TOOLS})
    assert fast == prompt_tokens(server, {"messages": [{"role": "user", "content": "Fix the bug."}]})


def test_fast_view_messages_and_responses(server):
    # Claude Code's form: a system prompt, tools, reminders, and a system message after the user's turn (which the
    # Messages API otherwise renders as a user turn)
    body = {"model": "tern-tiny", "max_tokens": 4, "system": "You are Claude Code. " * 30, "tools": [
        {"name": "Read", "description": "Reads a file.", "input_schema": {"type": "object", "properties": {}}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": REMINDER},
                                                      {"type": "text", "text": "Fix the bug."}]},
                         {"role": "system", "content": [{"type": "text", "text": "# Environment\n" * 40}]}]}
    view = {"model": "tern-tiny", "messages": [{"role": "user", "content": "Fix the bug."}]}
    assert count(server, dict(body, model="tern-tiny-fast")) == count(server, view)
    r = server.post("/v1/messages", dict(body, model="tern-tiny-fast"))
    usage = r.json()["usage"]
    assert r.status == 200 and usage["input_tokens"] + usage["cache_read_input_tokens"] == count(server, view), r

    resp = {"model": "tern-tiny-fast", "instructions": "You are Codex. " * 30,
            "input": [{"role": "user", "content": "List the files."},
                      {"role": "developer", "content": "Sandbox: read-only. " * 20}],
            "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}],
            "max_output_tokens": 4}
    r = server.post("/v1/responses", resp)
    assert r.status == 200, r
    assert r.json()["instructions"] == resp["instructions"], "the response echoes the request as sent"
    plain = server.post("/v1/responses", {"input": [{"role": "user", "content": "List the files."}],
                                          "max_output_tokens": 4})
    assert r.json()["usage"]["input_tokens"] == plain.json()["usage"]["input_tokens"]


def test_fast_names(server):
    msgs = [{"role": "system", "content": "You are an agent. " * 20}, {"role": "user", "content": "Hi"}]
    plain = prompt_tokens(server, {"messages": msgs})
    assert prompt_tokens(server, {"model": "qwen3.6-35b-a3b-fast", "messages": msgs}) < plain - 20, \
        "without --strict-model any name ending in -fast asks for the view"
    for name in ("qwen3.6-35b-a3b", "-fast", "fast", "tern-tiny-fastest"):
        assert prompt_tokens(server, {"model": name, "messages": msgs}) == plain, name


def test_fast_name_under_strict_model(start_server):
    s = start_server("--strict-model", "--ctx", "2048")
    msgs = [{"role": "user", "content": "Hi"}]
    assert s.post("/v1/chat/completions", {"model": "tern-tiny-fast", "messages": msgs, "max_tokens": 1}).status == 200
    assert s.get("/v1/models/tern-tiny-fast").status == 200
    r = s.post("/v1/chat/completions", {"model": "tern-tiny-slow", "messages": msgs, "max_tokens": 1})
    assert r.status == 404 and r.json()["error"]["code"] == "model_not_found", r


def concise_text():
    """The concise prompt as docs/SERVER.md quotes it (the test holds the docs to the code)."""
    doc = (REPO / "docs/SERVER.md").read_text()
    m = re.search(r"`--concise` adds this text.*?:\n\n> (.+?)\n\n", doc, re.S)
    assert m, "docs/SERVER.md quotes the concise prompt"
    return " ".join(m.group(1).split("\n> ")).replace("\n", " ")


def test_concise(server, start_server):
    s = start_server("--concise", "--ctx", "4096", "--max-tokens", "2")
    text = concise_text()
    user = [{"role": "user", "content": "Why is the sea salty?"}]
    assert prompt_tokens(s, {"messages": user}) == prompt_tokens(server, {"messages": [
        {"role": "system", "content": text}] + user})
    sys = [{"role": "system", "content": "You are a sailor."}] + user
    assert prompt_tokens(s, {"messages": sys}) == prompt_tokens(server, {"messages": [
        {"role": "system", "content": "You are a sailor.\n\n" + text}] + user})
    # with the fast view: the request's system prompt goes, the concise one stays
    assert prompt_tokens(s, {"model": "tern-tiny-fast", "messages": sys}) == prompt_tokens(s, {"messages": user})
    assert count(s, {"model": "tern-tiny", "messages": user}) == count(server, {
        "model": "tern-tiny", "system": text, "messages": user})


def test_fast_view_refuses_what_the_plain_one_refuses(server):
    for body in ({"messages": [{"content": "no role"}, {"role": "user", "content": "Hi"}]},
                 {"messages": [{"role": "user", "content": 7}]},
                 {"messages": "not a list"},
                 {"messages": [{"role": "system", "content": "only a system prompt"}]}):
        plain = server.post("/v1/chat/completions", dict(body, max_tokens=1))
        fast = server.post("/v1/chat/completions", dict(body, model="tern-tiny-fast", max_tokens=1))
        assert plain.status == fast.status == 400, (body, plain, fast)
    bad = {"model": "tern-tiny-fast", "max_tokens": 1, "messages": [{"role": "robot", "content": "Hi"}]}
    assert server.post("/v1/messages", bad).status == 400
