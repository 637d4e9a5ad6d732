#!/usr/bin/env python3
"""Replays an agent trace (tools/agent_trace.py) against a running tern serve,
one request at a time, and reports per request the time to the first token
and the prompt tokens the server reused (usage cached_tokens), then the hit
rate after the first request and the TTFT of continued turns.

    python3 tools/agent_trace.py --out trace.jsonl
    python3 tools/replay_trace.py --url http://127.0.0.1:8080 trace.jsonl
        [--max-tokens 16] [--limit N] [--json FILE]

Each line's `_trace` object is stripped; the rest is sent as a streamed
/v1/chat/completions request (usage included), with max_tokens lowered to
--max-tokens so the replay measures prompts, not generation. TTFT runs from
sending to the first streamed chunk that carries text, reasoning or a tool
call. The hit rate is the sum of cached tokens over the sum of prompt tokens,
both from the server's usage. Needs only the standard library.
"""
import argparse
import http.client
import json
import statistics
import sys
import time
import urllib.parse


def replay_one(url, body):
    """(ttft seconds or None, usage dict) of one streamed request."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=3600)
    t0 = time.monotonic()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"HTTP {resp.status}: {resp.read()[:500]!r}")
    ttft, usage = None, None
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        ev = json.loads(line[5:])
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices", []):
            d = ch.get("delta", {})
            if ttft is None and (d.get("content") or d.get("reasoning_content") or d.get("tool_calls")):
                ttft = time.monotonic() - t0
    conn.close()
    if usage is None:
        raise SystemExit("the server sent no usage (stream_options.include_usage)")
    return ttft, usage


def write_report(rows, summary, path):
    """Prints the summary; writes rows and summary as JSON to path unless it is None."""
    print(json.dumps(summary))
    if path:
        with open(path, "w") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--limit", type=int, default=0, help="replay the first N requests only")
    ap.add_argument("--json", help="write the per-request rows and the summary here")
    a = ap.parse_args()
    rows = []
    with open(a.trace) as f:
        for i, line in enumerate(f):
            if a.limit and i >= a.limit:
                break
            body = json.loads(line)
            tag = body.pop("_trace", {})
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
            body["max_tokens"] = min(body.get("max_tokens", a.max_tokens), a.max_tokens)
            ttft, usage = replay_one(a.url, body)
            prompt = usage["prompt_tokens"]
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            rows.append({"request": i, "conversation": tag.get("conversation"), "turn": tag.get("turn"),
                         "kind": tag.get("kind"), "prompt_tokens": prompt, "cached_tokens": cached,
                         "ttft_ms": None if ttft is None else round(ttft * 1e3, 1)})
            r = rows[-1]
            print(f"{i:4d} {str(r['conversation']):>4} {str(r['turn']):>4} {str(r['kind']):>7} prompt {prompt:7d} "
                  f"cached {cached:7d} ({100 * cached / max(prompt, 1):5.1f} %) ttft {r['ttft_ms']} ms", flush=True)
    later = rows[1:]
    hit = sum(r["cached_tokens"] for r in later) / max(1, sum(r["prompt_tokens"] for r in later))
    ttfts = [r["ttft_ms"] for r in later if r["ttft_ms"] is not None and r["cached_tokens"] > 0]
    summary = {"requests": len(rows), "hit_rate_after_first": round(hit, 4),
               "ttft_ms_median_continued": statistics.median(ttfts) if ttfts else None,
               "ttft_ms_max_continued": max(ttfts) if ttfts else None}
    write_report(rows, summary, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
