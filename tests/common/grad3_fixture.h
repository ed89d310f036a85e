/* Loading a tests/fixtures/grad_v3 fixture (tests/reference/make_grad_v3_fixtures.py) into
 * a training-core model of either precision: include after train/grad3.h (or grad3.c). */
#ifndef NEEDLE_TESTS_GRAD3_FIXTURE_H
#define NEEDLE_TESTS_GRAD3_FIXTURE_H

#include "export/export_model_v3.h"
#include "grad_fixture_files.h"

/* NAME.params.safetensors as a model (its config from the checkpoint's metadata) */
static inline int fx_model(const char *stem, G3(model) * *m) {
    char name[512];
    snprintf(name, sizeof name, "%.200s.params.safetensors", stem);
    fx_file f;
    if (fx_open(name, &f)) return -1;
    const char *cj = st_meta_get(&f.st, "config");
    export3_config cfg;
    int rc = !cj || export3_config_parse(cj, strlen(cj), &cfg) ? -1 : 0;
    if (!rc) rc = G3(model_from_checkpoint)(&cfg, &f.st, m);
    fx_close(&f);
    return rc;
}

/* relative L2 distance of a (n values) from the reference b */
static inline double fx_rel_l2(const G3_REAL *a, const st_tensor *b, uint64_t n) {
    double num = 0, den = 0;
    for (uint64_t i = 0; i < n; i++) {
        const double r = st_get(b, i), d = (double)a[i] - r;
        num += d * d;
        den += r * r;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
