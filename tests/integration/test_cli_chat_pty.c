/* `needle chat` on a terminal (a pseudo-terminal this test drives): with libedit the line
 * that reaches chat is the edited one. Keys the terminal driver alone does not edit with
 * are used, so a build reading plain lines would fail: "elp", Ctrl-A (start of line),
 * "/h", Enter must run /help; Ctrl-P (the previous line), Enter must run it again; and
 * "/caf\u00e9" must arrive as UTF-8 (libedit decodes in the locale's character set); and
 * "/quix", Backspace, "t", Enter must quit. Skipped when `needle --version` says the tool
 * was built without libedit, and under an emulator (the demo model is slow there). The
 * plain-line path (a pipe) is tested in test_cli.c. */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static char out[1 << 16];
static size_t out_len;

/* Reads the terminal's output until `text` appears at or after offset `from`; returns the
 * offset just past it, or 0 after timeout_s or when the child closed the terminal. */
static size_t read_until(int fd, const char *text, size_t from, double timeout_s) {
    const double end = now_s() + timeout_s;
    for (;;) {
        out[out_len] = 0;
        const char *hit = from <= out_len ? strstr(out + from, text) : NULL;
        if (hit) return (size_t)(hit - out) + strlen(text);
        const double left = end - now_s();
        if (left <= 0 || out_len + 1 >= sizeof out) return 0;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)(left * 1000) + 1) <= 0) continue;
        ssize_t n = read(fd, out + out_len, sizeof out - 1 - out_len);
        if (n <= 0 && errno != EINTR && errno != EAGAIN) return 0; /* EIO: the child is gone */
        if (n > 0) out_len += (size_t)n;
    }
}

static int count(const char *text) {
    int k = 0;
    for (const char *p = out; (p = strstr(p, text)); p++) k++;
    return k;
}

static void type_keys(int fd, const char *keys) {
    size_t n = strlen(keys);
    CHECK(write(fd, keys, n) == (ssize_t)n);
}

static void test_line_editing(void) {
    if (getenv("NEEDLE_EMULATED")) {
        harness_skip("the demo model under emulation is slow; covered by the native builds");
        return;
    }
    char cmd[2048], version[4096];
    snprintf(cmd, sizeof cmd, "%s --version", cli_path());
    CHECK_EQ_INT(run_command(cmd, version, sizeof version), 0);
    CHECK_MSG(strstr(version, "\nchat input: ") != NULL, "--version says nothing of chat input: %s", version);
    if (!strstr(version, "chat input: libedit")) {
        harness_skip("needle was built without libedit: chat reads plain lines");
        return;
    }
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    CHECK(master >= 0 && grantpt(master) == 0 && unlockpt(master) == 0);
    const char *slave_name = master >= 0 ? ptsname(master) : NULL;
    CHECK(slave_name != NULL);
    if (!slave_name) return;
    const char *demo = NEEDLE_SOURCE_DIR "/models/needle-demo";
    snprintf(cmd, sizeof cmd, "exec %s chat --weights %s.cact --tools %s.tools.json", cli_path(), demo, demo);
    pid_t pid = fork();
    if (pid == 0) { /* the child: a session whose terminal is the slave side */
        setsid();
        int slave = open(slave_name, O_RDWR);
        if (slave < 0) _exit(126);
        ioctl(slave, TIOCSCTTY, 0);
        dup2(slave, 0), dup2(slave, 1), dup2(slave, 2);
        close(master);
        setenv("TERM", "vt100", 1);
        setenv("HOME", "/nonexistent", 1); /* no ~/.editrc of the user running the tests */
        setenv("LC_ALL", "C", 1); /* not UTF-8: chat must still read UTF-8 (C.UTF-8) */
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    CHECK(pid > 0);
    if (pid < 0) return;
    size_t at = read_until(master, "query> ", 0, 120);
    CHECK_MSG(at > 0, "no first prompt: %s", out);
    if (at) {
        type_keys(master, "elp\001/h\r"); /* Ctrl-A: start of line */
        at = read_until(master, "forget the conversation", at, 30);
        CHECK_MSG(at > 0, "the edited line was not /help: %s", out);
    }
    if (at) {
        at = read_until(master, "query> ", at, 30);
        type_keys(master, "\020\r"); /* Ctrl-P: the previous line */
        at = read_until(master, "forget the conversation", at, 30);
        CHECK_MSG(at > 0, "the recalled line was not /help: %s", out);
    }
    if (at) {
        at = read_until(master, "query> ", at, 30);
        type_keys(master, "/caf\303\251\r"); /* UTF-8 arrives whole */
        at = read_until(master, "unknown command /caf\303\251", at, 30);
        CHECK_MSG(at > 0, "the UTF-8 line: %s", out);
    }
    if (at) {
        at = read_until(master, "query> ", at, 30);
        type_keys(master, "/quix\177t\r"); /* Backspace */
    }
    int status = -1;
    const double end = now_s() + 30;
    while (waitpid(pid, &status, WNOHANG) == 0 && now_s() < end) read_until(master, "\001", out_len, 0.2);
    if (waitpid(pid, &status, WNOHANG) == 0) {
        CHECK_MSG(0, "chat did not quit on the edited /quit: %s", out);
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    } else {
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "chat exited with status %d", status);
    }
    CHECK_EQ_INT(count("forget the conversation"), 2);
    CHECK_MSG(!strstr(out, "unknown command /quix"), "an unedited line reached chat: %s", out);
    close(master);
}

int main(void) {
    RUN(test_line_editing);
    return test_summary();
}
