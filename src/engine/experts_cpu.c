/* The routed experts of the CPU engine's MoE block: the tokens grouped by
 * the expert they chose, then one of three schedules, all adding each
 * expert's weighted output in ascending expert order, so every schedule
 * gives the same sums:
 *   grouped    resident experts at decode sizes: every routed expert of
 *              the layer in two parallel loops (gate/up, then down)
 *   one by one resident experts otherwise: tern_expert_ffn per expert
 *   streamed   experts read through the slot cache, in waves */
#include "engine/experts_cpu.h"

#include <stdlib.h>
#include <string.h>

#include "cpu/moe.h"
#include "cpu/ops.h"
#include "cpu/qmatvec.h"
#include "model/packed.h"

void tern_expert_ffn(tern_model *m, const tern_expert_w *e, const float *x, int n, float *out) {
    int64_t I = e->gate.rows;
    float *gt = tern_scratch_f((size_t)n * I), *up = tern_scratch_f((size_t)n * I);
    tern_mm(m, gt, x, n, &e->gate);
    tern_mm(m, up, x, n, &e->up);
    tern_swiglu(gt, gt, up, (size_t)n * I);
    tern_mm(m, out, gt, n, &e->down);
    free(gt);
    free(up);
}

/* Tokens routed to each expert: the entries of expert e are at start[e] ..
 * start[e] + count[e] of tok and wt, in token order. */
typedef struct {
    int *count, *start;           /* [E] */
    int *tok;                     /* [T * K] */
    float *wt;                    /* [T * K] */
} routing;

static void group_by_expert(int E, int K, int T, const int *idx, const float *wt, routing *r) {
    memset(r->count, 0, (size_t)E * sizeof(int));
    for (int i = 0; i < T * K; i++) r->count[idx[i]]++;
    for (int e = 0, s = 0; e < E; e++) { r->start[e] = s; s += r->count[e]; }
    int *fill = calloc((size_t)E, sizeof(int));
    if (!fill) abort();
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int e = idx[(size_t)t * K + k], at = r->start[e] + fill[e]++;
            r->tok[at] = t;
            r->wt[at] = wt[(size_t)t * K + k];
        }
    free(fill);
}

/* Expert e applied to the tokens that chose it (gathered into xe); its
 * output, not yet weighted, is written to ye [count, H]. */
static void run_expert(tern_model *m, const tern_expert_w *ew, const float *xn, const routing *r, int e,
                       float *xe, float *ye) {
    int H = m->cfg.hidden, n = r->count[e];
    for (int i = 0; i < n; i++)
        memcpy(xe + (size_t)i * H, xn + (size_t)r->tok[r->start[e] + i] * H, (size_t)H * sizeof(float));
    tern_expert_ffn(m, ew, xe, n, ye);
}

/* out[token] += weight * ye[i] for expert e's tokens. */
static void accumulate(const tern_config *c, const routing *r, int e, const float *ye, float *out) {
    int H = c->hidden;
    for (int i = 0; i < r->count[e]; i++) {
        float w = r->wt[r->start[e] + i];
        float *o = out + (size_t)r->tok[r->start[e] + i] * H;
        for (int d = 0; d < H; d++) o[d] += w * ye[(size_t)i * H + d];
    }
}

/* ---- one by one --------------------------------------------------------- */

static void routed_one_by_one(tern_model *m, const tern_moe_w *w, const float *xn, int T, const routing *r,
                              float *out) {
    int H = m->cfg.hidden;
    float *xe = tern_scratch_f((size_t)T * H), *ye = tern_scratch_f((size_t)T * H);
    for (int e = 0; e < m->cfg.n_experts; e++) {
        if (!r->count[e]) continue;
        run_expert(m, &w->experts[e], xn, r, e, xe, ye);
        accumulate(&m->cfg, r, e, ye, out);
    }
    free(xe);
    free(ye);
}

/* ---- streamed ------------------------------------------------------------
 * The experts this step needs, in waves of at most the slots per layer.
 * Within a wave the hits run while the misses load; the outputs are added
 * in ascending expert order afterwards, so the sum is the same whatever
 * came from disk first. */
static int routed_streamed(tern_model *m, const tern_moe_w *w, const float *xn, int T, const routing *r,
                           float *out, tern_error *err) {
    const tern_config *c = &m->cfg;
    int H = c->hidden, E = c->n_experts, slots = tern_expert_cache_slots(m->experts);
    int *ids = malloc((size_t)E * sizeof(int)), n_ids = 0;
    size_t *off = malloc((size_t)E * sizeof(size_t));
    if (!ids || !off) abort();
    for (int e = 0; e < E; e++) if (r->count[e]) ids[n_ids++] = e;
    float *xe = tern_scratch_f((size_t)T * H), *ybuf = NULL;
    int rc = 0;
    for (int w0 = 0; w0 < n_ids && rc == 0; w0 += slots) {
        int n = n_ids - w0 < slots ? n_ids - w0 : slots;
        size_t total = 0;
        for (int i = 0; i < n; i++) { off[i] = total; total += (size_t)r->count[ids[w0 + i]] * H; }
        free(ybuf);
        ybuf = tern_scratch_f(total);
        tern_expert_batch b;
        if ((rc = tern_expert_cache_begin(m->experts, w->stream_index, ids + w0, n, &b, err)) != 0) break;
        for (int pass = 0; pass < 2 && rc == 0; pass++)       /* hits first, then misses */
            for (int i = 0; i < n && rc == 0; i++) {
                if (tern_expert_batch_is_hit(&b, i) != (pass == 0)) continue;
                const uint8_t *blob = tern_expert_batch_wait(&b, i, err);
                if (!blob) { rc = -1; break; }
                tern_expert_w ew;
                tern_packed_expert_view(&m->man, blob, &ew);
                run_expert(m, &ew, xn, r, ids[w0 + i], xe, ybuf + off[i]);
            }
        tern_expert_batch_end(&b);
        for (int i = 0; i < n && rc == 0; i++) accumulate(c, r, ids[w0 + i], ybuf + off[i], out);
    }
    free(ybuf);
    free(xe);
    free(ids);
    free(off);
    return rc;
}

/* ---- grouped ---------------------------------------------------------------
 * Resident experts at decode sizes: every routed expert of the layer in two
 * parallel loops (gate/up, then down) instead of three per expert, each
 * task a slice of one expert's rows. Per row it runs the same kernel on the
 * same inputs as tern_expert_ffn does, so the result is bit-identical; what
 * changes is 2 thread-pool wake-ups per layer instead of 3 per expert. */
#define GROUPED_MAX (TERN_GEMV_MAX_T * 64)

typedef struct {
    tern_model *m;
    const tern_moe_w *w;
    const routing *r;
    const int *ids;
    int n_ids, slices;
    float **prep;             /* [n_ids] the expert's tokens, prepared for gate/up */
    float **h;                /* [n_ids] [count, I] silu(gate) * up */
    float **ye;               /* [n_ids] [count, H] down */
} grouped_job;

static void slice_of(int64_t rows, int slices, int s, int64_t *r0, int64_t *r1) {
    *r0 = rows * s / slices;
    *r1 = rows * (s + 1) / slices;
}

static void grouped_up(void *ctx, int64_t b, int64_t e) {
    grouped_job *j = ctx;
    for (int64_t task = b; task < e; task++) {
        int i = (int)(task / j->slices), x = j->ids[i], n = j->r->count[x];
        const tern_expert_w *ew = &j->w->experts[x];
        int64_t I = ew->gate.rows, r0, r1;
        slice_of(I, j->slices, (int)(task % j->slices), &r0, &r1);
        float *g = tern_scratch_f((size_t)n * I);
        tern_gemv_batch((tern_isa)j->m->isa, &ew->gate, r0, r1, j->prep[i], n, g);
        tern_gemv_batch((tern_isa)j->m->isa, &ew->up, r0, r1, j->prep[i], n, j->h[i]);
        for (int t = 0; t < n; t++) {
            size_t at = (size_t)t * I + r0;
            tern_swiglu(j->h[i] + at, g + at, j->h[i] + at, (size_t)(r1 - r0));
        }
        free(g);
    }
}

static void grouped_down(void *ctx, int64_t b, int64_t e) {
    grouped_job *j = ctx;
    for (int64_t task = b; task < e; task++) {
        int i = (int)(task / j->slices), x = j->ids[i], n = j->r->count[x];
        const tern_mat *D = &j->w->experts[x].down;
        int64_t r0, r1;
        slice_of(D->rows, j->slices, (int)(task % j->slices), &r0, &r1);
        size_t plen = tern_gemv_prep_len(D);
        float *prep = tern_scratch_f((size_t)n * plen);
        for (int t = 0; t < n; t++) tern_gemv_prep(D, j->h[i] + (size_t)t * D->cols, prep + (size_t)t * plen);
        tern_gemv_batch((tern_isa)j->m->isa, D, r0, r1, prep, n, j->ye[i]);
        free(prep);
    }
}

static int grouped_ok(const tern_model *m, const tern_moe_w *w, int T, const routing *r) {
    /* routed_grouped keeps the layer's experts in arrays of GROUPED_MAX */
    if (!m->fast || !w->experts || T > TERN_GEMV_MAX_T || T * m->cfg.top_k > GROUPED_MAX) return 0;
    for (int e = 0; e < m->cfg.n_experts; e++) {
        if (!r->count[e]) continue;
        const tern_expert_w *x = &w->experts[e];
        if (!tern_gemv_supported(&x->gate) || !tern_gemv_supported(&x->up) || !tern_gemv_supported(&x->down))
            return 0;
    }
    return 1;
}

static void routed_grouped(tern_model *m, const tern_moe_w *w, const float *xn, const routing *r, float *out) {
    const tern_config *c = &m->cfg;
    int H = c->hidden, E = c->n_experts, ids[GROUPED_MAX], n_ids = 0;
    for (int e = 0; e < E; e++) if (r->count[e]) ids[n_ids++] = e;   /* at most T x top_k <= GROUPED_MAX */
    float *prep[GROUPED_MAX], *h[GROUPED_MAX], *ye[GROUPED_MAX];
    int threads = tern_pool_size(m->pool);
    grouped_job j = {m, w, r, ids, n_ids, (threads + n_ids - 1) / n_ids, prep, h, ye};
    for (int i = 0; i < n_ids; i++) {
        const tern_expert_w *ew = &w->experts[ids[i]];
        int n = r->count[ids[i]];
        size_t plen = tern_gemv_prep_len(&ew->gate);
        prep[i] = tern_scratch_f((size_t)n * plen);
        h[i] = tern_scratch_f((size_t)n * ew->gate.rows);
        ye[i] = tern_scratch_f((size_t)n * H);
        for (int t = 0; t < n; t++)
            tern_gemv_prep(&ew->gate, xn + (size_t)r->tok[r->start[ids[i]] + t] * H, prep[i] + (size_t)t * plen);
    }
    tern_pool_for(m->pool, (int64_t)n_ids * j.slices, grouped_up, &j);
    tern_pool_for(m->pool, (int64_t)n_ids * j.slices, grouped_down, &j);
    for (int i = 0; i < n_ids; i++) {
        accumulate(c, r, ids[i], ye[i], out);
        free(prep[i]);
        free(h[i]);
        free(ye[i]);
    }
}

/* ---- the choice ------------------------------------------------------------ */

int tern_moe_routed(tern_model *m, const tern_moe_w *w, const float *xn, int T, const int *idx, const float *wt,
                    float *out, tern_error *err) {
    const tern_config *c = &m->cfg;
    int E = c->n_experts, K = c->top_k;
    routing r = {malloc((size_t)E * sizeof(int)), malloc((size_t)E * sizeof(int)),
                 malloc((size_t)T * K * sizeof(int)), tern_scratch_f((size_t)T * K)};
    if (!r.count || !r.start || !r.tok) abort();
    group_by_expert(E, K, T, idx, wt, &r);
    memset(out, 0, (size_t)T * c->hidden * sizeof(float));
    int rc = 0;
    if (grouped_ok(m, w, T, &r)) routed_grouped(m, w, xn, &r, out);
    else if (w->experts) routed_one_by_one(m, w, xn, T, &r, out);
    else rc = routed_streamed(m, w, xn, T, &r, out, err);
    free(r.count); free(r.start); free(r.tok); free(r.wt);
    return rc;
}
