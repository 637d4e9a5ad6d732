"""Model residency (docs/SERVER.md, "Loading and freeing the model"): --lazy-load starts without the model and the
first request loads it, once however many arrive together; --idle-unload frees it after the idle time and
POST /v1/models/unload at once (409 while a request uses it), and the process's resident memory drops by most of
the model's mapped weights; the next request loads it again and answers as before (greedy, plain and structured
output, compared with a server that loaded at start), and a prompt cached before the unload comes back from the
--cache-disk tier; a model whose weights fail to load leaves the server up, answering each request with a 500 in
its API's format."""
import json
import os
import resource
import shutil
import subprocess
import threading
import time

import pytest

from helpers import ASAN, REPO, chat_body, open_raw, read_events, tern_bin

MODEL = REPO / "models" / "tern-tiny"
WEIGHTS = os.path.getsize(MODEL / "model.safetensors")
PROMPT = "Tell me a fortune about the sea."
MAX_TOKENS = 24


def rss(server):
    with open(f"/proc/{server.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def health(server):
    r = server.get("/health")
    assert r.status == 200, r
    return r.json()


def answer(server, **kw):
    """The greedy chat answer (content, reasoning) and the response."""
    r = server.post("/v1/chat/completions", chat_body(PROMPT, max_tokens=MAX_TOKENS, **kw))
    assert r.status == 200, r
    m = r.json()["choices"][0]["message"]
    return (m["content"], m.get("reasoning_content")), r.json()


# structured output compiles against the model's vocabulary, read from its directory when it is not loaded
JSON_ANSWER = {"response_format": {"type": "json_object"}, "chat_template_kwargs": {"enable_thinking": False}}


def wait_metric(server, name, value, timeout=20):
    deadline = time.monotonic() + timeout
    while server.metric(name) != value:
        assert time.monotonic() < deadline, f"{name} stays {server.metric(name)}, expected {value}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def eager_answer():
    """What a server that loaded the model at start answers (greedy)."""
    from helpers import Server
    s = Server([])
    try:
        got, _ = answer(s)
        assert health(s) == {"status": "ok", "model": "loaded"}
        structured, _ = answer(s, **JSON_ANSWER)
    finally:
        s.assert_clean_stop()
    return got, structured


def test_lazy_load_starts_without_the_model(start_server, eager_answer):
    s = start_server("--lazy-load")
    assert health(s) == {"status": "ok", "model": "unloaded"}
    assert s.metric("tern_model_loaded") == 0 and s.metric("tern_model_loads_total") == 0
    models = s.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tern-tiny", "tern-tiny-fast"]
    # the tokenizer is there at start: counting tokens needs no model
    r = s.post("/v1/messages/count_tokens", {"model": "x", "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status == 200 and r.json()["input_tokens"] > 0, r
    assert health(s)["model"] == "unloaded"
    idle = rss(s)
    got, _ = answer(s)
    assert got == eager_answer[0], "the first request after a lazy start answers otherwise than an eager server"
    loaded = rss(s)
    assert loaded - idle > WEIGHTS / 2, f"RSS {idle} at start and {loaded} with the model: was it loaded at start?"
    assert health(s) == {"status": "ok", "model": "loaded"}
    assert s.metric("tern_model_loads_total") == 1 and s.metric("tern_model_loaded") == 1
    structured, _ = answer(s, **JSON_ANSWER)
    assert structured == eager_answer[1]
    json.loads(structured[0])


def test_concurrent_first_requests_load_once(start_server, eager_answer):
    s = start_server("--lazy-load")
    n = 6
    barrier = threading.Barrier(n)
    results = [None] * n

    def client(i):
        barrier.wait()
        try:
            if i % 2:
                status, frames, raw = s.sse("/v1/chat/completions",
                                            chat_body(PROMPT, max_tokens=MAX_TOKENS, stream=True))
                assert status == 200, raw[:300]
                text = reasoning = ""
                for _, data in frames:
                    if data != "[DONE]":
                        for c in json.loads(data)["choices"]:
                            text += c["delta"].get("content") or ""
                            reasoning += c["delta"].get("reasoning_content") or ""
                results[i] = (text, reasoning or None)
            else:
                results[i] = answer(s)[0]
        except Exception as e:  # noqa: BLE001 -- reported below
            results[i] = e

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(r == eager_answer[0] for r in results), results
    assert s.metric("tern_model_loads_total") == 1
    assert s.metric("tern_model_load_failures_total") == 0


def test_idle_unload_frees_memory_and_reloads(start_server, eager_answer):
    s = start_server("--idle-unload", "1")
    assert health(s)["model"] == "loaded"
    got, _ = answer(s)
    assert got == eager_answer[0]
    loaded = rss(s)
    # /health and /metrics, polled meanwhile, are no work: the model goes all the same
    wait_metric(s, "tern_model_unloads_total", 1)
    assert health(s) == {"status": "ok", "model": "unloaded"}
    assert s.metric("tern_model_loaded") == 0
    freed = rss(s)
    assert loaded - freed > WEIGHTS / 2, f"RSS {loaded} loaded, {freed} after the unload ({WEIGHTS} of weights)"
    assert "model unloaded (idle for 1 s): resident memory" in s.stderr()
    assert s.metric("process_resident_memory_bytes") < loaded - WEIGHTS / 2
    got, _ = answer(s)
    assert got == eager_answer[0], "the answer after a reload differs"
    assert s.metric("tern_model_loads_total") == 2


def test_disk_cache_outlives_the_unload(start_server, tmp_path):
    s = start_server("--slots", "1", "--cache-disk", str(tmp_path / "cache"))
    first, r1 = answer(s)
    assert r1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert s.metric("tern_prefix_cache_disk_writes_total") == 0
    _unload_when_idle(s)
    # the RAM tier went to disk
    assert s.metric("tern_prefix_cache_checkpoints") == 0
    assert s.metric("tern_prefix_cache_disk_writes_total") > 0
    assert s.metric("tern_prefix_cache_disk_checkpoints") > 0
    assert any((tmp_path / "cache").iterdir())
    again, r2 = answer(s)
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, r2["usage"]
    assert s.metric("tern_prefix_cache_disk_reads_total") > 0
    assert again == first
    assert s.metric("tern_model_loads_total") == 2


def _unload_when_idle(s, **kw):
    """POST /v1/models/unload once the last request's checkpoints are taken (until then: 409)."""
    deadline = time.monotonic() + 20
    while True:
        r = s.post("/v1/models/unload", {}, **kw)
        if r.status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert r.status == 200, r
    return r


def test_unload_endpoint(start_server):
    s = start_server("--api-key", "k", "--ignore-eos")
    key = {"Authorization": "Bearer k"}
    for hdrs in ({}, {"Authorization": "Bearer wrong"}):
        r = s.post("/v1/models/unload", {}, headers=hdrs)
        assert r.status == 401 and r.json()["error"]["code"] == "invalid_api_key", r
    assert s.get("/health").json()["model"] == "loaded"
    r = s.request("POST", "/v1/models/unload", headers=key)   # no body
    assert r.status == 200 and r.json() == {"id": "tern-tiny", "object": "model", "status": "unloaded"}, r
    assert s.get("/health").json()["model"] == "unloaded"
    assert s.post("/v1/models/unload", {"model": "tern-tiny"}, headers=key).status == 200   # already unloaded
    r = s.post("/v1/models/unload", {"model": 5}, headers=key)
    assert r.status == 400 and r.json()["error"]["param"] == "model", r
    assert s.post("/v1/models/unload", "[1]", headers=key).status == 400
    # a long stream holds the model: 409, in the OpenAI format
    sock = open_raw(s, "/v1/chat/completions", chat_body("Tell me a very long story.", max_tokens=8000, stream=True),
                    headers=b"Authorization: Bearer k\r\n")
    assert read_events(sock, 4).startswith(b"HTTP/1.1 200")
    assert s.get("/health").json()["model"] == "loaded"
    r = s.post("/v1/models/unload", {}, headers=key)
    assert r.status == 409, r
    err = r.json()["error"]
    assert err["code"] == "model_in_use" and err["type"] == "invalid_request_error" and err["message"], err
    assert s.get("/health").json()["model"] == "loaded"
    sock.close()   # the client leaves: its generation ends, then the model may go
    _unload_when_idle(s, headers=key)
    assert s.get("/health").json()["model"] == "unloaded"
    m = s.get("/metrics", headers=key)
    assert m.status == 200 and "tern_model_unloads_total 2" in m.body.decode()


def test_load_failure_keeps_the_server_up(start_server, tmp_path):
    d = tmp_path / "broken"
    d.mkdir()
    for f in MODEL.iterdir():
        if f.name != "model.safetensors":
            (d / f.name).symlink_to(f)
    (d / "model.safetensors").write_bytes((MODEL / "model.safetensors").read_bytes()[:4096])
    s = start_server("-m", str(d), "--lazy-load")
    assert health(s)["model"] == "unloaded"
    r = s.post("/v1/chat/completions", chat_body(PROMPT, max_tokens=4))
    assert r.status == 500, r
    err = r.json()["error"]
    assert err["type"] == "server_error" and "could not be loaded" in err["message"], err
    assert "model.safetensors" in err["message"], err
    # a stream learns it from the status too, before any event
    status, _, raw = s.sse("/v1/chat/completions", chat_body(PROMPT, max_tokens=4, stream=True))
    assert status == 500 and "could not be loaded" in raw, raw
    r = s.post("/v1/messages", {"model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status == 500 and r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error", r
    # each request tried again; the server is still up and says so
    assert s.metric("tern_model_load_failures_total") == 3
    assert s.metric("tern_model_loads_total") == 0
    assert health(s)["model"] == "unloaded"
    # the weights mended, the next request loads them
    (d / "model.safetensors").unlink()
    shutil.copyfile(MODEL / "model.safetensors", d / "model.safetensors")
    got, _ = answer(s)
    assert got[0] is not None
    assert health(s)["model"] == "loaded"


@pytest.mark.parametrize("args, msg", [
    (["--lazy-load", "--synth", "tiny", "--tokenizer", "models/tern-tiny"], "--lazy-load needs a model directory"),
    (["--idle-unload", "0"], "--idle-unload needs seconds"),
    (["--lazy-load", "-m", "/nonexistent-model"], "/nonexistent-model"),
])
def test_bad_residency_options(args, msg):
    p = subprocess.run([str(tern_bin()), "serve", "--port", "0", *args], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0 and msg in p.stderr, p.stderr


def vm_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def test_mlock_locks_the_weights(start_server):
    """--mlock: the model file's pages are locked in RAM once it is loaded (where the process may lock that much:
    tests/test_cli.c checks the refusal where it may not)."""
    if ASAN:
        pytest.skip("the sanitizers' runtime makes mlock do nothing")
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    cap_ipc_lock = (int(next(l for l in open("/proc/self/status") if l.startswith("CapEff:")).split()[1], 16) >> 14) & 1
    if not cap_ipc_lock and soft != resource.RLIM_INFINITY and soft < 2 * WEIGHTS:
        pytest.skip("this process may not lock the model's pages (RLIMIT_MEMLOCK); test_cli.c checks the refusal")
    s = start_server("--mlock")
    assert s.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2}).status == 200
    assert vm_kb(s.proc.pid, "VmLck") * 1024 >= WEIGHTS
    plain = start_server()
    assert vm_kb(plain.proc.pid, "VmLck") * 1024 < WEIGHTS
