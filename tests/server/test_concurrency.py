"""Many clients at once: concurrent streams lose nothing and match the same requests run alone (up to --max-seqs
of them generating together, a token each per step); a client that leaves cancels its generation; the queue limit
answers 429; waiting streams get heartbeats."""
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from helpers import REPO, chat_body, open_raw, read_events

# --ignore-eos: generations run to max_tokens, so "long" requests are long; --heartbeat 0.2: waiting streams ping.
SERVER_ARGS = ["--ctx", "32768", "--ignore-eos", "--heartbeat", "0.2"]
N_CLIENTS = 16
TOPICS = ["the sea", "the moon", "bread", "kings", "rain", "a lamp", "wisdom", "gold", "sheep", "the desert",
          "a river", "fire", "friends", "work", "silence", "the harvest"]


def run_threads(fn, args_list):
    results = [None] * len(args_list)
    barrier = threading.Barrier(len(args_list))

    def worker(i, args):
        barrier.wait()
        try:
            results[i] = fn(*args)
        except Exception as e:  # noqa: BLE001 -- reported by the caller
            results[i] = e

    threads = [threading.Thread(target=worker, args=(i, a)) for i, a in enumerate(args_list)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "a client thread hung"
    return results


def stream_text(server, body):
    """Streams a chat request; returns (content, reasoning, finish, done, n_pings, raw)."""
    status, frames, raw = server.sse("/v1/chat/completions", dict(body, stream=True), timeout=240)
    assert status == 200, raw[:500]
    content = reasoning = ""
    finish, done = None, False
    for _, data in frames:
        if data == "[DONE]":
            done = True
            continue
        assert not done, "data after [DONE]"
        ch = json.loads(data)
        for c in ch["choices"]:
            content += c["delta"].get("content") or ""
            reasoning += c["delta"].get("reasoning_content") or ""
            finish = c.get("finish_reason") or finish
    return content, reasoning, finish, done, raw.count(": ping\n"), raw


def test_concurrent_streams_match_sequential(server):
    bodies = [chat_body(f"Tell me a fortune about {t}.", max_tokens=24 + i) for i, t in enumerate(TOPICS)]
    assert len(bodies) == N_CLIENTS
    got = run_threads(lambda b: stream_text(server, b), [(b,) for b in bodies])
    errors = [g for g in got if isinstance(g, Exception)]
    assert not errors, errors
    for i, (b, g) in enumerate(zip(bodies, got)):
        content, reasoning, finish, done, _, raw = g
        assert done, f"client {i}: no [DONE]: {raw[-300:]!r}"
        assert finish == "length", f"client {i}: finish {finish!r}"
        alone = server.post("/v1/chat/completions", b).json()
        m = alone["choices"][0]["message"]
        assert content == m["content"], f"client {i} ({TOPICS[i]}): concurrent stream text differs from alone"
        assert reasoning == (m.get("reasoning_content") or ""), f"client {i}: reasoning differs"
        assert alone["usage"]["completion_tokens"] == b["max_tokens"]


def wait_generating_zero(server, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.metric("tern_requests_generating") == 0 and server.metric("tern_queue_depth") == 0:
            return True
        time.sleep(0.1)
    return False


LONG = 8000  # tokens: over 10 s on a CPU, unless cancelled


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_client_leaving_cancels_generation(start_server, stream):
    srv = start_server(*SERVER_ARGS)
    s = open_raw(srv, "/v1/chat/completions", chat_body("Tell me a very long story.", max_tokens=LONG,
                                                        stream=stream))
    if stream:
        assert read_events(s, 6).startswith(b"HTTP/1.1 200")
    else:
        deadline = time.monotonic() + 10
        while srv.metric("tern_requests_generating") == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # well into the generation
        assert srv.metric("tern_requests_generating") == 1
    s.close()
    freed = wait_generating_zero(srv, timeout=3)
    generated = srv.metric("tern_generated_tokens_total")
    if not freed:
        # the abandoned generation runs on: a second signal cancels it, so that the server stops now
        srv.signal(signal.SIGINT)
        time.sleep(0.3)
        srv.signal(signal.SIGINT)
    assert freed, (f"3 s after the client closed its connection the engine still runs its generation "
                   f"(max_tokens {LONG}, stream {stream}): tern_requests_generating stays 1")
    assert generated < LONG / 2, f"{generated} tokens generated: the abandoned generation was not cancelled"
    t0 = time.monotonic()
    r = srv.post("/v1/chat/completions", chat_body("Hi", max_tokens=5), timeout=60)
    elapsed = time.monotonic() - t0
    assert r.status == 200, r
    assert elapsed < 5, f"the next request took {elapsed:.1f} s"
    assert wait_generating_zero(srv), "tern_requests_generating did not return to 0"


def test_requests_generate_together(start_server):
    srv = start_server("--ctx", "8192", "--ignore-eos", "--slots", "3", "--max-seqs", "3")
    bodies = [chat_body(f"Story number {i}.", max_tokens=200) for i in range(3)]
    seen = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.append(srv.metric("tern_requests_generating"))
            time.sleep(0.01)

    w = threading.Thread(target=watch)
    w.start()
    try:
        results = run_threads(lambda b: srv.post("/v1/chat/completions", b, timeout=240), [(b,) for b in bodies])
    finally:
        stop.set()
        w.join()
    assert all(r.status == 200 and r.json()["usage"]["completion_tokens"] == 200 for r in results), results
    assert max(seen) == 3, f"three requests never generated together: {sorted(set(seen))}"


def test_long_prompt_prefills_between_steps(start_server):
    """A prompt that arrives while another request generates is prefilled --prefill-chunk tokens a step, between
    the other's tokens: the generating stream goes on meanwhile, and the prompt's answer is the one it gets alone."""
    srv = start_server("--ctx", "16384", "--ignore-eos", "--slots", "2", "--max-seqs", "2", "--prefill-chunk", "16",
                       "--cache-ram", "0")
    long_body = chat_body("Summarize: " + " ".join(f"line {i} of the record." for i in range(200)), max_tokens=8)
    alone = srv.post("/v1/chat/completions", long_body, timeout=240).json()
    n_prompt = alone["usage"]["prompt_tokens"]
    assert n_prompt > 1000, alone["usage"]
    times = []
    sock = open_raw(srv, "/v1/chat/completions", chat_body("Tell me a very long story.", max_tokens=LONG,
                                                            stream=True))

    def read_stream():
        while True:
            try:
                b = sock.recv(65536)
            except OSError:
                return
            if not b:
                return
            times.extend([time.monotonic()] * b.count(b"data: "))

    reader = threading.Thread(target=read_stream)
    reader.start()
    try:
        deadline = time.monotonic() + 30
        while len(times) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(times) >= 5, "the generating stream did not start"
        t0 = time.monotonic()
        r = srv.post("/v1/chat/completions", long_body, timeout=240)
        t1 = time.monotonic()
    finally:
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        reader.join(30)
    assert r.status == 200, r
    assert r.json()["choices"][0]["message"] == alone["choices"][0]["message"], "prefilled in chunks, the answer differs"
    during = sum(t0 < t < t1 for t in times)
    chunks = n_prompt // 16
    assert during >= chunks // 4, (f"{during} tokens streamed while a {n_prompt}-token prompt was prefilled in "
                                   f"~{chunks} chunks: the prefill held the generating request up")
    assert wait_generating_zero(srv), "tern_requests_generating did not return to 0"


def test_client_leaving_during_chunked_prefill(start_server):
    """A client that leaves while its prompt is prefilled in chunks beside another request's generation frees its
    place within a step or two, not after its whole prefill; the other request goes on."""
    srv = start_server("--ctx", "16384", "--ignore-eos", "--slots", "2", "--max-seqs", "2", "--prefill-chunk", "16",
                       "--cache-ram", "0")
    a = open_raw(srv, "/v1/chat/completions", chat_body("Tell me a very long story.", max_tokens=LONG, stream=True))
    try:
        buf = read_events(a, 3)
        long_body = chat_body("Summarize: " + " ".join(f"line {i} of the record." for i in range(600)), max_tokens=8)
        b = open_raw(srv, "/v1/chat/completions", long_body)
        deadline = time.monotonic() + 10
        while srv.metric("tern_requests_generating") < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert srv.metric("tern_requests_generating") == 2, "the long prompt was not admitted beside the stream"
        time.sleep(0.3)  # a few chunks into its prefill
        b.close()
        t0 = time.monotonic()
        while srv.metric("tern_requests_generating") != 1 and time.monotonic() - t0 < 10:
            time.sleep(0.02)
        left = time.monotonic() - t0
        assert srv.metric("tern_requests_generating") == 1, "the abandoned prefill never left"
        assert left < 2, f"the abandoned prefill took {left:.1f} s to leave: it ran to its end"
        got = len(buf)
        time.sleep(0.3)
        a.settimeout(5)
        assert len(a.recv(65536)) > 0 and got > 0, "the generating stream stopped"
    finally:
        a.close()
    assert wait_generating_zero(srv), "tern_requests_generating did not return to 0"


def test_queue_limit_429(start_server):
    # one request generates at a time, so the queue holds the others
    srv = start_server("--ctx", "8192", "--ignore-eos", "--queue-limit", "2", "--max-seqs", "1")
    n = 8
    bodies = [chat_body(f"Fortune number {i}.", max_tokens=300) for i in range(n)]
    results = run_threads(lambda b: srv.post("/v1/chat/completions", b, timeout=240), [(b,) for b in bodies])
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors
    statuses = sorted(r.status for r in results)
    ok = [r for r in results if r.status == 200]
    busy = [r for r in results if r.status == 429]
    assert len(ok) + len(busy) == n, statuses
    assert busy, f"no 429 with 8 requests at once and --queue-limit 2: {statuses}"
    assert 1 <= len(ok) <= 3, statuses
    for r in busy:
        e = r.json()["error"]
        assert e["type"] == "rate_limit_error", e
        assert e["message"]
    for r in ok:
        assert r.json()["usage"]["completion_tokens"] == 300
    assert srv.metric("tern_requests_total", endpoint="chat", status="429") == len(busy)
    assert srv.metric("tern_requests_total", endpoint="chat", status="200") == len(ok)


def test_waiting_streams_get_heartbeats(start_server):
    # a long first request holds the engine (one request at a time); the streams behind it wait in the queue
    # until it is abandoned
    server = start_server(*SERVER_ARGS, "--max-seqs", "1")
    first = open_raw(server, "/v1/chat/completions", chat_body("A long story, please.", max_tokens=LONG,
                                                               stream=True))
    results = {}
    try:
        deadline = time.monotonic() + 10
        while server.metric("tern_requests_generating") == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        threads = [threading.Thread(target=lambda k=k: results.__setitem__(k, capture(waiting_stream, server, k)))
                   for k in ("openai", "anthropic")]
        for t in threads:
            t.start()
        time.sleep(1.5)
        assert server.metric("tern_queue_depth") == 2, "the two streams should be waiting"
    finally:
        first.close()
    for t in threads:
        t.join(120)
    oa, an = results["openai"], results["anthropic"]
    assert not isinstance(oa, Exception), oa
    assert not isinstance(an, Exception), an
    assert oa["pings"] >= 2, oa["raw"][:600]
    assert oa["done"], oa["raw"][-300:]
    assert an["pings"] >= 2, an["raw"][:600]
    assert an["events"][0] == "message_start" and an["events"][-1] == "message_stop", an["events"]
    assert wait_generating_zero(server)


def capture(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 -- reported by the caller
        return e


def waiting_stream(server, kind):
    if kind == "openai":
        status, frames, raw = server.sse("/v1/chat/completions", chat_body("Hello", max_tokens=5, stream=True))
        assert status == 200
        first_content = raw.find('"finish_reason":"length"')
        return {"raw": raw, "pings": raw[:first_content].count(": ping\n\n"),
                "done": frames[-1][1] == "[DONE]"}
    body = {"model": "m", "max_tokens": 5, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "Hello"}]}
    status, frames, raw = server.sse("/v1/messages", body)
    assert status == 200
    events = [e for e, _ in frames]
    pings = [json.loads(d) for e, d in frames if e == "ping"]
    assert all(p == {"type": "ping"} for p in pings), pings
    start = events.index("content_block_start") if "content_block_start" in events else len(events)
    return {"raw": raw, "pings": events[:start].count("ping"), "events": [e for e in events if e != "ping"]}


def test_bench_server_concurrency(start_server, tmp_path):
    """tools/bench_server.py --concurrency: every level's requests all come back whole, and its figures are
    consistent with them."""
    srv = start_server("--ctx", "4096", "--slots", "2", "--max-seqs", "2")
    out = tmp_path / "conc.json"
    p = subprocess.run([sys.executable, "tools/bench_server.py", "--url", f"http://{srv.host}:{srv.port}",
                        "--concurrency", "1,2", "--prompt-range", "64:128", "--gen", "6", "--requests-per-stream", "2",
                        "--seed", "7", "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    levels = json.loads(out.read_text())["levels"]
    assert [lv["streams"] for lv in levels] == [1, 2]
    for lv in levels:
        assert lv["requests"] == 2 * lv["streams"]
        assert lv["generated"] == 6 * lv["requests"], lv
        # (the drawn lengths, plus the chat template's tokens and the words-per-token estimate's error)
        assert 50 <= lv["prompt_tokens_mean"] <= 200, lv
        assert lv["output_tok_s"] > 0 and lv["ttft_ms_p50"] <= lv["ttft_ms_p99"], lv
        assert lv["decode_tok_s_aggregate"] == pytest.approx(lv["streams"] * lv["decode_tok_s_per_stream"])
    assert sum(line.startswith("| ") for line in p.stdout.splitlines()) == 1 + 2, p.stdout


def kv_budget_run(start_server, *extra):
    """Four long generations under a KV budget that holds three of them: each stream's text equals its request
    run alone, and the budget made the scheduler preempt."""
    # tern-tiny's KV rows at 16 bits take 1 KiB a position, allocated 256 positions at first, then doubling:
    # past 256 positions each request holds 512 KiB, and 1536K holds three.
    server = start_server(*SERVER_ARGS, "--slots", "4", "--max-seqs", "4", "--kv-budget", "1536K", *extra)
    bodies = [chat_body(f"Tell me a fortune about {t}.", max_tokens=360) for t in TOPICS[:4]]
    got = run_threads(lambda b: stream_text(server, b), [(b,) for b in bodies])
    errors = [g for g in got if isinstance(g, Exception)]
    assert not errors, errors
    assert server.metric("tern_preemptions_total") >= 1
    assert server.metric("tern_kv_bytes") <= 1536 * 1024
    for i, (b, g) in enumerate(zip(bodies, got)):
        content, _, finish, done, _, raw = g
        assert done and finish == "length", f"client {i}: {raw[-300:]!r}"
        alone = server.post("/v1/chat/completions", b).json()
        assert content == alone["choices"][0]["message"]["content"], f"client {i}: preempted text differs from alone"
    return server


def test_kv_budget_preempts_and_resumes_exactly(start_server):
    server = kv_budget_run(start_server)
    assert server.metric("tern_preempted_resumed_exact_total") >= 1


def test_kv_budget_recomputes_without_a_cache(start_server):
    server = kv_budget_run(start_server, "--cache-ram", "0")
    assert server.metric("tern_preempted_recomputed_tokens_total") > 0


def test_kv_budget_bounds_one_request(start_server):
    # 1536K holds 1,024 positions of tern-tiny's rows (the rows double from 256; 2,048 would need 2 MiB)
    server = start_server(*SERVER_ARGS, "--kv-budget", "1536K")
    r = server.post("/v1/chat/completions", chat_body("Tell me a long story.", max_tokens=3000)).json()
    u = r["usage"]
    assert r["choices"][0]["finish_reason"] == "length"
    assert 512 < u["prompt_tokens"] + u["completion_tokens"] <= 1024, u
    assert server.metric("tern_kv_bytes") <= 1536 * 1024
    long_prompt = chat_body("word " * 1100, max_tokens=4)
    for stream in (False, True):
        r = server.post("/v1/chat/completions", dict(long_prompt, stream=stream))
        assert r.status == 400, r
        assert "KV budget" in r.json()["error"]["message"] and r.json()["error"]["code"] == "context_length_exceeded"
    assert server.post("/v1/chat/completions", chat_body("Hi", max_tokens=4)).status == 200
    assert server.metric("tern_kv_bytes") > 0
    deadline = time.monotonic() + 20
    while server.post("/v1/models/unload", {}).status != 200:
        assert time.monotonic() < deadline, "the model was not unloaded"
        time.sleep(0.05)
    assert server.metric("tern_kv_bytes") == 0, "the unloaded sessions' rows are still counted"


def drain(socks):
    """Reads what the streams have sent so far (their servers never wait on a full socket)."""
    for s in socks:
        s.settimeout(0.02)
        try:
            s.recv(1 << 20)
        except (TimeoutError, BlockingIOError):
            pass


def test_kv_budget_client_leaving_while_preempted(start_server):
    # Two long streams past 512 positions hold 1 MiB each; a third with a 200-token prompt fits beside them
    # (256 KiB) until it passes 256 positions, and is preempted; its client then leaves while the two still
    # run, and its place is free at once.
    server = start_server(*SERVER_ARGS, "--slots", "3", "--max-seqs", "3", "--kv-budget", "2304K")
    longs = [open_raw(server, "/v1/chat/completions", chat_body(f"Story {i}.", max_tokens=1000, stream=True))
             for i in range(2)]
    deadline = time.monotonic() + 30
    while server.metric("tern_kv_bytes") < 2 * 1024 * 1024:
        assert time.monotonic() < deadline, "the long streams did not grow past 512 positions"
        drain(longs)
    third = open_raw(server, "/v1/chat/completions", chat_body("word " * 190, max_tokens=1000, stream=True))
    while server.metric("tern_preemptions_total") == 0:
        assert time.monotonic() < deadline, "the third stream was never preempted"
        drain(longs + [third])
    assert server.metric("tern_requests_generating") == 3
    third.close()
    deadline = time.monotonic() + 3
    while server.metric("tern_requests_generating") != 2:
        assert time.monotonic() < deadline, "the preempted request's place was not freed"
        drain(longs)
    assert server.metric("tern_generations_total") == 0, "the long streams ended first: the test proves nothing"
    for s in longs:
        s.close()


def test_kv_budget_preempted_again_while_recomputed(start_server):
    # Without a cache a preempted request comes back by prefilling all it held again, in chunks (8 tokens a step
    # here); a request beside it that grows then preempts it again, mid-prefill. A (100-token prompt) and X run
    # first; B (480-token prompt) passes 512 positions (1 MiB) and is preempted when A passes 256. When A ends, X
    # is short of 512 positions and B comes back beside it (512K + 1M); X passes 512 while B is prefilled again.
    server = start_server(*SERVER_ARGS, "--slots", "3", "--max-seqs", "3", "--kv-budget", "1536K",
                          "--cache-ram", "0", "--prefill-chunk", "8")
    bodies = {"A": chat_body("word " * 90, max_tokens=480), "X": chat_body("Fortune X.", max_tokens=560),
              "B": chat_body("word " * 470, max_tokens=300)}
    got = {}

    def run(name):
        try:
            got[name] = stream_text(server, bodies[name])
        except Exception as e:  # noqa: BLE001 -- reported below
            got[name] = e

    threads = {n: threading.Thread(target=run, args=(n,)) for n in bodies}
    threads["A"].start()
    time.sleep(0.05)
    threads["X"].start()
    deadline = time.monotonic() + 30
    while server.metric("tern_requests_generating") < 2:
        assert time.monotonic() < deadline, "A and X did not start"
    threads["B"].start()
    for t in threads.values():
        t.join(300)
    errors = {n: g for n, g in got.items() if isinstance(g, Exception)}
    assert not errors, errors
    assert server.metric("tern_preemptions_total") >= 2, "B was not preempted twice: the test proves nothing"
    for name, body in bodies.items():
        content, _, finish, done, _, raw = got[name]
        assert done and finish == "length", f"{name}: {raw[-300:]!r}"
        alone = server.post("/v1/chat/completions", body).json()
        assert content == alone["choices"][0]["message"]["content"], f"{name}: preempted text differs from alone"
