/* Pieces and decode steps on the GPU: the one-token path (norms and
 * residual adds inside the GEMVs that consume them), CUDA graph capture
 * and replay of decode-sized steps, and sampling on the device with up
 * to two sampled steps in flight. tern_gpu_forward cuts its tokens into
 * pieces; a piece past SUB tokens runs gpu_prefill.c's layers. */
#ifdef TERN_CUDA

#include "engine/gpu_internal.h"

#include <string.h>

#include "util/clock.h"
#include "util/err.h"

/* Whether a step of s may take the experts' one launch, whose blocks wait
 * for each other, so no other session's such grid may share the SMs: when
 * s is the model's only session, or when the sessions' calls never overlap
 * (serial); then a session's first step after another's waits for that
 * one's stream. -1 when that wait fails. */
static int claim_one_launch(tern_session *s, tern_error *err) {
    gpu_model *gm = s->m->gpu;
    if (!gm->serial) return atomic_load(&gm->sessions) == 1;
    if (gm->last && gm->last != s && tern_cuda_sync(((gpu_session *)gm->last->state)->stream, err)) return -1;
    gm->last = s;
    return 1;
}

/* ---- the one-token path -----------------------------------------------------
 * A decoded token is a chain of small kernels; here every RMSNorm and
 * residual add is made in the prologue of the GEMV that consumes it
 * (tern_cuda_gemv1): the stacked input projections take x + the previous
 * block's output and the input norm, the router takes the post-attention
 * norm (and keeps the normalised vector for the experts), the lm_head the
 * final norm. The residual stream alternates between x and x2 because a
 * GEMV's blocks still read the old x while its first block writes the sum.
 * Attention/DeltaNet outputs land in out, the experts' in out2. */
typedef struct resid {
    float *x, *spare;
    const float *delta;           /* the output not yet added to x, or NULL */
    const long long *delta_fx;    /* or so, as the experts' fixed-point sums */
} resid;

static tern_cuda_vec_in resid_in(const resid *r, const float *norm_w, float eps, float *xn_out) {
    return (tern_cuda_vec_in){r->x, r->delta, r->delta || r->delta_fx ? r->spare : NULL, norm_w, 1, eps, xn_out,
                              r->delta_fx};
}

/* After a GEMV took resid_in: the sum is the stream now. */
static void resid_taken(resid *r) {
    if (r->delta || r->delta_fx) {
        float *t = r->x;
        r->x = r->spare;
        r->spare = t;
    }
    r->delta = NULL;
    r->delta_fx = NULL;
}

static int gemv_plain(const gpu_model *gm, const gpu_session *g, const tern_mat *W, const float *x, float *y,
                      tern_error *err) {
    if (!tern_cuda_gemv1_supported(W)) return tern_gpu_mm(gm, g, y, x, 1, W, err);
    tern_cuda_vec_in in = {x, NULL, NULL, NULL, 0, 0.0f, NULL, NULL};
    return tern_cuda_gemv1(W, &in, y, g->stream, err);
}

/* A layer's stacked input projections of x (+ the pending output), normed
 * with in_norm, into g->fused_out: one launch. */
static int in_proj1(gpu_session *g, const gpu_model *gm, int l, const float *in_norm, float eps, int role, resid *r,
                    tern_error *err) {
    tern_gpu_stage(g, role, 0);
    tern_cuda_vec_in in = resid_in(r, in_norm, eps, NULL);
    if (tern_cuda_gemv1(&gm->fused_in[l].m, &in, g->fused_out, g->stream, err)) return -1;
    resid_taken(r);
    tern_gpu_stage(g, role, 1);
    return 0;
}

/* The block's output projection into g->out, pending for the next norm. */
static int out_proj1(tern_session *s, const tern_mat *W, const float *x, int role, resid *r, tern_error *err) {
    gpu_session *g = s->state;
    tern_gpu_stage(g, role, 0);
    int rc = gemv_plain(s->m->gpu, g, W, x, g->out, err);
    r->delta = g->out;
    tern_gpu_stage(g, role, 1);
    return rc;
}

static int attn1(tern_session *s, const tern_attn_w *w, const float *in_norm, int l, resid *r, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    const gpu_model *gm = s->m->gpu;
    gpu_session *g = s->state;
    tern_cuda_attn_dims d = tern_gpu_attn_dims(c);
    if (in_proj1(g, gm, l, in_norm, c->norm_eps, R_ATTN_PROJ, r, err)) return -1;
    float *qg = g->fused_out, *k = qg + w->q.rows, *v = k + w->k.rows;
    tern_gpu_stage(g, R_ATTN, 0);
    if (tern_gpu_attend_small(s, g, &d, qg, k, v, g->o, w, l, 1, err)) return -1;
    tern_gpu_stage(g, R_ATTN, 1);
    return out_proj1(s, &w->o, g->o, R_ATTN_PROJ, r, err);
}

static int gdn1(tern_session *s, const tern_gdn_w *w, const float *in_norm, int l, resid *r, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    const gpu_model *gm = s->m->gpu;
    gpu_session *g = s->state;
    tern_cuda_gdn_w gw = tern_gpu_gdn_w_of(c, w);
    if (in_proj1(g, gm, l, in_norm, c->norm_eps, R_GDN_PROJ, r, err)) return -1;
    float *qkv = g->fused_out, *z = qkv + w->qkv.rows, *b = z + w->z.rows, *a = b + w->b.rows;
    tern_gpu_stage(g, R_GDN, 0);
    if (tern_cuda_gdn_step(&gw, qkv, z, b, a, 1, g->gdn[l].conv, g->gdn[l].S, g->g_out, g->stream, err)) return -1;
    tern_gpu_stage(g, R_GDN, 1);
    return out_proj1(s, &w->out, g->g_out, R_GDN_PROJ, r, err);
}

static int moe1(tern_session *s, const tern_moe_w *w, const float *post_norm, int l, resid *r, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    gpu_session *g = s->state;
    const gpu_model *gm = s->m->gpu;
    tern_cuda_experts ex = tern_gpu_experts_of(s->m, l);
    ex.one_launch = g->one_launch;
    /* the experts' one launch may take the top k itself (no router
     * epilogue, its count and its last block in the chain); not when the
     * host observes the ids between the two */
    int self = g->one_launch && !s->route_fn && !tern_gpu_experts_on_disk(gm) && gm->moe_self[l];
    tern_gpu_stage(g, R_ROUTER, 0);
    tern_cuda_vec_in in = resid_in(r, post_norm, c->norm_eps, g->xn);
    tern_cuda_route_out ro = {c->n_experts, c->top_k, c->norm_topk, g->ids, g->wts, g->route_counters + l};
    if (self ? tern_cuda_gemv1(&w->router, &in, g->rlog, g->stream, err)
             : tern_cuda_gemv1_route(&w->router, &in, g->rlog, &ro, g->stream, err))
        return -1;
    resid_taken(r);
    tern_gpu_stage(g, R_ROUTER, 1);
    if (s->route_fn && tern_gpu_observe(s, l, 1, err)) return -1;
    if (tern_gpu_experts_ready(s, l, 1, &ex, err)) return -1;
    tern_gpu_stage(g, R_MOE, 0);
    const int fx = self && gm->fx_prev[l] >= 0;
    if (fx) {
        ex.fx = g->fx + (size_t)l * g->fx_bytes;
        ex.fx_zero = g->fx + (size_t)gm->fx_prev[l] * g->fx_bytes;
    }
    int rc = self ? tern_cuda_moe_route(&ex, &w->shared, &w->shared_gate, g->xn, c->top_k, g->rlog, c->n_experts,
                                        c->norm_topk, g->ids, g->wts, g->moe_work, g->out2, g->stream, err)
                  : tern_cuda_moe(&ex, &w->shared, &w->shared_gate, g->xn, 1, c->top_k, g->ids, g->wts, g->moe_work,
                                  g->out2, g->stream, err);
    tern_gpu_stage(g, R_MOE, 1);
    if (rc == 0) rc = tern_gpu_experts_count(s, l, g->ids, c->top_k, err);
    if (fx) r->delta_fx = tern_cuda_moe_fx_sums(ex.fx);
    else r->delta = g->out2;
    return rc;
}

/* One token: every layer, then the final norm into xn and (rows) the
 * logits. */
static int step1(tern_session *s, int rows, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    const gpu_model *gm = s->m->gpu;
    gpu_session *g = s->state;
    resid r = {g->x, g->x2, NULL, NULL};
    for (int l = 0; l < c->n_layers; l++) {
        const tern_layer_w *L = &gm->w.layers[l];
        int rc = L->kind == TERN_LAYER_ATTN ? attn1(s, &L->attn, L->in_norm, l, &r, err)
                                            : gdn1(s, &L->gdn, L->in_norm, l, &r, err);
        if (rc == 0) rc = moe1(s, &L->moe, L->post_norm, l, &r, err);
        if (rc != 0) {
            tern_err_prefix(err, "GPU layer %d", l);
            return -1;
        }
    }
    tern_gpu_stage(g, R_HEAD, 0);
    int rc;
    if (rows) {
        tern_cuda_vec_in in = resid_in(&r, gm->w.final_norm, c->norm_eps, g->xn);
        rc = tern_cuda_gemv1(&gm->w.lm_head, &in, g->logits, g->stream, err);
    } else {
        const float *d = r.delta;
        rc = 0;
        if (r.delta_fx) {   /* (the norm kernel takes floats) */
            rc = tern_cuda_dfx_float(g->out2, r.delta_fx, c->hidden, g->stream, err);
            d = g->out2;
        }
        if (rc == 0)
            rc = tern_cuda_rmsnorm(g->xn, r.x, d, gm->w.final_norm, 1, c->hidden, 1, c->norm_eps, g->stream, err);
    }
    tern_gpu_stage(g, R_HEAD, 1);
    return rc;
}

/* The piece's input block goes up (in a captured step, as the graph's
 * first node: the host writes step_host[blk] and launches), then the
 * embedding rows into g->x from the token ids in it; an id of -1 (a step
 * launched before the host read the draw it evaluates) is the step
 * before's draw, which the sampler also left in d_id. */
static int embed(tern_session *s, int T, tern_error *err) {
    const gpu_model *gm = s->m->gpu;
    gpu_session *g = s->state;
    if (tern_cuda_copy_host(g->step_dev, g->step_host[g->blk], STEP_BYTES(T), 0, g->stream, err)) return -1;
    return tern_cuda_embed_prev(&gm->w.embed, g->tok_dev, g->d_id, T, g->x, g->stream, err);
}

/* The rule over g->logits (row 0) at the u in step_dev, straight into
 * id_host[blk] (and d_id, for a next step launched before the host reads
 * this one's): page-locked memory the device writes over the bus (mapped
 * by unified addressing), read by the host after the step's event, so no
 * copy node ends the step (docs/experiments/cuda-step-timeline.md). */
static int sample_ops(gpu_session *g, const tern_gpu_rule *r, tern_error *err) {
    const double *u = (const double *)(g->step_dev + STEP_U);
    int32_t *id = g->id_host[g->blk], *id2 = g->d_id;
    const uint32_t *mask = r->mask ? g->mask_host : NULL;
    if (r->greedy) return tern_cuda_argmax(g->logits, mask, r->n_valid, g->sample_work, id, id2, g->stream, err);
    return tern_cuda_sample(g->logits, mask, r->n_valid, r->temperature, r->top_k, r->top_p, r->min_p, u,
                            g->sample_work, id, id2, g->stream, err);
}

/* A rule as a captured graph knows it: whether it has a mask, not where
 * the caller keeps it (the graph reads the session's copy). */
static tern_gpu_rule rule_key(const tern_gpu_rule *r) {
    static const uint32_t masked = 0;   /* the one pointer every masked key holds */
    tern_gpu_rule k = *r;
    if (k.mask) k.mask = &masked;
    return k;
}

/* A decode-sized step (T <= SUB tokens, logits of at most LOGIT_ROWS rows,
 * and with a rule the draw of the next id from the last row's logits) is
 * captured as a CUDA graph and replayed with one launch; the capture of
 * the next step updates the same executable in place (only arguments
 * change). Each kernel then starts as the previous one ends instead of
 * when the host gets to launching it. */
static int enqueue_step(tern_session *s, int T, int rows, const tern_gpu_rule *rule, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    const gpu_model *gm = s->m->gpu;
    gpu_session *g = s->state;
    int H = c->hidden, rc;
    if (embed(s, T, err)) return -1;
    if (T == 1 && gm->one_token) {
        rc = step1(s, rows, err);
    } else {
        rc = tern_gpu_layers(s, T, err);
        if (rc == 0 && rows) {
            tern_gpu_stage(g, R_HEAD, 0);
            rc = tern_gpu_mm(gm, g, g->logits, g->xn + (size_t)(T - rows) * H, rows, &gm->w.lm_head, err);
            tern_gpu_stage(g, R_HEAD, 1);
        }
    }
    return rc == 0 && rule && sample_ops(g, rule, err) ? -1 : rc;
}

/* The attention's plan for a step of T tokens at s->pos: the next power of
 * two of the context from 256, at most the session's. */
static int plan_of(const tern_session *s, int T) {
    int n = s->pos + T, n_plan = 256;
    while (n_plan < n) n_plan *= 2;
    if (n_plan > s->max_ctx) n_plan = s->max_ctx > n ? s->max_ctx : n;
    return n_plan;
}

/* Whether graph[blk] was captured for this step: token count, rows, plan,
 * sampling rule, the experts' launch form and the KV caches it points at
 * (they grow by reallocation; kv_gen counts the moves). */
static int graph_current(tern_session *s, int T, int rows, const tern_gpu_rule *rule) {
    gpu_session *g = s->state;
    const tern_config *c = &s->m->cfg;
    int moved = 0;
    for (int l = 0; l < c->n_layers; l++) {
        moved |= g->kv_key[2 * l] != g->kv[l].k || g->kv_key[2 * l + 1] != g->kv[l].v;
        g->kv_key[2 * l] = g->kv[l].k;
        g->kv_key[2 * l + 1] = g->kv[l].v;
    }
    g->kv_gen += moved;
    int b = g->blk;
    tern_gpu_rule key;
    if (rule) key = rule_key(rule);
    int other_rule = g->key_rule[b].on != (rule != NULL) || (rule && memcmp(&g->key_rule[b].r, &key, sizeof key));
    return g->graph[b] && !other_rule && g->key[b].T == T && g->key[b].rows == rows &&
           g->key[b].n_plan == plan_of(s, T) && g->key[b].one_launch == g->one_launch && g->key[b].kv_gen == g->kv_gen;
}

/* The graph of a decode step is captured once per input block and
 * replayed for the following tokens: the token ids, the position and the
 * sampler's u are read on the device (the block's copy node) and the
 * attention's splits are planned for the next power of two of the
 * context, so only a new token count, another sampling rule, a longer plan
 * or a moved KV cache captures again, updating the executable graph in
 * place. The caller has checked graph_current (which records a move). */
static int replay_step(tern_session *s, int T, int rows, const tern_gpu_rule *rule, int current, tern_error *err) {
    gpu_session *g = s->state;
    int b = g->blk, n_plan = plan_of(s, T);
    if (!current) {
        /* a new plan changes the attention's splits, and with them the
         * cluster size of its launch (tern_cuda_attention_at), a launch
         * attribute an update in place is not relied on to carry: a graph of
         * its own */
        if (g->graph[b] && g->key[b].n_plan != n_plan) {
            tern_cuda_graph_destroy(g->graph[b]);
            g->graph[b] = NULL;
        }
        g->pos_dev = (const int *)(g->step_dev + STEP_POS);
        g->n_plan = n_plan;
        if (tern_cuda_capture_begin(g->stream, err)) return -1;
        int rc = enqueue_step(s, T, rows, rule, err);
        g->pos_dev = NULL;
        if (rc != 0) {
            tern_cuda_capture_abort(g->stream);
            g->key[b].T = 0;
            return -1;
        }
        if (tern_cuda_capture_end_into(g->stream, &g->graph[b], err)) {
            g->key[b].T = 0;
            return -1;
        }
        g->key[b].T = T;
        g->key[b].rows = rows;
        g->key[b].n_plan = n_plan;
        g->key[b].one_launch = g->one_launch;
        g->key[b].kv_gen = g->kv_gen;
        g->key_rule[b].on = rule != NULL;
        if (rule) g->key_rule[b].r = rule_key(rule);
    }
    stats *st = g->st && g->st->graph && T == 1 ? g->st : NULL;
    if (st) tern_cuda_mark(st->marks, 0, g->stream);
    int rc = tern_cuda_graph_launch(g->graph[b], g->stream, err);
    if (st) tern_cuda_mark(st->marks, 1, g->stream);
    return rc;
}

/* The piece's input (u, position, tokens) into step_host[blk]; embed()
 * copies it up. No step in flight reads that block: a piece runs with
 * none in flight, and a sampled step takes the block the step before it
 * did not. */
static void put_step(tern_session *s, const int32_t *tokens, int T, double u) {
    gpu_session *g = s->state;
    int32_t pos = (int32_t)s->pos;
    memcpy(g->step_host[g->blk] + STEP_U, &u, sizeof u);
    memcpy(g->step_host[g->blk] + STEP_POS, &pos, sizeof pos);
    memcpy(g->step_host[g->blk] + STEP_TOK, tokens, (size_t)T * sizeof *tokens);
}

/* After a step that failed to enqueue: the layers it ran left sums in
 * their slots that the next ones did not zero. */
static void clear_slots(tern_session *s) {
    gpu_session *g = s->state;
    const tern_config *c = &s->m->cfg;
    tern_cuda_fill(g->fx, 0, g->fx_bytes * (size_t)c->n_layers, g->stream, NULL);
}

/* Whether this session's steps may be captured and replayed: not with
 * debug.no_graphs, and per-role marks on decode steps (TERN_STATS_DECODE)
 * and the route observer need them uncaptured. */
static int graphs_allowed(const tern_session *s) {
    const gpu_session *g = s->state;
    int decode_marks = g->st && !g->st->graph && !g->st->prefill;
    return g->use_graph && !decode_marks && !s->route_fn;
}

/* One piece of T tokens; logits as tern_forward's. The hidden state stays
 * on the device (s->hidden_dev); the piece ends with the stream
 * synchronised. */
static int piece(tern_session *s, const int32_t *tokens, int T, float *logits, int all, tern_error *err) {
    tern_model *m = s->m;
    const tern_config *c = &m->cfg;
    const gpu_model *gm = m->gpu;
    gpu_session *g = s->state;
    int H = c->hidden, V = c->vocab;
    double t0 = tern_now_s() * 1e3;
    if (g->n_flight) return tern_fail(err, "GPU: a piece while %d sampled steps are in flight", g->n_flight);
    g->blk = 0;
    put_step(s, tokens, T, 0.0);
    int decode_marks = g->st && !g->st->graph && !g->st->prefill;
    if (g->st) g->st->n_marks = (g->st->prefill ? T > SUB : decode_marks && T == 1) ? 0 : -1;
    int rows = !logits ? 0 : all ? T : 1;
    int small = T <= SUB && rows <= LOGIT_ROWS;
    /* A small piece without logits is a prompt's tail, whose key (T) a
     * later step rarely repeats: run uncaptured rather than capture a graph
     * (and evict a decode step's) for one replay. */
    int graph = small && rows > 0 && graphs_allowed(s);
    if ((g->one_launch = claim_one_launch(s, err)) < 0) return -1;   /* read once: the whole step (and its graph) agree */
    int rc;
    if (graph) rc = replay_step(s, T, rows, NULL, graph_current(s, T, rows, NULL), err);
    else if (small) rc = enqueue_step(s, T, rows, NULL, err);
    else rc = embed(s, T, err) || tern_gpu_layers(s, T, err) ? -1 : 0;
    if (rc != 0) {
        clear_slots(s);
        return -1;
    }
    const float *last = g->xn + (size_t)(T - 1) * H;
    if (small && rows) {
        if (tern_cuda_sync(g->stream, err) || tern_cuda_download(logits, g->logits, (size_t)rows * V * sizeof(float), err))
            return -1;
    } else if (rows && tern_gpu_head(g, gm, all ? g->xn : last, rows, H, V, logits, err)) {
        return -1;
    }
    if (tern_cuda_sync(g->stream, err)) return -1;
    if (g->st && g->st->n_marks > 0) tern_gpu_collect(g->st, tern_now_s() * 1e3 - t0, T);
    s->hidden_dev = last;
    s->has_hidden = 1;
    s->pos += T;
    return 0;
}

/* The tokens in pieces of g->piece. */
int tern_gpu_forward(tern_session *s, const int32_t *tokens, int T, float *logits, int all_logits,
                     float *hidden_out, tern_error *err) {
    if (hidden_out) return tern_fail(err, "GPU: per-token hidden states are not read back");
    size_t V = (size_t)s->m->cfg.vocab;
    int P = ((gpu_session *)s->state)->piece;
    for (int done = 0; done < T; done += P) {
        int n = T - done < P ? T - done : P;
        int last = done + n == T;
        float *out = logits && all_logits ? logits + (size_t)done * V : logits && last ? logits : NULL;
        if (tern_gpu_experts_tick(s, err) || piece(s, tokens + done, n, out, all_logits, err) != 0) {
            s->broken = 1;
            return -1;
        }
    }
    return 0;
}

/* Whether sessions s[0..n_seq) can run one pass together: their tokens
 * fit the first one's buffers (a piece), which are sized, like its
 * workspaces, for a context every other session's stays within; none has
 * a sampled step in flight or a route observer (which reads one session's
 * positions). */
static int pass_fits(tern_session *const *s, const int *n, int n_seq) {
    const gpu_session *g = s[0]->state;
    int T = 0;
    for (int i = 0; i < n_seq; i++) {
        const gpu_session *gi = s[i]->state;
        T += n[i];
        if (n[i] < 1 || gi->n_flight || s[i]->route_fn || s[i]->max_ctx > s[0]->max_ctx) return 0;
    }
    return T <= g->piece;
}

/* The last row of each session's tokens in xn to rows 0 .. n_seq - 1 of
 * out (for the lm_head), and to row 0 of the session's own xn (its hidden
 * state, which the first session's next pass would overwrite). */
static int gather_last(const gpu_pass *p, tern_error *err) {
    gpu_session *g = p->g;
    size_t H = (size_t)p->s->m->cfg.hidden, row = H * sizeof(float);
    for (int i = 0; i < p->n_seg; i++) {
        const gpu_seg *sg = &p->seg[i];
        const float *last = g->xn + (size_t)(sg->t0 + sg->n - 1) * H;
        gpu_session *gi = sg->s->state;
        if (tern_cuda_copy(g->out + (size_t)i * H, last, row, g->stream, err) ||
            (i > 0 && tern_cuda_copy(gi->xn, last, row, g->stream, err)))
            return -1;
    }
    return 0;
}

/* Row `row` of page-locked masks (*buf, `rows` of a whole vocabulary,
 * made at the first masked draw) holding rule's mask, which the sampler
 * reads over the bus when its kernel runs; NULL on an error. */
static const uint32_t *put_mask(gpu_session *g, uint32_t **buf, int rows, int row, const tern_gpu_rule *r,
                                tern_error *err) {
    size_t words = ((size_t)r->n_valid + 31) / 32;
    if (words > g->mask_words) {
        tern_fail(err, "GPU sampling: a mask of %zu words (%zu at most)", words, g->mask_words);
        return NULL;
    }
    if (!*buf && !(*buf = tern_cuda_host_alloc((size_t)rows * g->mask_words * sizeof(uint32_t), err))) return NULL;
    uint32_t *m = *buf + (size_t)row * g->mask_words;
    memcpy(m, r->mask, words * sizeof(uint32_t));
    return m;
}

/* The draws' buffers of a pass (gpu_session.draw_*), made at its first
 * draw: a sampler workspace a row, u and the ids in page-locked memory
 * the kernels read and write over the bus. */
static int draw_buffers(gpu_session *g, int V, tern_error *err) {
    if (g->draw_work) return 0;
    g->draw_ws = (tern_cuda_sample_workspace(V) + 255) & ~(size_t)255;
    size_t all = g->draw_ws * LOGIT_ROWS;
    if (!(g->draw_work = tern_cuda_alloc(all, err)) || tern_cuda_fill(g->draw_work, 0, all, NULL, err) ||
        !(g->draw_host = tern_cuda_host_alloc(LOGIT_ROWS * (sizeof(double) + sizeof(int32_t)), err)))
        return -1;
    return 0;
}

/* The pass's rows (out, n_seq of them) through the lm_head; the rows with
 * a draw drawn on the device into id, the others' logits copied back.
 * More rows than the logits buffer holds: every row's logits come back
 * (id -1). */
static int pass_head(const gpu_pass *p, const tern_row_draw *draw, int32_t *id, float *logits, tern_error *err) {
    const gpu_model *gm = p->s->m->gpu;
    gpu_session *g = p->g;
    int B = p->n_seg, H = p->s->m->cfg.hidden, V = p->s->m->cfg.vocab, any = 0;
    for (int i = 0; draw && i < B; i++) any |= draw[i].on;
    for (int i = 0; id && i < B; i++) id[i] = -1;
    if (!any || B > LOGIT_ROWS) return logits ? tern_gpu_head(g, gm, g->out, B, H, V, logits, err) : 0;
    if (draw_buffers(g, V, err) || tern_gpu_mm(gm, g, g->logits, g->out, B, &gm->w.lm_head, err)) return -1;
    double *u = (double *)g->draw_host;
    int32_t *got = (int32_t *)(u + LOGIT_ROWS);
    for (int i = 0; i < B; i++) {
        if (!draw[i].on) continue;
        const tern_gpu_rule *r = &draw[i].r;
        const float *row = g->logits + (size_t)i * V;
        void *work = (uint8_t *)g->draw_work + (size_t)i * g->draw_ws;
        const uint32_t *mask = r->mask ? put_mask(g, &g->draw_mask, LOGIT_ROWS, i, r, err) : NULL;
        if (r->mask && !mask) return -1;
        u[i] = draw[i].u;
        int rc = r->greedy ? tern_cuda_argmax(row, mask, r->n_valid, work, &got[i], NULL, g->stream, err)
                           : tern_cuda_sample(row, mask, r->n_valid, r->temperature, r->top_k, r->top_p, r->min_p,
                                              &u[i], work, &got[i], NULL, g->stream, err);
        if (rc) return -1;
    }
    if (tern_cuda_sync(g->stream, err)) return -1;
    for (int i = 0; i < B; i++) {
        if (draw[i].on) id[i] = got[i];
        else if (logits && tern_cuda_download(logits + (size_t)i * V, g->logits + (size_t)i * V, (size_t)V * sizeof(float), err))
            return -1;
    }
    return 0;
}

/* Several sessions' tokens in one pass (tern_session_eval_many): the dense
 * projections and the experts over all of them at once, the attention and
 * the DeltaNet of each session on its own state (gpu_prefill.c's layers
 * over a gpu_pass), on the first session's stream and buffers; then each
 * session's last token drawn on the device (draw[i].on, into id[i]) or its
 * logits copied back. Sessions that cannot share a pass run one after
 * another, drawn on the host. */
int tern_gpu_forward_many(tern_session *const *s, const int32_t *const *tokens, const int *n, int n_seq,
                          const tern_row_draw *draw, int32_t *id, float *logits, float *const *hidden,
                          tern_error *err) {
    size_t V = (size_t)s[0]->m->cfg.vocab;
    for (int i = 0; hidden && i < n_seq; i++)
        if (hidden[i]) return tern_fail(err, "the GPU pass gives no per-token hidden states");
    if (n_seq == 1 || !pass_fits(s, n, n_seq)) {
        for (int i = 0; i < n_seq; i++) {
            if (id) id[i] = -1;
            if (tern_gpu_forward(s[i], tokens[i], n[i], logits ? logits + (size_t)i * V : NULL, 0, NULL, err))
                return -1;
        }
        return 0;
    }
    gpu_seg seg[n_seq];
    gpu_session *g = s[0]->state;
    int T = 0;
    for (int i = 0; i < n_seq; i++) {
        seg[i] = (gpu_seg){s[i], T, n[i]};
        /* (another session's last work, on its own stream, ends first) */
        if (i > 0 && tern_cuda_sync(((gpu_session *)s[i]->state)->stream, err)) return -1;
        memcpy(g->step_host[0] + STEP_TOK + (size_t)T * sizeof(int32_t), tokens[i], (size_t)n[i] * sizeof(int32_t));
        T += n[i];
    }
    gpu_pass p = {s[0], g, seg, n_seq, T};
    const gpu_model *gm = s[0]->m->gpu;
    const tern_config *c = &s[0]->m->cfg;
    g->blk = 0;
    if (g->st) g->st->n_marks = -1;
    int rc = tern_gpu_experts_tick(s[0], err) || embed(s[0], T, err) || tern_gpu_layers_pass(&p, err) ||
             gather_last(&p, err);
    if (rc == 0) rc = pass_head(&p, draw, id, logits, err);
    if (rc == 0) rc = tern_cuda_sync(g->stream, err);
    if (rc != 0) {
        clear_slots(s[0]);
        for (int i = 0; i < n_seq; i++) s[i]->broken = 1;
        return -1;
    }
    for (int i = 0; i < n_seq; i++) {
        gpu_session *gi = s[i]->state;
        s[i]->hidden_dev = i == 0 ? g->xn + (size_t)(n[0] - 1) * c->hidden : gi->xn;
        s[i]->has_hidden = 1;
        s[i]->pos += n[i];
    }
    if (gm->serial) ((gpu_model *)gm)->last = s[0];
    return 0;
}

/* (a vocabulary too large for the sampler's merge at this top-k: the CPU
 * sampler) */
int tern_gpu_sample_ok(const tern_session *s, const tern_gpu_rule *rule) {
    return !((const gpu_model *)s->m->gpu)->cpu_sampling &&
           (rule->greedy || tern_cuda_sample_fits(rule->n_valid, rule->top_k));
}

static int rule_ok(const tern_session *s, const tern_gpu_rule *r, double u, tern_error *err) {
    if (r->n_valid < 1 || r->n_valid > s->m->cfg.vocab)
        return tern_fail(err, "GPU sampling: %d valid ids of a %d-id vocabulary", r->n_valid, s->m->cfg.vocab);
    if (!(u >= 0 && u < 1)) return tern_fail(err, "GPU sampling: u %g is outside [0, 1)", u);
    return 0;
}

/* Waits for the steps in flight (their ids stay in their words for
 * tern_gpu_sample_wait). */
static int drain(gpu_session *g, tern_error *err) {
    return g->n_flight ? tern_cuda_sync(g->stream, err) : 0;
}

/* One sampled decode step at s->pos, enqueued (s->pos then counts it):
 * the captured graph of its block, then an event. Whatever must not
 * happen under a step in flight waits for the stream first: the KV
 * caches' growth (a reallocation), a capture, and the uncaptured forms
 * (measurement modes, the route observer), which also end synchronised. */
static int sample_launch(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, tern_error *err) {
    gpu_session *g = s->state;
    if (g->n_flight == 2) return tern_fail(err, "GPU sampling: two steps are in flight already");
    if (token < 0 && !g->n_flight && !g->drawn)
        return tern_fail(err, "GPU sampling: no step before drew the token to evaluate");
    if (tern_gpu_experts_tick(s, err)) return -1;
    if (s->pos + 1 > g->cap && (drain(g, err) || tern_gpu_reserve(s, s->pos + 1, err))) return -1;
    /* (the step's mask: no step in flight may still read the one before) */
    if (rule->mask && (drain(g, err) || !put_mask(g, &g->mask_host, 1, 0, rule, err))) return -1;
    g->blk = g->n_flight ? !g->flight[g->n_flight - 1] : !g->blk;
    put_step(s, &token, 1, u);
    int graph = graphs_allowed(s);
    if ((g->one_launch = claim_one_launch(s, err)) < 0) return -1;
    int current = graph && graph_current(s, 1, 1, rule);
    if ((!graph || !current) && drain(g, err)) return -1;
    double t0 = tern_now_s() * 1e3;
    int decode_marks = g->st && !g->st->graph && !g->st->prefill;
    if (g->st) g->st->n_marks = decode_marks ? 0 : -1;
    int rc = graph ? replay_step(s, 1, 1, rule, current, err) : enqueue_step(s, 1, 1, rule, err);
    if (rc != 0) {
        clear_slots(s);
        return -1;
    }
    if (tern_cuda_event_record(g->done[g->blk], g->stream, err)) return -1;
    g->flight[g->n_flight++] = g->blk;
    g->drawn = 1;
    if (!graph || (g->st && g->st->graph)) {   /* measured per step: synchronised here */
        if (tern_cuda_sync(g->stream, err)) return -1;
        if (g->st && g->st->n_marks > 0) tern_gpu_collect(g->st, tern_now_s() * 1e3 - t0, 1);
        if (graph && g->st && g->st->graph) {   /* (replay_step's marks: a replayed step only) */
            g->st->graph_ms += tern_cuda_marks_ms(g->st->marks, 0, 1);
            g->st->graph_wall_ms += tern_now_s() * 1e3 - t0;
            g->st->graph_steps++;
        }
    }
    s->hidden_dev = g->xn;
    s->has_hidden = 1;
    s->pos += 1;
    return 0;
}

int tern_gpu_sample_launch(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, tern_error *err) {
    if (rule_ok(s, rule, u, err)) return -1;
    if (sample_launch(s, token, rule, u, err) != 0) {
        s->broken = 1;
        return -1;
    }
    return 0;
}

int tern_gpu_sample_wait(tern_session *s, int32_t *next, tern_error *err) {
    gpu_session *g = s->state;
    if (!g->n_flight) return tern_fail(err, "GPU sampling: no step in flight");
    int b = g->flight[0];
    g->flight[0] = g->flight[1];
    g->n_flight--;
    if (tern_cuda_event_sync(g->done[b], err)) {
        s->broken = 1;
        return -1;
    }
    *next = *(volatile int32_t *)g->id_host[b];
    return 0;
}

int tern_gpu_sample_in_flight(const tern_session *s) {
    const gpu_session *g = s->state;
    return g ? g->n_flight : 0;
}

int tern_gpu_forward_sample(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, int32_t *next,
                            tern_error *err) {
    if (((gpu_session *)s->state)->n_flight) return tern_fail(err, "GPU sampling: a step is in flight");
    if (tern_gpu_reserve(s, s->pos + 1, err)) return -1;
    return tern_gpu_sample_launch(s, token, rule, u, err) || tern_gpu_sample_wait(s, next, err) ? -1 : 0;
}

#endif
