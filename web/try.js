// The /try page: the engine compiled to WebAssembly (needle-web.wasm) runs the query in
// this tab. The page fetches the module, the demo model and its tools from the server
// once; a query never leaves the tab. `?q=TEXT` fills the query box and runs it as soon as
// the model is loaded (what the headless browser test uses).
import { WasiHost } from "./wasi_host.js";

const $ = (id) => document.getElementById(id);
const here = new URL(".", import.meta.url);
const MAX_NEW_TOKENS = 256;

// The module's exports behind JS strings and bytes (web/needle_web.c).
class Engine {
  constructor(instance, host) {
    this.ex = instance.exports;
    this.host = host;
  }

  static async create(wasmResponse) {
    const host = new WasiHost();
    const module = await WebAssembly.compile(await wasmResponse.arrayBuffer());
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
  const r = await fetch(new URL(name, here));
  if (!r.ok) throw new Error(`GET ${new URL(name, here).pathname}: ${r.status} ${await r.text()}`);
  return r;
}

function showError(where, err) {
  where.textContent = "";
  const e = document.createElement("div");
  e.className = "error";
  e.textContent = String(err && err.message ? err.message : err);
  where.appendChild(e);
}

function renderCalls(envelope) {
  const box = $("calls");
  box.textContent = "";
  if (!envelope.success) {
    showError(box, `${envelope.error_code}: ${envelope.error}`);
    return;
  }
  if (!envelope.function_calls.length) box.textContent = "(no call: the model declined)";
  for (const call of envelope.function_calls) {
    const div = document.createElement("div");
    div.className = "call";
    const name = document.createElement("b");
    name.textContent = call.name;
    div.append(name, " ", JSON.stringify(call.arguments));
    box.appendChild(div);
  }
}

let engine = null;
let toolsSet = null; // the tools text the session holds

function run() {
  const query = $("query").value.trim();
  if (!engine || !query) return;
  $("run").disabled = true;
  $("status").textContent = "running in this tab…";
  // let the status paint before the module takes the thread
  setTimeout(() => {
    try {
      const t0 = performance.now();
      const tools = $("tools").value;
      if (tools !== toolsSet) {
        engine.setTools(tools);
        toolsSet = tools;
      }
      const envelope = engine.complete(query);
      renderCalls(envelope);
      $("envelope").textContent = JSON.stringify(envelope, null, 2);
      $("status").textContent = `${Math.round(performance.now() - t0)} ms in this tab`;
    } catch (err) {
      toolsSet = null;
      showError($("calls"), err);
      $("status").textContent = "";
    }
    $("run").disabled = false;
    document.body.dataset.state = "done";
  }, 0);
}

async function main() {
  $("run").addEventListener("click", run);
  $("query").addEventListener("keydown", (e) => { if (e.key === "Enter") run(); });
  try {
    const t0 = performance.now();
    const [wasm, model, tools] = await Promise.all([
      fetchOk("needle-web.wasm"), fetchOk("needle-demo.cact"), fetchOk("needle-demo.tools.json")]);
    engine = await Engine.create(wasm);
    const bytes = new Uint8Array(await model.arrayBuffer());
    engine.load(bytes);
    $("tools").value = JSON.stringify(await tools.json(), null, 2);
    $("tools").disabled = false;
    $("engine").textContent = `needle ${engine.version()} · WebAssembly · needle-demo.cact ` +
      `(${(bytes.length / 1048576).toFixed(1)} MiB) loaded in ${Math.round(performance.now() - t0)} ms`;
    $("run").disabled = false;
  } catch (err) {
    $("engine").textContent = "the engine could not start";
    showError($("calls"), err);
    document.body.dataset.state = "failed";
    return;
  }
  const q = new URLSearchParams(location.search).get("q");
  if (q) {
    $("query").value = q;
    run();
  }
}

main();
