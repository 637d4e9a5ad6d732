// The list of conversations: search, open, rename, delete; on a narrow screen it slides over the page.
import { titleOf } from "./store.js";

const ICONS = {
  rename: "M4 20h4L19 9l-4-4L4 16zM13 7l4 4",
  delete: "M5 7h14M10 7V4h4v3M7 7l1 13h8l1-13",
};

function iconButton(kind, label, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = "icon small";
  b.setAttribute("aria-label", label);
  b.title = label;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("aria-hidden", "true");
  const path = document.createElementNS("http://www.w3.org/2000/svg", "path");
  path.setAttribute("d", ICONS[kind]);
  svg.append(path);
  b.append(svg);
  b.addEventListener("click", onClick);
  return b;
}

export function initSidebar(store, { open, fresh, removed }) {
  const list = document.getElementById("conv-list");
  const empty = document.getElementById("conv-empty");
  const search = document.getElementById("search");
  const menu = document.getElementById("menu");
  const scrim = document.getElementById("scrim");
  let active = "";

  const isOpen = () => document.body.classList.contains("side-open");
  const setOpen = (on) => {
    document.body.classList.toggle("side-open", on);
    menu.setAttribute("aria-expanded", String(on));
    scrim.hidden = !on;
    if (on) document.getElementById("new-chat").focus();
  };
  menu.addEventListener("click", () => setOpen(!isOpen()));
  scrim.addEventListener("click", () => setOpen(false));
  document.addEventListener("keydown", (ev) => {
    if (ev.key !== "Escape" || !isOpen()) return;
    setOpen(false);
    menu.focus();
  });
  document.getElementById("new-chat").addEventListener("click", () => { setOpen(false); fresh(); });
  search.addEventListener("input", () => render(active));

  function rename(c, li) {
    const input = document.createElement("input");
    input.type = "text";
    input.value = titleOf(c);
    input.setAttribute("aria-label", "New name for " + titleOf(c));
    let done = false;
    const finish = (keep) => {
      if (done) return;
      done = true;
      if (keep) {
        c.title = input.value.trim();
        store.save();
      }
      render(active);
      if (c.id === active) document.getElementById("title").textContent = titleOf(c);
    };
    input.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter") { ev.preventDefault(); finish(true); }
      if (ev.key === "Escape") { ev.stopPropagation(); finish(false); }
    });
    input.addEventListener("blur", () => finish(true));
    li.replaceChildren(input);
    input.focus();
    input.select();
  }

  // Deleting asks once more on the same button, for a few seconds.
  function remove(c, b) {
    if (b.dataset.armed) {
      store.remove(c.id);
      removed(c.id);
      render(active);
      search.focus();
      return;
    }
    b.dataset.armed = "1";
    b.classList.add("armed");
    b.setAttribute("aria-label", "Press again to delete " + titleOf(c));
    setTimeout(() => {
      delete b.dataset.armed;
      b.classList.remove("armed");
      b.setAttribute("aria-label", "Delete " + titleOf(c));
    }, 3000);
  }

  function render(id) {
    active = id || "";
    const items = store.search(search.value).map((c) => {
      const li = document.createElement("li");
      li.className = "conv" + (c.id === active ? " active" : "");
      const b = document.createElement("button");
      b.type = "button";
      b.className = "open";
      b.textContent = titleOf(c);
      if (c.id === active) b.setAttribute("aria-current", "true");
      b.addEventListener("click", () => { setOpen(false); open(c.id); });
      const del = iconButton("delete", "Delete " + titleOf(c), () => remove(c, del));
      li.append(b, iconButton("rename", "Rename " + titleOf(c), () => rename(c, li)), del);
      return li;
    });
    list.replaceChildren(...items);
    empty.hidden = items.length > 0;
    empty.textContent = search.value.trim() ? "No conversation matches." : "No conversations yet.";
  }

  return { render };
}
