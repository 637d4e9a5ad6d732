"""The prefix cache (docs/SERVER.md, "Conversations that continue"): a prompt resumes from the deepest checkpoint
that starts it, and what it then generates is byte for byte what a fresh server generates for the same prompt
(greedy). The server runs one slot, and an unrelated request comes between the turns, so a reused prefix can only
come from the cache, not from a live session. The cold reference is a server with the same options and the cache
off, and each of its answers is checked to have reused nothing."""
import subprocess
import time

import pytest

from helpers import REPO, Server, tern_bin

INTERVAL = 64
SERVER_ARGS = ["--ctx", "4096", "--slots", "1", "--cache-checkpoint-interval", str(INTERVAL)]

GENESIS = (
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; and darkness "
    "was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God said, Let there "
    "be light: and there was light. And God saw the light, that it was good: and God divided the light from the "
    "darkness. And God called the light Day, and the darkness he called Night. And the evening and the morning were "
    "the first day. And God said, Let there be a firmament in the midst of the waters, and let it divide the waters "
    "from the waters. And God made the firmament, and divided the waters which were under the firmament from the "
    "waters which were above the firmament: and it was so. And God called the firmament Heaven. And the evening and "
    "the morning were the second day. And God said, Let the waters under the heaven be gathered together unto one "
    "place, and let the dry land appear: and it was so.")
EXODUS = " And the LORD spake unto Moses, saying, Speak unto the children of Israel, that they bring me an offering."


@pytest.fixture(scope="module")
def cold():
    s = Server(SERVER_ARGS + ["--cache-ram", "0"])
    yield s
    s.assert_clean_stop()


def tokenize(text):
    out = subprocess.run([str(tern_bin()), "tokenize", text], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [int(t) for t in out.stdout.split()]


def post(server, path, body):
    r = server.post(path, body)
    assert r.status == 200, r
    return r.json()


def complete(server, prompt, **kw):
    return post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0, **kw})


def cached(r):
    return r["usage"]["prompt_tokens_details"]["cached_tokens"]


def something_else(server):
    """An unrelated request: the one slot now holds another conversation."""
    complete(server, "Blessed are the meek", max_tokens=2)


def restored(server):
    return server.metric("tern_prefix_cache_restored_tokens_total")


def cold_complete(cold, prompt, **kw):
    r = complete(cold, prompt, **kw)
    assert cached(r) == 0
    return r


# ---- completions: checkpoints at exact positions ------------------------------------------------------------


@pytest.mark.parametrize("cut, expect", [(100, 64), (128, 128), (127, 64)])
def test_divergence_between_checkpoints_resumes_from_the_last_before(server, cold, cut, expect):
    a = tokenize(GENESIS)
    assert len(a) > 2 * INTERVAL + 20
    complete(server, a)   # checkpoints every 64 tokens
    something_else(server)
    b = a[:cut] + tokenize(EXODUS)
    before = restored(server)
    warm = complete(server, b, max_tokens=24)
    assert cached(warm) == expect
    assert restored(server) - before == expect
    assert warm["choices"][0]["text"] == cold_complete(cold, b, max_tokens=24)["choices"][0]["text"]


def test_the_turn_after_max_tokens_resumes_after_the_generated_tokens(server, cold):
    p = tokenize(GENESIS[:200])
    r1 = complete(server, p, max_tokens=8)
    assert r1["choices"][0]["finish_reason"] == "length"
    something_else(server)
    ids = tokenize(GENESIS[:200] + r1["choices"][0]["text"] + EXODUS)
    assert ids[:len(p)] == p
    warm = complete(server, ids, max_tokens=24)
    assert cached(warm) == len(p) + 8, "the checkpoint after the generated turn"
    assert warm["choices"][0]["text"] == cold_complete(cold, ids, max_tokens=24)["choices"][0]["text"]


# ---- chat: message boundaries ---------------------------------------------------------------------------------


def chat(server, messages, **kw):
    return post(server, "/v1/chat/completions", {"messages": messages, "temperature": 0, "max_tokens": 40, **kw})


def said(r):
    m = r["choices"][0]["message"]
    return m.get("reasoning_content"), m.get("content")


def reply_of(r):
    m = r["choices"][0]["message"]
    out = {"role": "assistant", "content": m.get("content") or ""}
    if m.get("reasoning_content"):
        out["reasoning_content"] = m["reasoning_content"]
    return out


def stop_inside(r):
    """A stop string that the generation of r meets in its middle."""
    reasoning, content = said(r)
    text = (reasoning or "") + (content or "")
    assert len(text) > 20, r
    return text[len(text) // 2:len(text) // 2 + 3]


@pytest.mark.parametrize("ending", ["length", "stop"])
def test_turn_two_after_a_cut_turn_is_exact(server, cold, ending):
    turn1 = [{"role": "system", "content": "You tell fortunes of the sea."},
             {"role": "user", "content": f"A fortune about a ship ({ending})."}]
    if ending == "length":
        r1 = chat(server, turn1, max_tokens=12)
        assert r1["choices"][0]["finish_reason"] == "length"
    else:
        full = chat(server, turn1)
        r1 = chat(server, turn1, stop=[stop_inside(full)])
        assert r1["choices"][0]["finish_reason"] == "stop"
        assert r1["usage"]["completion_tokens"] < full["usage"]["completion_tokens"]
    something_else(server)
    turn2 = turn1 + [reply_of(r1), {"role": "user", "content": "Another one."}]
    before = restored(server)
    warm = chat(server, turn2)
    cold_r = chat(cold, turn2)
    assert cold_r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert cached(warm) > 0 and restored(server) - before == cached(warm)
    assert said(warm) == said(cold_r)


SYSTEM = ("You are a keeper of proverbs. " + GENESIS)


def test_conversations_sharing_a_system_prompt_both_hit_it(server):
    n_sys = len(tokenize(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"))
    assert n_sys > 2 * INTERVAL
    a = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Say something about the sea."}]
    b = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What of the stars?"}]
    a1 = chat(server, a)
    assert cached(a1) == 0
    b1 = chat(server, b)
    assert cached(b1) >= n_sys
    a2 = chat(server, a + [reply_of(a1), {"role": "user", "content": "And the wind?"}])
    b2 = chat(server, b + [reply_of(b1), {"role": "user", "content": "And the moon?"}])
    assert cached(a2) >= n_sys and cached(b2) >= n_sys


# ---- every API reports the reused tokens --------------------------------------------------------------------


def test_cached_tokens_on_every_api(server):
    """The same request twice: the second resumes from the checkpoint at the prompt's end (all but its last
    token; the live session holds the first answer too, so it cannot continue)."""
    msg = [{"role": "user", "content": "A proverb about bread, please."}]
    cases = [
        ("/v1/chat/completions", {"messages": msg, "max_tokens": 4},
         lambda u: (u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"])),
        ("/v1/completions", {"prompt": "A proverb about bread:", "max_tokens": 4},
         lambda u: (u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"])),
        ("/v1/responses", {"input": "A proverb about salt, please.", "max_output_tokens": 4},
         lambda u: (u["input_tokens"], u["input_tokens_details"]["cached_tokens"])),
        ("/v1/messages", {"model": "any", "messages": msg, "max_tokens": 4},
         lambda u: (u["input_tokens"] + u["cache_read_input_tokens"], u["cache_read_input_tokens"])),
    ]
    for path, body, usage in cases:
        body = {**body, "temperature": 0}
        first = usage(post(server, path, body)["usage"])
        total, n_cached = usage(post(server, path, body)["usage"])
        assert total == first[0]
        assert n_cached == total - 1, path


# ---- the budget and the options -----------------------------------------------------------------------------


def idle(s):
    """Waits until the scheduler is done with the request it just answered: the evictions a turn calls for run
    after its answer went out (docs/SERVER.md)."""
    deadline = time.monotonic() + 30
    while s.metric("tern_requests_generating") != 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_bytes_held_stay_within_the_budget(start_server):
    s = start_server("--cache-ram", "3M", "--cache-checkpoint-interval", "16")
    budget = s.metric("tern_prefix_cache_budget_bytes")
    assert budget == 3 << 20
    words = GENESIS.split()
    for i in range(6):
        complete(s, " ".join(words[i * 10:i * 10 + 40]), max_tokens=2)
        idle(s)
        assert 0 < s.metric("tern_prefix_cache_bytes") <= budget
    assert s.metric("tern_prefix_cache_evictions_total") > 0
    assert s.metric("tern_prefix_cache_checkpoints") >= 1


def test_the_ready_line_names_the_budgets(start_server):
    s = start_server("--cache-ram", "3M")
    assert "prefix cache 3 MiB in RAM\n" in s.stderr(), s.stderr()
    s = start_server("--cache-ram", "0")
    assert "prefix cache off\n" in s.stderr(), s.stderr()


def test_cache_off_keeps_nothing(start_server):
    s = start_server("--cache-ram", "0", "--slots", "1")
    complete(s, GENESIS[:300])
    something_else(s)
    assert cached(complete(s, GENESIS[:300])) == 0
    assert s.metric("tern_prefix_cache_checkpoints") == 0


@pytest.mark.parametrize("flag, value", [("--cache-ram", "lots"), ("--cache-ram", "-1G"),
                                         ("--cache-checkpoint-interval", "-5")])
def test_bad_cache_options_refused(flag, value):
    p = subprocess.run([str(tern_bin()), "serve", "--port", "0", flag, value], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], p.stderr



def test_cache_vram_refused_on_the_cpu():
    p = subprocess.run([str(tern_bin()), "serve", "--port", "0", "--cache-vram", "1G"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert "--cache-vram" in last and "CPU" in last, p.stderr


# ---- an agent's new message after a tool loop ---------------------------------------------------------------

AGENT = [{"role": "user", "content": "The build fails in the parser; find out why."},
         {"role": "assistant", "content": None,
          "tool_calls": [{"id": "call_1", "type": "function",
                          "function": {"name": "shell", "arguments": "{\"command\": \"make 2>&1 | tail\"}"}}]},
         {"role": "tool", "tool_call_id": "call_1", "content": "parser.c:41: error: 'n' undeclared"}]


@pytest.mark.parametrize("preserve", [False, True])
def test_a_new_message_after_a_tool_loop(start_server, preserve):
    """The chat template drops the reasoning of the turns before the newest user message, so a new message
    re-renders the tool loop before it and only the prefix up to that loop can be reused; with
    --preserve-thinking every turn renders as it did and the whole previous prompt is reused."""
    s = start_server("--slots", "1", *(["--preserve-thinking"] if preserve else []))
    first = chat(s, AGENT)
    n_first = first["usage"]["prompt_tokens"]
    something_else(s)
    second = chat(s, AGENT + [{"role": "assistant", "content": "A missing declaration."},
                              {"role": "user", "content": "Fix it, then."}])
    n_user = len(tokenize(f"<|im_start|>user\n{AGENT[0]['content']}<|im_end|>\n"))
    if preserve:
        assert cached(second) == n_first - 1
    else:
        assert n_user <= cached(second) < n_first - 8
