// The /try page: the engine compiled to WebAssembly (needle-web.wasm) runs the query in
// this tab, in a worker (try_worker.js) so the page stays responsive. The module, the demo
// model and its tools are fetched from the server once; a query never leaves the tab.
// `?q=TEXT` fills the query box and runs it as soon as the model is loaded (what the
// headless browser test's --dump-dom check uses).
const $ = (id) => document.getElementById(id);
const worker = new Worker(new URL("try_worker.js", import.meta.url), { type: "module" });
let nextId = 0;

function showError(message) {
  const box = $("calls");
  box.textContent = "";
  const e = document.createElement("div");
  e.className = "error";
  e.textContent = message;
  box.appendChild(e);
}

function renderCalls(envelope) {
  const box = $("calls");
  box.textContent = "";
  if (!envelope.success) {
    showError(`${envelope.error_code}: ${envelope.error}`);
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

function run() {
  const query = $("query").value.trim();
  if ($("run").disabled || !query) return;
  $("run").disabled = true;
  document.body.dataset.state = "running";
  $("status").textContent = "running in this tab…";
  worker.postMessage({ id: ++nextId, tools: $("tools").value, query });
}

worker.onmessage = (e) => {
  const m = e.data;
  if (m.type === "ready") {
    $("tools").value = m.tools;
    $("tools").disabled = false;
    $("engine").textContent = `needle ${m.version} · WebAssembly · needle-demo.cact ` +
      `(${(m.modelBytes / 1048576).toFixed(1)} MiB) · loaded in ${Math.round(m.loadMs)} ms, ` +
      `tools prefilled in ${Math.round(m.toolsMs)} ms`;
    $("run").disabled = false;
    const q = new URLSearchParams(location.search).get("q");
    if (q) {
      $("query").value = q;
      run();
    }
    return;
  }
  if (m.type === "result") {
    renderCalls(m.envelope);
    $("envelope").textContent = JSON.stringify(m.envelope, null, 2);
    $("status").textContent = (m.toolsMs ? `tools prefilled in ${Math.round(m.toolsMs)} ms, ` : "") +
      `answered in ${Math.round(m.queryMs)} ms in this tab`;
  } else {
    showError(m.message);
    $("status").textContent = "";
    if (m.id === undefined) {
      $("engine").textContent = "the engine could not start";
      document.body.dataset.state = "failed";
      return;
    }
  }
  $("run").disabled = false;
  document.body.dataset.state = "done";
};

worker.onerror = (e) => {
  showError(`the engine's worker failed: ${e.message || "could not load try_worker.js"}`);
  document.body.dataset.state = "failed";
};

$("run").addEventListener("click", run);
$("query").addEventListener("keydown", (e) => { if (e.key === "Enter") run(); });
