// The chosen theme before the first paint (a blocking script of its own, since the page allows no inline one).
try {
  const t = localStorage.getItem("tern.theme");
  if (t === "light" || t === "dark") document.documentElement.dataset.theme = t;
} catch (e) { /* storage disabled: the system's theme */ }
