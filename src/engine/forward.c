/* The forward pass of the CPU reference engine, in the order data flows:
 * embedding -> per layer (Gated DeltaNet or gated attention, then MoE) ->
 * final norm -> lm_head. Shapes follow ../shared/docs/qwen36-model.md §2. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/attention.h"
#include "cpu/gdn.h"
#include "cpu/ops.h"
#include "cpu/qmatvec.h"
#include "engine/engine.h"
#include "engine/gpu.h"
#include "model/packed.h"
#include "util/err.h"

/* Scratch that must not fail mid-layer: an allocation failure here is not a
 * recoverable input error, so it aborts. */
static float *alloc_f(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) abort();
    return p;
}

/* y[T, W.rows] = x[T, W.cols] @ W^T: the SIMD kernels (fast mode), else
 * the reference product. */
static void mm(tern_model *m, float *y, const float *x, int64_t T, const tern_mat *W) {
    if (m->fast && tern_gemv_supported(W) &&
        tern_qmatmul(m->pool, (tern_isa)m->isa, y, x, T, W) == 0)
        return;
    tern_matmul(m->pool, y, x, T, W);
}

/* ---- gated full attention ---------------------------------------------- */

/* q_proj's output per token, per head h: [query (head_dim) | gate
 * (head_dim)], interleaved head by head (not all queries then all gates). */
static inline size_t q_at(int t, int h, int nh, int hd) { return ((size_t)t * nh + h) * 2 * hd; }
static inline size_t gate_at(int t, int h, int nh, int hd) { return q_at(t, h, nh, hd) + hd; }
static inline size_t q_head_stride(int hd) { return (size_t)2 * hd; }

typedef struct {
    const tern_model *m;
    const float *qg;          /* [T, n_heads, 2, head_dim] query | gate per head */
    const tern_kv *kv;
    const tern_kv_format *f;
    int pos0;
    float *o;                 /* [T, n_heads * head_dim] */
} attend_job;

/* fp32 rows (the reference): work item i = (token t, query head h). */
static void attend_f32(void *ctx, int64_t begin, int64_t end) {
    const attend_job *j = ctx;
    const tern_config *c = &j->m->cfg;
    int hd = c->head_dim, nh = c->n_heads, row = c->n_kv_heads * hd;
    int group = nh / c->n_kv_heads;
    /* the last item's token attends to the most positions */
    float *scores = alloc_f((size_t)j->pos0 + (size_t)((end - 1) / nh) + 1);
    float scale = 1.0f / sqrtf((float)hd);
    const float *K = (const float *)j->kv->k, *V = (const float *)j->kv->v;
    for (int64_t i = begin; i < end; i++) {
        int t = (int)(i / nh), h = (int)(i % nh), g = h / group;
        const float *q = j->qg + q_at(t, h, nh, hd);
        float *o = j->o + ((size_t)t * nh + h) * hd;
        tern_attend(o, q, K + (size_t)g * hd, V + (size_t)g * hd, j->pos0 + t + 1, row, hd, scale, scores);
    }
    free(scores);
}

/* Quantized rows: work item i = (token t, kv head g), taking the query
 * heads that share g together so each K/V row is read once for them. */
static void attend_quant(void *ctx, int64_t begin, int64_t end) {
    const attend_job *j = ctx;
    const tern_config *c = &j->m->cfg;
    int hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, group = nh / nkv;
    int t_max = (int)((end - 1) / nkv);
    float *scores = alloc_f((size_t)group * ((size_t)j->pos0 + (size_t)t_max + 1));
    float scale = 1.0f / sqrtf((float)hd);
    for (int64_t i = begin; i < end; i++) {
        int t = (int)(i / nkv), g = (int)(i % nkv), h0 = g * group;
        tern_kv_attend((tern_isa)j->m->isa, &j->f->q, g, j->qg + q_at(t, h0, nh, hd), group,
                       q_head_stride(hd), j->kv->k, j->kv->v, j->f->row_bytes, j->pos0 + t + 1, scale, scores,
                       j->o + ((size_t)t * nh + h0) * hd, (size_t)hd);
    }
    free(scores);
}

static void store_row(const tern_kv_format *f, const float *x, uint8_t *dst) {
    if (f->bits == 32) memcpy(dst, x, f->row_bytes);
    else tern_kv_quantize_row(&f->q, x, dst);
}

static void attn_layer(tern_model *m, const tern_attn_w *w, const float *xn, int T, int pos0, tern_kv *kv,
                       const tern_kv_format *f, float *out) {
    const tern_config *c = &m->cfg;
    int hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, row = nkv * hd;
    float *qg = alloc_f((size_t)T * nh * 2 * hd);
    float *k = alloc_f((size_t)T * row), *v = alloc_f((size_t)T * row);
    mm(m, qg, xn, T, &w->q);
    mm(m, k, xn, T, &w->k);
    mm(m, v, xn, T, &w->v);
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < nh; h++) {
            float *q = qg + q_at(t, h, nh, hd);
            tern_rmsnorm_1p(q, q, w->q_norm, hd, c->norm_eps);
            tern_rope(q, c->rope_dim, m->inv_freq, pos0 + t);
        }
        for (int g = 0; g < nkv; g++) {
            float *kh = k + (size_t)t * row + (size_t)g * hd;
            tern_rmsnorm_1p(kh, kh, w->k_norm, hd, c->norm_eps);
            tern_rope(kh, c->rope_dim, m->inv_freq, pos0 + t);
        }
        store_row(f, k + (size_t)t * row, kv->k + (size_t)(pos0 + t) * f->row_bytes);
        store_row(f, v + (size_t)t * row, kv->v + (size_t)(pos0 + t) * f->row_bytes);
    }
    float *o = alloc_f((size_t)T * nh * hd);
    attend_job job = {m, qg, kv, f, pos0, o};
    if (f->bits == 32) tern_pool_for(m->pool, (int64_t)T * nh, attend_f32, &job);
    else tern_pool_for(m->pool, (int64_t)T * nkv, attend_quant, &job);
    /* output gate: o * sigmoid(gate), per head */
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            float *oh = o + ((size_t)t * nh + h) * hd;
            const float *gate = qg + gate_at(t, h, nh, hd);
            for (int d = 0; d < hd; d++) oh[d] *= tern_sigmoid(gate[d]);
        }
    mm(m, out, o, T, &w->o);
    free(qg);
    free(k);
    free(v);
    free(o);
}

/* ---- Gated DeltaNet ----------------------------------------------------- */

/* Causal depthwise conv (kernel K) + SiLU over the qkv channels. Input row
 * i < 0 comes from the conv state (the previous K-1 rows); the state then
 * keeps the last K-1 rows. */
static void gdn_conv(const tern_config *c, const float *wconv, float *state, const float *qkv, int T,
                     float *outc) {
    int C = tern_cfg_gdn_conv_dim(c), K = c->gdn_conv_kernel;
#define IN(i, ch) ((i) >= 0 ? qkv[(size_t)(i) * C + (ch)] : state[(size_t)((K - 1) + (i)) * C + (ch)])
    for (int t = 0; t < T; t++)
        for (int ch = 0; ch < C; ch++) {
            float acc = 0.0f;
            for (int j = 0; j < K; j++) acc += wconv[(size_t)ch * K + j] * IN(t - (K - 1) + j, ch);
            outc[(size_t)t * C + ch] = tern_silu(acc);
        }
    float *next = alloc_f((size_t)(K - 1) * C);
    for (int r = 0; r < K - 1; r++)
        for (int ch = 0; ch < C; ch++) next[(size_t)r * C + ch] = IN(T - (K - 1) + r, ch);
#undef IN
    memcpy(state, next, (size_t)(K - 1) * C * sizeof(float));
    free(next);
}

/* x / sqrt(sum(x^2) + 1e-6), the reference's l2norm (eps fixed at 1e-6). */
static void l2norm(float *x, int n) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss + 1e-6f);
    for (int i = 0; i < n; i++) x[i] *= r;
}

typedef struct {
    tern_gdn_io io;
    int mode;
} gdn_job;

static void gdn_heads(void *ctx, int64_t h0, int64_t h1) {
    const gdn_job *j = ctx;
    if (j->mode == TERN_GDN_RECURRENT) tern_gdn_recurrent(&j->io, (int)h0, (int)h1);
    else tern_gdn_chunked(&j->io, (int)h0, (int)h1, 64);
}

static void gdn_layer(tern_model *m, const tern_gdn_w *w, const float *xn, int T, tern_gdn_state *st, int mode,
                      float *out) {
    const tern_config *c = &m->cfg;
    int C = tern_cfg_gdn_conv_dim(c), kd = tern_cfg_gdn_key_dim(c), vd = tern_cfg_gdn_value_dim(c);
    int nk = c->gdn_k_heads, nv = c->gdn_v_heads, dk = c->gdn_k_dim, dv = c->gdn_v_dim;
    float *qkv = alloc_f((size_t)T * C), *conv = alloc_f((size_t)T * C);
    float *z = alloc_f((size_t)T * vd), *b = alloc_f((size_t)T * nv), *a = alloc_f((size_t)T * nv);
    mm(m, qkv, xn, T, &w->qkv);
    mm(m, z, xn, T, &w->z);
    mm(m, b, xn, T, &w->b);
    mm(m, a, xn, T, &w->a);
    gdn_conv(c, w->conv, st->conv, qkv, T, conv);

    /* Split the conv output into q | k | v heads (flat channel order). */
    float *q = alloc_f((size_t)T * kd), *k = alloc_f((size_t)T * kd), *v = alloc_f((size_t)T * vd);
    float *g = alloc_f((size_t)T * nv), *beta = alloc_f((size_t)T * nv);
    float qscale = 1.0f / sqrtf((float)dk);
    for (int t = 0; t < T; t++) {
        const float *row = conv + (size_t)t * C;
        memcpy(q + (size_t)t * kd, row, (size_t)kd * sizeof(float));
        memcpy(k + (size_t)t * kd, row + kd, (size_t)kd * sizeof(float));
        memcpy(v + (size_t)t * vd, row + 2 * kd, (size_t)vd * sizeof(float));
        for (int h = 0; h < nk; h++) {
            float *qh = q + (size_t)t * kd + (size_t)h * dk;
            l2norm(qh, dk);
            for (int i = 0; i < dk; i++) qh[i] *= qscale;
            l2norm(k + (size_t)t * kd + (size_t)h * dk, dk);
        }
        for (int j = 0; j < nv; j++) {
            size_t i = (size_t)t * nv + j;
            beta[i] = tern_sigmoid(b[i]);
            g[i] = -expf(w->A_log[j]) * tern_softplus(a[i] + w->dt_bias[j]);
        }
    }
    float *o = alloc_f((size_t)T * vd);
    gdn_job job = {{T, nk, nv, dk, dv, q, k, v, g, beta, st->S, o}, mode};
    tern_pool_for(m->pool, nv, gdn_heads, &job);

    /* Gated RMSNorm per (token, value head): plain weight, times silu(z) of
     * the same head. */
    for (size_t i = 0; i < (size_t)T * nv; i++) {
        float *oh = o + i * dv;
        const float *zh = z + i * dv;
        tern_rmsnorm(oh, oh, w->norm, dv, c->norm_eps);
        for (int d = 0; d < dv; d++) oh[d] *= tern_silu(zh[d]);
    }
    mm(m, out, o, T, &w->out);
    free(qkv); free(conv); free(z); free(b); free(a);
    free(q); free(k); free(v); free(g); free(beta); free(o);
}

/* ---- sparse MoE --------------------------------------------------------- */

/* out[n, H] = (silu(x G^T) * (x U^T)) D^T */
static void swiglu(tern_model *m, const tern_expert_w *e, const float *x, int n, float *out) {
    int64_t I = e->gate.rows;
    float *gt = alloc_f((size_t)n * I), *up = alloc_f((size_t)n * I);
    mm(m, gt, x, n, &e->gate);
    mm(m, up, x, n, &e->up);
    for (size_t i = 0; i < (size_t)n * I; i++) gt[i] = tern_silu(gt[i]) * up[i];
    mm(m, out, gt, n, &e->down);
    free(gt);
    free(up);
}

/* Router: softmax over all experts, top-k (largest first, ties to the lower
 * index), renormalised over the k. */
static void route(const tern_config *c, float *probs, int *idx, float *wt) {
    tern_softmax(probs, c->n_experts);
    float sum = 0.0f;
    for (int r = 0; r < c->top_k; r++) {
        int best = -1;
        for (int e = 0; e < c->n_experts; e++) {
            int taken = 0;
            for (int q = 0; q < r; q++) taken |= idx[q] == e;
            if (!taken && (best < 0 || probs[e] > probs[best])) best = e;
        }
        idx[r] = best;
        wt[r] = probs[best];
        sum += wt[r];
    }
    if (c->norm_topk)
        for (int r = 0; r < c->top_k; r++) wt[r] /= sum;
}

/* Tokens routed to each expert: rows[e] lists (token, weight) pairs. */
typedef struct {
    int *count, *start;           /* [E]: entries of expert e are at start[e] .. start[e] + count[e] */
    int *tok;                     /* [T * K] */
    float *wt;
} routing;

/* Where a session's routing observer (tern_session_set_route_observer)
 * hears of each token's experts. */
typedef struct {
    tern_route_fn fn;
    void *ud;
    int layer, pos0;
} route_obs;

static void route_tokens(const tern_config *c, float *probs, int T, routing *r, const route_obs *obs) {
    int E = c->n_experts, K = c->top_k;
    int *idx = malloc((size_t)T * K * sizeof(int));
    float *wt = alloc_f((size_t)T * K);
    if (!idx) abort();
    for (int t = 0; t < T; t++) route(c, probs + (size_t)t * E, idx + (size_t)t * K, wt + (size_t)t * K);
    if (obs && obs->fn)
        for (int t = 0; t < T; t++) obs->fn(obs->ud, obs->layer, obs->pos0 + t, idx + (size_t)t * K, K);
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
    free(idx);
    free(wt);
}

/* Expert e applied to the tokens that chose it; its weighted output is
 * written to ye [count, H] (accumulated later, in expert order). */
static void run_expert(tern_model *m, const tern_expert_w *ew, const float *xn, const routing *r, int e,
                       float *xe, float *ye) {
    int H = m->cfg.hidden, n = r->count[e];
    for (int i = 0; i < n; i++)
        memcpy(xe + (size_t)i * H, xn + (size_t)r->tok[r->start[e] + i] * H, (size_t)H * sizeof(float));
    swiglu(m, ew, xe, n, ye);
}

static void accumulate(const tern_config *c, const routing *r, int e, const float *ye, float *out) {
    int H = c->hidden;
    for (int i = 0; i < r->count[e]; i++) {
        float w = r->wt[r->start[e] + i];
        float *o = out + (size_t)r->tok[r->start[e] + i] * H;
        for (int d = 0; d < H; d++) o[d] += w * ye[(size_t)i * H + d];
    }
}

/* Streamed experts: the experts this step needs, in waves of at most the
 * slots per layer. Within a wave the hits run while the misses load; the
 * outputs are added in ascending expert order afterwards, so the sum is the
 * same whatever came from disk first. */
static int routed_streamed(tern_model *m, const tern_moe_w *w, const float *xn, int T, const routing *r,
                           float *out, tern_error *err) {
    const tern_config *c = &m->cfg;
    int H = c->hidden, E = c->n_experts, slots = tern_expert_cache_slots(m->experts);
    int *ids = malloc((size_t)E * sizeof(int)), n_ids = 0;
    size_t *off = malloc((size_t)E * sizeof(size_t));
    if (!ids || !off) abort();
    for (int e = 0; e < E; e++) if (r->count[e]) ids[n_ids++] = e;
    float *xe = alloc_f((size_t)T * H), *ybuf = NULL;
    int rc = 0;
    for (int w0 = 0; w0 < n_ids && rc == 0; w0 += slots) {
        int n = n_ids - w0 < slots ? n_ids - w0 : slots;
        size_t total = 0;
        for (int i = 0; i < n; i++) { off[i] = total; total += (size_t)r->count[ids[w0 + i]] * H; }
        free(ybuf);
        ybuf = alloc_f(total);
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

/* Resident experts at decode sizes: every routed expert of the layer in two
 * parallel loops (gate/up, then down) instead of three per expert, each
 * task a slice of one expert's rows. Per row it runs the same kernel on the
 * same inputs as swiglu() does, so the result is bit-identical; what
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
        float *g = alloc_f((size_t)n * I);
        tern_gemv_batch((tern_isa)j->m->isa, &ew->gate, r0, r1, j->prep[i], n, g);
        tern_gemv_batch((tern_isa)j->m->isa, &ew->up, r0, r1, j->prep[i], n, j->h[i]);
        for (int t = 0; t < n; t++)
            for (int64_t q = r0; q < r1; q++) {
                size_t at = (size_t)t * I + q;
                j->h[i][at] = tern_silu(g[at]) * j->h[i][at];
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
        float *prep = alloc_f((size_t)n * plen);
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
        prep[i] = alloc_f((size_t)n * plen);
        h[i] = alloc_f((size_t)n * ew->gate.rows);
        ye[i] = alloc_f((size_t)n * H);
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

static int moe_layer(tern_model *m, const tern_moe_w *w, const float *xn, int T, float *out, const route_obs *obs,
                     tern_error *err) {
    const tern_config *c = &m->cfg;
    int H = c->hidden, E = c->n_experts, K = c->top_k;
    float *probs = alloc_f((size_t)T * E);
    routing r = {malloc((size_t)E * sizeof(int)), malloc((size_t)E * sizeof(int)),
                 malloc((size_t)T * K * sizeof(int)), alloc_f((size_t)T * K)};
    if (!r.count || !r.start || !r.tok) abort();
    mm(m, probs, xn, T, &w->router);
    route_tokens(c, probs, T, &r, obs);

    /* Routed experts, each applied once to the tokens that chose it, added
     * in ascending expert order (as the reference's eager loop does). */
    memset(out, 0, (size_t)T * H * sizeof(float));
    float *xe = alloc_f((size_t)T * H), *ye = alloc_f((size_t)T * H);
    int rc = 0;
    if (grouped_ok(m, w, T, &r)) {
        routed_grouped(m, w, xn, &r, out);
    } else if (w->experts) {
        for (int e = 0; e < E; e++) {
            if (!r.count[e]) continue;
            run_expert(m, &w->experts[e], xn, &r, e, xe, ye);
            accumulate(c, &r, e, ye, out);
        }
    } else {
        rc = routed_streamed(m, w, xn, T, &r, out, err);
    }
    /* Shared expert, scaled per token by sigmoid(x . w_sg). */
    swiglu(m, &w->shared, xn, T, ye);
    float *sg = alloc_f((size_t)H);
    tern_mat_row(&w->shared_gate, 0, sg);
    for (int t = 0; t < T; t++) {
        float s = tern_sigmoid(tern_dot(xn + (size_t)t * H, sg, H));
        for (int d = 0; d < H; d++) out[(size_t)t * H + d] += s * ye[(size_t)t * H + d];
    }
    free(probs); free(r.count); free(r.start); free(r.tok); free(r.wt); free(xe); free(ye); free(sg);
    return rc;
}

/* ---- decoder layer and model -------------------------------------------- */

/* x [T, H] += mixer(norm(x)); x += moe(norm(x)). The mixer is attention (kv
 * used) or Gated DeltaNet (gs used). */
static int decoder_layer(tern_model *m, const tern_layer_w *L, float *x, int T, int pos0, tern_kv *kv,
                         const tern_kv_format *f, tern_gdn_state *gs, int gdn_mode, const route_obs *obs,
                         tern_error *err) {
    int H = m->cfg.hidden;
    float eps = m->cfg.norm_eps;
    float *xn = alloc_f((size_t)T * H), *out = alloc_f((size_t)T * H);
    for (int t = 0; t < T; t++) tern_rmsnorm_1p(xn + (size_t)t * H, x + (size_t)t * H, L->in_norm, H, eps);
    if (L->kind == TERN_LAYER_ATTN) attn_layer(m, &L->attn, xn, T, pos0, kv, f, out);
    else gdn_layer(m, &L->gdn, xn, T, gs, gdn_mode, out);
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] += out[i];
    for (int t = 0; t < T; t++) tern_rmsnorm_1p(xn + (size_t)t * H, x + (size_t)t * H, L->post_norm, H, eps);
    int rc = moe_layer(m, &L->moe, xn, T, out, obs, err);
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] += out[i];
    free(xn);
    free(out);
    return rc;
}

static int check_tokens(const tern_config *c, const int32_t *tokens, int T, tern_error *err) {
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab)
            return tern_fail(err, "token id %d (at %d) is out of range [0, %d)", tokens[t], t, c->vocab);
    return 0;
}

/* Final norm of the needed rows and the lm_head. */
static void head(tern_model *m, const float *x, int T, float *logits, int all, float *hidden_out,
                 float *last_hidden) {
    int H = m->cfg.hidden;
    float *h = alloc_f((size_t)T * H);
    for (int t = 0; t < T; t++) tern_rmsnorm_1p(h + (size_t)t * H, x + (size_t)t * H, m->w.final_norm, H, m->cfg.norm_eps);
    memcpy(last_hidden, h + (size_t)(T - 1) * H, (size_t)H * sizeof(float));
    if (hidden_out) memcpy(hidden_out, h, (size_t)T * H * sizeof(float));
    if (logits) {
        if (all) mm(m, logits, h, T, &m->w.lm_head);
        else mm(m, logits, h + (size_t)(T - 1) * H, 1, &m->w.lm_head);
    }
    free(h);
}

int tern_forward(tern_session *s, const int32_t *tokens, int T, float *logits, int all_logits,
                 float *hidden_out, tern_error *err) {
    tern_model *m = s->m;
    const tern_config *c = &m->cfg;
    int H = c->hidden;
    if (T <= 0) return tern_fail(err, "no tokens to evaluate");
    if (check_tokens(c, tokens, T, err) || tern_session_reserve(s, s->pos + T, err)) return -1;
    if (s->gpu) {
        if (hidden_out) return tern_fail(err, "GPU: per-token hidden states are not read back");
        return tern_gpu_forward(s, tokens, T, logits, all_logits, err);
    }
    float *x = alloc_f((size_t)T * H);
    for (int t = 0; t < T; t++) tern_mat_row(&m->w.embed, tokens[t], x + (size_t)t * H);
    for (int l = 0; l < c->n_layers; l++) {
        route_obs obs = {s->route_fn, s->route_ud, l, s->pos};
        if (decoder_layer(m, &m->w.layers[l], x, T, s->pos, &s->kv[l], &s->kvf, &s->gdn[l], s->gdn_mode, &obs, err)) {
            /* An expert read failed mid-step: the session state is now
             * partly advanced, so it is unusable until restored or reset. */
            free(x);
            s->broken = 1;
            return -1;
        }
        if (s->hook) s->hook(s->hook_ctx, l, x, T);
    }
    head(m, x, T, logits, all_logits, hidden_out, s->hidden);
    s->has_hidden = 1;
    s->pos += T;
    free(x);
    return 0;
}

int tern_forward_sample(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, int32_t *next,
                        tern_error *err) {
    if (!s->gpu) return tern_fail(err, "sampling in the step needs a GPU session");
    if (check_tokens(&s->m->cfg, &token, 1, err) || tern_session_reserve(s, s->pos + 1, err)) return -1;
    return tern_gpu_forward_sample(s, token, rule, u, next, err);
}

int tern_forward_sample_launch(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, tern_error *err) {
    if (!s->gpu) return tern_fail(err, "sampling in the step needs a GPU session");
    if (token != -1 && check_tokens(&s->m->cfg, &token, 1, err)) return -1;   /* (the KV caches: tern_gpu_sample_launch) */
    return tern_gpu_sample_launch(s, token, rule, u, err);
}

/* ---- MTP head ----------------------------------------------------------- */

int tern_mtp_forward(tern_session *s, const float *hidden, const int32_t *next, int n, float *logits,
                     tern_error *err) {
    tern_model *m = s->m;
    const tern_config *c = &m->cfg;
    const tern_mtp_w *w = &m->w.mtp;
    int H = c->hidden;
    if (!m->w.has_mtp) return tern_fail(err, "%s: the model has no MTP weights (mtp.*)", m->dir);
    if (s->gpu) return tern_fail(err, "the MTP head does not run on the GPU yet");
    if (n <= 0) return tern_fail(err, "no tokens for the MTP head");
    if (check_tokens(c, next, n, err) || tern_session_reserve_mtp(s, s->mtp_pos + n, err)) return -1;
    /* u = fc(concat(norm(embed(next)), norm(hidden))): embedding half first. */
    float *cat = alloc_f((size_t)n * 2 * H), *x = alloc_f((size_t)n * H);
    for (int i = 0; i < n; i++) {
        float *ce = cat + (size_t)i * 2 * H;
        tern_mat_row(&m->w.embed, next[i], ce);
        tern_rmsnorm_1p(ce, ce, w->pre_emb_norm, H, c->norm_eps);
        tern_rmsnorm_1p(ce + H, hidden + (size_t)i * H, w->pre_hidden_norm, H, c->norm_eps);
    }
    mm(m, x, cat, n, &w->fc);
    route_obs obs = {s->route_fn, s->route_ud, m->cfg.n_layers, s->mtp_pos};
    if (decoder_layer(m, &w->layer, x, n, s->mtp_pos, &s->mtp_kv, &s->kvf, NULL, s->gdn_mode, &obs, err)) {
        free(cat);
        free(x);
        s->broken = 1;
        return -1;
    }
    for (int i = 0; i < n; i++) tern_rmsnorm_1p(x + (size_t)i * H, x + (size_t)i * H, w->norm, H, c->norm_eps);
    if (logits) mm(m, logits, x, n, &m->w.lm_head);
    s->mtp_pos += n;
    free(cat);
    free(x);
    return 0;
}
