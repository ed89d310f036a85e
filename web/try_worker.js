// The engine's thread for the /try page: a module worker that fetches needle-web.wasm, the
// demo model and its tools, and answers queries, so that the page stays responsive while
// the module computes. Messages in: {type: "run", id, tools, query}. Out: {type: "ready",
// ...}, {type: "result", id, envelope, toolsMs, queryMs}, {type: "error", id?, message}.
import { WasiHost } from "./wasi_host.js";

const here = new URL(".", import.meta.url);
const MAX_NEW_TOKENS = 256;

// The module's exports behind JS strings and bytes (web/needle_web.c).
class Engine {
  constructor(instance, host) {
    this.ex = instance.exports;
    this.host = host;
  }

  static async create(wasmBytes) {
    const host = new WasiHost();
    const module = await WebAssembly.compile(wasmBytes);
    const instance = await WebAssembly.instantiate(module, host.imports(module));
    host.initialize(instance);
    return new Engine(instance, host);
  }

  put(bytes) {
    const ptr = this.ex.nw_alloc(bytes.length);
    if (!ptr) throw new Error(`out of memory for ${bytes.length} bytes`);
    new Uint8Array(this.ex.memory.buffer, ptr, bytes.length).set(bytes);
    return ptr;
  }

  putString(text) { return this.put(new TextEncoder().encode(text + "\0")); }

  string(ptr) {
    const mem = new Uint8Array(this.ex.memory.buffer);
    let end = ptr;
    while (mem[end]) end++;
    return new TextDecoder().decode(mem.slice(ptr, end));
  }

  error() { return this.string(this.ex.nw_error()); }
  version() { return this.string(this.ex.nw_version()); }

  load(modelBytes) {
    // the module owns the buffer from here (also on failure)
    const rc = this.ex.nw_load(this.put(modelBytes), modelBytes.length);
    this.host.flush();
    if (rc !== 0) throw new Error(this.error());
  }

  setTools(toolsJson) {
    const ptr = this.putString(toolsJson);
    const rc = this.ex.nw_set_tools(0, ptr);
    this.ex.nw_free(ptr);
    this.host.flush();
    if (rc !== 0) throw new Error(this.error());
  }

  complete(query) {
    const ptr = this.putString(query);
    const out = this.ex.nw_complete(ptr, MAX_NEW_TOKENS);
    this.ex.nw_free(ptr);
    this.host.flush();
    if (!out) throw new Error(this.error());
    return JSON.parse(this.string(out));
  }
}

async function fetchOk(name) {
  const url = new URL(name, here);
  const r = await fetch(url);
  if (!r.ok) throw new Error(`GET ${url.pathname}: ${r.status} ${(await r.text()).trim()}`);
  return r;
}

let engine = null;
let toolsSet = null; // the tools text the session holds

function setTools(tools) {
  if (tools === toolsSet) return 0;
  const t0 = performance.now();
  toolsSet = null;
  engine.setTools(tools);
  toolsSet = tools;
  return performance.now() - t0;
}

async function start() {
  try {
    const t0 = performance.now();
    const [wasm, model, tools] = await Promise.all([
      fetchOk("needle-web.wasm"), fetchOk("needle-demo.cact"), fetchOk("needle-demo.tools.json")]);
    engine = await Engine.create(await wasm.arrayBuffer());
    const bytes = new Uint8Array(await model.arrayBuffer());
    engine.load(bytes);
    const toolsText = JSON.stringify(await tools.json(), null, 2);
    const loadMs = performance.now() - t0;
    // the demo tools' prefix now, so the first query only pays for itself
    const toolsMs = setTools(toolsText);
    postMessage({ type: "ready", version: engine.version(), modelBytes: bytes.length,
                  tools: toolsText, loadMs, toolsMs });
  } catch (err) {
    postMessage({ type: "error", message: String(err && err.message ? err.message : err) });
  }
}

onmessage = (e) => {
  const { id, tools, query } = e.data;
  try {
    const toolsMs = setTools(tools);
    const t0 = performance.now();
    const envelope = engine.complete(query);
    postMessage({ type: "result", id, envelope, toolsMs, queryMs: performance.now() - t0 });
  } catch (err) {
    postMessage({ type: "error", id, message: String(err && err.message ? err.message : err) });
  }
};

start();
