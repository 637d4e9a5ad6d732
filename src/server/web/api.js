// The server's own API: /v1/chat/completions streamed as server-sent events, /v1/models and /health.
// Paths are relative, so the page also works behind a proxy that serves tern under a prefix.

export class ApiError extends Error {
  // status: the HTTP status, or 0 when the server could not be reached.
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function headers(apiKey, json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  if (apiKey) h["Authorization"] = "Bearer " + apiKey;
  return h;
}

async function errorOf(resp) {
  let msg = resp.statusText || "HTTP " + resp.status;
  try {
    const j = await resp.json();
    if (j && j.error && j.error.message) msg = j.error.message;
  } catch (e) { /* not JSON: the status text */ }
  return new ApiError(resp.status, msg);
}

async function send(path, init) {
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, "the server does not answer");
  }
  if (!resp.ok) throw await errorOf(resp);
  return resp;
}

// GET /health: 200 ready, 503 loading, 0 unreachable.
export async function health() {
  try {
    return (await fetch("health", { cache: "no-store" })).status;
  } catch (e) {
    return 0;
  }
}

export async function modelId(apiKey) {
  const j = await (await send("v1/models", { headers: headers(apiKey, false) })).json();
  return j.data && j.data[0] ? j.data[0].id : "";
}

// Streams one chat completion. onDelta(delta) gets each choice's delta ({content}, {reasoning_content} or
// {tool_calls}); returns {usage, finish}. Rejects with ApiError, or an AbortError when signal aborts.
export async function streamChat(body, { apiKey, signal, onDelta }) {
  const req = Object.assign({}, body, { stream: true, stream_options: { include_usage: true } });
  const resp = await send("v1/chat/completions", {
    method: "POST", headers: headers(apiKey, true), body: JSON.stringify(req), signal,
  });
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  const out = { usage: null, finish: null, done: false };
  let buf = "";
  for (;;) {
    let r;
    try {
      r = await reader.read();
    } catch (e) {
      if (e.name === "AbortError") throw e;
      throw new ApiError(0, "the connection to the server broke during the reply");
    }
    if (r.done) break;
    buf += r.value.replace(/\r\n/g, "\n");
    let at;
    while ((at = buf.indexOf("\n\n")) >= 0) {
      frame(buf.slice(0, at), out, onDelta);
      buf = buf.slice(at + 2);
    }
    if (out.done) break;
  }
  if (!out.done) throw new ApiError(0, "the server closed the connection before the reply ended");
  return out;
}

function frame(block, out, onDelta) {
  const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
  if (!data) return;   // a keep-alive comment
  if (data === "[DONE]") {
    out.done = true;
    return;
  }
  const ch = JSON.parse(data);
  if (ch.error) throw new ApiError(500, ch.error.message || "the generation failed");
  if (ch.usage) out.usage = ch.usage;
  for (const c of ch.choices || []) {
    if (c.delta) onDelta(c.delta);
    if (c.finish_reason) out.finish = c.finish_reason;
  }
}
