// Text files attached to the next message (the clip button, or dropped on the message box).

const MAX_FILE = 1 << 20;

export function initAttachments({ input, list, box, focus, complain }) {
  let pending = [];

  function render() {
    list.replaceChildren(...pending.map((f, i) => {
      const li = document.createElement("li");
      li.className = "chip";
      li.append(document.createTextNode(f.name + " "));
      const rm = document.createElement("button");
      rm.type = "button";
      rm.className = "link";
      rm.textContent = "×";
      rm.setAttribute("aria-label", "Remove " + f.name);
      rm.addEventListener("click", () => { pending.splice(i, 1); render(); focus(); });
      li.append(rm);
      return li;
    }));
  }

  async function add(files) {
    for (const f of files) {
      if (f.size > MAX_FILE) { complain(f.name + " is larger than 1 MiB: attach a smaller text file."); continue; }
      const text = await f.text();
      if (text.includes("\u0000")) { complain(f.name + " is not a text file."); continue; }
      pending.push({ name: f.name, text });
    }
    render();
    focus();
  }

  input.addEventListener("change", () => { add([...input.files]); input.value = ""; });
  box.addEventListener("dragover", (ev) => ev.preventDefault());
  box.addEventListener("drop", (ev) => { ev.preventDefault(); add([...ev.dataTransfer.files]); });

  return {
    get count() { return pending.length; },
    // The files, handed over and cleared.
    take() {
      const f = pending;
      pending = [];
      render();
      return f;
    },
  };
}
