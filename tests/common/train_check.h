/* The official code's view of a file the training core wrote: runs
 * tests/reference/check_train_files.py under the pinned reference venv (PYTHON_V3, else
 * tests/reference/.venv3/bin/python) and parses what it prints. */
#ifndef NEEDLE_TESTS_TRAIN_CHECK_H
#define NEEDLE_TESTS_TRAIN_CHECK_H

#include <cjson/cJSON.h>

/* The reference interpreter, or NULL when there is none (the caller skips). */
const char *train_official_python(void);

/* check_train_files.py MODE PATH as parsed JSON (cJSON_Delete it), or NULL when it failed
 * (its stderr is the test's). */
cJSON *train_official_read(const char *mode, const char *path);
/* The same with a third argument (e.g. "apply"). */
cJSON *train_official_read_arg(const char *mode, const char *path, const char *arg);

/* A fresh empty directory under $TMPDIR (static buffer), removed by train_tmpdir_remove. */
const char *train_tmpdir(void);
void train_tmpdir_remove(const char *dir);

#endif
