"""The chat page at / (src/server/web/, embedded in the binary): its files over HTTP, then the page itself in
headless Chromium (Selenium) against tern-tiny: a streamed reply, stop, conversations kept across a reload,
editing, markdown with highlighted code, model output that tries to run script, an API key, a busy and a gone
server, and the basics a page audit checks (console errors, labels, page weight, first paint). Saves screenshots of the
desktop and phone layouts to docs/img/ (WEBUI_SHOTS: another directory)."""
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest

from helpers import REPO, parse_metrics

# --ignore-eos: every reply runs to its max tokens (48 by default; the tests set more where a reply must last).
SERVER_ARGS = ["--ctx", "4096", "--seed", "5", "--ignore-eos", "--max-tokens", "48"]
WEB = REPO / "src/server/web"
SHOTS = Path(os.environ.get("WEBUI_SHOTS", REPO / "docs/img"))
TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
VENDOR = {"/vendor/marked.min.js": "/usr/share/javascript/marked/marked.min.js",
          "/vendor/highlight.min.js": "/usr/share/javascript/highlight.js/highlight.min.js"}
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def web_files():
    return sorted(p for p in WEB.iterdir() if p.is_file())


def url_of(p):
    return "/" if p.name == "index.html" else "/" + p.name


# ---- the files, over HTTP -----------------------------------------------------------------------------------


def test_page_files(server):
    files = web_files()
    assert any(p.name == "index.html" for p in files)
    for p in files:
        r = server.get(url_of(p))
        assert r.status == 200, (p, r)
        assert r.body == p.read_bytes(), f"{url_of(p)} is not {p} as built"
        assert r.headers["content-type"].startswith(TYPES[p.suffix]), (p, r.headers)
        assert r.headers.get("etag", "").startswith('"'), r.headers
        assert r.headers.get("cache-control") == "no-cache"
        again = server.get(url_of(p), headers={"If-None-Match": r.headers["etag"]})
        assert again.status == 304 and again.body == b"", again
    page = server.get("/")
    csp = page.headers.get("content-security-policy", "")
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp, csp
    head = server.request("HEAD", "/")
    assert head.status == 200 and head.body == b""
    assert server.post("/", {"x": 1}).status == 405
    assert server.get("/nothing.js").status == 404
    assert server.get("/v1/app.js").status == 404, "the page's files are not under /v1"
    assert server.metric("tern_requests_total", endpoint="web", status="200") >= len(files)


def test_vendor_libraries(server):
    for path, installed in VENDOR.items():
        r = server.get(path)
        assert r.status == 200 and r.headers["content-type"].startswith("text/javascript"), r
        if os.path.exists(installed):
            assert r.body == Path(installed).read_bytes()
            assert server.get(path, headers={"If-None-Match": r.headers["etag"]}).status == 304
        else:
            assert r.body.startswith(b"/*") and b"not installed" in r.body, r


def test_page_open_with_api_key(start_server):
    s = start_server("--api-key", "k-web", "--ctx", "4096")
    assert s.get("/").status == 200 and s.get("/app.js").status == 200, "the page loads before the key is given"
    assert s.get("/v1/models").status == 401
    assert s.get("/v1/models", headers={"Authorization": "Bearer k-web"}).status == 200


def test_no_webui(start_server):
    s = start_server("--no-webui", "--ctx", "4096")
    for p in web_files():
        assert s.get(url_of(p)).status == 404, url_of(p)
    assert s.get("/vendor/marked.min.js").status == 404
    assert s.get("/health").status == 200
    assert "chat page" not in s.stderr()


# ---- the page, in a browser -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("chromium and chromium-driver are not installed (scripts/install-deps.sh installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    o = webdriver.ChromeOptions()
    o.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,800",
              "--force-device-scale-factor=1", "--lang=en-US", "--no-first-run"):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=o)
    d.set_window_size(1280, 800)
    yield d
    d.quit()


class Page:
    def __init__(self, d, server):
        self.d, self.server = d, server

    def js(self, script, *args):
        return self.d.execute_script(script, *args)

    def until(self, what, fn, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = fn()
            if v:
                return v
            time.sleep(0.03)
        raise AssertionError(f"timed out waiting for {what}\n--- server stderr ---\n{self.server.stderr()[-3000:]}")

    def open(self, fresh=True):
        self.d.get(self.server.base + "/")
        if fresh:
            self.js("localStorage.clear()")
            self.d.get(self.server.base + "/")
        self.until("the page", lambda: self.js("return document.readyState") == "complete")

    def el(self, css):
        from selenium.webdriver.common.by import By
        return self.d.find_element(By.CSS_SELECTOR, css)

    def type(self, css, text):
        e = self.el(css)
        e.clear()
        e.send_keys(text)

    def setting(self, css, value):
        """Sets a field of the settings panel (opening it) and closes it."""
        from selenium.webdriver.common.keys import Keys
        if self.el("#settings").get_attribute("hidden") is not None:
            self.el("#settings-toggle").click()
        self.type(css, str(value))
        self.el(css).send_keys(Keys.TAB)
        self.el("#settings-toggle").click()

    def send(self, text):
        from selenium.webdriver.common.keys import Keys
        self.type("#input", text)
        self.el("#input").send_keys(Keys.ENTER)

    def reply_state(self):
        """(length of its reasoning and answer, streaming) of the last reply, or None."""
        return self.js("const a = [...document.querySelectorAll('.msg.assistant')].pop();"
                       "return a ? [a.querySelector('.reasoning-text').textContent.length + "
                       "a.querySelector('.body').textContent.length, a.classList.contains('streaming')] : null")

    def wait_reply_done(self, timeout=60):
        self.until("the reply to end", lambda: (s := self.reply_state()) is not None and not s[1], timeout)

    def messages(self):
        return self.js("return [...document.querySelectorAll('#messages .msg')].map(m => "
                       "[m.classList.contains('user') ? 'user' : 'assistant', m.textContent])")

    def conversations(self):
        return self.js("return [...document.querySelectorAll('#conv-list .open')].map(b => b.textContent)")

    def errors(self, allow=()):
        """Console entries at SEVERE since the last call, less those holding a string of allow."""
        logs = self.d.get_log("browser")
        return [e for e in logs if e["level"] == "SEVERE" and not any(a in e["message"] for a in allow)]


def prompt_tokens(p):
    meta = p.js("return [...document.querySelectorAll('.msg.assistant .meta')].pop().textContent")
    return int(re.search(r"prompt (\d+)", meta).group(1))


def test_chat(browser, server, tmp_path):
    p = Page(browser, server)
    p.open()
    assert p.js("return typeof marked") == ("object" if os.path.exists(VENDOR["/vendor/marked.min.js"]) else "undefined")
    assert p.js("return document.activeElement.id") in ("input", ""), "the message box is ready"

    # Shift+Enter is a new line, not a send
    from selenium.webdriver.common.keys import Keys
    p.el("#input").send_keys("one", Keys.SHIFT, Keys.ENTER, Keys.NULL, "two")
    assert p.js("return document.getElementById('input').value") == "one\ntwo" and p.messages() == []
    p.el("#input").clear()

    # a reply streams: its text grows while it is marked as streaming
    p.setting("#max-tokens", 400)
    p.send("Tell me a fortune")
    lengths = []
    p.until("the reply to start", lambda: p.reply_state() is not None)
    while (s := p.reply_state())[1]:
        lengths.append(s[0])
        time.sleep(0.03)
    # (markdown rendered as it comes need not grow at every step: "**b" shows two characters more than "**b**")
    assert len(set(lengths)) >= 3 and lengths[-1] > lengths[0], f"the reply did not stream: lengths {lengths}"
    meta = p.el(".msg.assistant .meta").text
    assert "400 tokens" in meta and "tokens/s" in meta and "prompt" in meta and "cached" in meta, meta
    assert " length, prompt " in server.stderr() and "completion 400" in server.stderr(), "max tokens reached the server"
    assert p.el(".msg.assistant .reasoning").get_attribute("hidden") is None, "the reasoning is shown apart"
    assert p.js("return document.querySelector('.msg.assistant .reasoning').open") is False, "collapsed when done"

    # stop: Esc aborts the stream and the server stops generating
    before = server.metric("tern_requests_total", endpoint="chat", status="499")
    p.setting("#max-tokens", 100000)
    p.send("Tell me a long story")
    p.until("the long reply to stream", lambda: (s := p.reply_state()) and s[1] and s[0] > 40)
    assert server.metric("tern_requests_generating") == 1
    p.d.switch_to.active_element.send_keys(Keys.ESCAPE)
    p.until("the reply to stop", lambda: not p.reply_state()[1], timeout=10)
    p.until("the server to stop generating", lambda: server.metric("tern_requests_generating") == 0, timeout=10)
    assert server.metric("tern_requests_total", endpoint="chat", status="499") == before + 1
    stopped = p.reply_state()[0]
    time.sleep(0.3)
    assert p.reply_state()[0] == stopped, "the stopped reply still grows"
    assert "stopped" in p.js("return [...document.querySelectorAll('.msg.assistant .meta')].pop().textContent")

    # a second conversation; edit-and-resend and regenerate in it
    p.el("#new-chat").click()
    assert p.messages() == []
    p.send("Hello there")
    p.wait_reply_done()
    p.el(".msg.user button").click()     # Edit
    p.type(".msg.user textarea", "Hello again")
    p.el(".msg.user textarea").send_keys(Keys.ENTER)
    p.wait_reply_done()
    msgs = p.messages()
    assert [m[0] for m in msgs] == ["user", "assistant"] and msgs[0][1].startswith("Hello again"), msgs
    answered = server.metric("tern_requests_total", endpoint="chat", status="200")
    p.js("[...document.querySelectorAll('.msg.assistant button')].find(b => b.textContent == 'Regenerate').click()")
    p.wait_reply_done()
    assert [m[0] for m in p.messages()] == ["user", "assistant"]
    assert server.metric("tern_requests_total", endpoint="chat", status="200") == answered + 1
    assert "completion 48" in server.stderr()

    # a text file attached as context
    before = prompt_tokens(p)
    notes = tmp_path / "notes.txt"
    notes.write_text(" ".join(f"item{i}" for i in range(80)) + "\n")
    p.el("#file").send_keys(str(notes))
    p.until("the attached file", lambda: "notes.txt" in p.el("#attachments").text)
    p.send("What do the notes say?")
    p.wait_reply_done()
    assert p.el("#attachments").text == ""
    assert "notes.txt" in p.js("return [...document.querySelectorAll('.msg.user .files')].pop().textContent")
    assert prompt_tokens(p) >= before + 80, "the file's text did not reach the prompt"

    # reload: both conversations are there, with their messages
    p.d.refresh()
    p.until("the list", lambda: len(p.conversations()) == 2)
    assert p.conversations() == ["Hello again", "Tell me a fortune"], p.conversations()
    assert p.messages()[0][1].startswith("Hello again") and len(p.messages()) == 4, "the open conversation returns"
    p.js("[...document.querySelectorAll('#conv-list .open')].find(b => b.textContent == 'Tell me a fortune').click()")
    msgs = p.messages()
    assert [m[0] for m in msgs] == ["user", "assistant", "user", "assistant"], msgs
    assert "stopped" in msgs[3][1]

    # rename, search, delete
    p.el("#conv-list .conv:not(.active) button[aria-label^='Rename']").click()
    p.d.switch_to.active_element.send_keys(Keys.CONTROL, "a")
    p.d.switch_to.active_element.send_keys("Second", Keys.ENTER)
    assert sorted(p.conversations()) == ["Second", "Tell me a fortune"]
    p.type("#search", "secon")
    assert p.conversations() == ["Second"]
    p.type("#search", "story")            # message text matches too
    assert p.conversations() == ["Tell me a fortune"]
    p.el("#search").clear()
    p.el("#search").send_keys(" ")
    delete = "#conv-list button[aria-label='Delete Second']"
    p.el(delete).click()
    assert len(p.conversations()) == 2, "one click only arms the delete"
    p.el("#conv-list .conv:not(.active) button.armed").click()
    assert p.conversations() == ["Tell me a fortune"]
    p.d.refresh()
    p.until("the list", lambda: p.conversations() == ["Tell me a fortune"])

    # a conversation's own system prompt and thinking switch; an out-of-range setting is refused
    p.el("#new-chat").click()
    p.setting("#temperature", 5)
    assert p.el("#temperature").get_attribute("aria-invalid") == "true"
    p.setting("#temperature", 0.7)
    assert p.el("#temperature").get_attribute("aria-invalid") == "false"
    p.setting("#system", " ".join(f"rule{i}" for i in range(60)))
    p.el("#settings-toggle").click()
    p.el("#thinking").click()
    p.el("#settings-toggle").click()
    p.send("Hi")
    p.wait_reply_done()
    assert prompt_tokens(p) >= 60, "the system prompt did not reach the prompt"
    assert p.el(".msg.assistant .reasoning").get_attribute("hidden") is not None, "thinking was off"
    saved = p.js("return JSON.parse(localStorage.getItem('tern.conversations'))[0].settings")
    assert saved["temperature"] == 0.7 and saved["thinking"] is False and saved["system"].startswith("rule0"), saved
    assert p.errors() == []


HOSTILE = ("<script>window.__pwned=1</script>\n\n<img src=x onerror=\"window.__pwned=2\">\n\n"
           "[a link](javascript:window.__pwned=3) and <a href=\"javascript:window.__pwned=4\">another</a>\n\n"
           "![image](x onerror=window.__pwned=5)")
ANSWER = ("Here is a small function:\n\n```python\ndef greet(name: str) -> str:\n    # a friendly greeting\n"
          "    return f\"Hello, {name}!\"\n```\n\nCall it as `greet(\"world\")`, which returns **Hello, world!**\n\n"
          "- works with any string\n- needs no imports\n")


def conversation(cid, updated, user, answer, reasoning, tool_calls=()):
    return {"id": cid, "title": "", "created": updated, "updated": updated,
            "settings": {"system": "", "temperature": None, "top_p": None, "max_tokens": None, "thinking": True},
            "messages": [{"role": "user", "content": user, "files": []},
                         {"role": "assistant", "reasoning": reasoning, "content": answer, "finish": "stop", "tps": 152.4,
                          "tool_calls": list(tool_calls),
                          "usage": {"prompt_tokens": 31, "completion_tokens": 64,
                                    "prompt_tokens_details": {"cached_tokens": 12}}}]}


# Stored conversations, rendered by the page's own path: localStorage, then a load.
STORED = [
    conversation("demo", 3, "Write a Python function that greets someone.", ANSWER,
                 "A one-line function is enough; show how to call it."),
    conversation("hostile", 2, "Show me some HTML <img src=x onerror=\"window.__pwned=7\">", ANSWER + HOSTILE,
                 "Some reasoning. <script>window.__pwned=6</script>",
                 [{"name": "get_weather", "arguments": '{"city": "Paris <script>window.__pwned=8</script>"}'}]),
    conversation("fortune", 1, "Tell me a fortune", "You will be hungry again in one hour.", "A short fortune."),
]


def load_stored(p, current, theme=None):
    p.js("localStorage.setItem('tern.conversations', arguments[0]); localStorage.setItem('tern.current', arguments[1]);"
         "if (arguments[2]) localStorage.setItem('tern.theme', arguments[2])", json.dumps(STORED), current, theme)
    p.d.refresh()
    p.until("the stored reply", lambda: p.js("return document.querySelectorAll('.msg.assistant').length") == 1)


def test_markdown_and_hostile_output(browser, server):
    """A stored conversation renders through the page's own path (localStorage, then a reload)."""
    p = Page(browser, server)
    p.open()
    load_stored(p, "hostile")
    time.sleep(0.3)   # an image's onerror would have run by now
    assert p.js("return window.__pwned") is None, "model output ran script"
    found = p.js("""const m = document.getElementById('messages');
        return {scripts: m.querySelectorAll('script').length, imgs: m.querySelectorAll('img').length,
                handlers: [...m.querySelectorAll('*')].flatMap(e => [...e.attributes].map(a => a.name))
                          .filter(n => n.startsWith('on')),
                hrefs: [...m.querySelectorAll('a[href]')].map(a => a.getAttribute('href')),
                text: m.textContent}""")
    assert found["scripts"] == 0 and found["imgs"] == 0 and found["handlers"] == [], found
    assert not any(h.lower().startswith("javascript:") for h in found["hrefs"]), found["hrefs"]
    assert "<script>window.__pwned=1</script>" in found["text"], "raw HTML is shown as text"
    call = p.el(".msg.assistant .toolcall")
    assert p.el(".toolcall summary").text == "Tool call: get_weather" and '"city": "Paris <script>' in call.text
    code = p.el(".codeblock pre code")
    assert "def greet(name: str) -> str:" in code.text
    assert p.el(".codeblock .codebar").text.startswith("python")
    assert p.js("return !!document.querySelector('.msg.assistant .body strong')"), "markdown rendered"
    if os.path.exists(VENDOR["/vendor/highlight.min.js"]):
        assert p.js("return arguments[0].querySelectorAll('span[class^=hljs-]').length", code) >= 3, "not highlighted"
    p.d.execute_cdp_cmd("Browser.grantPermissions", {"origin": server.base,
                                                     "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]})
    p.js("[...document.querySelectorAll('.codebar button')][0].click()")
    copied = p.d.execute_async_script("navigator.clipboard.readText().then(arguments[0], e => arguments[0]('ERR ' + e))")
    assert copied.startswith("def greet(name: str)") and "```" not in copied, copied
    meta = p.el(".msg.assistant .meta").text
    assert meta == "64 tokens · 152.4 tokens/s · prompt 31 (12 cached)", meta

    # without the Debian libraries: the plain renderer, fenced code still a code block, HTML still text
    p.js("window.marked = undefined; window.hljs = undefined")
    for title in ("Tell me a fortune", "Show me some HTML"):
        p.js("[...document.querySelectorAll('#conv-list .open')].find(b => b.textContent.startsWith(arguments[0]))"
             ".click()", title)
    time.sleep(0.3)
    plain = p.js("""const m = document.querySelector('.msg.assistant .body');
        return {code: (m.querySelector('.codeblock pre code') || {}).textContent, strong: !!m.querySelector('strong'),
                elements: [...m.querySelectorAll('*')].map(e => e.tagName.toLowerCase()), text: m.textContent}""")
    assert plain["code"].startswith("def greet(name: str)") and not plain["strong"], plain
    assert set(plain["elements"]) <= {"p", "div", "span", "button", "pre", "code"}, plain["elements"]
    assert "<img src=x onerror" in plain["text"] and p.js("return window.__pwned") is None
    assert p.errors() == []


def test_hostile_output_streamed(browser, server):
    """The same hostile text written by the model itself and streamed: a GBNF grammar, added to the page's own
    request, makes tern-tiny's answer that text (thinking off, so the grammar holds from the first token; the
    server's --ignore-eos lifted, which a grammar cannot be combined with)."""
    p = Page(browser, server)
    p.open()
    text = ("<script>window.__pwned=1</script>\n\n<img src=x onerror=\"window.__pwned=2\">\n\n"
            "[a link](javascript:window.__pwned=3)\n\n```html\n<b onmouseover=window.__pwned=4>x</b>\n```\n")
    p.js("""const grammar = arguments[0], real = window.fetch;
        window.fetch = (url, init) => {
          if (String(url).endsWith('chat/completions'))
            init = Object.assign({}, init, {body: JSON.stringify(Object.assign(JSON.parse(init.body), {grammar, ignore_eos: false}))});
          return real(url, init);
        };""", "root ::= " + json.dumps(text))
    p.setting("#max-tokens", 400)
    p.el("#settings-toggle").click()
    p.el("#thinking").click()
    p.el("#settings-toggle").click()
    p.send("Show me")
    p.wait_reply_done()
    time.sleep(0.3)   # an image's onerror would have run by now
    assert p.js("return window.__pwned") is None, "model output ran script"
    body = p.el(".msg.assistant .body")
    found = p.js("""const b = arguments[0];
        return {elements: [...b.querySelectorAll('script, img, iframe, object, embed')].length,
                handlers: [...b.querySelectorAll('*')].flatMap(e => [...e.attributes].map(a => a.name))
                          .filter(n => n.startsWith('on')),
                hrefs: [...b.querySelectorAll('a[href]')].map(a => a.getAttribute('href')),
                code: (b.querySelector('.codeblock pre code') || {}).textContent, text: b.textContent}""", body)
    assert found["elements"] == 0 and found["handlers"] == [], found
    assert not any(h.lower().startswith("javascript:") for h in found["hrefs"]), found["hrefs"]
    assert "<script>window.__pwned=1</script>" in found["text"] and '<img src=x onerror="window.__pwned=2">' in found["text"]
    assert found["code"].startswith("<b onmouseover=window.__pwned=4>x</b>"), found
    assert p.errors() == []


def test_layout_and_audit(browser, server):
    """Screenshots of both layouts, and the basics an audit checks: labels, names, alt text, page weight, first paint."""
    p = Page(browser, server)
    p.open()
    p.d.execute_cdp_cmd("Network.enable", {})
    p.d.execute_cdp_cmd("Network.setCacheDisabled", {"cacheDisabled": True})   # every file counted as loaded
    try:
        load_stored(p, "demo", "light")
    finally:
        p.d.execute_cdp_cmd("Network.setCacheDisabled", {"cacheDisabled": False})
    p.until("the model's name", lambda: p.el("#model").text)
    audit = p.js("""
        const named = (e) => (e.labels && e.labels.length) || e.getAttribute('aria-label') || e.getAttribute('aria-labelledby');
        return {
          unlabelled: [...document.querySelectorAll('input, textarea, select')].filter(e => !named(e)).map(e => e.outerHTML),
          nameless: [...document.querySelectorAll('button')].filter(b => !b.textContent.trim() && !b.getAttribute('aria-label'))
                       .map(b => b.outerHTML),
          noalt: [...document.querySelectorAll('img')].filter(i => !i.hasAttribute('alt')).map(i => i.outerHTML),
          lang: document.documentElement.lang,
          weight: performance.getEntriesByType('navigation').concat(performance.getEntriesByType('resource'))
                    .filter(r => new URL(r.name).origin === location.origin)
                    .filter(r => !/^\\/(vendor|v1)\\/|^\\/health$/.test(new URL(r.name).pathname))
                    .reduce((n, r) => n + r.decodedBodySize, 0),
          paint: (performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime,
        }""")
    assert audit["unlabelled"] == [] and audit["nameless"] == [] and audit["noalt"] == [], audit
    assert audit["lang"] == "en"
    own = sum(f.stat().st_size for f in web_files() if f.suffix != ".svg")   # the icon is no resource entry
    assert own <= audit["weight"] < 300_000, f"page weight {audit['weight']} bytes (its own files: {own})"
    # first paint under 200 ms on loopback: the best of up to three loads, so one stall of a busy machine is no failure
    inf = float("inf")
    paints = [audit["paint"] or inf]
    while not min(paints) < 200 and len(paints) < 3:
        p.d.refresh()
        p.until("the model's name", lambda: p.el("#model").text)
        paints.append(p.js("return (performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime") or inf)
    assert min(paints) < 200, f"first contentful paint {paints} ms"
    print(f"page weight {audit['weight']} bytes; first contentful paint {paints} ms")

    SHOTS.mkdir(parents=True, exist_ok=True)
    p.d.set_window_size(1280, 800)
    p.js("document.activeElement.blur()")
    p.d.save_screenshot(str(SHOTS / "webui-desktop.png"))
    p.d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                        {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True})
    try:
        load_stored(p, "hostile")     # its long unbroken lines too must wrap
        m = p.el("#messages")
        assert p.js("return arguments[0].scrollWidth - arguments[0].clientWidth", m) <= 0, "messages scroll sideways"
        load_stored(p, "demo")
        narrow = p.js("""const r = (id) => document.getElementById(id).getBoundingClientRect();
            return {overflow: document.documentElement.scrollWidth - innerWidth, input: r('input').right,
                    send: r('send').right, side: getComputedStyle(document.getElementById('sidebar')).visibility,
                    width: innerWidth}""")
        assert narrow["overflow"] <= 0 and narrow["send"] <= narrow["width"], narrow
        assert narrow["side"] == "hidden", "on a phone the list waits behind the menu"
        p.js("document.activeElement.blur()")
        p.d.save_screenshot(str(SHOTS / "webui-phone.png"))
        p.el("#menu").click()
        visibility = lambda: p.js("return getComputedStyle(document.getElementById('sidebar')).visibility")
        p.until("the list to open", lambda: visibility() == "visible")
        assert p.js("return document.activeElement.id") == "new-chat"
        from selenium.webdriver.common.keys import Keys
        p.d.switch_to.active_element.send_keys(Keys.ESCAPE)
        p.until("the list to close", lambda: visibility() == "hidden")
    finally:
        p.d.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    for shot in ("webui-desktop.png", "webui-phone.png"):
        assert (SHOTS / shot).stat().st_size < 150_000, shot

    # the theme toggle: dark, then kept across a reload
    p.el("#theme").click()
    assert p.js("return document.documentElement.dataset.theme") == "dark"
    p.d.refresh()
    assert p.js("return document.documentElement.dataset.theme") == "dark"
    assert p.el("#theme").get_attribute("aria-pressed") == "true"
    assert p.errors() == []


def test_api_key_busy_and_gone(browser, start_server):
    """The page asks for the key a server wants; says so when the server is busy (429) or gone."""
    s = start_server("--api-key", "k-web", "--ctx", "4096", "--max-seqs", "1", "--queue-limit", "0", "--ignore-eos",
                     "--max-tokens", "8")
    p = Page(browser, s)
    p.open()
    p.until("the key request", lambda: "API key" in p.el("#status-text").text)
    assert p.el("#settings").get_attribute("hidden") is None and p.js("return document.activeElement.id") == "api-key"
    p.type("#api-key", "k-web")
    from selenium.webdriver.common.keys import Keys
    p.el("#api-key").send_keys(Keys.TAB)
    p.until("the model's name", lambda: p.el("#model").text == "tern-tiny")
    assert p.el("#status").get_attribute("hidden") is not None, "the message cleared"
    p.send("Hi")
    p.wait_reply_done()
    assert "8 tokens" in p.el(".msg.assistant .meta").text

    # busy: another client holds the only slot and the queue is 0
    import http.client
    c = http.client.HTTPConnection(s.host, s.port, timeout=60)
    body = {"messages": [{"role": "user", "content": "Go on"}], "max_tokens": 3000, "stream": True}
    key = {"Authorization": "Bearer k-web"}
    c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=dict(key, **{"Content-Type": "application/json"}))
    assert c.getresponse().status == 200
    generating = lambda: parse_metrics(s.get("/metrics", headers=key).body.decode())[("tern_requests_generating", ())]
    p.until("the other client to generate", lambda: generating() == 1)
    p.send("Hi again")
    p.until("the busy message", lambda: "busy" in p.el("#status-text").text)
    c.close()
    p.until("the slot to free", lambda: generating() == 0, timeout=10)
    p.js("[...document.querySelectorAll('.msg.assistant button')].find(b => b.textContent == 'Regenerate').click()")
    p.wait_reply_done()
    assert "8 tokens" in [*p.messages()][-1][1]

    # gone
    assert s.stop() == []
    p.send("Anyone there?")
    p.until("the gone message", lambda: "gone" in p.el("#status-text").text)
    p.d.get("about:blank")
    assert p.errors(allow=("401", "429", "ERR_CONNECTION_REFUSED", "Failed to fetch")) == []
