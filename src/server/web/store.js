// Conversations and preferences in this browser's localStorage.
//   tern.conversations  a JSON list: {id, title, created, updated, settings, messages}
//     settings  {system, temperature, top_p, max_tokens, thinking} (null: the server's default)
//     messages  {role: "user", content, files: [{name, text}]}
//               {role: "assistant", content, reasoning, tool_calls: [{name, arguments}], usage, tps, stopped, error}
//   tern.current        the open conversation's id
//   tern.apiKey, tern.theme

const KEY = "tern.conversations";

export function defaultSettings() {
  return { system: "", temperature: null, top_p: null, max_tokens: null, thinking: true };
}

function read(key, fallback) {
  try {
    const v = localStorage.getItem(key);
    return v === null ? fallback : v;
  } catch (e) {
    return fallback;
  }
}

function valid(c) {
  return c && typeof c.id === "string" && Array.isArray(c.messages);
}

export class Store {
  constructor() {
    let list = [];
    try {
      list = JSON.parse(read(KEY, "[]"));
    } catch (e) {
      list = [];
    }
    this.list = Array.isArray(list) ? list.filter(valid) : [];
    for (const c of this.list) {
      c.settings = Object.assign(defaultSettings(), c.settings || {});
      c.title = typeof c.title === "string" ? c.title : "";
    }
    this.onError = () => {};
  }

  // Writes everything; false when the browser's storage is full or off.
  save() {
    try {
      localStorage.setItem(KEY, JSON.stringify(this.list));
      return true;
    } catch (e) {
      this.onError("Could not save the conversations in this browser (" + e.name + ").");
      return false;
    }
  }

  get(id) {
    return this.list.find((c) => c.id === id) || null;
  }

  create() {
    const id = Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
    const now = Date.now();
    const c = { id, title: "", created: now, updated: now, settings: defaultSettings(), messages: [] };
    this.list.unshift(c);
    return c;
  }

  remove(id) {
    this.list = this.list.filter((c) => c.id !== id);
    this.save();
  }

  touch(c) {
    c.updated = Date.now();
    this.list = [c, ...this.list.filter((x) => x !== c)];
  }

  // Newest first; a query matches titles and message text, ignoring case.
  search(query) {
    const q = query.trim().toLowerCase();
    const list = [...this.list].sort((a, b) => b.updated - a.updated);
    if (!q) return list;
    return list.filter((c) => titleOf(c).toLowerCase().includes(q) ||
      c.messages.some((m) => typeof m.content === "string" && m.content.toLowerCase().includes(q)));
  }

  get current() { return read("tern.current", ""); }
  set current(id) { pref("tern.current", id); }
  get apiKey() { return read("tern.apiKey", ""); }
  set apiKey(k) { pref("tern.apiKey", k); }
  get theme() { return read("tern.theme", ""); }
  set theme(t) { pref("tern.theme", t); }
}

function pref(key, value) {
  try {
    if (value) localStorage.setItem(key, value);
    else localStorage.removeItem(key);
  } catch (e) { /* storage off: the preference lasts this page */ }
}

export function titleOf(c) {
  if (c.title) return c.title;
  const first = c.messages.find((m) => m.role === "user");
  const text = first ? (first.content || (first.files && first.files[0] && first.files[0].name) || "") : "";
  const line = text.trim().split("\n")[0];
  return line ? (line.length > 48 ? line.slice(0, 47) + "…" : line) : "New chat";
}
