#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "util/err.h"

static float *rope_frequencies(const tern_config *c) {
    int half = c->rope_dim / 2;
    float *f = malloc((size_t)half * sizeof(float));
    if (!f) return NULL;
    for (int i = 0; i < half; i++) f[i] = (float)(1.0 / pow(c->rope_theta, (double)(2 * i) / c->rope_dim));
    return f;
}

tern_model *tern_model_load(const char *dir, const tern_load_params *params, tern_error *err) {
    tern_model *m = calloc(1, sizeof *m);
    if (!m || !(m->dir = strdup(dir))) {
        free(m);
        tern_fail(err, "out of memory");
        return NULL;
    }
    if (tern_config_load(&m->cfg, dir, err) != 0 || tern_tensors_open(&m->ts, dir, 0, err) != 0 ||
        tern_weights_bind(&m->w, &m->cfg, &m->ts, err) != 0) {
        tern_model_free(m);
        return NULL;
    }
    m->pool = tern_pool_create(params ? params->n_threads : 0);
    m->inv_freq = rope_frequencies(&m->cfg);
    if (!m->pool || !m->inv_freq) {
        tern_fail(err, "out of memory");
        tern_model_free(m);
        return NULL;
    }
    return m;
}

void tern_model_free(tern_model *m) {
    if (!m) return;
    tern_weights_free(&m->w, &m->cfg);
    tern_tensors_close(&m->ts);
    tern_pool_destroy(m->pool);
    free(m->inv_freq);
    free(m->dir);
    free(m);
}

int tern_model_vocab_size(const tern_model *m) { return m->cfg.vocab; }
int tern_model_has_mtp(const tern_model *m) { return m->w.has_mtp; }
int tern_model_n_threads(const tern_model *m) { return tern_pool_size(m->pool); }

int tern_model_is_eos(const tern_model *m, int32_t id) {
    for (int i = 0; i < m->cfg.n_eos; i++)
        if (m->cfg.eos[i] == id) return 1;
    return 0;
}
