#!/usr/bin/env python3
"""Measures tern serve from the client's side: the decode rate of streamed
responses and the time to the first token of cold prompts.

    python3 tools/bench_server.py --url http://127.0.0.1:8080 [--endpoint chat|completions]
        [--prompt-tokens 1024] [--gen 128] [--runs 3] [--ttft-runs 5] [--json FILE]
    python3 tools/bench_server.py --url ... --concurrency 1,4,16,64 [--prompt-range 512:4096] [--gen 256]
        [--requests-per-stream 2] [--seed N] [--json FILE]

Decode: a streamed request of --gen tokens (ignore_eos) after a prompt of
about --decode-prompt tokens; the rate is (tokens - 1) over the time from
the first text chunk to the last. TTFT: streamed requests whose prompts
(about --prompt-tokens tokens) share nothing with earlier ones, timed from
sending to the first text chunk; the server's usage must report 0 cached
tokens. Sampling: temperature 1, top_k 20 (as tern bench --top-k 20).

Concurrency: for each N, N client threads each send --requests-per-stream
streamed chat requests one after another (prompts of a length drawn
uniformly from --prompt-range tokens, sharing nothing, --gen tokens each).
Per N: output tok/s (every generated token over the level's wall time, the
prefills included), the per-stream decode rate (median over requests of
(tokens - 1) over first to last text chunk) and N times it (the aggregate
decode rate), the time to the first token (from sending; the queue and the
other streams' work included) and the gaps between text chunks (inter-token
latency), p50 and p99. Any OpenAI-compatible server that takes ignore_eos
and top_k (llama-server too) can be measured the same way.
Needs only the standard library.
"""
import threading
import argparse
import http.client
import json
import random
import re
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
    try:
        r = post(url, "/v1/messages/count_tokens",
                 {"model": "m", "messages": [{"role": "user", "content": text}]}, False)
        return r["input_tokens"]
    except SystemExit:   # not tern: llama-server's /tokenize counts the text alone
        return len(post(url, "/tokenize", {"content": text}, False)["tokens"])


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


TEXT_CHUNK = re.compile(rb'"(reasoning_)?content":"[^"]')


def stream_chunks(url, text, gen):
    """One streamed chat request: (sent, [text chunk arrival times], usage)."""
    path, body = request("chat", text, gen)
    t0 = time.perf_counter()
    conn, resp = post(url, path, body, True)
    times, usage = [], None
    for t, data in sse_lines(resp):
        if b'"usage"' in data and json.loads(data).get("usage"):
            usage = json.loads(data)["usage"]
        elif TEXT_CHUNK.search(data):
            times.append(t)
    conn.close()
    return t0, times, usage


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def run_level(url, n, a, words_per_token, salt):
    """n client threads, each a.requests_per_stream requests in turn."""
    lo, hi = a.prompt_range
    results, errors = [], []
    lock = threading.Lock()

    def client(c):
        rng = random.Random(salt * 1000 + c)
        for r in range(a.requests_per_stream):
            tokens = rng.randint(lo, hi)
            text = f"{salt}-{n}-{c}-{r}: " + prompt_text(max(1, int(tokens * words_per_token)), rng.random())
            try:
                got = stream_chunks(url, text, a.gen)
            except BaseException as e:  # noqa: BLE001 -- reported after the level
                with lock:
                    errors.append(repr(e))
                return
            with lock:
                results.append(got)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"{n} streams: {len(errors)} requests failed: {errors[0]}")
    gen = sum((u or {}).get("completion_tokens", len(ts)) for _, ts, u in results)
    rates = [((u or {}).get("completion_tokens", len(ts)) - 1) / (ts[-1] - ts[0])
             for _, ts, u in results if len(ts) > 1 and ts[-1] > ts[0]]
    ttft = [(ts[0] - sent) * 1e3 for sent, ts, _ in results if ts]
    itl = [(b - x) * 1e3 for _, ts, _ in results for x, b in zip(ts, ts[1:])]
    prompt = [u["prompt_tokens"] for _, _, u in results if u]
    per_stream = statistics.median(rates) if rates else float("nan")
    return {"streams": n, "requests": len(results), "prompt_tokens_mean": statistics.mean(prompt) if prompt else None,
            "generated": gen, "wall_s": wall, "output_tok_s": gen / wall, "decode_tok_s_per_stream": per_stream,
            "decode_tok_s_aggregate": n * per_stream, "ttft_ms_p50": pct(ttft, 0.5), "ttft_ms_p99": pct(ttft, 0.99),
            "itl_ms_p50": pct(itl, 0.5), "itl_ms_p99": pct(itl, 0.99)}


def concurrency(a):
    salt = a.seed if a.seed is not None else random.randrange(1 << 30)
    probe = prompt_text(400, salt)
    words_per_token = 400 / max(1, count_tokens(a.url, probe))
    stream_chunks(a.url, prompt_text(64, salt + 1), 8)   # warm-up
    levels = []
    print("| streams | requests | prompt tokens (mean) | output tok/s | decode tok/s a stream | decode tok/s "
          "aggregate | TTFT p50 / p99 ms | ITL p50 / p99 ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in a.concurrency:
        r = run_level(a.url, n, a, words_per_token, salt)
        levels.append(r)
        print(f"| {n} | {r['requests']} | {r['prompt_tokens_mean'] or 0:.0f} | {r['output_tok_s']:.1f} | "
              f"{r['decode_tok_s_per_stream']:.1f} | {r['decode_tok_s_aggregate']:.1f} | "
              f"{r['ttft_ms_p50']:.0f} / {r['ttft_ms_p99']:.0f} | {r['itl_ms_p50']:.1f} / {r['itl_ms_p99']:.1f} |",
              flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"levels": levels, "gen": a.gen, "prompt_range": a.prompt_range}, f, indent=1)


def int_list(v):
    return [int(x) for x in v.split(",")]


def token_range(v):
    lo, _, hi = v.partition(":")
    lo, hi = int(lo), int(hi or lo)
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"a range MIN:MAX of tokens, got {v!r}")
    return lo, hi


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--decode-prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, help="tokens generated a request (default 128; 256 with --concurrency)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ttft-runs", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--concurrency", type=int_list, help="stream counts, e.g. 1,4,16,64 (the concurrency mode)")
    ap.add_argument("--prompt-range", type=token_range, default=(512, 4096))
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--seed", type=int, help="the concurrency mode's prompts (default: new ones each run; a seed "
                    "repeats them, for runs side by side)")
    a = ap.parse_args()
    a.gen = a.gen or (256 if a.concurrency else 128)
    if a.concurrency:
        return concurrency(a)
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
