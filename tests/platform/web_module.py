#!/usr/bin/env python3
"""The browser build's module (web/needle_web.c, needle-web.wasm) driven through its exports
as the page drives it, under wasmtime with nothing opened to it (no files, no environment:
what a browser tab gives): load the demo model's bytes, set the demo tools, one query.
Also a malformed model and a query before any model: clear errors, no trap.

    web_module.py MODULE MODEL TOOLS     exit 0: all as expected, 1: not
"""
import json
import sys

import wasmtime


class Module:
    def __init__(self, path):
        engine = wasmtime.Engine()
        linker = wasmtime.Linker(engine)
        linker.define_wasi()
        self.store = wasmtime.Store(engine)
        self.store.set_wasi(wasmtime.WasiConfig())  # no args, env, preopens or stdin
        self.instance = linker.instantiate(self.store, wasmtime.Module.from_file(engine, path))
        self.ex = self.instance.exports(self.store)
        self.memory = self.ex["memory"]
        self.ex["_initialize"](self.store)

    def call(self, name, *args):
        return self.ex[name](self.store, *args)

    def put(self, data):
        ptr = self.call("nw_alloc", len(data))
        assert ptr, "nw_alloc failed"
        self.memory.write(self.store, data, ptr)
        return ptr

    def string(self, ptr):
        size = self.memory.data_len(self.store)
        raw = self.memory.read(self.store, ptr, min(ptr + (1 << 20), size))
        return bytes(raw[:raw.index(0)]).decode()


def main():
    if len(sys.argv) != 4:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    module_path, model_path, tools_path = sys.argv[1:]
    failures = []
    m = Module(module_path)

    text = m.put(b"Set a timer for 25 minutes\0")
    if m.call("nw_complete", text, 64) != 0:
        failures.append("a query before any model did not fail")
    elif "nw_load" not in m.string(m.call("nw_error")):
        failures.append("no model: unclear error " + m.string(m.call("nw_error")))

    bad = b"CACT" + b"\x00" * 60
    rc = m.call("nw_load", m.put(bad), len(bad))
    why = m.string(m.call("nw_error"))
    print(f"malformed model: {rc} {why}")
    if rc >= 0 or "cannot open the model" not in why:
        failures.append(f"malformed model: status {rc}, message {why!r}")

    with open(model_path, "rb") as f:
        model = f.read()
    rc = m.call("nw_load", m.put(model), len(model))
    if rc != 0:
        failures.append(f"nw_load: {rc} {m.string(m.call('nw_error'))}")
        print("\n".join("FAIL: " + f for f in failures))
        return 1
    with open(tools_path, "rb") as f:
        tools = f.read()
    rc = m.call("nw_set_tools", 0, m.put(tools + b"\0"))
    if rc != 0:
        failures.append(f"nw_set_tools: {rc} {m.string(m.call('nw_error'))}")
    else:
        for _ in range(2):  # twice: each query stands alone (the session rewinds to the tools)
            out = m.call("nw_complete", text, 64)
            envelope = json.loads(m.string(out)) if out else None
            print("envelope:", json.dumps(envelope)[:300])
            if not envelope or envelope.get("function_calls") != [
                    {"name": "set_timer", "arguments": {"minutes": 25}}]:
                failures.append(f"query: {envelope or m.string(m.call('nw_error'))}")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
