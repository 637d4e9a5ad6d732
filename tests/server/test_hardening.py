"""Exposure and abuse: the default bind address, API keys, body and connection limits, slow and idle clients, the
context limit, routing errors, and a clean stop on SIGINT while a stream is running."""
import json
import signal
import socket
import time

import pytest

import subprocess

from helpers import REPO, body_of, chat_body, open_raw, openai_client, raw_exchange, read_events, status_of, tern_bin

SERVER_ARGS = ["--ctx", "4096"]


# ---- the bind address ------------------------------------------------------------------------------------------


def listening_addresses(port):
    """The local addresses (hex, as /proc/net/tcp{,6} write them) of the sockets listening on port."""
    out = []
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(f).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            addr, p = fields[1].split(":")
            if int(p, 16) == port and fields[3] == "0A":
                out.append(addr)
    return out


def non_loopback_ipv4():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.255.255.255", 1))
        ip = s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()
    return None if ip.startswith("127.") else ip


def test_default_bind_is_loopback_only(server):
    addrs = listening_addresses(server.port)
    assert addrs == ["0100007F"], f"listening on {addrs} (hex), expected 127.0.0.1 only"
    ip = non_loopback_ipv4()
    if ip:
        with pytest.raises(OSError):
            socket.create_connection((ip, server.port), timeout=3).close()


def test_port_in_use_refused(server):
    """A second server on a port in use stops with one line (no shared port splitting the traffic)."""
    p = subprocess.run([str(tern_bin()), "serve", "--port", str(server.port)], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0, p.stderr
    assert "already in use" in p.stderr, p.stderr
    assert server.get("/health").status == 200


def test_host_all_interfaces_is_visible(start_server):
    """The check above can fail: --host 0.0.0.0 shows as 00000000 in /proc/net/tcp."""
    s = start_server("--host", "0.0.0.0", "--ctx", "4096")
    assert listening_addresses(s.port) == ["00000000"]


# ---- API keys ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed(request):
    from helpers import Server
    s = Server(["--api-key", "sekrit-key", "--ctx", "4096"])
    yield s
    s.assert_clean_stop()


@pytest.mark.parametrize("headers", [
    {},
    {"Authorization": "Bearer wrong"},
    {"Authorization": "Bearer sekrit-key-and-more"},
    {"Authorization": "sekrit-key"},
    {"x-api-key": "wrong"},
    {"x-api-key": "sekrit-ke"},
], ids=["none", "bearer-wrong", "bearer-longer", "no-bearer", "x-api-key-wrong", "x-api-key-prefix"])
def test_api_key_refused(keyed, headers):
    r = keyed.post("/v1/chat/completions", chat_body(max_tokens=3), headers=headers)
    assert r.status == 401, r
    assert r.json()["error"]["type"] == "authentication_error"
    r = keyed.post("/v1/messages", {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]},
                   headers=headers)
    assert r.status == 401, r
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize("headers", [{"Authorization": "Bearer sekrit-key"}, {"x-api-key": "sekrit-key"}],
                         ids=["bearer", "x-api-key"])
def test_api_key_accepted(keyed, headers):
    r = keyed.post("/v1/chat/completions", chat_body(max_tokens=3), headers=headers)
    assert r.status == 200, r
    r = keyed.get("/v1/models", headers=headers)
    assert r.status == 200, r


def test_api_key_sdk(keyed):
    import openai
    with pytest.raises(openai.AuthenticationError):
        openai_client(keyed, api_key="nope").models.list()
    assert [m.id for m in openai_client(keyed, api_key="sekrit-key").models.list()] == ["tern-tiny", "tern-tiny-fast"]


def test_health_needs_no_key(keyed):
    r = keyed.get("/health")
    assert r.status == 200, f"GET /health with --api-key and no key: {r}"
    assert r.json() == {"status": "ok", "model": "loaded"}


# ---- body limits -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_body(request):
    from helpers import Server
    s = Server(["--max-body", "1K", "--ctx", "4096"])
    yield s
    s.assert_clean_stop()


def test_body_over_limit_413(small_body):
    big = chat_body("x " * 1000, max_tokens=3)
    r = small_body.post("/v1/chat/completions", big)
    assert r.status == 413, r
    assert r.json()["error"]["message"]
    r = small_body.post("/v1/messages", {"model": "m", "max_tokens": 3,
                                         "messages": [{"role": "user", "content": "x " * 1000}]})
    assert r.status == 413, r
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "request_too_large"
    # a body just under the limit is served
    r = small_body.post("/v1/chat/completions", chat_body("hello", max_tokens=3))
    assert r.status == 200, r


def test_body_over_limit_chunked_413(small_body):
    data = json.dumps(chat_body("y " * 1500, max_tokens=3)).encode()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(data[i:i + 300]), data[i:i + 300]) for i in range(0, len(data), 300))
    raw = raw_exchange(small_body, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                                   b"\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n")
    assert status_of(raw) == 413, raw[:300]


def test_announced_content_length_over_limit_413(small_body):
    """Content-Length announces 100 MB against --max-body 1K, and the client waits before sending the body:
    the server knows enough to answer 413 at once (it must not wait for 100 MB, or until its read timeout)."""
    t0 = time.monotonic()
    raw = raw_exchange(small_body, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                   b"application/json\r\nContent-Length: 100000000\r\n\r\n{\"messages\":", timeout=5)
    assert status_of(raw) == 413, f"after {time.monotonic() - t0:.1f} s: {raw[:300]!r}"


def test_announced_content_length_over_limit_expect_100_continue(small_body):
    """With Expect: 100-continue the client waits for the server's word: it must be 413, not 100 Continue."""
    raw = raw_exchange(small_body, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                   b"application/json\r\nContent-Length: 100000000\r\nExpect: 100-continue\r\n\r\n",
                       timeout=5)
    assert status_of(raw) == 413, raw[:300]


# ---- connections -------------------------------------------------------------------------------------------------


def _held_connection(s):
    """A connection that has completed a kept-alive exchange, so the server holds it; None if it was refused
    (closed, or reset: a refused connection may be either)."""
    h = socket.create_connection((s.host, s.port), timeout=5)
    try:
        h.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while not got.endswith(b'{"status":"ok","model":"loaded"}'):
            chunk = h.recv(4096)
            if not chunk:
                h.close()
                return None
            got += chunk
    except (ConnectionResetError, BrokenPipeError):
        h.close()
        return None
    return h


def _exchange_or_refused(s, data):
    """raw_exchange, with a connection reset while sending counted as no answer (b"")."""
    try:
        return raw_exchange(s, data, timeout=3)
    except (ConnectionResetError, BrokenPipeError):
        return b""


def test_connection_limit(start_server):
    s = start_server("--max-connections", "4", "--ctx", "4096")
    held = []
    deadline = time.monotonic() + 10
    try:
        # the server may still count a connection it is closing (the harness's health checks): retry until it
        # holds four of ours, however loaded the machine
        while len(held) < 4 and time.monotonic() < deadline:
            h = _held_connection(s)
            if h:
                held.append(h)
            else:
                time.sleep(0.05)
        assert len(held) == 4, f"the server held only {len(held)} connections"
        raw = _exchange_or_refused(s, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(raw) is None, f"a 5th connection was served: {raw[:200]!r}"
    finally:
        for h in held:
            h.close()
    deadline = time.monotonic() + 10
    while True:
        raw = _exchange_or_refused(s, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        if status_of(raw) == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert status_of(raw) == 200, raw[:200]
    assert s.post("/v1/chat/completions", chat_body(max_tokens=3)).status == 200


@pytest.fixture(scope="module")
def impatient(request):
    from helpers import Server
    s = Server(["--read-timeout", "2", "--idle-timeout", "2", "--ctx", "4096"])
    yield s
    s.assert_clean_stop()


def time_until_closed(sock, send_every=None, payload=b"", limit=15):
    """Seconds until the server closes sock (recv gives EOF or an error); sends one byte of payload every
    send_every seconds meanwhile. None if still open after `limit` seconds."""
    t0 = time.monotonic()
    i = 0
    sock.settimeout(0.2)
    next_send = t0
    while time.monotonic() - t0 < limit:
        if send_every and i < len(payload) and time.monotonic() >= next_send:
            try:
                sock.sendall(payload[i:i + 1])
            except OSError:
                return time.monotonic() - t0
            i += 1
            next_send += send_every
        try:
            b = sock.recv(4096)
            if not b:
                return time.monotonic() - t0
        except socket.timeout:
            continue
        except OSError:
            return time.monotonic() - t0
    return None


def test_slowloris_headers(impatient):
    s = socket.create_connection((impatient.host, impatient.port), timeout=5)
    try:
        t = time_until_closed(s, send_every=1.0, payload=b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" * 4)
    finally:
        s.close()
    assert t is not None, "a client sending a header byte a second kept its connection for 15 s"
    assert 1.5 <= t <= 4.5, t
    assert impatient.get("/health").status == 200


def test_slowloris_body(impatient):
    data = json.dumps(chat_body(max_tokens=3)).encode()
    s = socket.create_connection((impatient.host, impatient.port), timeout=5)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(data))
    try:
        t = time_until_closed(s, send_every=0.5, payload=data)
    finally:
        s.close()
    assert t is not None and t <= 4.5, t


def test_silent_connection_closed(impatient):
    s = socket.create_connection((impatient.host, impatient.port), timeout=5)
    try:
        t = time_until_closed(s)
    finally:
        s.close()
    assert t is not None and t <= 4.5, t


def test_idle_keep_alive_closed(impatient):
    s = socket.create_connection((impatient.host, impatient.port), timeout=5)
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        buf = b""
        while b"\r\n\r\n" not in buf or not buf.endswith(b"}"):
            buf += s.recv(4096)
        assert status_of(buf) == 200
        t = time_until_closed(s)
    finally:
        s.close()
    assert t is not None, "an idle keep-alive connection stayed open for 15 s (--idle-timeout 2)"
    assert 1.0 <= t <= 6.5, t


def test_keep_alive_serves_several_requests(server):
    s = socket.create_connection((server.host, server.port), timeout=10)
    try:
        for _ in range(3):
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            buf = b""
            while not buf.endswith(b"}"):
                b = s.recv(4096)
                assert b, "closed between keep-alive requests"
                buf += b
            assert status_of(buf) == 200
    finally:
        s.close()


# ---- the context limit -------------------------------------------------------------------------------------------


def test_prompt_over_context_400(start_server):
    s = start_server("--ctx", "256")
    long_text = "And the LORD spake unto Moses, saying, " * 60
    r = s.post("/v1/chat/completions", chat_body(long_text, max_tokens=3))
    assert r.status == 400, r
    e = r.json()["error"]
    assert "context" in e["message"] and "256" in e["message"], e
    r = s.post("/v1/completions", {"prompt": long_text, "max_tokens": 3})
    assert r.status == 400 and "context" in r.json()["error"]["message"], r
    r = s.post("/v1/responses", {"input": long_text, "max_output_tokens": 3})
    assert r.status == 400 and "context" in r.json()["error"]["message"], r
    r = s.post("/v1/messages", {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": long_text}]})
    assert r.status == 400, r
    assert r.json()["type"] == "error" and "context" in r.json()["error"]["message"], r
    # a prompt that fits is served, its generation clamped to the room left
    r = s.post("/v1/chat/completions", chat_body("Hello", max_tokens=100000))
    assert r.status == 200, r
    u = r.json()["usage"]
    assert u["prompt_tokens"] + u["completion_tokens"] <= 256


def test_context_past_the_model_refused_at_start():
    """More context than the model's positions stops the server at start, with a line that says how to reach it."""
    from helpers import Server
    with pytest.raises(RuntimeError) as e:
        Server(["--ctx", "2000000000"])
    assert "tern serve: --ctx: a context of 2000000000 exceeds the model's 262144 positions" in str(e.value)
    assert "--rope-scaling yarn" in str(e.value)


def test_yarn_context(start_server):
    """--rope-scaling yarn --ctx 1048576: tern-tiny past its native 262,144 positions, said at start."""
    s = start_server("--rope-scaling", "yarn", "--ctx", "1048576")
    assert "context 1048576 (rope scaling yarn, factor 4 over 262144 native positions" in s.stderr(), s.stderr()
    r = s.post("/v1/chat/completions", chat_body("Hello", max_tokens=4))
    assert r.status == 200, r


# ---- routes and models -------------------------------------------------------------------------------------------


def test_unknown_path_404_and_wrong_method_405(server):
    r = server.get("/v1/nothing")
    assert r.status == 404 and r.json()["error"]["type"] == "not_found_error", r
    r = server.get("/v1/chat/completions")
    assert r.status == 405, r
    assert r.json()["error"]["message"]
    r = server.request("DELETE", "/v1/models")
    assert r.status == 405, r
    r = server.post("/health", {})
    assert r.status == 405, r


def test_strict_model(start_server):
    s = start_server("--strict-model", "--model-id", "served-name", "--ctx", "4096")
    r = s.post("/v1/chat/completions", dict(chat_body(max_tokens=3), model="other"))
    assert r.status == 404, r
    assert r.json()["error"]["code"] == "model_not_found"
    r = s.post("/v1/messages", {"model": "other", "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]})
    assert r.status == 404 and r.json()["error"]["type"] == "not_found_error", r
    r = s.post("/v1/chat/completions", dict(chat_body(max_tokens=3), model="served-name"))
    assert r.status == 200 and r.json()["model"] == "served-name", r
    assert s.get("/v1/models/served-name").json()["id"] == "served-name"
    assert s.get("/v1/models/other").status == 404


def test_default_max_tokens_option(start_server):
    s = start_server("--max-tokens", "7", "--ctx", "4096", "--ignore-eos")
    b = chat_body()
    del b["max_tokens"]
    r = s.post("/v1/chat/completions", b)
    assert r.status == 200 and r.json()["usage"]["completion_tokens"] == 7, r


# ---- stopping ----------------------------------------------------------------------------------------------------


def test_sigint_finishes_the_stream(start_server):
    s = start_server("--ctx", "4096", "--ignore-eos")
    sock = open_raw(s, "/v1/chat/completions", chat_body("A long story.", max_tokens=400, stream=True), timeout=60)
    buf = read_events(sock, 3)
    s.signal(signal.SIGINT)
    while True:
        b = sock.recv(65536)
        if not b:
            break
        buf += b
        if buf.endswith(b"0\r\n\r\n"):
            break
    sock.close()
    text = buf.decode("utf-8", "replace")
    assert "data: [DONE]" in text, text[-500:]
    assert '"finish_reason":"length"' in text
    rc = s.proc.wait(30)
    assert rc == 0, s.stderr()
    assert "tern serve: stopped" in s.stderr()
    # new connections are no longer taken
    with pytest.raises(OSError):
        socket.create_connection((s.host, s.port), timeout=2).close()


def test_sigterm_idle_exits_zero(start_server):
    s = start_server("--ctx", "4096")
    assert s.get("/health").status == 200
    s.signal(signal.SIGTERM)
    assert s.proc.wait(20) == 0
    assert "tern serve: stopped" in s.stderr()


def test_error_answers_have_json_bodies(server):
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"):
        raw = raw_exchange(server, b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n{x}" % path.encode())
        assert status_of(raw) == 400, raw[:200]
        json.loads(body_of(raw))
