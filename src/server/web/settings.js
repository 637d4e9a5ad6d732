// The settings panel (a conversation's system prompt and sampling, this browser's API key) and the theme.

const $ = (id) => document.getElementById(id);
const FIELDS = [["temperature", "temperature"], ["top-p", "top_p"], ["max-tokens", "max_tokens"]];

// current(): the open conversation; saved(c): its settings changed; keyChanged(): a new API key.
export function initSettings(store, { current, saved, keyChanged }) {
  const panel = $("settings");
  const toggle = $("settings-toggle");

  function read(id, key, s) {
    const input = $(id);
    const v = input.value.trim() === "" ? null : Number(input.value);
    const ok = v === null || (Number.isFinite(v) && input.checkValidity());
    input.setAttribute("aria-invalid", ok ? "false" : "true");
    if (ok) s[key] = key === "max_tokens" && v !== null ? Math.round(v) : v;
  }

  function changed() {
    const c = current();
    c.settings.system = $("system").value;
    for (const [id, key] of FIELDS) read(id, key, c.settings);
    c.settings.thinking = $("thinking").checked;
    saved(c);
  }

  function open(on, focusKey) {
    panel.hidden = !on;
    toggle.setAttribute("aria-expanded", String(on));
    if (on && focusKey) $("api-key").focus();
  }

  for (const id of ["system", "temperature", "top-p", "max-tokens", "thinking"]) $(id).addEventListener("change", changed);
  $("api-key").addEventListener("change", () => {
    store.apiKey = $("api-key").value.trim();
    keyChanged();
  });
  toggle.addEventListener("click", () => open(panel.hidden));
  panel.addEventListener("submit", (ev) => { ev.preventDefault(); changed(); open(false); });

  const dark = window.matchMedia("(prefers-color-scheme: dark)");
  const theme = () => document.documentElement.dataset.theme || (dark.matches ? "dark" : "light");
  const showTheme = () => $("theme").setAttribute("aria-pressed", String(theme() === "dark"));
  $("theme").addEventListener("click", () => {
    const t = theme() === "dark" ? "light" : "dark";
    document.documentElement.dataset.theme = t;
    store.theme = t;
    showTheme();
  });
  dark.addEventListener("change", showTheme);
  showTheme();

  return {
    open,
    get isOpen() { return !panel.hidden; },
    // Shows conversation c's settings.
    load(c) {
      const s = c.settings;
      $("system").value = s.system;
      for (const [id, key] of FIELDS) $(id).value = s[key] === null ? "" : String(s[key]);
      for (const [id] of FIELDS) $(id).setAttribute("aria-invalid", "false");
      $("thinking").checked = !!s.thinking;
      $("api-key").value = store.apiKey;
    },
  };
}
