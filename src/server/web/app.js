// The chat page: conversations (store.js), the reply stream (api.js), messages (view.js).
import { ApiError, health, modelId, streamChat } from "./api.js";
import { Store, defaultSettings, titleOf } from "./store.js";
import { assistantView, userView } from "./view.js";
import { initSidebar } from "./sidebar.js";

const $ = (id) => document.getElementById(id);
const store = new Store();
const ui = {
  messages: $("messages"), welcome: $("welcome"), input: $("input"), send: $("send"), stop: $("stop"),
  title: $("title"), composer: $("composer"), file: $("file"), attachments: $("attachments"),
  status: $("status"), statusText: $("status-text"), settings: $("settings"), settingsToggle: $("settings-toggle"),
};
let conv = null;          // the open conversation (a draft until its first message)
let running = null;       // {controller, msg, view} while a reply streams
let pending = [];         // files attached to the next message: {name, text}
let healthTimer = null;

store.onError = (msg) => showStatus(msg);
const sidebar = initSidebar(store, { open: openConversation, fresh: newConversation, removed: onRemoved });

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
    openSettings(true, true);
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

function persist() {
  if (!conv.id) {
    const c = store.create();
    Object.assign(c, conv, { id: c.id });
    conv = c;
    store.current = c.id;
  }
  store.touch(conv);
  store.save();
  sidebar.render(conv.id);
}

// ---- messages ---------------------------------------------------------------------------------------------

function show() {
  ui.title.textContent = titleOf(conv);
  document.title = conv.messages.length ? titleOf(conv) + " · tern" : "tern";
  const views = conv.messages.map((m, i) => viewOf(m, i));
  ui.messages.replaceChildren(...(views.length ? views : [ui.welcome]));
  loadSettings();
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

function apiMessages(upto) {
  const out = [];
  if (conv.settings.system.trim()) out.push({ role: "system", content: conv.settings.system });
  for (const m of conv.messages.slice(0, upto)) {
    if (m.role === "user") out.push({ role: "user", content: compose(m.content, m.files || []) });
    else if (m.content || m.reasoning) {
      const a = { role: "assistant", content: m.content || "" };
      if (m.reasoning) a.reasoning_content = m.reasoning;
      out.push(a);
    }
  }
  return out;
}

function requestBody(upto) {
  const s = conv.settings;
  const body = { messages: apiMessages(upto), chat_template_kwargs: { enable_thinking: !!s.thinking } };
  if (s.temperature !== null) body.temperature = s.temperature;
  if (s.top_p !== null) body.top_p = s.top_p;
  if (s.max_tokens !== null) body.max_tokens = s.max_tokens;
  return body;
}

async function generate() {
  const msg = { role: "assistant", content: "", reasoning: "" };
  conv.messages.push(msg);
  persist();
  show();
  const view = ui.messages.lastElementChild;
  view.update(msg, true);
  const controller = new AbortController();
  running = { controller, msg, view };
  setBusy(true);
  let first = 0, last = 0, timer = null;
  const paint = () => {
    timer = null;
    view.update(msg, true);
    scrollDown(false);
  };
  try {
    const out = await streamChat(requestBody(conv.messages.length - 1), {
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
    persist();
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
  if (busy) ui.stop.focus({ preventScroll: true });
  else if (document.activeElement === ui.stop || document.activeElement === document.body) ui.input.focus();
}

function submit() {
  const text = ui.input.value.trim();
  if (running || (!text && !pending.length)) return;
  conv.messages.push({ role: "user", content: text, files: pending });
  pending = [];
  renderAttachments();
  ui.input.value = "";
  autosize();
  generate();
}

function regenerate() {
  if (running) return;
  while (conv.messages.length && conv.messages[conv.messages.length - 1].role === "assistant") conv.messages.pop();
  if (conv.messages.length) generate();
}

// Edit-and-resend: the message becomes an editor; saving drops what followed it and asks again.
function edit(i) {
  if (running) return;
  const m = conv.messages[i];
  const view = ui.messages.children[i];
  const form = document.createElement("form");
  form.className = "editor";
  const label = document.createElement("label");
  label.className = "visually-hidden";
  label.textContent = "Edit the message";
  const ta = document.createElement("textarea");
  ta.id = "edit-" + i;
  label.htmlFor = ta.id;
  ta.value = m.content;
  ta.rows = Math.min(12, m.content.split("\n").length + 1);
  const save = document.createElement("button");
  save.type = "submit";
  save.className = "primary small";
  save.textContent = "Send";
  const cancel = document.createElement("button");
  cancel.type = "button";
  cancel.className = "small";
  cancel.textContent = "Cancel";
  cancel.addEventListener("click", show);
  form.append(label, ta, save, cancel);
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    conv.messages = conv.messages.slice(0, i);
    conv.messages.push(Object.assign({}, m, { content: ta.value.trim() }));
    generate();
  });
  ta.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); form.requestSubmit(); }
    if (ev.key === "Escape") { ev.stopPropagation(); show(); }
  });
  view.replaceChildren(form);
  ta.focus();
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
  else if (!ui.settings.hidden) openSettings(false);
});

const MAX_FILE = 1 << 20;

async function attach(files) {
  for (const f of files) {
    if (f.size > MAX_FILE) { showStatus(f.name + " is larger than 1 MiB: attach a smaller text file."); continue; }
    const text = await f.text();
    if (text.includes("\u0000")) { showStatus(f.name + " is not a text file."); continue; }
    pending.push({ name: f.name, text });
  }
  renderAttachments();
  ui.input.focus();
}

function renderAttachments() {
  ui.attachments.replaceChildren(...pending.map((f, i) => {
    const li = document.createElement("li");
    li.className = "chip";
    li.append(document.createTextNode(f.name + " "));
    const rm = document.createElement("button");
    rm.type = "button";
    rm.className = "link";
    rm.textContent = "×";
    rm.setAttribute("aria-label", "Remove " + f.name);
    rm.addEventListener("click", () => { pending.splice(i, 1); renderAttachments(); ui.input.focus(); });
    li.append(rm);
    return li;
  }));
}

ui.file.addEventListener("change", () => { attach([...ui.file.files]); ui.file.value = ""; });
ui.composer.addEventListener("dragover", (ev) => ev.preventDefault());
ui.composer.addEventListener("drop", (ev) => { ev.preventDefault(); attach([...ev.dataTransfer.files]); });

// ---- settings and theme -----------------------------------------------------------------------------------

const FIELDS = [["temperature", "temperature"], ["top-p", "top_p"], ["max-tokens", "max_tokens"]];

function loadSettings() {
  const s = conv.settings;
  $("system").value = s.system;
  for (const [id, key] of FIELDS) $(id).value = s[key] === null ? "" : String(s[key]);
  $("thinking").checked = !!s.thinking;
  $("api-key").value = store.apiKey;
}

function readSetting(id, key) {
  const input = $(id);
  const v = input.value.trim() === "" ? null : Number(input.value);
  const ok = v === null || (Number.isFinite(v) && input.checkValidity());
  input.setAttribute("aria-invalid", ok ? "false" : "true");
  if (ok) conv.settings[key] = key === "max_tokens" && v !== null ? Math.round(v) : v;
}

function settingsChanged() {
  conv.settings.system = $("system").value;
  for (const [id, key] of FIELDS) readSetting(id, key);
  conv.settings.thinking = $("thinking").checked;
  if (conv.id) store.save();
}

for (const id of ["system", "temperature", "top-p", "max-tokens", "thinking"]) $(id).addEventListener("change", settingsChanged);
$("api-key").addEventListener("change", () => {
  store.apiKey = $("api-key").value.trim();
  clearStatus();
  loadModel();
});

function openSettings(open, focusKey) {
  ui.settings.hidden = !open;
  ui.settingsToggle.setAttribute("aria-expanded", String(open));
  if (open && focusKey) $("api-key").focus();
}

ui.settingsToggle.addEventListener("click", () => openSettings(ui.settings.hidden));
ui.settings.addEventListener("submit", (ev) => { ev.preventDefault(); settingsChanged(); openSettings(false); });

const dark = window.matchMedia("(prefers-color-scheme: dark)");
function theme() { return document.documentElement.dataset.theme || (dark.matches ? "dark" : "light"); }
function showTheme() { $("theme").setAttribute("aria-pressed", String(theme() === "dark")); }
$("theme").addEventListener("click", () => {
  const t = theme() === "dark" ? "light" : "dark";
  document.documentElement.dataset.theme = t;
  store.theme = t;
  showTheme();
});
dark.addEventListener("change", showTheme);
showTheme();

// ---- start ------------------------------------------------------------------------------------------------

const start = store.get(store.current);
if (start) { conv = start; show(); } else newConversation();
loadModel();
