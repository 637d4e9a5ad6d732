#!/usr/bin/env python3
"""Measures tern serve from the client's side: the decode rate of streamed
responses and the time to the first token of cold prompts.

    python3 tools/bench_server.py --url http://127.0.0.1:8080 [--endpoint chat|completions]
        [--prompt-tokens 1024] [--gen 128] [--runs 3] [--ttft-runs 5] [--json FILE]

Decode: a streamed request of --gen tokens (ignore_eos) after a prompt of
about --decode-prompt tokens; the rate is (tokens - 1) over the time from
the first text chunk to the last. TTFT: streamed requests whose prompts
(about --prompt-tokens tokens) share nothing with earlier ones, timed from
sending to the first text chunk; the server's usage must report 0 cached
tokens. Sampling: temperature 1, top_k 20 (as tern bench --top-k 20).
Needs only the standard library.
"""
import argparse
import http.client
import json
import random
import statistics
import sys
import time
import urllib.parse

WORDS = ("time river stone light window garden paper silver music winter forest ocean mountain "
         "city lantern engine harbor meadow thunder velvet candle marble orchard canyon").split()


def post(url, path, body, stream):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"{path}: HTTP {resp.status}: {resp.read()[:500]!r}")
    if not stream:
        out = json.loads(resp.read())
        conn.close()
        return out
    return conn, resp


def sse_lines(resp):
    """Yields (arrival time, data bytes) for each data frame; JSON is parsed
    by the caller only where needed, so the client's own work stays small."""
    while True:
        line = resp.readline()
        if not line:
            return
        if line.startswith(b"data: "):
            data = line[6:].rstrip(b"\r\n")
            if data == b"[DONE]":
                return
            yield time.perf_counter(), data


def prompt_text(n_words, salt):
    rng = random.Random(salt)
    return f"[{salt}] " + " ".join(rng.choice(WORDS) for _ in range(n_words))


def count_tokens(url, text):
    r = post(url, "/v1/messages/count_tokens",
             {"model": "m", "messages": [{"role": "user", "content": text}]}, False)
    return r["input_tokens"]


def sized_prompt(url, tokens, salt):
    """A user message whose chat prompt is close to `tokens` tokens."""
    words = max(1, tokens // 2)
    for _ in range(6):
        n = count_tokens(url, prompt_text(words, salt))
        if abs(n - tokens) <= 2:
            break
        words = max(1, int(words * tokens / n))
    return prompt_text(words, salt)


def request(endpoint, text, gen):
    body = {"max_tokens": gen, "temperature": 1.0, "top_k": 20, "top_p": 1.0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    if endpoint == "completions":
        body["prompt"] = text
        return "/v1/completions", body
    body["messages"] = [{"role": "user", "content": text}]
    return "/v1/chat/completions", body


def stream_once(url, endpoint, text, gen):
    """Times a stream: its text chunks are those after the chat's role chunk
    and before the finish chunk (no text) and the usage chunk."""
    path, body = request(endpoint, text, gen)
    t0 = time.perf_counter()
    conn, resp = post(url, path, body, True)
    times = []
    usage = None
    for t, data in sse_lines(resp):
        if b'"usage"' in data:
            usage = json.loads(data)["usage"]
        elif b'"finish_reason":null' in data:
            times.append(t)
    conn.close()
    if endpoint == "chat":
        times = times[1:]   # the role chunk
    return t0, times[0], times[-1], usage


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--decode-prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ttft-runs", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    salt = random.randrange(1 << 30)
    res = {"endpoint": a.endpoint, "decode_tok_s": [], "ttft_ms": [], "ttft_prompt_tokens": []}

    text = sized_prompt(a.url, a.decode_prompt, salt) if a.endpoint == "chat" else prompt_text(a.decode_prompt // 2, salt)
    stream_once(a.url, a.endpoint, text, 8)   # warm-up
    for r in range(a.runs):
        t0, first, last, usage = stream_once(a.url, a.endpoint, prompt_text(8, salt + 1000 + r) + text, a.gen)
        n = usage["completion_tokens"]
        res["decode_tok_s"].append((n - 1) / (last - first))
        print(f"decode run {r}: {n} tokens after {usage['prompt_tokens']} prompt tokens: "
              f"{res['decode_tok_s'][-1]:.1f} tok/s", flush=True)

    if a.ttft_runs:
        base = sized_prompt(a.url, a.prompt_tokens, salt + 7) if a.endpoint == "chat" else None
        for r in range(a.ttft_runs + 1):
            # a new first word: the prompt shares no prefix with any kept session
            text = f"{r}-{salt}: " + (base or prompt_text(a.prompt_tokens // 2, salt + r))
            t0, first, last, usage = stream_once(a.url, a.endpoint, text, 4)
            if usage["prompt_tokens_details"]["cached_tokens"] > 4:
                raise SystemExit(f"the TTFT prompt was cached: {usage}")
            if r == 0:
                continue   # warm-up
            res["ttft_ms"].append((first - t0) * 1e3)
            res["ttft_prompt_tokens"].append(usage["prompt_tokens"])
            print(f"ttft run {r}: {usage['prompt_tokens']} prompt tokens "
                  f"(cached {usage['prompt_tokens_details']['cached_tokens']}): {res['ttft_ms'][-1]:.1f} ms",
                  flush=True)

    summary = {k: statistics.median(v) for k, v in res.items() if isinstance(v, list) and v}
    print("median:", json.dumps(summary))
    res["median"] = summary
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
