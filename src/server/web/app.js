// The chat page: conversations (store.js, sidebar.js), the reply stream (api.js), messages (view.js),
// settings (settings.js) and attached files (attach.js).
import { ApiError, health, modelId, streamChat } from "./api.js";
import { Store, defaultSettings, titleOf } from "./store.js";
import { assistantView, editorView, userView } from "./view.js";
import { initSidebar } from "./sidebar.js";
import { initSettings } from "./settings.js";
import { initAttachments } from "./attach.js";

const $ = (id) => document.getElementById(id);
const store = new Store();
const ui = {
  messages: $("messages"), welcome: $("welcome"), input: $("input"), send: $("send"), stop: $("stop"),
  title: $("title"), composer: $("composer"), status: $("status"), statusText: $("status-text"),
};
let conv = null;          // the open conversation (a draft until its first message)
let running = null;       // {controller} while a reply streams
let healthTimer = null;

store.onError = (msg) => showStatus(msg);
const sidebar = initSidebar(store, { open: openConversation, fresh: newConversation, removed: onRemoved });
const settings = initSettings(store, {
  current: () => conv,
  saved: (c) => { if (c.id) store.save(); },
  keyChanged: () => { clearStatus(); loadModel(); },
});
const files = initAttachments({
  input: $("file"), list: $("attachments"), box: ui.composer, focus: () => ui.input.focus(), complain: showStatus,
});

// ---- status -----------------------------------------------------------------------------------------------

function showStatus(text) {
  ui.statusText.textContent = text;
  ui.status.hidden = false;
}

function clearStatus() {
  ui.status.hidden = true;
  ui.statusText.textContent = "";
}

$("status-close").addEventListener("click", clearStatus);

// Polls /health until the server is ready again, then clears the message.
function waitForServer() {
  if (healthTimer) return;
  healthTimer = setInterval(async () => {
    if ((await health()) !== 200) return;
    clearInterval(healthTimer);
    healthTimer = null;
    clearStatus();
    loadModel();
  }, 1000);
}

function explain(e) {
  switch (e.status) {
  case 0: waitForServer(); return "The server is gone: nothing answers at this address. Waiting for it to come back…";
  case 401:
    settings.open(true, true);
    return "The server asks for an API key: enter it under Settings (tern serve --api-key).";
  case 429: return "The server is busy: its queue is full. Try again in a moment.";
  case 503:
    waitForServer();
    return /loading/.test(e.message) ? "The model is still loading; the page will be ready when it is." : e.message;
  default: return "The server refused the request: " + e.message;
  }
}

async function loadModel() {
  const st = await health();
  if (st !== 200) {
    showStatus(explain(new ApiError(st, st === 503 ? "loading" : "")));
    return;
  }
  try {
    $("model").textContent = await modelId(store.apiKey);
  } catch (e) {
    showStatus(explain(e));
  }
}

// ---- conversations ----------------------------------------------------------------------------------------

function newConversation() {
  if (running) stop();
  conv = { id: "", title: "", created: Date.now(), updated: Date.now(), settings: defaultSettings(), messages: [] };
  store.current = "";
  show();
  ui.input.focus();
}

function openConversation(id) {
  const c = store.get(id);
  if (!c || c === conv) return;
  if (running) stop();
  conv = c;
  store.current = id;
  show();
}

function onRemoved(id) {
  if (conv && conv.id === id) newConversation();
}

// Saves conversation c, adding it to the list when it is the draft; returns what was saved.
function persist(c) {
  if (!c.id) {
    const saved = store.create();
    Object.assign(saved, c, { id: saved.id });
    if (conv === c) {
      conv = saved;
      store.current = saved.id;
    }
    c = saved;
  }
  store.touch(c);
  store.save();
  sidebar.render(conv.id);
  return c;
}

// ---- messages ---------------------------------------------------------------------------------------------

function show() {
  ui.title.textContent = titleOf(conv);
  document.title = conv.messages.length ? titleOf(conv) + " · tern" : "tern";
  const views = conv.messages.map((m, i) => viewOf(m, i));
  ui.messages.replaceChildren(...(views.length ? views : [ui.welcome]));
  settings.load(conv);
  sidebar.render(conv.id);
  scrollDown(true);
}

function viewOf(m, i) {
  const last = i === conv.messages.length - 1;
  if (m.role === "user") return userView(m, { onEdit: () => edit(i) });
  return assistantView(m, { onRegenerate: last ? regenerate : null });
}

function scrollDown(force) {
  const box = ui.messages;
  if (force || box.scrollHeight - box.scrollTop - box.clientHeight < 120) box.scrollTop = box.scrollHeight;
}

function compose(text, files) {
  const parts = files.map((f) => "File: " + f.name + "\n```\n" + f.text + "\n```");
  if (text) parts.push(text);
  return parts.join("\n\n");
}

function apiMessages(c, upto) {
  const out = [];
  if (c.settings.system.trim()) out.push({ role: "system", content: c.settings.system });
  for (const m of c.messages.slice(0, upto)) {
    if (m.role === "user") out.push({ role: "user", content: compose(m.content, m.files || []) });
    else if (m.content || m.reasoning) {
      const a = { role: "assistant", content: m.content || "" };
      if (m.reasoning) a.reasoning_content = m.reasoning;
      out.push(a);
    }
  }
  return out;
}

function requestBody(c, upto) {
  const s = c.settings;
  const body = { messages: apiMessages(c, upto), chat_template_kwargs: { enable_thinking: !!s.thinking } };
  if (s.temperature !== null) body.temperature = s.temperature;
  if (s.top_p !== null) body.top_p = s.top_p;
  if (s.max_tokens !== null) body.max_tokens = s.max_tokens;
  return body;
}

// Asks for the next reply of the open conversation, streaming it into its view. Opening another
// conversation stops it; it is saved into the one it belongs to.
async function generate() {
  const msg = { role: "assistant", content: "", reasoning: "" };
  conv.messages.push(msg);
  let c = persist(conv);
  show();
  const view = ui.messages.lastElementChild;
  view.update(msg, true);
  const controller = new AbortController();
  running = { controller };
  setBusy(true);
  let first = 0, last = 0, timer = null;
  const paint = () => {
    timer = null;
    view.update(msg, true);
    scrollDown(false);
  };
  try {
    const out = await streamChat(requestBody(c, c.messages.length - 1), {
      apiKey: store.apiKey, signal: controller.signal,
      onDelta: (d) => {
        last = performance.now();
        if (!first) first = last;
        if (d.reasoning_content) msg.reasoning += d.reasoning_content;
        if (d.content) msg.content += d.content;
        if (d.tool_calls) addToolCalls(msg, d.tool_calls);
        if (!timer) timer = setTimeout(paint, 40);
      },
    });
    msg.usage = out.usage;
    msg.finish = out.finish;
    const n = out.usage ? out.usage.completion_tokens : 0;
    if (n > 1 && last > first) msg.tps = (n - 1) / ((last - first) / 1000);
    clearStatus();
  } catch (e) {
    if (e.name === "AbortError") msg.stopped = true;
    else {
      msg.error = e.message;
      if (e instanceof ApiError) showStatus(explain(e));
    }
  } finally {
    clearTimeout(timer);
    running = null;
    setBusy(false);
    c = persist(c);
    view.update(msg, false);
    scrollDown(false);
  }
}

function addToolCalls(msg, calls) {
  msg.tool_calls = msg.tool_calls || [];
  for (const tc of calls) {
    const i = tc.index || 0;
    const slot = msg.tool_calls[i] || (msg.tool_calls[i] = { name: "", arguments: "" });
    if (tc.function && tc.function.name) slot.name = tc.function.name;
    if (tc.function && tc.function.arguments) slot.arguments += tc.function.arguments;
  }
}

function stop() {
  if (running) running.controller.abort();
}

function setBusy(busy) {
  ui.send.hidden = busy;
  ui.stop.hidden = !busy;
  if (!busy && (document.activeElement === ui.stop || document.activeElement === document.body)) ui.input.focus();
}

function submit() {
  const text = ui.input.value.trim();
  if (running || (!text && !files.count)) return;
  conv.messages.push({ role: "user", content: text, files: files.take() });
  ui.input.value = "";
  autosize();
  generate();
}

function regenerate() {
  if (running) return;
  while (conv.messages.length && conv.messages[conv.messages.length - 1].role === "assistant") conv.messages.pop();
  if (conv.messages.length) generate();
}

// Edit-and-resend: the message becomes an editor; sending drops what followed it and asks again.
function edit(i) {
  if (running) return;
  const m = conv.messages[i];
  const form = editorView(m, "edit-" + i, {
    onCancel: show,
    onSend: (text) => {
      conv.messages = conv.messages.slice(0, i);
      conv.messages.push(Object.assign({}, m, { content: text }));
      generate();
    },
  });
  ui.messages.children[i].replaceChildren(form);
  form.querySelector("textarea").focus();
}

// ---- composer ---------------------------------------------------------------------------------------------

function autosize() {
  ui.input.style.height = "auto";
  ui.input.style.height = Math.min(ui.input.scrollHeight + 2, window.innerHeight * 0.4) + "px";
}

ui.input.addEventListener("input", autosize);
ui.input.addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
    ev.preventDefault();
    submit();
  }
});
ui.composer.addEventListener("submit", (ev) => { ev.preventDefault(); submit(); });
ui.stop.addEventListener("click", stop);
document.addEventListener("keydown", (ev) => {
  if (ev.key !== "Escape") return;
  if (running) { ev.preventDefault(); stop(); }
  else if (settings.isOpen) settings.open(false);
});

// ---- start ------------------------------------------------------------------------------------------------

const start = store.get(store.current);
if (start) { conv = start; show(); } else newConversation();
loadModel();
