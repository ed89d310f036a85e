/* Windows only (tests/platform/windows.cmake): an application linked against libneedle.dll
 * through its import library opens the demo model by a UTF-8 path with non-ASCII
 * characters (platform_win32.c converts it to UTF-16 for CreateFileW), and a missing file
 * gives NEEDLE_ERR_IO with the system's message. Exit 0 when all holds. */
#define WIN32_LEAN_AND_MEAN
#include <windows.h>

#include <stdio.h>
#include <string.h>

#include "needle.h"

int main(void) {
    const char *demo = needle_default_model_path();
    if (!demo) {
        fprintf(stderr, "FAIL: no demo model found\n");
        return 1;
    }
    /* "modèle-ü\\demo-ß.cact", written as UTF-16 for the copy and UTF-8 for the library */
    const wchar_t *wdir = L"mod\u00e8le-\u00fc";
    const wchar_t *wfile = L"mod\u00e8le-\u00fc\\demo-\u00df.cact";
    const char *u8file = "mod\xc3\xa8le-\xc3\xbc\\demo-\xc3\x9f.cact";
    wchar_t wdemo[1024];
    if (!MultiByteToWideChar(CP_UTF8, 0, demo, -1, wdemo, 1024)) return 1;
    CreateDirectoryW(wdir, NULL);
    if (!CopyFileW(wdemo, wfile, FALSE)) {
        fprintf(stderr, "FAIL: cannot copy %s (error %lu)\n", demo, (unsigned long)GetLastError());
        return 1;
    }
    int fails = 0;
    needle_model *m = NULL;
    int rc = needle_model_open(u8file, NULL, &m);
    if (rc != NEEDLE_OK) {
        fprintf(stderr, "FAIL: open by UTF-8 path: %d %s\n", rc, needle_last_error());
        fails++;
    } else {
        needle_model_info info = {.size = sizeof info};
        rc = needle_model_get_info(m, &info);
        if (rc != NEEDLE_OK || info.vocab == 0) {
            fprintf(stderr, "FAIL: model info after the UTF-8 open\n");
            fails++;
        }
        needle_model_free(m);
        m = NULL;
    }
    rc = needle_model_open("mod\xc3\xa8le-\xc3\xbc\\missing.cact", NULL, &m);
    if (rc != NEEDLE_ERR_IO || m != NULL || !strstr(needle_last_error(), "cannot open")) {
        fprintf(stderr, "FAIL: missing file: %d %s\n", rc, needle_last_error());
        fails++;
    }
    rc = needle_model_open("bad-utf8-\xc3.cact", NULL, &m);
    if (rc != NEEDLE_ERR_IO || !strstr(needle_last_error(), "not valid UTF-8")) {
        fprintf(stderr, "FAIL: invalid UTF-8 path: %d %s\n", rc, needle_last_error());
        fails++;
    }
    DeleteFileW(wfile);
    RemoveDirectoryW(wdir);
    if (!fails) printf("ok: UTF-8 path open through libneedle.dll\n");
    return fails ? 1 : 0;
}
