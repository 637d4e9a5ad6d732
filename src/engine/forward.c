/* The forward pass of the CPU reference engine, in the order data flows:
 * embedding -> per layer (the Gated DeltaNet or the gated attention block,
 * then the MoE block) -> final norm -> lm_head; and the MTP block. Each
 * block follows ../shared/docs/qwen36-model.md §2 (section numbers in the
 * banners); the per-op math is in src/cpu, the routed experts' scheduling
 * in engine/experts_cpu.c. The CPU backend (cpu_backend.c) runs a
 * session's steps here once session.c has checked their tokens. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/attention.h"
#include "cpu/gdn.h"
#include "cpu/moe.h"
#include "cpu/ops.h"
#include "cpu/qmatvec.h"
#include "engine/cpu_backend.h"
#include "engine/experts_cpu.h"
#include "util/err.h"

void tern_mm(tern_model *m, float *y, const float *x, int64_t T, const tern_mat *W) {
    if (m->fast && tern_gemv_supported(W) &&
        tern_qmatmul(m->pool, (tern_isa)m->isa, y, x, T, W) == 0)
        return;
    tern_matmul(m->pool, y, x, T, W);
}

/* ---- gated attention block (§2.3, §2.4) --------------------------------- */

/* q_proj's output per token, per head h: [query (head_dim) | gate
 * (head_dim)], interleaved head by head (not all queries then all gates). */
static inline size_t q_at(int t, int h, int nh, int hd) { return ((size_t)t * nh + h) * 2 * hd; }
static inline size_t gate_at(int t, int h, int nh, int hd) { return q_at(t, h, nh, hd) + hd; }
static inline size_t q_head_stride(int hd) { return (size_t)2 * hd; }

/* Where a session's routing observer (tern_session_set_route_observer)
 * hears of each token's experts. */
typedef struct {
    tern_route_fn fn;
    void *ud;
} route_obs;

/* One sequence's rows of a forward call and its state in the layer at
 * hand: rows [t0, t0 + n) sit at positions pos0.. of the sequence whose
 * attention rows are kv (format f) or whose DeltaNet state is gs. The
 * projections, the norms and the experts run over the rows of every
 * sequence at once; attention and the delta rule over each its own. */
typedef struct {
    int t0, n, pos0;
    tern_kv *kv;
    const tern_kv_format *f;
    tern_gdn_state *gs;
    int gdn_mode;
    route_obs obs;
    int step;                 /* the recurrence token by token, as one-token steps run it */
    float *keep;              /* step: the state after each token but the last goes here (or NULL) */
} seg;

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
    float *scores = tern_scratch_f((size_t)j->pos0 + (size_t)((end - 1) / nh) + 1);
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
    float *scores = tern_scratch_f((size_t)group * ((size_t)j->pos0 + (size_t)t_max + 1));
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

/* Queries and keys normed and rotated, the rows stored, then each query
 * attends over its sequence's cached rows. */
static void attn_seg(tern_model *m, const tern_attn_w *w, float *qg, float *k, float *v, const seg *q, float *o) {
    const tern_config *c = &m->cfg;
    int hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, row = nkv * hd;
    float scale = (float)c->rope.attn_factor;
    for (int t = q->t0; t < q->t0 + q->n; t++) {
        int pos = q->pos0 + t - q->t0;
        for (int h = 0; h < nh; h++) {
            float *qh = qg + q_at(t, h, nh, hd);
            tern_rmsnorm_1p(qh, qh, w->q_norm, hd, c->norm_eps);
            tern_rope(qh, c->rope_dim, m->inv_freq, scale, pos);
        }
        for (int g = 0; g < nkv; g++) {
            float *kh = k + (size_t)t * row + (size_t)g * hd;
            tern_rmsnorm_1p(kh, kh, w->k_norm, hd, c->norm_eps);
            tern_rope(kh, c->rope_dim, m->inv_freq, scale, pos);
        }
        store_row(q->f, k + (size_t)t * row, q->kv->k + (size_t)pos * q->f->row_bytes);
        store_row(q->f, v + (size_t)t * row, q->kv->v + (size_t)pos * q->f->row_bytes);
    }
    attend_job job = {m, qg + q_at(q->t0, 0, nh, hd), q->kv, q->f, q->pos0, o + (size_t)q->t0 * nh * hd};
    if (q->f->bits == 32) tern_pool_for(m->pool, (int64_t)q->n * nh, attend_f32, &job);
    else tern_pool_for(m->pool, (int64_t)q->n * nkv, attend_quant, &job);
}

static void attn_block(tern_model *m, const tern_attn_w *w, const float *xn, int T, const seg *sg, int n_seg,
                       float *out) {
    const tern_config *c = &m->cfg;
    int hd = c->head_dim, nh = c->n_heads, row = c->n_kv_heads * hd;
    float *qg = tern_scratch_f((size_t)T * nh * 2 * hd);
    float *k = tern_scratch_f((size_t)T * row), *v = tern_scratch_f((size_t)T * row);
    tern_mm(m, qg, xn, T, &w->q);
    tern_mm(m, k, xn, T, &w->k);
    tern_mm(m, v, xn, T, &w->v);
    float *o = tern_scratch_f((size_t)T * nh * hd);
    for (int i = 0; i < n_seg; i++) attn_seg(m, w, qg, k, v, &sg[i], o);
    /* output gate: o * sigmoid(gate), per head */
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            float *oh = o + ((size_t)t * nh + h) * hd;
            const float *gate = qg + gate_at(t, h, nh, hd);
            for (int d = 0; d < hd; d++) oh[d] *= tern_sigmoid(gate[d]);
        }
    tern_mm(m, out, o, T, &w->o);
    free(qg);
    free(k);
    free(v);
    free(o);
}

/* ---- Gated DeltaNet block (§2.5) ------------------------------------------ */

typedef struct {
    tern_gdn_io io;
    int mode, chunk;
} gdn_job;

static void gdn_heads(void *ctx, int64_t h0, int64_t h1) {
    const gdn_job *j = ctx;
    if (j->mode == TERN_GDN_RECURRENT) tern_gdn_recurrent(&j->io, (int)h0, (int)h1);
    else tern_gdn_chunked(&j->io, (int)h0, (int)h1, j->chunk);
}

/* The causal conv over one sequence's rows; stepwise, a token at a time,
 * its window after each token kept (the conv of a token does not depend
 * on how the rows are cut). */
static void conv_seg(const tern_config *c, const tern_gdn_w *w, const seg *q, const float *qkv, float *conv) {
    int C = tern_cfg_gdn_conv_dim(c), K = c->gdn_conv_kernel;
    size_t t0 = (size_t)q->t0;
    if (!q->step) {
        tern_gdn_conv(w->conv, q->gs->conv, qkv + t0 * C, q->n, C, K, conv + t0 * C);
        return;
    }
    for (int t = 0; t < q->n; t++) {
        tern_gdn_conv(w->conv, q->gs->conv, qkv + (t0 + t) * C, 1, C, K, conv + (t0 + t) * C);
        if (q->keep && t + 1 < q->n)
            memcpy(q->keep + t * tern_cpu_keep_floats(c), q->gs->conv, tern_cfg_gdn_conv_floats(c) * sizeof(float));
    }
}

/* The delta rule over one sequence's rows (io: its rows), value heads
 * spread over the pool; stepwise, in chunks of one token (each as a
 * decode step makes it), the state after each token kept. */
static void recur_seg(tern_model *m, const seg *q, gdn_job job) {
    const tern_config *c = &m->cfg;
    if (q->step) {
        job.chunk = 1;
        job.io.keep = q->keep ? q->keep + tern_cfg_gdn_conv_floats(c) : NULL;
        job.io.keep_stride = tern_cpu_keep_floats(c);
    }
    tern_pool_for(m->pool, c->gdn_v_heads, gdn_heads, &job);
}

static void gdn_block(tern_model *m, const tern_gdn_w *w, const float *xn, int T, const seg *sg, int n_seg,
                      float *out) {
    const tern_config *c = &m->cfg;
    int C = tern_cfg_gdn_conv_dim(c), kd = tern_cfg_gdn_key_dim(c), vd = tern_cfg_gdn_value_dim(c);
    int nk = c->gdn_k_heads, nv = c->gdn_v_heads, dk = c->gdn_k_dim, dv = c->gdn_v_dim;
    float *qkv = tern_scratch_f((size_t)T * C), *conv = tern_scratch_f((size_t)T * C);
    float *z = tern_scratch_f((size_t)T * vd), *b = tern_scratch_f((size_t)T * nv), *a = tern_scratch_f((size_t)T * nv);
    tern_mm(m, qkv, xn, T, &w->qkv);
    tern_mm(m, z, xn, T, &w->z);
    tern_mm(m, b, xn, T, &w->b);
    tern_mm(m, a, xn, T, &w->a);
    for (int i = 0; i < n_seg; i++) conv_seg(c, w, &sg[i], qkv, conv);

    /* q, k (L2-normed, q scaled), v heads; the decay g and the write strength beta */
    float *q = tern_scratch_f((size_t)T * kd), *k = tern_scratch_f((size_t)T * kd), *v = tern_scratch_f((size_t)T * vd);
    float *g = tern_scratch_f((size_t)T * nv), *beta = tern_scratch_f((size_t)T * nv);
    tern_gdn_inputs(conv, b, a, w->A_log, w->dt_bias, T, nk, nv, dk, dv, q, k, v, g, beta);

    float *o = tern_scratch_f((size_t)T * vd);
    for (int i = 0; i < n_seg; i++) {
        size_t t0 = (size_t)sg[i].t0;
        gdn_job job = {{sg[i].n, nk, nv, dk, dv, q + t0 * kd, k + t0 * kd, v + t0 * vd, g + t0 * nv, beta + t0 * nv,
                        sg[i].gs->S, o + t0 * vd, NULL, 0},
                       sg[i].gdn_mode, 64};
        recur_seg(m, &sg[i], job);
    }

    tern_gdn_gated_norm(o, z, w->norm, (size_t)T * nv, dv, c->norm_eps);
    tern_mm(m, out, o, T, &w->out);
    free(qkv); free(conv); free(z); free(b); free(a);
    free(q); free(k); free(v); free(g); free(beta); free(o);
}

/* ---- sparse MoE block (§2.6) --------------------------------------------- */

/* out = the routed experts (engine/experts_cpu.c) + sigmoid(x . w_sg) *
 * shared(x), per token. */
static int moe_block(tern_model *m, const tern_moe_w *w, const float *xn, int T, float *out, int layer,
                     const seg *sg, int n_seg, tern_error *err) {
    const tern_config *c = &m->cfg;
    int H = c->hidden, E = c->n_experts, K = c->top_k;
    float *probs = tern_scratch_f((size_t)T * E), *wt = tern_scratch_f((size_t)T * K);
    int *idx = malloc((size_t)T * K * sizeof(int));
    if (!idx) abort();
    tern_mm(m, probs, xn, T, &w->router);
    for (int t = 0; t < T; t++)
        tern_moe_topk(probs + (size_t)t * E, E, K, c->norm_topk, idx + (size_t)t * K, wt + (size_t)t * K);
    for (int i = 0; i < n_seg; i++)
        for (int t = sg[i].t0; sg[i].obs.fn && t < sg[i].t0 + sg[i].n; t++)
            sg[i].obs.fn(sg[i].obs.ud, layer, sg[i].pos0 + t - sg[i].t0, idx + (size_t)t * K, K);
    int rc = tern_moe_routed(m, w, xn, T, idx, wt, out, err);

    float *ye = tern_scratch_f((size_t)T * H), *gw = tern_scratch_f((size_t)H);
    tern_expert_ffn(m, &w->shared, xn, T, ye);
    tern_mat_row(&w->shared_gate, 0, gw);
    for (int t = 0; t < T; t++) {
        float s = tern_sigmoid(tern_dot(xn + (size_t)t * H, gw, H));
        for (int d = 0; d < H; d++) out[(size_t)t * H + d] += s * ye[(size_t)t * H + d];
    }
    free(probs); free(wt); free(idx); free(ye); free(gw);
    return rc;
}

/* ---- the layer and the model (§2.1, §2.7) ------------------------------- */

/* x [T, H] += mixer(norm(x)); x += moe(norm(x)). The mixer is attention
 * (the segments' kv) or Gated DeltaNet (their gs). */
static int decoder_layer(tern_model *m, const tern_layer_w *L, int layer, float *x, int T, const seg *sg, int n_seg,
                         tern_error *err) {
    int H = m->cfg.hidden;
    float eps = m->cfg.norm_eps;
    float *xn = tern_scratch_f((size_t)T * H), *out = tern_scratch_f((size_t)T * H);
    for (int t = 0; t < T; t++) tern_rmsnorm_1p(xn + (size_t)t * H, x + (size_t)t * H, L->in_norm, H, eps);
    if (L->kind == TERN_LAYER_ATTN) attn_block(m, &L->attn, xn, T, sg, n_seg, out);
    else gdn_block(m, &L->gdn, xn, T, sg, n_seg, out);
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] += out[i];
    for (int t = 0; t < T; t++) tern_rmsnorm_1p(xn + (size_t)t * H, x + (size_t)t * H, L->post_norm, H, eps);
    int rc = moe_block(m, &L->moe, xn, T, out, layer, sg, n_seg, err);
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] += out[i];
    free(xn);
    free(out);
    return rc;
}

int tern_check_tokens(const tern_config *c, const int32_t *tokens, int T, tern_error *err) {
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab)
            return tern_fail(err, "token id %d (at %d) is out of range [0, %d)", tokens[t], t, c->vocab);
    return 0;
}

/* Final norm of the needed rows and the lm_head. */
static void head(tern_model *m, const float *x, int T, float *logits, int all, float *hidden_out,
                 float *last_hidden) {
    int H = m->cfg.hidden;
    float *h = tern_scratch_f((size_t)T * H);
    for (int t = 0; t < T; t++) tern_rmsnorm_1p(h + (size_t)t * H, x + (size_t)t * H, m->w.final_norm, H, m->cfg.norm_eps);
    memcpy(last_hidden, h + (size_t)(T - 1) * H, (size_t)H * sizeof(float));
    if (hidden_out) memcpy(hidden_out, h, (size_t)T * H * sizeof(float));
    if (logits) {
        if (all) tern_mm(m, logits, h, T, &m->w.lm_head);
        else tern_mm(m, logits, h + (size_t)(T - 1) * H, 1, &m->w.lm_head);
    }
    free(h);
}

int tern_cpu_forward_many(const tern_cpu_seq *q, int n_seq, tern_error *err) {
    tern_model *m = q[0].s->m;
    const tern_config *c = &m->cfg;
    int H = c->hidden, T = 0;
    seg *sg = malloc((size_t)n_seq * sizeof *sg);
    if (!sg) return tern_fail(err, "out of memory");
    for (int i = 0; i < n_seq; i++) {
        tern_session *s = q[i].s;
        sg[i] = (seg){T, q[i].n, s->pos, NULL, &s->kvf, NULL, s->gdn_mode, {s->route_fn, s->route_ud}, q[i].step,
                      NULL};
        T += q[i].n;
        ((tern_cpu_state *)s->state)->keep_T = 0;
    }
    float *x = tern_scratch_f((size_t)T * H);
    for (int i = 0; i < n_seq; i++)
        for (int t = 0; t < q[i].n; t++) tern_mat_row(&m->w.embed, q[i].tokens[t], x + (size_t)(sg[i].t0 + t) * H);
    int rc = 0;
    for (int l = 0, n_gdn = 0; rc == 0 && l < c->n_layers; l++) {
        for (int i = 0; i < n_seq; i++) {
            tern_cpu_state *st = q[i].s->state;
            sg[i].kv = &st->kv[l];
            sg[i].gs = &st->gdn[l];
            if (q[i].keep && c->layer_kind[l] == TERN_LAYER_GDN)
                sg[i].keep = st->keep + (size_t)n_gdn * (size_t)(q[i].n - 1) * tern_cpu_keep_floats(c);
        }
        n_gdn += c->layer_kind[l] == TERN_LAYER_GDN;
        rc = decoder_layer(m, &m->w.layers[l], l, x, T, sg, n_seq, err);
        for (int i = 0; rc == 0 && i < n_seq; i++)
            if (q[i].s->hook) q[i].s->hook(q[i].s->hook_ctx, l, x + (size_t)sg[i].t0 * H, q[i].n);
    }
    for (int i = 0; i < n_seq; i++) {
        tern_session *s = q[i].s;
        /* an expert read failed mid-step: the state is partly advanced, so
         * the session is unusable until restored or reset */
        if (rc) {
            s->broken = 1;
            continue;
        }
        head(m, x + (size_t)sg[i].t0 * H, q[i].n, q[i].logits, q[i].all_logits, q[i].hidden_out, s->hidden);
        s->has_hidden = 1;
        s->pos += q[i].n;
    }
    free(x);
    free(sg);
    return rc;
}

int tern_cpu_forward(tern_session *s, const int32_t *tokens, int T, float *logits, int all_logits,
                     float *hidden_out, tern_error *err) {
    tern_cpu_seq q = {s, tokens, T, logits, all_logits, hidden_out, 0, 0};
    return tern_cpu_forward_many(&q, 1, err);
}

size_t tern_cpu_keep_floats(const tern_config *c) {
    return tern_cfg_gdn_conv_floats(c) + tern_cfg_gdn_state_floats(c);
}

int tern_cpu_verify(tern_session *s, const int32_t *tokens, int T, float *logits, float *hidden_out, int keep,
                    tern_error *err) {
    const tern_config *c = &s->m->cfg;
    tern_cpu_state *st = s->state;
    int n_gdn = 0;
    for (int l = 0; l < c->n_layers; l++) n_gdn += c->layer_kind[l] == TERN_LAYER_GDN;
    size_t need = keep ? (size_t)n_gdn * (size_t)(T - 1) * tern_cpu_keep_floats(c) : 0;
    if (need > st->keep_cap) {
        float *k = realloc(st->keep, need * sizeof(float));
        if (!k) return tern_fail(err, "out of memory keeping the verify's %d states", T);
        st->keep = k;
        st->keep_cap = need;
    }
    tern_cpu_seq q = {s, tokens, T, logits, 1, hidden_out, 1, keep && T > 1};
    if (tern_cpu_forward_many(&q, 1, err)) return -1;
    st->keep_T = keep ? T : 0;
    return 0;
}

/* ---- MTP block (§2.8) ---------------------------------------------------- */

int tern_cpu_mtp_forward(tern_session *s, const float *hidden, const int32_t *next, int n, float *logits,
                         float *hidden_out, tern_error *err) {
    tern_model *m = s->m;
    const tern_config *c = &m->cfg;
    const tern_mtp_w *w = &m->w.mtp;
    int H = c->hidden;
    if (!m->w.has_mtp) return tern_fail(err, "%s: the model has no MTP weights (mtp.*)", m->dir);
    if (n <= 0) return tern_fail(err, "no tokens for the MTP head");
    if (tern_check_tokens(c, next, n, err) ||
        tern_kv_reserve_host(&s->mtp_kv, &s->mtp_cap, s->mtp_pos + n, s->max_ctx, s->kvf.row_bytes, err))
        return -1;
    /* u = fc(concat(norm(embed(next)), norm(hidden))): embedding half first. */
    float *cat = tern_scratch_f((size_t)n * 2 * H), *x = tern_scratch_f((size_t)n * H);
    for (int i = 0; i < n; i++) {
        float *ce = cat + (size_t)i * 2 * H;
        tern_mat_row(&m->w.embed, next[i], ce);
        tern_rmsnorm_1p(ce, ce, w->pre_emb_norm, H, c->norm_eps);
        tern_rmsnorm_1p(ce + H, hidden + (size_t)i * H, w->pre_hidden_norm, H, c->norm_eps);
    }
    tern_mm(m, x, cat, n, &w->fc);
    seg sg = {0, n, s->mtp_pos, &s->mtp_kv, &s->kvf, NULL, s->gdn_mode, {s->route_fn, s->route_ud}, 0, NULL};
    if (decoder_layer(m, &w->layer, m->cfg.n_layers, x, n, &sg, 1, err)) {
        free(cat);
        free(x);
        s->broken = 1;
        return -1;
    }
    for (int i = 0; i < n; i++) tern_rmsnorm_1p(x + (size_t)i * H, x + (size_t)i * H, w->norm, H, c->norm_eps);
    if (logits) tern_mm(m, logits, x, n, &m->w.lm_head);
    if (hidden_out) memcpy(hidden_out, x, (size_t)n * H * sizeof(float));
    s->mtp_pos += n;
    free(cat);
    free(x);
    return 0;
}
