/* Loading a tests/fixtures/grad_v2 fixture (tests/reference/make_grad_v2_fixtures.py) into
 * a Needle 2 training-core model of either precision: include after train/grad2.h (or
 * grad2.c). The file helpers are grad_fixture_files.h's, shared with grad3_fixture.h. */
#ifndef NEEDLE_TESTS_GRAD2_FIXTURE_H
#define NEEDLE_TESTS_GRAD2_FIXTURE_H

#include "export/export_model.h"
#include "grad_fixture_files.h"

/* NAME.params.safetensors as a model, its config from NAME.config.json (a Needle 2
 * checkpoint keeps the config beside it, as `needle export --config` takes it) */
static inline int fx_model(const char *stem, G2(model) * *m) {
    char name[512];
    snprintf(name, sizeof name, "%.200s.config.json", stem);
    size_t size = 0;
    char *cj = (char *)read_file(fixture_path(name), &size);
    export_config cfg;
    int rc = !cj || export_config_parse(cj, size, &cfg) ? -1 : 0;
    free(cj);
    snprintf(name, sizeof name, "%.200s.params.safetensors", stem);
    fx_file f;
    if (rc || fx_open(name, &f)) return -1;
    rc = G2(model_from_checkpoint)(&cfg, &f.st, m);
    fx_close(&f);
    return rc;
}

/* relative L2 distance of a (n values) from the reference b */
static inline double fx_rel_l2(const G2_REAL *a, const st_tensor *b, uint64_t n) {
    double num = 0, den = 0;
    for (uint64_t i = 0; i < n; i++) {
        const double r = st_get(b, i), d = (double)a[i] - r;
        num += d * d;
        den += r * r;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
