"""Speculative decoding with the MTP head in tern serve (`--mtp N`, the `mtp` request field): greedy replies are the
ones a server without drafts gives, alone, while other requests generate (the scheduler then steps them together
without drafts), and in a continued conversation (the prefix cache); a bad depth gets a 400 naming the field."""
import threading

import pytest

from helpers import Server, chat_body

SERVER_ARGS = ["--ctx", "4096", "--mtp", "3"]
PROMPTS = ["Tell me a fortune.", "Quote a verse about light.", "What did Moses say unto the people?"]


@pytest.fixture(scope="module")
def plain():
    s = Server(["--ctx", "4096"])
    yield s
    s.assert_clean_stop()


def strip(j):
    """A response without what differs between two responses to one request (ids, times, usage)."""
    if isinstance(j, dict):
        return {k: strip(v) for k, v in j.items() if k not in ("id", "created", "created_at", "usage")}
    return [strip(v) for v in j] if isinstance(j, list) else j


def reply(server, body):
    r = server.post("/v1/chat/completions", body)
    assert r.status == 200, r
    m = r.json()["choices"][0]
    return m["message"].get("content"), m["message"].get("reasoning_content"), m["finish_reason"]


def test_same_replies_as_without_drafts(server, plain):
    drafted = server.metric("tern_mtp_drafted_tokens_total")
    for text in PROMPTS:
        for n in (1, 5, 60):
            body = chat_body(text, max_tokens=n)
            assert reply(server, body) == reply(plain, body), (text, n)
    body = chat_body(PROMPTS[0], max_tokens=80, stop=["the", "."])
    assert reply(server, body) == reply(plain, body)
    assert server.metric("tern_mtp_drafted_tokens_total") > drafted
    assert 0 < server.metric("tern_mtp_accepted_tokens_total") <= server.metric("tern_mtp_drafted_tokens_total")
    assert plain.metric("tern_mtp_drafted_tokens_total") == 0


def test_request_field(server, plain):
    body = chat_body(PROMPTS[1], max_tokens=60)
    want = reply(plain, body)
    assert reply(plain, dict(body, mtp=2)) == want
    assert reply(server, dict(body, mtp=0)) == want
    drafted = plain.metric("tern_mtp_drafted_tokens_total")
    assert reply(plain, dict(body, mtp="auto")) == want
    assert plain.metric("tern_mtp_drafted_tokens_total") > drafted, "mtp auto tried no drafts"
    for path, b in (("/v1/completions", {"prompt": "And God said,", "max_tokens": 24, "temperature": 0}),
                    ("/v1/messages", {"model": "tern-tiny", "max_tokens": 24, "temperature": 0,
                                      "messages": [{"role": "user", "content": PROMPTS[0]}]}),
                    ("/v1/responses", {"input": PROMPTS[0], "max_output_tokens": 24, "temperature": 0})):
        a, b2 = plain.post(path, b), plain.post(path, dict(b, mtp=3))
        assert a.status == 200 and b2.status == 200, (path, a, b2)
        assert strip(a.json()) == strip(b2.json()), path


@pytest.mark.parametrize("value", [4, -1, "2", 1.5, True, "Auto"])
def test_bad_depth(server, value):
    r = server.post("/v1/chat/completions", chat_body(mtp=value))
    assert r.status == 400, r
    err = r.json()["error"]
    assert err["param"] == "mtp" and "mtp" in err["message"], err
    if isinstance(value, str):
        assert '"auto"' in err["message"], err


def test_together_same_as_alone(server, plain):
    bodies = [chat_body(t, max_tokens=48) for t in PROMPTS]
    want = [reply(plain, b) for b in bodies]
    got = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def run(i):
        barrier.wait()
        got[i] = reply(server, bodies[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert got == want


def test_continued_conversation(server, plain):
    msgs = [{"role": "user", "content": PROMPTS[2]}]
    first = server.post("/v1/chat/completions", dict(chat_body(max_tokens=40), messages=msgs))
    assert first.status == 200, first
    msgs += [first.json()["choices"][0]["message"], {"role": "user", "content": "And then?"}]
    body = dict(chat_body(max_tokens=40), messages=msgs)
    second = server.post("/v1/chat/completions", body)
    assert second.status == 200, second
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert reply(server, body) == reply(plain, body)


def test_refused_on_the_gpu(start_server):
    with pytest.raises(RuntimeError, match="does not run on the GPU yet"):
        start_server("--mtp", "1", "--device", "cuda")


def test_grammar_with_drafts(server, plain):
    body = chat_body("Give me a JSON object about bread.", max_tokens=60, response_format={"type": "json_object"},
                     chat_template_kwargs={"enable_thinking": False})
    drafted = server.metric("tern_mtp_drafted_tokens_total")
    assert reply(server, body) == reply(plain, body)
    assert server.metric("tern_mtp_drafted_tokens_total") > drafted


def test_lazy_load(start_server, plain):
    lazy = start_server("--ctx", "4096", "--mtp", "2", "--lazy-load")
    body = chat_body(PROMPTS[0], max_tokens=40)
    want = reply(plain, body)
    assert reply(lazy, body) == want
    assert lazy.post("/v1/models/unload", {}).status == 200
    assert reply(lazy, dict(body, mtp=1)) == want
    assert lazy.metric("tern_mtp_drafted_tokens_total") > 0
