"""Helpers for the `tern serve` end-to-end tests (conftest.py holds the fixtures).

A `Server` runs `tern serve --port 0 ARGS` (the binary from $TERN_BIN, default build/tern, the repository root as
working directory), waits for GET /health to answer 200, and at its end sends SIGTERM and checks that the process
exits 0 within 20 s with no sanitizer report on its stderr (the suite also runs against the ASan build).
"""
import http.client
import json
import os
import re
import signal as _signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TERN_BIN = os.environ.get("TERN_BIN", "build/tern")
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")
ASAN = "asan" in TERN_BIN
STOP_TIMEOUT_S = 20


def tern_bin():
    p = Path(TERN_BIN)
    return p if p.is_absolute() else REPO / p


# ---- HTTP ------------------------------------------------------------------------------------------------------


class Resp:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return f"<HTTP {self.status} {self.body[:600]!r}>"


class Server:
    def __init__(self, args=(), env=None, ready_timeout=90):
        self.args = [str(a) for a in args]
        self.log = tempfile.NamedTemporaryFile(prefix="tern-serve-", suffix=".log", delete=False)
        self.cmd = [str(tern_bin()), "serve", "--port", "0", *self.args]
        self.proc = subprocess.Popen(self.cmd, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self.log, env=env)
        self.stopped = False
        self.rc = None
        deadline = time.monotonic() + ready_timeout
        self.host, self.port = None, None
        while time.monotonic() < deadline and self.port is None:
            m = re.search(r"listening on http://(\S+):(\d+)", self.stderr())
            if m:
                self.host, self.port = m.group(1), int(m.group(2))
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"tern serve exited {self.proc.returncode} at start: {self.stderr()}")
            time.sleep(0.02)
        if self.port is None:
            self.proc.kill()
            raise RuntimeError(f"tern serve did not print its address: {self.stderr()}")
        if self.host in ("0.0.0.0", "::", "[::]", "localhost"):
            self.host = "127.0.0.1"
        self.host = self.host.strip("[]")
        while time.monotonic() < deadline:
            try:
                st = self.get("/health", timeout=5).status
                # 200: ready. (With --api-key, /health may be refused: then the "ready" line tells; the hardening
                # tests check /health's own answer.)
                if st == 200 or (st == 401 and "tern serve: ready" in self.stderr()):
                    break
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"tern serve exited {self.proc.returncode} while loading: {self.stderr()}")
            time.sleep(0.05)
        else:
            self.proc.kill()
            raise RuntimeError(f"tern serve did not become ready: {self.stderr()}")

    # -- addresses
    @property
    def base(self):
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{h}:{self.port}"

    @property
    def v1(self):
        return self.base + "/v1"

    def stderr(self):
        with open(self.log.name, "rb") as f:
            return f.read().decode("utf-8", "replace")

    # -- plain requests (a new connection each)
    def request(self, method, path, body=None, headers=None, timeout=120):
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        hdrs = {"Content-Type": "application/json"} if body is not None else {}
        hdrs.update(headers or {})
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            c.request(method, path, body=body, headers=hdrs)
            r = c.getresponse()
            return Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        finally:
            c.close()

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body, **kw):
        return self.request("POST", path, body=body, **kw)

    def sse(self, path, body, headers=None, timeout=120):
        """POSTs a streaming request; returns (status, frames, raw text). frames: [(event or None, data str)]."""
        hdrs = {"Content-Type": "application/json"}
        hdrs.update(headers or {})
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            c.request("POST", path, body=json.dumps(body) if not isinstance(body, (str, bytes)) else body,
                      headers=hdrs)
            r = c.getresponse()
            raw = r.read().decode("utf-8")
            return r.status, parse_sse(raw), raw
        finally:
            c.close()

    def metrics(self):
        r = self.get("/metrics", timeout=30)
        assert r.status == 200, r
        return parse_metrics(r.body.decode())

    def metric(self, name, **labels):
        return self.metrics().get((name, tuple(sorted(labels.items()))), 0.0)

    # -- the end
    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self, sig=_signal.SIGTERM, timeout=STOP_TIMEOUT_S):
        """Signals the server (unless it already exited) and returns a list of problems (empty: clean)."""
        if self.stopped:
            return []
        self.stopped = True
        problems = []
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.rc = self.proc.wait()
            problems.append(f"tern serve did not exit within {timeout} s of SIGTERM")
        err = self.stderr()
        if self.rc != 0:
            problems.append(f"tern serve exited {self.rc}")
        for marker in SANITIZER_MARKERS:
            if marker in err:
                problems.append(f"sanitizer report ({marker!r})")
        if problems:
            problems.append(f"{' '.join(self.cmd)}\n--- stderr (last 6000 chars) ---\n{err[-6000:]}")
        try:
            os.unlink(self.log.name)
        except OSError:
            pass
        return problems

    def assert_clean_stop(self, **kw):
        problems = self.stop(**kw)
        assert not problems, "\n".join(problems)


def parse_sse(raw):
    frames = []
    for block in raw.replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        event, data = None, []
        for line in block.split("\n"):
            if line.startswith(":"):
                continue
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if event is not None or data:
            frames.append((event, "\n".join(data)))
    return frames


def parse_metrics(text):
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$", line)
        assert m, f"bad metrics line: {line!r}"
        labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m.group(3) or "")))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


def open_raw(server, path, body, headers=b"", timeout=30):
    """A POST of JSON `body` on a connection of its own, left open: the caller reads the answer from the socket
    (or leaves, to see what the server does). headers: more raw header lines, each ending in CRLF."""
    s = socket.create_connection((server.host, server.port), timeout=timeout)
    data = json.dumps(body).encode()
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s"
              % (path.encode(), headers, len(data), data))
    return s


def read_events(s, n):
    """Reads a streamed answer from socket s until it holds n SSE data lines; returns the bytes."""
    buf = b""
    while buf.count(b"data: ") < n:
        b = s.recv(65536)
        assert b, "the stream ended early: %r" % buf[-300:]
        buf += b
    return buf


def raw_exchange(server, data, timeout=10, shutdown_write=False):
    """Sends raw bytes on a new connection and reads until the server closes or `timeout` passes.
    Returns the bytes received (b"" when the connection was closed without an answer)."""
    s = socket.create_connection((server.host, server.port), timeout=timeout)
    try:
        s.sendall(data)
        if shutdown_write:
            s.shutdown(socket.SHUT_WR)
        return read_response(s, timeout)
    finally:
        s.close()


def read_response(s, timeout):
    """Reads from socket s until one whole response arrived, the server closed, or `timeout` passed."""
    buf = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            b = s.recv(65536)
        except (socket.timeout, ConnectionResetError):
            break
        if not b:
            break
        buf += b
        if response_complete(buf):
            break
    return buf


def response_complete(buf):
    """Whether buf holds one whole HTTP response (Content-Length framed)."""
    head, sep, body = buf.partition(b"\r\n\r\n")
    if not sep:
        return False
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return bool(m) and len(body) >= int(m.group(1))


def status_of(raw):
    m = re.match(rb"HTTP/1\.[01] (\d{3})", raw)
    return int(m.group(1)) if m else None


def body_of(raw):
    return raw.partition(b"\r\n\r\n")[2]


def chat_body(text="Tell me a fortune.", max_tokens=16, **kw):
    b = {"model": "tern-tiny", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
         "temperature": 0}
    b.update(kw)
    return b


def clean_env(**extra):
    """The environment without any client's API settings, plus extra."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENAI_", "CODEX_", "ANTHROPIC_", "CLAUDE_"))}
    env.update(extra)
    return env


def run_cli(argv, cwd, env, timeout):
    """Runs a client CLI; (exit code or "timeout", stdout, stderr)."""
    try:
        p = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        return "timeout", e.stdout or "", e.stderr or ""


def check_cli_turn(server, name, endpoint, rc, out, err):
    """The CLI exited 0 and the server answered its requests to `endpoint` with 200 only."""
    answers = {dict(k[1]).get("status"): v for k, v in server.metrics().items()
               if k[0] == "tern_requests_total" and dict(k[1]).get("endpoint") == endpoint}
    diag = (f"{name} exit {rc}\n--- {name} stdout ---\n{out[-4000:]}\n--- {name} stderr ---\n{err[-6000:]}\n"
            f"--- /{endpoint} answers by status: {answers}\n--- server stderr ---\n{server.stderr()[-4000:]}")
    assert rc == 0, diag
    assert answers.get("200", 0) >= 1, diag
    assert not any(s.startswith(("4", "5")) for s in answers), diag


def openai_client(server, **kw):
    import openai
    kw.setdefault("timeout", 120)
    kw.setdefault("max_retries", 0)
    return openai.OpenAI(base_url=server.v1, api_key=kw.pop("api_key", "sk-test"), **kw)


def anthropic_client(server, **kw):
    import anthropic
    kw.setdefault("timeout", 120)
    kw.setdefault("max_retries", 0)
    return anthropic.Anthropic(base_url=server.base, api_key=kw.pop("api_key", "sk-ant-test"), **kw)
