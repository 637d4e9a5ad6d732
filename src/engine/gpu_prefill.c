/* The GPU forward pass over a gpu_pass (one session's T tokens, or
 * several sessions' together), layer by layer, in forward.c's order
 * on the ops of src/cuda: the GEMV kernels or cuBLAS for the projections,
 * the prefill attention and the chunked DeltaNet past SUB tokens (the
 * decode forms up to it), the experts grouped by expert or the fused
 * decode launch. gpu_decode.c runs a single token its own way. */
#ifdef TERN_CUDA

#include "engine/gpu_internal.h"

#include <math.h>

#include "util/err.h"

/* y[T, W.rows] = x[T, W.cols] W^T in fp32 whatever T: the GEMV kernels 8
 * tokens at a time. */
static int mm_fp32(const gpu_session *g, float *y, const float *x, int T, const tern_mat *W, tern_error *err) {
    for (int t0 = 0; t0 < T; t0 += TERN_CUDA_GEMV_MAX_T) {
        int n = T - t0 < TERN_CUDA_GEMV_MAX_T ? T - t0 : TERN_CUDA_GEMV_MAX_T;
        if (tern_cuda_gemv(W, x + (size_t)t0 * W->cols, n, y + (size_t)t0 * W->rows, g->stream, err)) return -1;
    }
    return 0;
}

/* The same: the GEMV kernels up to their token count, cuBLAS above it. */
int tern_gpu_mm(const gpu_model *gm, const gpu_session *g, float *y, const float *x, int T, const tern_mat *W,
              tern_error *err) {
    if (T <= TERN_CUDA_GEMV_MAX_T) return mm_fp32(g, y, x, T, W, err);
    return tern_cuda_gemm(gm->ctx, W, x, T, y, g->stream, err);
}

/* A decode-sized step's attention (T <= SUB): K/V rows into s's cache,
 * then the split-K attention into o, on g's stream and workspace (g: s's
 * own state, or in a pass of several sessions the first one's). While a
 * graph is captured the position is read on the device and the splits are
 * planned for g->n_plan, so the graph serves the following tokens too. */
int tern_gpu_attend_small(tern_session *s, gpu_session *g, const tern_cuda_attn_dims *d, float *qg, float *k,
                          float *v, float *o, const tern_attn_w *w, int l, int T, tern_error *err) {
    const gpu_model *gm = s->m->gpu;
    const tern_kv *kv = &((gpu_session *)s->state)->kv[l];
    float scale = 1.0f / sqrtf((float)s->m->cfg.head_dim);
    if (g->pos_dev)
        return tern_cuda_attn_prep_at(d, &s->kvf.q, qg, k, v, w->q_norm, w->k_norm, gm->inv_freq, T, g->pos_dev,
                                      kv->k, kv->v, g->stream, err) ||
                       tern_cuda_attention_at(d, &s->kvf.q, qg, kv->k, kv->v, T, g->pos_dev, g->n_plan, scale,
                                              g->att_work, g->att_bytes, o, g->stream, err)
                   ? -1 : 0;
    return tern_cuda_attn_prep(d, &s->kvf.q, qg, k, v, w->q_norm, w->k_norm, gm->inv_freq, T, s->pos, kv->k, kv->v,
                               g->stream, err) ||
                   tern_cuda_attention(d, &s->kvf.q, qg, kv->k, kv->v, T, s->pos, scale, g->att_work, g->att_bytes, o,
                                       g->stream, err)
               ? -1 : 0;
}

/* The end of the attention role and the output projection of g->o. */
static int attn_out(const gpu_pass *p, const tern_attn_w *w, tern_error *err) {
    gpu_session *g = p->g;
    tern_gpu_stage(g, R_ATTN, 1);
    tern_gpu_stage(g, R_ATTN_PROJ, 0);
    int rc = tern_gpu_mm(p->s->m->gpu, g, g->out, g->o, p->T, &w->o, err);
    tern_gpu_stage(g, R_ATTN_PROJ, 1);
    return rc;
}

/* One session's rows of the attention core: its K/V rows into its cache,
 * its queries against them, into its rows of o. */
static int attend(const gpu_pass *p, const gpu_seg *sg, float *qg, float *k, float *v, float *o,
                  const tern_attn_w *w, int l, tern_error *err) {
    tern_session *s = sg->s;
    const tern_config *c = &s->m->cfg;
    const gpu_model *gm = s->m->gpu;
    gpu_session *g = p->g;
    const tern_kv *kv = &((gpu_session *)s->state)->kv[l];
    tern_cuda_attn_dims d = tern_gpu_attn_dims(c);
    int T = sg->n, hd = c->head_dim;
    if (T <= SUB) return tern_gpu_attend_small(s, g, &d, qg, k, v, o, w, l, T, err);
    if (tern_cuda_attn_prep(&d, &s->kvf.q, qg, k, v, w->q_norm, w->k_norm, gm->inv_freq, T, s->pos, kv->k, kv->v,
                            g->stream, err))
        return -1;
    size_t qrow = (size_t)c->n_heads * 2 * hd, orow = (size_t)c->n_heads * hd;
    float scale = 1.0f / sqrtf((float)hd);
    if (hd == 32 || hd == 64 || hd == 128 || hd == 256)
        return tern_cuda_attention_prefill(&d, &s->kvf.q, qg, kv->k, kv->v, T, s->pos, scale, g->att_work,
                                           g->att_bytes, o, g->stream, err);
    /* every row of the piece is in the cache now: each run of SUB tokens
     * attends causally from its own first position */
    for (int t0 = 0; t0 < T; t0 += SUB) {
        int n = T - t0 < SUB ? T - t0 : SUB;
        if (tern_cuda_attention(&d, &s->kvf.q, qg + t0 * qrow, kv->k, kv->v, n, s->pos + t0, scale, g->att_work,
                                g->att_bytes, o + t0 * orow, g->stream, err))
            return -1;
    }
    return 0;
}

static int attn_layer(const gpu_pass *p, const tern_attn_w *w, int l, tern_error *err) {
    const tern_config *c = &p->s->m->cfg;
    const gpu_model *gm = p->s->m->gpu;
    gpu_session *g = p->g;
    int T = p->T;
    tern_gpu_stage(g, R_ATTN_PROJ, 0);
    const fused_mat *fz = gm->fused_in ? &gm->fused_in[l] : NULL;
    float *qg = g->qg, *k = g->k, *v = g->v;
    if (T == 1 && fz && fz->m.data) {
        /* one token: the stacked output's slices are q|gate, k and v */
        if (tern_gpu_mm(gm, g, g->fused_out, g->xn, 1, &fz->m, err)) return -1;
        qg = g->fused_out;
        k = qg + w->q.rows;
        v = k + w->k.rows;
    } else if (tern_gpu_mm(gm, g, g->qg, g->xn, T, &w->q, err) || tern_gpu_mm(gm, g, g->k, g->xn, T, &w->k, err) ||
               tern_gpu_mm(gm, g, g->v, g->xn, T, &w->v, err)) {
        return -1;
    }
    tern_gpu_stage(g, R_ATTN_PROJ, 1);
    tern_gpu_stage(g, R_ATTN, 0);
    size_t orow = (size_t)c->n_heads * c->head_dim;
    for (int i = 0; i < p->n_seg; i++) {
        const gpu_seg *sg = &p->seg[i];
        if (attend(p, sg, qg + sg->t0 * w->q.rows, k + sg->t0 * w->k.rows, v + sg->t0 * w->v.rows,
                   g->o + sg->t0 * orow, w, l, err))
            return -1;
    }
    return attn_out(p, w, err);
}

static int gdn_layer(const gpu_pass *p, const tern_gdn_w *w, int l, tern_error *err) {
    const tern_config *c = &p->s->m->cfg;
    const gpu_model *gm = p->s->m->gpu;
    gpu_session *g = p->g;
    int T = p->T;
    tern_cuda_gdn_w gw = tern_gpu_gdn_w_of(c, w);
    tern_gpu_stage(g, R_GDN_PROJ, 0);
    const fused_mat *fz = gm->fused_in ? &gm->fused_in[l] : NULL;
    float *qkv = g->qkv, *z = g->z, *b = g->b, *a = g->a;
    if (T == 1 && fz && fz->m.data) {
        /* one token: the stacked output's slices are qkv, z, b and a */
        if (tern_gpu_mm(gm, g, g->fused_out, g->xn, 1, &fz->m, err)) return -1;
        qkv = g->fused_out;
        z = qkv + w->qkv.rows;
        b = z + w->z.rows;
        a = b + w->b.rows;
    } else if (tern_gpu_mm(gm, g, g->qkv, g->xn, T, &w->qkv, err) || tern_gpu_mm(gm, g, g->z, g->xn, T, &w->z, err) ||
               tern_gpu_mm(gm, g, g->b, g->xn, T, &w->b, err) || tern_gpu_mm(gm, g, g->a, g->xn, T, &w->a, err)) {
        return -1;
    }
    tern_gpu_stage(g, R_GDN_PROJ, 1);
    tern_gpu_stage(g, R_GDN, 0);
    /* each session's rows on its own state: a prefill's in the chunked form
     * (chunk 64), a decode's in the step */
    int rc = 0;
    for (int i = 0; i < p->n_seg && rc == 0; i++) {
        const gpu_seg *sg = &p->seg[i];
        tern_gdn_state *st = &((gpu_session *)sg->s->state)->gdn[l];
        size_t t0 = (size_t)sg->t0;
        float *q_i = qkv + t0 * w->qkv.rows, *z_i = z + t0 * w->z.rows, *b_i = b + t0 * w->b.rows;
        float *a_i = a + t0 * w->a.rows, *o_i = g->g_out + t0 * w->out.cols;
        rc = sg->n > SUB ? tern_cuda_gdn_chunked(&gw, q_i, z_i, b_i, a_i, sg->n, st->conv, st->S, g->gdn_work,
                                                 g->gdn_bytes, o_i, g->stream, err)
                         : tern_cuda_gdn_step(&gw, q_i, z_i, b_i, a_i, sg->n, st->conv, st->S, o_i, g->stream, err);
    }
    tern_gpu_stage(g, R_GDN, 1);
    tern_gpu_stage(g, R_GDN_PROJ, 0);
    rc = rc || tern_gpu_mm(gm, g, g->out, g->g_out, T, &w->out, err) ? -1 : 0;
    tern_gpu_stage(g, R_GDN_PROJ, 1);
    return rc;
}

int tern_gpu_observe(tern_session *s, int l, int T, tern_error *err) {
    gpu_session *g = s->state;
    int K = s->m->cfg.top_k;
    if (tern_cuda_sync(g->stream, err) || tern_cuda_download(g->host_ids, g->ids, (size_t)T * K * sizeof(int32_t), err))
        return -1;
    for (int t = 0; t < T; t++) s->route_fn(s->route_ud, l, s->pos + t, g->host_ids + (size_t)t * K, K);
    return 0;
}

static int moe_layer(const gpu_pass *p, const tern_moe_w *w, int l, tern_error *err) {
    tern_session *s = p->s;
    int T = p->T;
    const tern_config *c = &s->m->cfg;
    const tern_model *m = s->m;
    const gpu_model *gm = m->gpu;
    gpu_session *g = p->g;
    int E = c->n_experts, K = c->top_k;
    tern_gpu_stage(g, R_ROUTER, 0);
    if (tern_gpu_mm(gm, g, g->rlog, g->xn, T, &w->router, err) ||
        tern_cuda_route(g->rlog, T, E, K, c->norm_topk, g->ids, g->wts, g->stream, err))
        return -1;
    tern_gpu_stage(g, R_ROUTER, 1);
    if (s->route_fn && tern_gpu_observe(s, l, T, err)) return -1;
    if (tern_gpu_experts_count(s, l, g->ids, T * K, err)) return -1;
    tern_cuda_experts ex = tern_gpu_experts_of(m, l);
    if (tern_gpu_experts_ready(s, l, T, &ex, err)) return -1;
    size_t H = (size_t)c->hidden;
    const tern_pk_tensor *pt = m->man.parts;
    int groupable = pt[0].encoding == pt[2].encoding && pt[0].group == pt[1].group && pt[0].group == pt[2].group &&
                    H % 32 == 0 && c->expert_inter % 32 == 0;
    tern_gpu_stage(g, R_MOE, 0);
    if (T > SUB && groupable) {   /* grouped by expert: each expert's weights read once per 64 of its tokens */
        int rc = tern_cuda_moe_grouped(&ex, E, &w->shared, &w->shared_gate, g->xn, T, K, g->ids, g->wts,
                                       g->grouped_work, g->grouped_bytes, g->out, g->stream, err);
        tern_gpu_stage(g, R_MOE, 1);
        return rc || tern_gpu_experts_done(s, l, T, err) ? -1 : 0;
    }
    for (int t0 = 0; t0 < T; t0 += SUB) {
        int n = T - t0 < SUB ? T - t0 : SUB;
        if (tern_cuda_moe(&ex, &w->shared, &w->shared_gate, g->xn + t0 * H, n, K, g->ids + (size_t)t0 * K,
                          g->wts + (size_t)t0 * K, g->moe_work, g->out + t0 * H, g->stream, err))
            return -1;
    }
    tern_gpu_stage(g, R_MOE, 1);
    return tern_gpu_experts_done(s, l, T, err);
}

/* x += out (the previous block's output, when there is one), xn = norm(x). */
static int norm_in(gpu_session *g, const float *w, int add, int H, int T, float eps, tern_error *err) {
    tern_gpu_stage(g, R_NORM, 0);
    int rc = tern_cuda_rmsnorm(g->xn, g->x, add ? g->out : NULL, w, 1, H, T, eps, g->stream, err);
    tern_gpu_stage(g, R_NORM, 1);
    return rc;
}

/* The lm_head over n normed rows, LOGIT_ROWS at a time, copied to logits. */
int tern_gpu_head(gpu_session *g, const gpu_model *gm, const float *xn, int n, int H, int V, float *logits,
                tern_error *err) {
    for (int r0 = 0; r0 < n; r0 += LOGIT_ROWS) {
        int k = n - r0 < LOGIT_ROWS ? n - r0 : LOGIT_ROWS;
        if (tern_gpu_mm(gm, g, g->logits, xn + (size_t)r0 * H, k, &gm->w.lm_head, err) || tern_cuda_sync(g->stream, err) ||
            tern_cuda_download(logits + (size_t)r0 * V, g->logits, (size_t)k * V * sizeof(float), err))
            return -1;
    }
    return 0;
}

/* Every layer and the final norm of a pass, enqueued on its stream. */
int tern_gpu_layers_pass(const gpu_pass *p, tern_error *err) {
    const tern_config *c = &p->s->m->cfg;
    const gpu_model *gm = p->s->m->gpu;
    gpu_session *g = p->g;
    int H = c->hidden, T = p->T;
    for (int l = 0; l < c->n_layers; l++) {
        const tern_layer_w *L = &gm->w.layers[l];
        int rc = norm_in(g, L->in_norm, l > 0, H, T, c->norm_eps, err);
        if (rc == 0) rc = L->kind == TERN_LAYER_ATTN ? attn_layer(p, &L->attn, l, err) : gdn_layer(p, &L->gdn, l, err);
        if (rc == 0) rc = norm_in(g, L->post_norm, 1, H, T, c->norm_eps, err);
        if (rc == 0) rc = moe_layer(p, &L->moe, l, err);
        if (rc != 0) {
            tern_err_prefix(err, "GPU layer %d", l);
            return -1;
        }
    }
    return norm_in(g, gm->w.final_norm, 1, H, T, c->norm_eps, err);
}

int tern_gpu_layers(tern_session *s, int T, tern_error *err) {
    gpu_seg one = {s, 0, T};
    gpu_pass p = {s, s->state, &one, 1, T};
    return tern_gpu_layers_pass(&p, err);
}

#endif
