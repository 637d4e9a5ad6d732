#!/usr/bin/env python3
"""Measures the time to the first token of a turn that continues a long
cached conversation (issue 36): against a running tern serve, replays one
conversation of an agent trace (tools/agent_trace.py) until its prompt
reaches --context tokens, then sends --repeats follow-ups, each that
conversation plus the agent's next step: an assistant tool call (a shell
command) and its result, a different text of about --new tokens each. It
reports each one's time to the first token and the prompt tokens the
server reused (usage cached_tokens). (A new user message instead would
re-render the turns since the previous one: the chat template drops their
thinking once a newer user message follows.)

    python3 tools/continue_probe.py --url http://127.0.0.1:8080 trace.jsonl
        [--context 32768] [--new 500] [--repeats 5] [--gap 1.0] [--json FILE]

Requests are --gap seconds apart, as an agent's are while it runs the tool
(the server finishes its work on the previous turn in such gaps: with
--gap 0 a follow-up may wait for it, and its TTFT says so).

The server's log line of each request gives the restore and prefill times
behind the TTFT. Needs only the standard library and tools/replay_trace.py.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from replay_trace import replay_one, write_report  # noqa: E402

# Plain prose for the new messages; each follow-up gets its own slice.
WORDS = ("the parser reads each line of the configuration file and keeps a table of the keys it has seen so that a "
         "repeated key is reported with both of its line numbers before the loader gives up on the file and the "
         "caller prints one message naming the file the key and the two places it was set").split()


def new_result(i, tokens):
    # about 4.5 characters per token for English prose
    n_words = int(tokens * 0.8)
    words = [WORDS[(i * 7 + k) % len(WORDS)] for k in range(n_words)]
    return f"Follow-up {i}: " + " ".join(words)


def next_step(i, tokens):
    call = f"call_probe_{i:04d}"
    return [{"role": "assistant", "content": None,
             "tool_calls": [{"id": call, "type": "function",
                             "function": {"name": "shell", "arguments": json.dumps({"command": f"make check-{i}"})}}]},
            {"role": "tool", "tool_call_id": call, "content": new_result(i, tokens)}]


def request(body, max_tokens):
    body = dict(body)
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    body["max_tokens"] = max_tokens
    return body


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--new", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--gap", type=float, default=1.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    base = None
    with open(a.trace) as f:
        for line in f:
            body = json.loads(line)
            tag = body.pop("_trace", {})
            if tag.get("conversation") not in (None, "c0") or tag.get("kind") == "branch":
                continue
            _, usage = replay_one(a.url, request(body, 1))
            print(f"warm-up: prompt {usage['prompt_tokens']}", flush=True)
            if usage["prompt_tokens"] >= a.context:
                base = body
                break
    if base is None:
        raise SystemExit(f"no request of the trace's conversation c0 reaches {a.context} tokens")
    rows = []
    for i in range(a.repeats):
        time.sleep(a.gap)
        body = dict(base)
        body["messages"] = base["messages"] + next_step(i, a.new)
        ttft, usage = replay_one(a.url, request(body, 4))
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        rows.append({"prompt_tokens": usage["prompt_tokens"], "cached_tokens": cached,
                     "new_tokens": usage["prompt_tokens"] - cached,
                     "ttft_ms": None if ttft is None else round(ttft * 1e3, 1)})
        print(json.dumps(rows[-1]), flush=True)
    ttfts = [r["ttft_ms"] for r in rows if r["ttft_ms"] is not None]
    summary = {"repeats": len(rows), "ttft_ms_median": statistics.median(ttfts) if ttfts else None,
               "ttft_ms_max": max(ttfts) if ttfts else None,
               "cached_tokens_min": min(r["cached_tokens"] for r in rows)}
    write_report(rows, summary, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
