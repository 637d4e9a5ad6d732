// Model output as markdown, safely: Debian's marked and highlight.js when the server found them installed
// (served under vendor/), else a plain renderer of paragraphs and fenced code. Model text can never run
// script: raw HTML in it is shown as text, links keep only web and mail addresses, images become links, and
// whatever markup results passes an allowlist of elements and attributes before it joins the page.

const ALLOWED = {
  P: [], BR: [], HR: [], H1: [], H2: [], H3: [], H4: [], H5: [], H6: [], STRONG: [], EM: [], DEL: [], B: [], I: [],
  CODE: ["class"], PRE: [], BLOCKQUOTE: [], UL: [], OL: ["start"], LI: [], A: ["href", "title"],
  TABLE: [], THEAD: [], TBODY: [], TR: [], TH: ["align"], TD: ["align"], SPAN: ["class"],
  INPUT: ["type", "checked", "disabled"],
};

export function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

export function safeHref(href) {
  try {
    const u = new URL(href, location.href);
    return ["http:", "https:", "mailto:"].includes(u.protocol) ? u.href : null;
  } catch (e) {
    return null;
  }
}

// Keeps only allowed elements (others give way to their children) and attributes.
function clean(node) {
  for (const el of [...node.children]) {
    clean(el);
    const allowed = ALLOWED[el.tagName];
    if (!allowed) {
      el.replaceWith(...el.childNodes);
      continue;
    }
    for (const a of [...el.attributes]) if (!allowed.includes(a.name)) el.removeAttribute(a.name);
    if (el.tagName === "A") {
      const href = safeHref(el.getAttribute("href") || "");
      if (href) {
        el.setAttribute("href", href);
        el.setAttribute("target", "_blank");
        el.setAttribute("rel", "noopener noreferrer");
      } else {
        el.removeAttribute("href");
      }
    }
    if (el.tagName === "INPUT" && (el.getAttribute("type") !== "checkbox" || !el.hasAttribute("disabled"))) el.remove();
  }
}

// Markup to nodes: parsed inert (a template runs no script and loads nothing), then cleaned.
export function sanitize(html) {
  const t = document.createElement("template");
  t.innerHTML = html;
  clean(t.content);
  return t.content;
}

let renderer = null;

function markedRenderer(m) {
  const r = new m.Renderer();
  r.html = (html) => escapeHtml(typeof html === "string" ? html : html.text);
  r.image = (href, title, text) => {
    const h = typeof href === "object" && href ? href.href : href;
    const alt = typeof href === "object" && href ? href.text : text;
    const url = safeHref(h || "");
    const label = escapeHtml("image: " + (alt || h || ""));
    return url ? `<a href="${escapeHtml(url)}">${label}</a>` : label;
  };
  return r;
}

function markdownHtml(text) {
  const m = window.marked;
  if (!m || typeof m.parse !== "function" || typeof m.Renderer !== "function") return null;
  if (!renderer) renderer = markedRenderer(m);
  return m.parse(text, { gfm: true, breaks: false, headerIds: false, mangle: false, renderer });
}

// Without marked: paragraphs as text, ``` fences as code blocks.
function plainNodes(text) {
  const frag = document.createDocumentFragment();
  const lines = text.split("\n");
  let para = [];
  const flush = () => {
    if (para.join("").trim()) {
      const p = document.createElement("p");
      p.textContent = para.join("\n").trim();
      frag.append(p);
    }
    para = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const fence = lines[i].match(/^\s*```\s*([\w+#.-]*)/);
    if (!fence) {
      if (lines[i].trim()) para.push(lines[i]);
      else flush();
      continue;
    }
    flush();
    const code = [];
    for (i++; i < lines.length && !/^\s*```\s*$/.test(lines[i]); i++) code.push(lines[i]);
    const pre = document.createElement("pre");
    const c = document.createElement("code");
    if (fence[1]) c.className = "language-" + fence[1];
    c.textContent = code.join("\n") + "\n";
    pre.append(c);
    frag.append(pre);
  }
  flush();
  return frag;
}

function highlight(code) {
  const h = window.hljs;
  if (!h || typeof h.highlightAuto !== "function") return;
  if (h.configure) h.configure({ hideUpgradeWarningAcceptNoSupportOrSecurityUpdates: true });
  const text = code.textContent;
  const m = /(?:^|\s)language-([\w+#.-]+)/.exec(code.className);
  const lang = m && h.getLanguage(m[1]) ? m[1] : null;
  if (!lang && text.length > 20000) return;
  let html;
  try {
    if (!lang) html = h.highlightAuto(text).value;
    else if (parseInt(h.versionString, 10) >= 11) html = h.highlight(text, { language: lang, ignoreIllegals: true }).value;
    else html = h.highlight(lang, text, true).value;
  } catch (e) {
    return;
  }
  code.replaceChildren(sanitize(html));
  code.classList.add("hljs");
}

async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
  const ta = document.createElement("textarea");
  ta.value = text;
  ta.setAttribute("aria-hidden", "true");
  ta.className = "offscreen";
  document.body.append(ta);
  ta.select();
  document.execCommand("copy");
  ta.remove();
}

export function copyButton(getText, label = "Copy") {
  const b = document.createElement("button");
  b.type = "button";
  b.className = "small";
  b.textContent = label;
  b.addEventListener("click", async () => {
    try {
      await copyText(getText());
      b.textContent = "Copied";
    } catch (e) {
      b.textContent = "Copy failed";
    }
    setTimeout(() => { b.textContent = label; }, 1500);
  });
  return b;
}

// Each code block in a frame with its language and a copy button.
function decorateCode(root, final) {
  for (const pre of root.querySelectorAll("pre")) {
    const code = pre.querySelector("code") || pre;
    const lang = (/(?:^|\s)language-([\w+#.-]+)/.exec(code.className) || [])[1] || "";
    if (final) highlight(code);
    const box = document.createElement("div");
    box.className = "codeblock";
    const bar = document.createElement("div");
    bar.className = "codebar";
    const name = document.createElement("span");
    name.textContent = lang || "code";
    bar.append(name, copyButton(() => code.textContent, "Copy code"));
    pre.replaceWith(box);
    box.append(bar, pre);
  }
}

// Replaces el's content with text rendered; final: the text is complete (code is highlighted then).
export function renderMarkdown(el, text, final) {
  const html = markdownHtml(text);
  const nodes = html === null ? plainNodes(text) : sanitize(html);
  const div = document.createElement("div");
  div.append(nodes);
  decorateCode(div, final);
  el.replaceChildren(...div.childNodes);
}
