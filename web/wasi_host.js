// A minimal WASI (wasi_snapshot_preview1) host for the engine's browser build
// (needle-web.wasm, web/needle_web.c). A tab has no files, arguments or environment, so
// the module gets: empty args and environ, stdout/stderr to the console (line by line),
// the clocks, crypto random bytes, and proc_exit as an exception. Every other WASI call
// the module imports (the file functions libc links for fopen) answers ENOSYS: the page
// hands the model over as bytes (nw_load), never as a path.

const ERRNO_SUCCESS = 0;
const ERRNO_BADF = 8;
const ERRNO_INVAL = 28;
const ERRNO_NOSYS = 52;
const FILETYPE_CHARACTER_DEVICE = 2;

// proc_exit: the module asked to stop (it never returns to the caller's frame)
export class WasiExit extends Error {
  constructor(code) {
    super(`the module exited with status ${code}`);
    this.code = code;
  }
}

export class WasiHost {
  // log(fd, line): where stdout (1) and stderr (2) lines go; the console by default
  constructor(log) {
    this.log = log || ((fd, line) => (fd === 2 ? console.error : console.log)(line));
    this.memory = null;
    this.pending = { 1: "", 2: "" };
    this.decoders = { 1: new TextDecoder(), 2: new TextDecoder() };
  }

  // The import object for WebAssembly.instantiate: the functions above for every
  // wasi_snapshot_preview1 import `module` (a WebAssembly.Module) declares.
  imports(module) {
    const own = this.functions();
    const wasi = {};
    for (const imp of WebAssembly.Module.imports(module)) {
      if (imp.module !== "wasi_snapshot_preview1" || imp.kind !== "function") continue;
      wasi[imp.name] = own[imp.name] || (() => ERRNO_NOSYS);
    }
    return { wasi_snapshot_preview1: wasi };
  }

  // Binds the instance's memory and runs its constructors (a reactor's _initialize).
  initialize(instance) {
    this.memory = instance.exports.memory;
    if (instance.exports._initialize) instance.exports._initialize();
  }

  // The memory may grow (and its buffer be replaced) during any call: fresh views each time.
  view() { return new DataView(this.memory.buffer); }
  bytes() { return new Uint8Array(this.memory.buffer); }

  flush() {
    for (const fd of [1, 2]) {
      if (this.pending[fd]) this.log(fd, this.pending[fd]);
      this.pending[fd] = "";
    }
  }

  functions() {
    const emptyList = (countPtr, sizePtr) => {
      const v = this.view();
      v.setUint32(countPtr, 0, true);
      v.setUint32(sizePtr, 0, true);
      return ERRNO_SUCCESS;
    };
    const nowNs = (id) => {
      // 0: realtime; 1: monotonic; 2, 3: process and thread CPU time (a tab has one
      // thread busy with the module, so the monotonic clock stands for them)
      if (id === 0) return BigInt(Date.now()) * 1000000n;
      return BigInt(Math.round(performance.now() * 1e6));
    };
    return {
      args_sizes_get: emptyList,
      args_get: () => ERRNO_SUCCESS,
      environ_sizes_get: emptyList,
      environ_get: () => ERRNO_SUCCESS,
      clock_time_get: (id, _precision, outPtr) => {
        if (id < 0 || id > 3) return ERRNO_INVAL;
        this.view().setBigUint64(outPtr, nowNs(id), true);
        return ERRNO_SUCCESS;
      },
      clock_res_get: (id, outPtr) => {
        if (id < 0 || id > 3) return ERRNO_INVAL;
        this.view().setBigUint64(outPtr, id === 0 ? 1000000n : 1000n, true);
        return ERRNO_SUCCESS;
      },
      random_get: (ptr, len) => {
        // getRandomValues fills at most 65536 bytes a call
        for (let at = 0; at < len; at += 65536)
          crypto.getRandomValues(this.bytes().subarray(ptr + at, ptr + Math.min(len, at + 65536)));
        return ERRNO_SUCCESS;
      },
      fd_write: (fd, iovs, iovsLen, writtenPtr) => {
        if (fd !== 1 && fd !== 2) return ERRNO_BADF;
        const v = this.view();
        let total = 0;
        for (let i = 0; i < iovsLen; i++) {
          const base = v.getUint32(iovs + 8 * i, true);
          const len = v.getUint32(iovs + 8 * i + 4, true);
          // copied: TextDecoder may not read a view of a growable buffer
          const chunk = this.bytes().slice(base, base + len);
          this.pending[fd] += this.decoders[fd].decode(chunk, { stream: true });
          total += len;
        }
        const lines = this.pending[fd].split("\n");
        this.pending[fd] = lines.pop();
        for (const line of lines) this.log(fd, line);
        v.setUint32(writtenPtr, total, true);
        return ERRNO_SUCCESS;
      },
      fd_fdstat_get: (fd, outPtr) => {
        // stdin, stdout and stderr exist (as character devices: libc then line-buffers);
        // no other descriptor does
        if (fd > 2) return ERRNO_BADF;
        const v = this.view();
        for (let i = 0; i < 24; i += 4) v.setUint32(outPtr + i, 0, true);
        v.setUint8(outPtr, FILETYPE_CHARACTER_DEVICE);
        // rights: fd_read (bit 1) on stdin, fd_write (bit 6) on the others
        v.setBigUint64(outPtr + 8, fd === 0 ? 2n : 64n, true);
        return ERRNO_SUCCESS;
      },
      // no preopened folders: libc's search for them ends at the first descriptor
      fd_prestat_get: () => ERRNO_BADF,
      fd_close: (fd) => (fd <= 2 ? ERRNO_SUCCESS : ERRNO_BADF),
      sched_yield: () => ERRNO_SUCCESS,
      proc_exit: (code) => {
        this.flush();
        throw new WasiExit(code);
      },
    };
  }
}
