"""tools/agent_trace.py, the agent trace for the prefix-cache benchmark: no server, only the generator.

A small trace is the same bytes twice for a seed, every line is a chat-completions request whose messages follow
the OpenAI rules (tool results answer the tool_calls of the assistant message before them), each request extends
the previous one of its conversation except at the branch, and the ideal hit rate it reports is above 0.9.
"""
import json
import re
import subprocess
import sys

from helpers import REPO

TOOL = REPO / "tools" / "agent_trace.py"
SMALL = ["--system-tokens", "4000", "--turns", "8", "--max-result-tokens", "500"]


def generate(tmp_path, name, *args):
    out = tmp_path / name
    r = subprocess.run([sys.executable, str(TOOL), "--out", str(out), "--summary", *args],
                       capture_output=True, text=True, timeout=120, check=True)
    return out.read_bytes(), r.stdout


def hit_rate(summary):
    m = re.search(r"ideal hit rate after the first request: ([0-9.]+)", summary)
    assert m, summary
    return float(m.group(1))


def check_messages(msgs):
    assert msgs[0]["role"] == "system" and msgs[1]["role"] == "user"
    open_ids = set()
    for m in msgs[1:]:
        if m["role"] == "tool":
            assert m["tool_call_id"] in open_ids, "a tool result without its call"
            open_ids.discard(m["tool_call_id"])
            continue
        assert not open_ids, "tool calls left unanswered"
        assert m["role"] in ("user", "assistant")
        for c in m.get("tool_calls") or ():
            assert c["type"] == "function" and c["id"].startswith("call_")
            json.loads(c["function"]["arguments"])
            open_ids.add(c["id"])
        if m["role"] == "assistant":
            assert m.get("content") or m.get("tool_calls")
    assert not open_ids
    assert msgs[-1]["role"] in ("user", "tool"), "a request ends with what the model must answer"


def check_trace(data):
    reqs = [json.loads(line) for line in data.decode().splitlines()]
    last, convs, branches = {}, set(), 0
    for r in reqs:
        meta = r["_trace"]
        assert r["stream"] is True and r["temperature"] == 0 and r["max_tokens"] > 0 and r["model"]
        assert r["tools"] == reqs[0]["tools"] and r["messages"][0] == reqs[0]["messages"][0]
        check_messages(r["messages"])
        prev = last.get(meta["conversation"])
        msgs = r["messages"]
        if prev is None:
            assert meta["turn"] == 0
        else:
            assert meta["turn"] == prev["_trace"]["turn"] + 1
            p = prev["messages"]
            if meta["kind"] == "branch":
                branches += 1
                # the edited user message replaces an earlier one: everything before it is shared
                assert msgs[-1]["role"] == "user" and len(msgs) < len(p)
                assert p[:len(msgs) - 1] == msgs[:-1] and p[len(msgs) - 1] != msgs[-1]
                assert p[len(msgs) - 1]["role"] == "user"
            else:
                assert msgs[:len(p)] == p and len(msgs) > len(p)
        last[meta["conversation"]] = r
        convs.add(meta["conversation"])
    return reqs, convs, branches


def test_small_trace(tmp_path):
    a, summary = generate(tmp_path, "a.jsonl", "--seed", "7", *SMALL)
    b, _ = generate(tmp_path, "b.jsonl", "--seed", "7", *SMALL)
    assert a == b, "the same seed must give the same bytes"
    c, _ = generate(tmp_path, "c.jsonl", "--seed", "8", *SMALL)
    assert c != a
    reqs, convs, branches = check_trace(a)
    assert len(reqs) == 16 and convs == {"c0", "c1"} and branches == 1
    # the conversations alternate for a stretch
    kinds = [r["_trace"]["conversation"] for r in reqs]
    assert any(kinds[i:i + 4] == ["c0", "c1", "c0", "c1"] for i in range(len(kinds)))
    assert hit_rate(summary) > 0.9


def test_default_scale(tmp_path):
    data, summary = generate(tmp_path, "d.jsonl")
    reqs, convs, branches = check_trace(data)
    assert len(reqs) == 60 and len(convs) == 2 and branches == 1
    branch = next(r for r in reqs if r["_trace"]["kind"] == "branch")
    assert branch["_trace"] == {"conversation": "c0", "turn": 20, "kind": "branch", "edits_turn": 12}
    assert hit_rate(summary) > 0.9
