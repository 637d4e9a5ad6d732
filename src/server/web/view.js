// The DOM of one message. Everything the model or the user wrote enters as text (textContent), except an
// answer's markdown, which render.js sanitizes.
import { copyButton, renderMarkdown } from "./render.js";

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function button(label, onClick, cls = "small") {
  const b = el("button", cls, label);
  b.type = "button";
  b.addEventListener("click", onClick);
  return b;
}

export function userView(m, { onEdit }) {
  const art = el("article", "msg user");
  art.setAttribute("aria-label", "You");
  if (m.files && m.files.length) {
    const ul = el("ul", "files");
    ul.setAttribute("aria-label", "Attached files");
    for (const f of m.files) ul.append(el("li", "chip", f.name));
    art.append(ul);
  }
  art.append(el("div", "body plain", m.content));
  const actions = el("div", "actions");
  if (onEdit) actions.append(button("Edit", onEdit));
  actions.append(copyButton(() => m.content));
  art.append(actions);
  return art;
}

// A reply's view with update(m, final) to follow it as it streams.
export function assistantView(m, { onRegenerate }) {
  const art = el("article", "msg assistant");
  art.setAttribute("aria-label", "tern");
  const reasoning = el("details", "reasoning");
  const summary = el("summary", null, "Reasoning");
  const rtext = el("div", "reasoning-text plain");
  reasoning.append(summary, rtext);
  reasoning.hidden = true;
  let touched = false;   // the reader opened or closed it: leave it so
  summary.addEventListener("click", () => { touched = true; });
  const tools = el("div", "tools");
  const body = el("div", "body markdown");
  const error = el("p", "error");
  error.hidden = true;
  const meta = el("p", "meta");
  const actions = el("div", "actions");
  actions.append(copyButton(() => m.content));
  if (onRegenerate) actions.append(button("Regenerate", onRegenerate));
  art.append(reasoning, tools, body, error, meta, actions);
  let shown = { reasoning: null, content: null, tools: -1 };

  art.update = (msg, streaming) => {
    if (msg.reasoning !== shown.reasoning) {
      reasoning.hidden = !msg.reasoning;
      rtext.textContent = msg.reasoning || "";
    }
    if (!touched) reasoning.open = streaming && !msg.content;   // open while it is all there is
    summary.textContent = streaming && !msg.content && msg.reasoning ? "Reasoning…" : "Reasoning";
    const calls = msg.tool_calls || [];
    if (calls.length !== shown.tools || streaming) {
      tools.replaceChildren(...calls.map((c) => {
        const d = el("details", "toolcall");
        d.open = true;
        d.append(el("summary", null, "Tool call: " + (c.name || "…")), el("pre", "plain", prettyArgs(c.arguments)));
        return d;
      }));
    }
    if (msg.content !== shown.content || !streaming) renderMarkdown(body, msg.content || "", !streaming);
    art.classList.toggle("streaming", streaming);
    art.setAttribute("aria-busy", streaming ? "true" : "false");
    error.hidden = !msg.error;
    error.textContent = msg.error ? "Error: " + msg.error : "";
    meta.textContent = streaming ? "" : metaText(msg);
    actions.hidden = streaming;
    shown = { reasoning: msg.reasoning, content: msg.content, tools: calls.length };
  };
  art.update(m, false);
  return art;
}

function prettyArgs(args) {
  try {
    return JSON.stringify(JSON.parse(args), null, 2);
  } catch (e) {
    return args || "";
  }
}

function metaText(m) {
  const parts = [];
  const u = m.usage;
  if (u) {
    parts.push(u.completion_tokens + " tokens");
    if (m.tps) parts.push(m.tps.toFixed(1) + " tokens/s");
    const cached = u.prompt_tokens_details ? u.prompt_tokens_details.cached_tokens || 0 : 0;
    parts.push("prompt " + u.prompt_tokens + " (" + cached + " cached)");
  }
  if (m.finish === "length") parts.push("cut at max tokens");
  if (m.stopped) parts.push("stopped");
  return parts.join(" · ");
}

// A message of yours made editable: onSend(text) resends it, onCancel() puts it back.
export function editorView(m, id, { onSend, onCancel }) {
  const form = el("form", "editor");
  const label = el("label", "visually-hidden", "Edit the message");
  const ta = el("textarea");
  ta.id = id;
  label.htmlFor = id;
  ta.value = m.content;
  ta.rows = Math.min(12, m.content.split("\n").length + 1);
  const send = el("button", "primary small", "Send");
  send.type = "submit";
  form.append(label, ta, send, button("Cancel", onCancel));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    onSend(ta.value.trim());
  });
  ta.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); form.requestSubmit(); }
    if (ev.key === "Escape") { ev.stopPropagation(); onCancel(); }
  });
  return form;
}
