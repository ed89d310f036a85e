#!/usr/bin/env python3
"""Runs a WASI command module (wasm32-wasi build) with PyPI's wasmtime: the arguments, the
environment, stdin/stdout/stderr of this process, and the host's root folder opened to the
module as "/" (so the absolute paths of ctest and the default model resolve alike).
Exit status: the module's.

    wasmtime_run.py MODULE [ARG...]
"""
import os
import sys

import wasmtime


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    module_path = sys.argv[1]
    engine = wasmtime.Engine()
    module = wasmtime.Module.from_file(engine, module_path)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    wasi = wasmtime.WasiConfig()
    wasi.argv = [os.path.basename(module_path)] + sys.argv[2:]
    wasi.env = list(os.environ.items())
    wasi.inherit_stdin()
    wasi.inherit_stdout()
    wasi.inherit_stderr()
    wasi.preopen_dir("/", "/")
    store = wasmtime.Store(engine)
    store.set_wasi(wasi)
    instance = linker.instantiate(store, module)
    start = instance.exports(store)["_start"]
    try:
        start(store)
    except wasmtime.ExitTrap as e:
        return e.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
