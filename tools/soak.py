#!/usr/bin/env python3
"""Soak and fault test of `tern serve` (make soak; docs/RELIABILITY.md).

    python3 tools/soak.py [--bin build/tern] [--seconds 600] [--clients 32] [--json FILE]

Starts `tern serve` on the embedded model and runs CLIENTS threads against it for SECONDS. Each thread loops,
picking one kind of request at random:

    stream      a well-formed streamed request on one of the four APIs; must end as its API says it ends
    plain       a well-formed non-streamed request; must answer 200 with a complete body
    slow        a well-formed stream read a few bytes at a time with pauses; must still end complete
    disconnect  a stream dropped by the client after its first bytes
    malformed   invalid JSON, wrong types, a prompt beyond the context, an unknown path, garbage bytes, a body
                over the limit announced in the headers, or a body cut short: must get a 4xx (or, for bytes that
                are not HTTP, a closed connection), never a 5xx or a hang

Every 10 s it samples the server's resident memory, open file descriptors and threads. It passes when no
well-formed request failed, no malformed one got an unexpected answer, resident memory is flat (the second half's
peak within max(8 MiB, 3 %) of the first half's, warm-up excluded), descriptors return to their starting count
once the clients stop, and the server exits 0 on SIGTERM. Exit status 0 on a pass, 1 otherwise.
"""
import argparse
import http.client
import json
import os
import random
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "server"))
import helpers  # noqa: E402  (the server tests' Server class: start, /health, clean stop)

CTX = 2048
MAX_BODY = "1M"
TOPICS = ["the sea", "the moon", "bread", "kings", "rain", "a lamp", "wisdom", "gold", "sheep", "a river"]
KINDS = [("stream", 40), ("plain", 15), ("slow", 10), ("disconnect", 15), ("malformed", 20)]


# ---- requests ---------------------------------------------------------------------------------------------------


def well_formed(rng, stream):
    """(path, body, check) for a random API; check(text) -> None or the problem."""
    topic, n = rng.choice(TOPICS), rng.randint(4, 48)
    msg = f"Tell me a fortune about {topic}."
    api = rng.choice(["chat", "completions", "responses", "messages"])
    if api == "chat":
        body = {"messages": [{"role": "user", "content": msg}], "max_tokens": n}
        end = "data: [DONE]" if stream else '"finish_reason"'
        path = "/v1/chat/completions"
    elif api == "completions":
        body = {"prompt": f"And {topic} said,", "max_tokens": n}
        end = "data: [DONE]" if stream else '"finish_reason"'
        path = "/v1/completions"
    elif api == "responses":
        body = {"input": msg, "max_output_tokens": n, "store": False}
        # a generation cut by max_output_tokens ends "incomplete", one that stopped by itself "completed"
        end = ("event: response.completed", "event: response.incomplete") if stream else \
              ('"status":"completed"', '"status":"incomplete"')
        path = "/v1/responses"
    else:
        body = {"model": "tern", "messages": [{"role": "user", "content": msg}], "max_tokens": n}
        end = "event: message_stop" if stream else '"stop_reason"'
        path = "/v1/messages"
    body["stream"] = stream
    ends = end if isinstance(end, tuple) else (end,)

    def check(text):
        text = text.replace('": "', '":"')
        return None if any(e in text for e in ends) else f"{api}: none of {ends} in the answer: {text[-300:]!r}"
    return path, body, check


def post(server, path, body, timeout, extra=None):
    c = http.client.HTTPConnection(server.host, server.port, timeout=timeout)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json", **(extra or {})})
    return c, c.getresponse()


def do_complete(server, rng, stream, slow):
    path, body, check = well_formed(rng, stream)
    c, r = post(server, path, body, timeout=300)
    try:
        if not slow:
            text = r.read().decode()
        else:
            parts = []
            while True:
                b = r.read(48)
                if not b:
                    break
                parts.append(b)
                time.sleep(0.05)
            text = b"".join(parts).decode()
    finally:
        c.close()
    if r.status != 200:
        return f"{path}: HTTP {r.status}: {text[:200]}"
    return check(text)


def do_disconnect(server, rng):
    path, body, _ = well_formed(rng, True)
    c, r = post(server, path, body, timeout=300)
    if r.status == 200:
        r.read(rng.choice([1, 64, 512]))
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()


def raw(server, data, timeout=30):
    """Sends bytes; returns what came back until the server closed or answered completely."""
    s = socket.create_connection((server.host, server.port), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        while True:
            try:
                b = s.recv(65536)
            except ConnectionResetError:
                break
            if not b:
                break
            out += b
            if helpers.response_complete(out):
                break
        return out
    finally:
        s.close()


def do_malformed(server, rng):
    """Returns None when the answer is the expected refusal, else the problem."""
    case = rng.choice(["json", "types", "long", "path", "garbage", "oversize", "short"])
    host = f"Host: {server.host}\r\n"
    if case == "garbage":
        out = raw(server, bytes(rng.randrange(256) for _ in range(rng.randint(1, 400))) + b"\r\n\r\n")
        st = helpers.status_of(out) if out else None
        return None if st is None or 400 <= st < 500 else f"garbage: HTTP {st}"
    if case == "oversize":
        out = raw(server, (f"POST /v1/chat/completions HTTP/1.1\r\n{host}Content-Type: application/json\r\n"
                           f"Content-Length: {4 << 20}\r\n\r\n").encode())
        st = helpers.status_of(out) if out else None
        return None if st == 413 else f"oversize: HTTP {st}"
    if case == "short":
        out = raw(server, (f"POST /v1/chat/completions HTTP/1.1\r\n{host}Content-Type: application/json\r\n"
                           f"Content-Length: 100\r\n\r\n" + '{"messages": [').encode(), timeout=60)
        st = helpers.status_of(out) if out else None
        return None if st is None or 400 <= st < 500 else f"short body: HTTP {st}"
    path, body = "/v1/chat/completions", None
    if case == "json":
        body = '{"messages": [{"role": "user", "content": "hi"}'[: rng.randint(1, 40)]
    elif case == "types":
        body = rng.choice(['{"messages": 5}', '{"messages": [{"role": 7}]}', '{"max_tokens": "x", "messages": []}',
                           '[1, 2]', '{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}'])
    elif case == "long":
        body = json.dumps({"messages": [{"role": "user", "content": "wisdom and gold " * (2 * CTX)}],
                           "max_tokens": 8})
    else:
        path, body = rng.choice(["/v1/nothing", "/v2/chat/completions"]), "{}"
    r = server.request("POST", path, body=body, timeout=60)
    return None if 400 <= r.status < 500 else f"{case}: HTTP {r.status}: {r.body[:200]!r}"


# ---- the run ----------------------------------------------------------------------------------------------------


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {k: 0 for k, _ in KINDS}
        self.failures = []

    def add(self, kind, problem):
        with self.lock:
            self.counts[kind] += 1
            if problem:
                self.failures.append(f"{kind}: {problem}")


def client(server, seed, deadline, tally):
    rng = random.Random(seed)
    kinds, weights = zip(*KINDS)
    while time.monotonic() < deadline:
        kind = rng.choices(kinds, weights)[0]
        try:
            if kind == "stream":
                problem = do_complete(server, rng, True, False)
            elif kind == "plain":
                problem = do_complete(server, rng, False, False)
            elif kind == "slow":
                problem = do_complete(server, rng, True, True)
            elif kind == "disconnect":
                problem = do_disconnect(server, rng)
            else:
                problem = do_malformed(server, rng)
        except (OSError, http.client.HTTPException) as e:
            problem = None if kind == "disconnect" else f"{type(e).__name__}: {e}"
        tally.add(kind, problem)


def sample(pid):
    status = Path(f"/proc/{pid}/status").read_text()
    field = {ln.split(":")[0]: ln.split(":")[1].split() for ln in status.splitlines() if ":" in ln}
    return {"rss_mib": int(field["VmRSS"][0]) / 1024, "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": int(field["Threads"][0])}


def flat(samples, warmup_s):
    """The RSS verdict: (ok, first-half peak, second-half peak)."""
    w = [s for s in samples if s["t"] >= warmup_s]
    if len(w) < 4:
        return False, 0.0, 0.0
    a, b = w[: len(w) // 2], w[len(w) // 2:]
    pa, pb = max(s["rss_mib"] for s in a), max(s["rss_mib"] for s in b)
    return pb - pa <= max(8.0, 0.03 * pa), pa, pb


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/tern")
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--interval", type=float, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the samples and the verdict here")
    a = ap.parse_args()
    helpers.TERN_BIN = a.bin
    # a prefix cache small enough to fill during the warm-up (RSS grows up to its budget, then must stay flat)
    # and to evict all along
    server = helpers.Server(["--ctx", CTX, "--queue-limit", 2 * a.clients, "--max-connections", 4 * a.clients,
                             "--max-body", MAX_BODY, "--read-timeout", 5, "--heartbeat", 1, "--no-think",
                             "--cache-ram", "8M"])
    pid = server.proc.pid
    base = sample(pid)
    print(f"soak: tern serve pid {pid} on port {server.port}: {a.clients} clients for {a.seconds:.0f} s; "
          f"at start {base['rss_mib']:.1f} MiB, {base['fds']} fds", flush=True)
    tally = Tally()
    t0 = time.monotonic()
    deadline = t0 + a.seconds
    threads = [threading.Thread(target=client, args=(server, a.seed * 1000 + i, deadline, tally), daemon=True)
               for i in range(a.clients)]
    for t in threads:
        t.start()
    samples = []
    print(f"{'t (s)':>6} {'RSS MiB':>8} {'fds':>5} {'threads':>7} {'requests':>8} {'failed':>6}", flush=True)
    while any(t.is_alive() for t in threads):
        left = deadline - time.monotonic()
        time.sleep(min(a.interval, left) if left > 1 else a.interval)
        if server.proc.poll() is not None:
            break
        s = dict(sample(pid), t=round(time.monotonic() - t0, 1))
        samples.append(s)
        print(f"{s['t']:6.0f} {s['rss_mib']:8.1f} {s['fds']:5d} {s['threads']:7d} "
              f"{sum(tally.counts.values()):8d} {len(tally.failures):6d}", flush=True)
        if time.monotonic() > deadline + 360:
            tally.failures.append("clients still running 360 s after the end: a hang")
            break
    alive = server.proc.poll() is None
    time.sleep(3)
    end = sample(pid) if alive else None
    problems = list(tally.failures)
    if not alive:
        problems.append(f"tern serve died (exit {server.proc.returncode})")
    ok_rss, pa, pb = flat(samples, min(60.0, a.seconds / 4))
    if not ok_rss:
        problems.append(f"resident memory grew: peak {pa:.1f} MiB in the first half, {pb:.1f} MiB in the second")
    if end and end["fds"] > base["fds"]:
        problems.append(f"file descriptors: {base['fds']} at start, {end['fds']} after the clients stopped")
    problems += server.stop()
    verdict = {"seconds": a.seconds, "clients": a.clients, "requests": tally.counts, "base": base, "end": end,
               "rss_peak_first_half_mib": pa, "rss_peak_second_half_mib": pb,
               "max_fds": max((s["fds"] for s in samples), default=0), "samples": samples, "problems": problems}
    if a.json:
        Path(a.json).write_text(json.dumps(verdict, indent=1))
    print("requests: " + ", ".join(f"{k} {v}" for k, v in tally.counts.items()) +
          f"; RSS peak {pa:.1f} -> {pb:.1f} MiB; fds {base['fds']} -> {end['fds'] if end else '-'}"
          f" (max {verdict['max_fds']})")
    for p in problems[:20]:
        print("FAIL: " + p.splitlines()[0] if p else p)
    if len(problems) > 20:
        print(f"... and {len(problems) - 20} more")
    print("soak: " + ("passed" if not problems else f"FAILED ({len(problems)} problems)"))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
