/* The GPU backend (engine/backend.h): a GPU session's device side
 * (activations and op workspaces for pieces of up to gpu_session.piece
 * tokens, the KV rows and DeltaNet state), its snapshots' device copies,
 * and the kernel statistics (tern_load_params.debug.kernel_stats); the
 * steps are gpu_decode.c's. */
#ifdef TERN_CUDA

#include "engine/gpu_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include "util/err.h"

static atomic_int *sessions_of(const tern_model *m) { return &((gpu_model *)m->gpu)->sessions; }

static const char *const role_names[R_COUNT] = {"rmsnorm + residual", "attention projections", "attention core",
                                                "DeltaNet projections", "DeltaNet core", "router + top-k",
                                                "experts (routed + shared)", "final norm + lm_head"};

static void print_stats(const stats *st);

static float *dalloc(size_t n, int *ok, tern_error *err) {
    float *p = *ok ? tern_cuda_alloc((n ? n : 1) * sizeof(float), err) : NULL;
    if (!p) *ok = 0;
    return p;
}

tern_cuda_attn_dims tern_gpu_attn_dims(const tern_config *c) {
    return (tern_cuda_attn_dims){c->n_heads, c->n_kv_heads, c->head_dim, c->rope_dim, c->norm_eps,
                                 (float)c->rope.attn_factor};
}

/* Activations and op outputs for pieces of up to g->piece tokens. */
static int alloc_activations(gpu_session *g, const tern_config *c, tern_error *err) {
    int ok = 1;
    size_t H = (size_t)c->hidden, P = (size_t)g->piece, vd = (size_t)tern_cfg_gdn_value_dim(c);
    size_t qrows = (size_t)c->n_heads * c->head_dim * 2, kvrow = (size_t)c->n_kv_heads * c->head_dim;
    g->x = dalloc(P * H, &ok, err);
    g->xn = dalloc(P * H, &ok, err);
    g->x2 = dalloc(H, &ok, err);     /* the one-token path's residual stream alternates x / x2 */
    g->out2 = dalloc(H, &ok, err);   /* and its experts' output */
    g->out = dalloc(P * H, &ok, err);
    g->qg = dalloc(P * qrows, &ok, err);
    g->k = dalloc(P * kvrow, &ok, err);
    g->v = dalloc(P * kvrow, &ok, err);
    g->o = dalloc(P * qrows / 2, &ok, err);
    g->qkv = dalloc(P * (size_t)tern_cfg_gdn_conv_dim(c), &ok, err);
    g->z = dalloc(P * vd, &ok, err);
    g->b = dalloc(P * (size_t)c->gdn_v_heads, &ok, err);
    g->a = dalloc(P * (size_t)c->gdn_v_heads, &ok, err);
    g->g_out = dalloc(P * vd, &ok, err);
    size_t fused_rows = (size_t)tern_cfg_gdn_conv_dim(c) + vd + 2 * (size_t)c->gdn_v_heads;
    if (qrows + 2 * kvrow > fused_rows) fused_rows = qrows + 2 * kvrow;
    g->fused_out = dalloc(fused_rows, &ok, err);
    g->rlog = dalloc(P * (size_t)c->n_experts, &ok, err);
    g->wts = dalloc(P * (size_t)c->top_k, &ok, err);
    g->ids = (int32_t *)dalloc(P * (size_t)c->top_k, &ok, err);
    g->logits = dalloc((size_t)LOGIT_ROWS * c->vocab, &ok, err);
    g->d_id = (int32_t *)dalloc(1, &ok, err);
    g->mask_words = ((size_t)c->vocab + 31) / 32;
    g->route_counters = (unsigned *)dalloc((size_t)c->n_layers, &ok, err);
    if (ok && tern_cuda_fill(g->route_counters, 0, (size_t)c->n_layers * sizeof(unsigned), NULL, err)) ok = 0;
    size_t blk_bytes = (STEP_BYTES(P) + 63) & ~(size_t)63;
    if (ok && !(g->step_host[0] = tern_cuda_host_alloc(2 * blk_bytes + 2 * sizeof(int32_t), err))) ok = 0;
    for (int b = 0; ok && b < 2; b++) {
        g->step_host[b] = g->step_host[0] + b * blk_bytes;
        g->id_host[b] = (int32_t *)(g->step_host[0] + 2 * blk_bytes) + b;
        if (!(g->done[b] = tern_cuda_event_create(err))) ok = 0;
    }
    if (ok && !(g->step_dev = tern_cuda_alloc(STEP_BYTES(P), err))) ok = 0;
    g->tok_dev = ok ? (const int32_t *)(g->step_dev + STEP_TOK) : NULL;
    g->host_ids = malloc(P * (size_t)c->top_k * sizeof(int32_t));
    g->kv_key = calloc(2 * (size_t)c->n_layers, sizeof *g->kv_key);
    if (ok && (!g->host_ids || !g->kv_key)) return tern_fail(err, "out of memory");
    return ok ? 0 : -1;
}

/* The ops' workspaces: decode experts, split-K attention up to max_ctx,
 * the prefill ops for a piece, sampling over the vocabulary. */
static int alloc_workspaces(gpu_session *g, const tern_config *c, int max_ctx, tern_error *err) {
    size_t inter = (size_t)(c->expert_inter > c->shared_inter ? c->expert_inter : c->shared_inter);
    tern_cuda_attn_dims d = tern_gpu_attn_dims(c);
    tern_cuda_gdn_w gw = tern_gpu_gdn_w_of(c, NULL);
    /* one workspace for the split-K attention of decode steps and of short prefills */
    size_t dec = tern_cuda_attention_workspace(&d, SUB, max_ctx), pre = tern_cuda_attention_prefill_workspace(&d, max_ctx);
    g->att_bytes = dec > pre ? dec : pre;
    g->gdn_bytes = tern_cuda_gdn_chunked_workspace(&gw, g->piece);
    g->grouped_bytes = tern_cuda_moe_grouped_workspace(g->piece, c->top_k, c->n_experts, (int64_t)c->hidden,
                                                       c->expert_inter, c->shared_inter);
    size_t moe_bytes = tern_cuda_moe_workspace(SUB, c->top_k, (int64_t)inter, (int64_t)c->hidden);
    g->fx_bytes = tern_cuda_moe_fx_bytes((int64_t)c->hidden);
    size_t fx_all = g->fx_bytes * (size_t)c->n_layers;
    if (!(g->moe_work = tern_cuda_alloc(moe_bytes, err)) || tern_cuda_fill(g->moe_work, 0, moe_bytes, NULL, err) ||
        !(g->fx = tern_cuda_alloc(fx_all, err)) || tern_cuda_fill(g->fx, 0, fx_all, NULL, err) ||
        !(g->att_work = tern_cuda_alloc(g->att_bytes, err)) || !(g->gdn_work = tern_cuda_alloc(g->gdn_bytes, err)) ||
        !(g->grouped_work = tern_cuda_alloc(g->grouped_bytes, err)) ||
        !(g->sample_work = tern_cuda_alloc(tern_cuda_sample_workspace(c->vocab), err)) ||
        tern_cuda_fill(g->sample_work, 0, tern_cuda_sample_workspace(c->vocab), NULL, err))   /* (its count) */
        return -1;
    return 0;
}

/* The session's piece size and kernel statistics, from the model's
 * debugging aids (tern_load_params.debug). */
static int configure(gpu_session *g, const gpu_model *gm, int max_ctx, tern_error *err) {
    g->use_graph = !gm->no_graphs && !tern_gpu_experts_on_disk(gm);
    g->piece = gm->piece ? gm->piece : PIECE_DEFAULT;
    if (max_ctx > 0 && g->piece > max_ctx) g->piece = max_ctx < 16 ? 16 : max_ctx;
    if (gm->kernel_stats == TERN_STATS_OFF) return 0;
    if (!(g->st = calloc(1, sizeof *g->st))) return tern_fail(err, "out of memory");
    if (!(g->st->marks = tern_cuda_marks_create(MAX_MARKS, err))) return -1;
    g->st->n_marks = -1;
    g->st->graph = gm->kernel_stats == TERN_STATS_GRAPH;
    g->st->prefill = gm->kernel_stats == TERN_STATS_PREFILL;
    return 0;
}

/* Every DeltaNet layer's conv window and recurrent state, zeroed. */
static int alloc_gdn_state(gpu_session *g, const tern_config *c, tern_error *err) {
    int ok = 1;
    for (int l = 0; ok && l < c->n_layers; l++) {
        if (c->layer_kind[l] != TERN_LAYER_GDN) continue;
        g->gdn[l].conv = dalloc(tern_cfg_gdn_conv_floats(c), &ok, err);
        g->gdn[l].S = dalloc(tern_cfg_gdn_state_floats(c), &ok, err);
        if (ok && (tern_cuda_fill(g->gdn[l].conv, 0, tern_cfg_gdn_conv_floats(c) * sizeof(float), NULL, err) ||
                   tern_cuda_fill(g->gdn[l].S, 0, tern_cfg_gdn_state_floats(c) * sizeof(float), NULL, err)))
            ok = 0;
    }
    return ok ? tern_cuda_sync(NULL, err) : -1;
}

static int gpu_create(tern_session *s, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    if (s->kvf.bits == 32)
        return tern_fail(err, "GPU: the KV cache is 16, 8 or 4-bit on the GPU (kv_bits 32 is the CPU reference's)");
    gpu_session *g = calloc(1, sizeof *g);
    if (!g) return tern_fail(err, "out of memory");
    s->state = g;   /* gpu_destroy releases whatever was allocated */
    g->kv = calloc((size_t)c->n_layers, sizeof *g->kv);
    g->gdn = calloc((size_t)c->n_layers, sizeof *g->gdn);
    if (!g->kv || !g->gdn) return tern_fail(err, "out of memory creating a session");
    if (configure(g, s->m->gpu, s->max_ctx, err) || alloc_activations(g, c, err) ||
        alloc_workspaces(g, c, s->max_ctx, err) || !(g->stream = tern_cuda_stream_create(err)) ||
        alloc_gdn_state(g, c, err))
        return -1;
    atomic_fetch_add(sessions_of(s->m), 1);
    g->counted = 1;
    return 0;
}

/* The session's device KV rows and DeltaNet state. */
static void free_state(gpu_session *g, const tern_config *c) {
    for (int l = 0; l < c->n_layers; l++) {
        if (g->kv) {
            tern_cuda_free(g->kv[l].k);
            tern_cuda_free(g->kv[l].v);
        }
        if (g->gdn) {
            tern_cuda_free(g->gdn[l].conv);
            tern_cuda_free(g->gdn[l].S);
        }
    }
    free(g->kv);
    free(g->gdn);
}

static void gpu_destroy(tern_session *s) {
    gpu_session *g = s->state;
    if (!g) return;
    free_state(g, &s->m->cfg);
    if (g->stream) tern_cuda_sync(g->stream, NULL);
    if (g->counted) atomic_fetch_sub(sessions_of(s->m), 1);   /* its last grid has ended */
    if (((gpu_model *)s->m->gpu)->last == s) ((gpu_model *)s->m->gpu)->last = NULL;
    const char *trace = ((gpu_model *)s->m->gpu)->phase_trace;   /* a measurement build's records (src/cuda/trace.cuh) */
    tern_error terr;
    if (trace && tern_cuda_trace_dump(trace, &terr)) fprintf(stderr, "tern: %s\n", terr.msg);
    float *bufs[] = {g->x, g->x2, g->out2, g->xn, g->out, g->qg, g->k, g->v, g->o, g->qkv, g->z, g->b, g->a, g->g_out, g->rlog,
                     g->wts, g->logits, g->fused_out};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) tern_cuda_free(bufs[i]);
    tern_cuda_free(g->ids);
    tern_cuda_free(g->moe_work);
    tern_cuda_free(g->fx);
    tern_cuda_free(g->att_work);
    tern_cuda_free(g->sample_work);
    tern_cuda_free(g->draw_work);
    tern_cuda_host_free(g->draw_host);
    tern_cuda_host_free(g->draw_mask);
    tern_cuda_host_free(g->mask_host);
    tern_cuda_free(g->d_id);
    tern_cuda_free(g->route_counters);
    tern_cuda_free(g->gdn_work);
    tern_cuda_free(g->grouped_work);
    for (int b = 0; b < 2; b++) {
        tern_cuda_graph_destroy(g->graph[b]);
        tern_cuda_event_destroy(g->done[b]);
    }
    if (g->st) {
        print_stats(g->st);
        tern_cuda_marks_destroy(g->st->marks);
        free(g->st);
    }
    tern_cuda_stream_destroy(g->stream);
    tern_cuda_host_free(g->step_host[0]);
    tern_cuda_free(g->step_dev);
    free(g->host_ids);
    free(g->kv_key);
    free(g);
    s->state = NULL;
}

/* Device KV rows: a new buffer of new_bytes holding the first old_bytes of
 * *p (NULL: nothing yet), the old one freed. */
static int grow(uint8_t **p, size_t old_bytes, size_t new_bytes, tern_error *err) {
    uint8_t *n = tern_cuda_alloc(new_bytes, err);
    if (!n) return -1;
    if (*p && old_bytes && (tern_cuda_sync(NULL, err) || tern_cuda_copy(n, *p, old_bytes, NULL, err) ||
                            tern_cuda_sync(NULL, err))) {
        tern_cuda_free(n);
        return -1;
    }
    tern_cuda_free(*p);
    *p = n;
    return 0;
}

int tern_gpu_reserve(tern_session *s, int needed, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    gpu_session *g = s->state;
    if (needed <= g->cap) return 0;
    int n = tern_kv_next_cap(g->cap, needed, s->max_ctx, err);
    if (n < 0) return -1;
    size_t row = s->kvf.row_bytes, old = (size_t)g->cap * row;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kind[l] != TERN_LAYER_ATTN) continue;
        if (grow(&g->kv[l].k, old, (size_t)n * row, err) || grow(&g->kv[l].v, old, (size_t)n * row, err)) return -1;
    }
    g->cap = n;
    return 0;
}

static int gpu_kv_cap(const tern_session *s) { return ((const gpu_session *)s->state)->cap; }

/* (a step's graph holds the rows' addresses: the next reserve's new ones
 * make it captured again, as a grow does) */
static void gpu_release_rows(tern_session *s) {
    gpu_session *g = s->state;
    for (int l = 0; l < s->m->cfg.n_layers; l++) {
        tern_cuda_free(g->kv[l].k);
        tern_cuda_free(g->kv[l].v);
        g->kv[l].k = g->kv[l].v = NULL;
    }
    g->cap = 0;
}

/* The DeltaNet state back to zero, as a new session has them. */
static int gpu_reset(tern_session *s, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    gpu_session *g = s->state;
    if (tern_cuda_sync(g->stream, err)) return -1;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kind[l] != TERN_LAYER_GDN) continue;
        if (tern_cuda_fill(g->gdn[l].conv, 0, tern_cfg_gdn_conv_floats(c) * sizeof(float), g->stream, err) ||
            tern_cuda_fill(g->gdn[l].S, 0, tern_cfg_gdn_state_floats(c) * sizeof(float), g->stream, err))
            return -1;
    }
    return tern_cuda_sync(g->stream, err);
}

static int gpu_mtp_forward(tern_session *s, const float *hidden, const int32_t *next, int n, float *logits,
                           float *hidden_out, tern_error *err) {
    return tern_fail(err, "the MTP head does not run on the GPU yet");
}

/* ---- snapshots: device memory, device-to-device copies --------------------
 * Copies between device pointers are enqueued in order on the default
 * stream and done once gpu_wait returns; they read the state the session's
 * last piece or step left, which ends synchronised. */

/* Enqueues the copies of the layer state's pieces between the session and
 * buf; to_buf picks the direction. */
static int walk_layers(const tern_session *s, uint8_t *buf, int from, int pos, int recurrent, int to_buf,
                       tern_error *err) {
    const gpu_session *g = s->state;
    tern_span sp[2 * TERN_MAX_LAYERS];
    int n = tern_state_spans(&s->m->cfg, g->kv, g->gdn, s->kvf.row_bytes, from, pos, recurrent, sp);
    for (int i = 0; i < n; i++) {
        if (to_buf ? tern_cuda_copy(buf, sp[i].p, sp[i].n, NULL, err) : tern_cuda_copy(sp[i].p, buf, sp[i].n, NULL, err))
            return -1;
        buf += sp[i].n;
    }
    return 0;
}

static int gpu_save(const tern_session *s, uint8_t *buf, int from, int pos, int recurrent, tern_error *err) {
    return walk_layers(s, buf, from, pos, recurrent, 1, err);
}

static int gpu_load(tern_session *s, const uint8_t *buf, int from, int pos, int recurrent, tern_error *err) {
    return walk_layers(s, (uint8_t *)buf, from, pos, recurrent, 0, err);
}

/* Host ends are copied at once, after the work before them. */
static int gpu_copy(void *dst, const void *src, size_t n, tern_copy_kind kind, tern_error *err) {
    if (!n) return 0;
    if (kind == TERN_COPY_IN_BE) return tern_cuda_copy(dst, src, n, NULL, err);
    if (tern_cuda_sync(NULL, err) != 0) return -1;
    return kind == TERN_COPY_TO_HOST ? tern_cuda_download(dst, src, n, err) : tern_cuda_upload(dst, src, n, err);
}

static void *gpu_snap_alloc(size_t n, tern_error *err) { return tern_cuda_alloc(n, err); }

static void gpu_snap_free(void *p) { tern_cuda_free(p); }

static void *gpu_host_alloc(size_t n, tern_error *err) { return tern_cuda_host_alloc(n, err); }

static void gpu_host_free(void *p) { tern_cuda_host_free(p); }

static int gpu_wait(tern_error *err) { return tern_cuda_sync(NULL, err); }

/* An evaluation's whole run goes to tern_gpu_forward, which cuts it into
 * pieces of its own size (tern_load_params.debug.piece), bounded by the
 * session's preallocated buffers. */
const tern_backend tern_gpu_backend = {
    .kv_bits = 16,   /* the GPU keeps no fp32 rows */
    .eval_piece = 0,
    .create = gpu_create,
    .destroy = gpu_destroy,
    .reset = gpu_reset,
    .reserve = tern_gpu_reserve,
    .kv_cap = gpu_kv_cap,
    .release_rows = gpu_release_rows,
    .forward = tern_gpu_forward,
    .forward_many = tern_gpu_forward_many,
    .mtp_forward = gpu_mtp_forward,
    .sample_ok = tern_gpu_sample_ok,
    .forward_sample = tern_gpu_forward_sample,
    .sample_launch = tern_gpu_sample_launch,
    .sample_wait = tern_gpu_sample_wait,
    .sample_in_flight = tern_gpu_sample_in_flight,
    .save = gpu_save,
    .load = gpu_load,
    .copy = gpu_copy,
    .snap_alloc = gpu_snap_alloc,
    .snap_free = gpu_snap_free,
    .host_alloc = gpu_host_alloc,
    .host_free = gpu_host_free,
    .wait = gpu_wait,
};

/* ---- kernel statistics ---------------------------------------------------- */

static void print_stats(const stats *st) {
    if (st->graph_steps)
        fprintf(stderr, "\nkernel stats: %ld one-token graph replays: GPU %.3f ms per token, host wall %.3f ms "
                        "per token (the GPU busy %.0f %% of it)\n", st->graph_steps, st->graph_ms / st->graph_steps,
                st->graph_wall_ms / st->graph_steps,
                st->graph_wall_ms > 0 ? 100 * st->graph_ms / st->graph_wall_ms : 0.0);
    if (!st->tokens) return;
    double n = (double)st->tokens;
    if (st->prefill)
        fprintf(stderr, "\nkernel stats: %ld prefill tokens in %ld pieces; GPU time per token by role:\n",
                st->tokens, st->pieces);
    else
        fprintf(stderr, "\nkernel stats: %ld decode steps; GPU time per token by role:\n", st->tokens);
    /* a prefill token takes tens of microseconds: us per token there */
    double f = st->prefill ? 1e3 : 1.0;
    const char *u = st->prefill ? "us" : "ms";
    for (int r = 0; r < R_COUNT; r++)
        fprintf(stderr, "  %-28s %8.3f %s  %5.1f %%\n", role_names[r], f * st->ms[r] / n, u,
                st->busy_ms > 0 ? 100 * st->ms[r] / st->busy_ms : 0.0);
    fprintf(stderr, "  GPU busy %.3f %s of a %.3f %s GPU span (%.0f %%); host wall %.3f %s per token "
                    "(GPU busy %.0f %% of it)\n", f * st->busy_ms / n, u, f * st->span_ms / n, u,
            st->span_ms > 0 ? 100 * st->busy_ms / st->span_ms : 0.0, f * st->wall_ms / n, u,
            st->wall_ms > 0 ? 100 * st->busy_ms / st->wall_ms : 0.0);
}

/* Marks around a role's ops: only on uncaptured single-token steps. */
void tern_gpu_stage(gpu_session *g, int role, int end) {
    stats *st = g->st;
    if (!st || st->n_marks < 0 || st->n_marks >= MAX_MARKS) return;
    if (!end) st->role[st->n_marks / 2] = role;
    tern_cuda_mark(st->marks, st->n_marks++, g->stream);
}

/* After a step's final sync: add its marks' times (T tokens). */
void tern_gpu_collect(stats *st, double wall_ms, int T) {
    int pairs = st->n_marks / 2;
    for (int i = 0; i < pairs; i++) {
        float ms = tern_cuda_marks_ms(st->marks, 2 * i, 2 * i + 1);
        if (ms > 0) {
            st->ms[st->role[i]] += ms;
            st->busy_ms += ms;
        }
    }
    if (pairs) st->span_ms += tern_cuda_marks_ms(st->marks, 0, 2 * pairs - 1);
    st->wall_ms += wall_ms;
    st->tokens += T;
    st->pieces++;
}

#endif
