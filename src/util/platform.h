/* The few operating-system services the library needs beyond C11 and pthreads, behind one
 * interface with an implementation per system: platform_posix.c (Linux, macOS, the BSDs),
 * platform_win32.c (Windows: Win32 file mapping, UTF-8 paths) and platform_wasi.c
 * (WebAssembly under WASI: no mmap, one thread). Each file compiles to nothing on the
 * other systems, so the build lists them all. */
#ifndef NEEDLE_UTIL_PLATFORM_H
#define NEEDLE_UTIL_PLATFORM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* A whole file in memory, read-only: a mapping where the system has one, else a copy in
 * 64-byte-aligned memory. `path` is UTF-8 on every system. Returns NEEDLE_OK, or a
 * negative needle_status with the message recorded (a file larger than the address
 * space, as on 32-bit targets, is refused here rather than truncated). */
int platform_map_file(const char *path, const void **data, size_t *size);
void platform_unmap_file(const void *data, size_t size);

/* 1 if `path` (UTF-8) names a file this process can read. */
int platform_readable(const char *path);

/* When `path` itself (not what a symbolic link there points to) was last modified, in
 * seconds since the epoch; -1 if it cannot be read. The hub cache's snapshots are links. */
double platform_link_mtime(const char *path);

/* Creates the folder `path` (UTF-8; its parent must exist): 0, or -1 with errno set
 * (EEXIST when something is there already). */
int platform_mkdir(const char *path);

/* fopen of a UTF-8 path (Windows: the wide-character _wfopen, where fopen would read the
 * bytes in the ANSI code page). NULL with errno set when it cannot be opened. */
FILE *platform_fopen(const char *path, const char *mode);

/* Moves `from` to `to`, replacing a file already at `to` (POSIX rename; Windows'
 * rename refuses an existing target, so MoveFileEx with MOVEFILE_REPLACE_EXISTING): the
 * last step of every atomic write. 0, or -1 with errno set. */
int platform_replace_file(const char *from, const char *to);

/* remove() of a UTF-8 path. 0, or -1 with errno set. */
int platform_remove(const char *path);

/* Makes *argv UTF-8 (Windows: rebuilt from the wide command line, since the C runtime's
 * argv holds the arguments in the ANSI code page and loses what it cannot represent; the
 * console's output code page is set to UTF-8 too). Elsewhere argv already is and nothing
 * changes. The rebuilt array lives until the process exits. 0, or -1 when out of memory. */
int platform_utf8_args(int *argc, char ***argv);

/* Processors online (at least 1), physical memory in bytes (0 if unknown), and the
 * machine's architecture name for when no CPU model name is known ("x86_64", ...). */
int platform_cpu_count(void);
uint64_t platform_memory_bytes(void);
void platform_machine_name(char *out, size_t cap);

/* The process's peak resident memory in MiB (0 if unknown). */
double platform_peak_rss_mb(void);

/* `size` bytes aligned to `align` (a power of two), released with platform_aligned_free:
 * C11's aligned_alloc is missing from the Windows C runtime, whose aligned blocks need
 * their own free. NULL when out of memory. */
void *platform_aligned_alloc(size_t align, size_t size);
void platform_aligned_free(void *p);

/* 1 if this build can start threads (0 under WASI: the thread pool then runs every task
 * on the calling thread). */
int platform_has_threads(void);

#endif
