/* The CPU backend (engine/backend.h): a session's state in host memory (KV
 * rows grown on demand, DeltaNet state of fixed size), forward.c's forward
 * pass, and snapshots as plain copies. */
#include <stdlib.h>
#include <string.h>

#include "engine/cpu_backend.h"
#include "util/err.h"

int tern_kv_reserve_host(tern_kv *kv, int *cap, int needed, int max_ctx, size_t row_bytes, tern_error *err) {
    if (needed <= *cap) return 0;
    int n = tern_kv_next_cap(*cap, needed, max_ctx, err);
    if (n < 0) return -1;
    uint8_t *k = realloc(kv->k, (size_t)n * row_bytes);
    if (k) kv->k = k;
    uint8_t *v = k ? realloc(kv->v, (size_t)n * row_bytes) : NULL;
    if (v) kv->v = v;
    if (!k || !v) return tern_fail(err, "out of memory growing the KV cache to %d positions", n);
    *cap = n;
    return 0;
}

static int cpu_create(tern_session *s, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    tern_cpu_state *st = calloc(1, sizeof *st);
    if (!st) return tern_fail(err, "out of memory creating a session");
    s->state = st;   /* cpu_destroy frees whatever was allocated */
    st->kv = calloc((size_t)c->n_layers, sizeof *st->kv);
    st->gdn = calloc((size_t)c->n_layers, sizeof *st->gdn);
    int ok = st->kv && st->gdn;
    for (int l = 0; ok && l < c->n_layers; l++) {
        if (c->layer_kind[l] != TERN_LAYER_GDN) continue;
        st->gdn[l].conv = calloc(tern_cfg_gdn_conv_floats(c) + 1, sizeof(float));
        st->gdn[l].S = calloc(tern_cfg_gdn_state_floats(c), sizeof(float));
        ok = st->gdn[l].conv && st->gdn[l].S;
    }
    return ok ? 0 : tern_fail(err, "out of memory creating a session");
}

static void cpu_destroy(tern_session *s) {
    tern_cpu_state *st = s->state;
    if (!st) return;
    for (int l = 0; l < s->m->cfg.n_layers; l++) {
        if (st->kv) { free(st->kv[l].k); free(st->kv[l].v); }
        if (st->gdn) { free(st->gdn[l].conv); free(st->gdn[l].S); }
    }
    free(st->kv);
    free(st->gdn);
    free(st->keep);
    free(st);
    s->state = NULL;
}

static int cpu_reset(tern_session *s, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    tern_cpu_state *st = s->state;
    st->keep_T = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kind[l] != TERN_LAYER_GDN) continue;
        memset(st->gdn[l].conv, 0, tern_cfg_gdn_conv_floats(c) * sizeof(float));
        memset(st->gdn[l].S, 0, tern_cfg_gdn_state_floats(c) * sizeof(float));
    }
    return 0;
}

/* Every attention layer's rows grow together: one capacity for all. */
static int cpu_reserve(tern_session *s, int needed, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    tern_cpu_state *st = s->state;
    if (needed <= st->cap) return 0;
    int cap = st->cap;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kind[l] != TERN_LAYER_ATTN) continue;
        cap = st->cap;
        if (tern_kv_reserve_host(&st->kv[l], &cap, needed, s->max_ctx, s->kvf.row_bytes, err)) return -1;
    }
    st->cap = cap;
    return 0;
}

static int cpu_kv_cap(const tern_session *s) { return ((const tern_cpu_state *)s->state)->cap; }

static void cpu_release_rows(tern_session *s) {
    tern_cpu_state *st = s->state;
    for (int l = 0; l < s->m->cfg.n_layers; l++) {
        free(st->kv[l].k);
        free(st->kv[l].v);
        st->kv[l] = (tern_kv){0};
    }
    st->cap = 0;
}

/* ---- sampling in the step: the CPU samples the logits on the host ------- */

static int no_step_sampling(tern_error *err) { return tern_fail(err, "sampling in the step needs a GPU session"); }

static int cpu_sample_ok(const tern_session *s, const tern_gpu_rule *rule) { return 0; }

static int cpu_forward_sample(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, int32_t *next,
                              tern_error *err) {
    return no_step_sampling(err);
}

static int cpu_sample_launch(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, tern_error *err) {
    return no_step_sampling(err);
}

static int cpu_sample_wait(tern_session *s, int32_t *next, tern_error *err) { return no_step_sampling(err); }

static int cpu_sample_in_flight(const tern_session *s) { return 0; }

/* ---- snapshots: host copies ---------------------------------------------- */

/* Copies the layer state's pieces between the session and buf; to_buf
 * picks the direction. */
static void walk_layers(const tern_session *s, uint8_t *buf, int from, int pos, int recurrent, int to_buf) {
    const tern_config *c = &s->m->cfg;
    const tern_cpu_state *st = s->state;
    tern_span sp[2 * TERN_MAX_LAYERS];
    int n = tern_state_spans(c, st->kv, st->gdn, s->kvf.row_bytes, from, pos, recurrent, sp);
    for (int i = 0; i < n; i++) {
        if (to_buf) memcpy(buf, sp[i].p, sp[i].n);
        else memcpy(sp[i].p, buf, sp[i].n);
        buf += sp[i].n;
    }
}

static int cpu_save(const tern_session *s, uint8_t *buf, int from, int pos, int recurrent, tern_error *err) {
    walk_layers(s, buf, from, pos, recurrent, 1);
    return 0;
}

static int cpu_load(tern_session *s, const uint8_t *buf, int from, int pos, int recurrent, tern_error *err) {
    walk_layers(s, (uint8_t *)buf, from, pos, recurrent, 0);
    ((tern_cpu_state *)s->state)->keep_T = 0;
    return 0;
}

/* ---- speculative steps: the verify's kept states -------------------------- */

static int cpu_rollback(tern_session *s, int k, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    tern_cpu_state *st = s->state;
    int T = st->keep_T;
    if (k < 1 || k > T) return tern_fail(err, "rollback to %d of the verify's %d tokens", k, T);
    size_t per = tern_cpu_keep_floats(c), conv = tern_cfg_gdn_conv_floats(c);
    for (int l = 0, g = 0; k < T && l < c->n_layers; l++) {
        if (c->layer_kind[l] != TERN_LAYER_GDN) continue;
        const float *kept = st->keep + ((size_t)g++ * (size_t)(T - 1) + (size_t)(k - 1)) * per;
        memcpy(st->gdn[l].conv, kept, conv * sizeof(float));
        memcpy(st->gdn[l].S, kept + conv, tern_cfg_gdn_state_floats(c) * sizeof(float));
    }
    st->keep_T = 0;
    return 0;
}

static int cpu_copy(void *dst, const void *src, size_t n, tern_copy_kind kind, tern_error *err) {
    if (n) memcpy(dst, src, n);
    return 0;
}

static void *cpu_snap_alloc(size_t n, tern_error *err) {
    void *p = malloc(n);
    if (!p) tern_fail(err, "out of memory for a %zu-byte snapshot", n);
    return p;
}

static int cpu_wait(tern_error *err) { return 0; }

/* Long prompts run in pieces so scratch memory stays bounded; a multiple of
 * the GDN chunk keeps the chunk boundaries where one long call puts them. */
#define EVAL_PIECE 512

/* The CPU draws no row in the step: every row's logits come back. */
static int cpu_forward_many(tern_session *const *s, const int32_t *const *tokens, const int *n, int n_seq,
                            const tern_row_draw *draw, int32_t *id, float *logits, float *const *hidden,
                            tern_error *err) {
    (void)draw;
    for (int i = 0; id && i < n_seq; i++) id[i] = -1;
    tern_cpu_seq *q = malloc((size_t)n_seq * sizeof *q);
    if (!q) return tern_fail(err, "out of memory");
    size_t V = (size_t)s[0]->m->cfg.vocab;
    for (int i = 0; i < n_seq; i++)
        q[i] = (tern_cpu_seq){s[i], tokens[i], n[i], logits ? logits + i * V : NULL, 0, hidden ? hidden[i] : NULL, 0, 0};
    int rc = tern_cpu_forward_many(q, n_seq, err);
    free(q);
    return rc;
}

const tern_backend tern_cpu_backend = {
    .kv_bits = 32,
    .eval_piece = EVAL_PIECE,
    .server_batches = 1,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .reset = cpu_reset,
    .reserve = cpu_reserve,
    .kv_cap = cpu_kv_cap,
    .release_rows = cpu_release_rows,
    .forward = tern_cpu_forward,
    .forward_many = cpu_forward_many,
    .mtp_forward = tern_cpu_mtp_forward,
    .verify = tern_cpu_verify,
    .rollback = cpu_rollback,
    .sample_ok = cpu_sample_ok,
    .forward_sample = cpu_forward_sample,
    .sample_launch = cpu_sample_launch,
    .sample_wait = cpu_sample_wait,
    .sample_in_flight = cpu_sample_in_flight,
    .save = cpu_save,
    .load = cpu_load,
    .copy = cpu_copy,
    .snap_alloc = cpu_snap_alloc,
    .snap_free = free,
    .wait = cpu_wait,
};
