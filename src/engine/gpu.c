#include "engine/gpu.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

#ifndef TERN_CUDA

static int no_cuda(tern_error *err) {
    return tern_fail(err, "this tern was built without CUDA (make CUDA=1 builds the GPU engine)");
}
int tern_gpu_model_init(tern_model *m, const char *device, const tern_load_params *params, tern_error *err) {
    (void)m; (void)device; (void)params;
    return no_cuda(err);
}
void tern_gpu_model_free(tern_model *m) { (void)m; }
const char *tern_gpu_name(const tern_model *m) { (void)m; return "cpu"; }
int tern_gpu_session_init(tern_session *s, tern_error *err) { (void)s; return no_cuda(err); }
void tern_gpu_session_free(tern_session *s) { (void)s; }
int tern_gpu_grow(uint8_t **p, size_t o, size_t n, tern_error *err) { (void)p; (void)o; (void)n; return no_cuda(err); }
int tern_gpu_copy(void *h, void *d, size_t n, int to_host, tern_error *err) {
    (void)h; (void)d; (void)n; (void)to_host;
    return no_cuda(err);
}
int tern_gpu_session_reset(tern_session *s, tern_error *err) { (void)s; return no_cuda(err); }
void *tern_gpu_alloc(size_t n, tern_error *err) { (void)n; no_cuda(err); return NULL; }
void tern_gpu_free(void *p) { (void)p; }
int tern_gpu_copy_d2d(void *dst, const void *src, size_t n, tern_error *err) {
    (void)dst; (void)src; (void)n;
    return no_cuda(err);
}
int tern_gpu_wait(tern_error *err) { return no_cuda(err); }
int tern_gpu_forward(tern_session *s, const int32_t *tokens, int T, float *logits, int all, tern_error *err) {
    (void)s; (void)tokens; (void)T; (void)logits; (void)all;
    return no_cuda(err);
}
int tern_gpu_sampling_enabled(const tern_session *s) { (void)s; return 0; }
int tern_gpu_sample_fits(int n_valid, int top_k) { (void)n_valid; (void)top_k; return 0; }
int tern_gpu_forward_sample(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, int32_t *next,
                            tern_error *err) {
    (void)s; (void)token; (void)rule; (void)u; (void)next;
    return no_cuda(err);
}
int tern_gpu_sample_launch(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, tern_error *err) {
    (void)s; (void)token; (void)rule; (void)u;
    return no_cuda(err);
}
int tern_gpu_sample_wait(tern_session *s, int32_t *next, tern_error *err) {
    (void)s; (void)next;
    return no_cuda(err);
}
int tern_gpu_sample_in_flight(const tern_session *s) { (void)s; return 0; }

#else

#include <math.h>

#include "cpu/ops.h"
#include "cuda/cuda_ops.h"
#include "util/clock.h"

/* Tokens per GPU forward piece (default; tern_load_params.debug.piece
 * overrides it, and a session's context caps it): bounds every scratch
 * buffer and the prefill ops' workspaces (chunked DeltaNet, grouped
 * experts), ~0.3 MB a token. Longer pieces fill the experts' 64-row tiles
 * (at 512 tokens an expert has ~16 rows) and dequantize the dense weights
 * less often (docs/experiments/cuda-prefill.md). */
#define PIECE_DEFAULT 4096
/* Rows of logits computed and copied back at a time (all_logits callers). */
#define LOGIT_ROWS 64
/* Up to SUB tokens run the decode ops (GEMV, split-K attention, the fused
 * experts, the DeltaNet step); longer runs the prefill ops. */
#define SUB 8
/* A piece's input block (gpu_session.step_host / step_dev): the sampler's
 * u, the position, the tokens. */
#define STEP_U 0
#define STEP_POS 8
#define STEP_TOK 12
#define STEP_BYTES(T) (STEP_TOK + 4 * (size_t)(T))

/* ---- the model ---------------------------------------------------------- */

/* A layer's input projections stacked into one matrix (rows of the
 * parts one after another, same encoding): one GEMV launch instead of 3 or
 * 4 for a single token, whose output slices are the parts' outputs. */
typedef struct fused_mat {
    tern_mat m;                   /* rows = the parts' rows together; NULL data: not fused */
    uint8_t *mem;                 /* its device copy (data, scales, biases) */
} fused_mat;

typedef struct gpu_model {
    int device;
    fused_mat *fused_in;          /* per layer: [q|k|v] or [qkv|z|b|a] (NULL data: parts that differ) */
    int one_token;                /* the one-token path (norms inside tern_cuda_gemv1) fits every layer */
    char name[320];               /* "cuda:N (device name)" */
    tern_cuda_ctx *ctx;
    uint8_t *resident;            /* resident.bin, same offsets as the host map */
    uint8_t **experts;            /* per expert file: n_experts x stride */
    int n_expert_files;
    tern_weights w;               /* m->w with every pointer on the device */
    float **vecs;                 /* device copies of the small fp32 vectors, for freeing */
    int n_vecs, cap_vecs;
    float *inv_freq;
    int w_layers;
    /* live GPU sessions of this model: the experts' one launch (blocks
     * that wait for each other) is used only while there is one, so two
     * such grids never share the SMs */
    atomic_int sessions;
    /* tern_load_params.serial_sessions: the sessions' calls never overlap,
     * so the one launch is taken with any number of them; `last` is the
     * session whose GPU work came last (the next one's waits for it) */
    int serial;
    tern_session *last;
    /* per layer: its experts' one launch can route the token itself (shapes,
     * kinds and the device's room; fixed for the model, planned once) */
    unsigned char *moe_self;
    /* per layer: with its experts' sums in fixed point, the layer whose
     * slot its launch zeroes: the one before it among those that route
     * themselves, cyclically (-1: floats; fewer than two such layers,
     * since a launch cannot zero its own slot) */
    int *fx_prev;
    /* tern_load_params.debug (phase_trace copied) */
    int no_graphs, cpu_sampling, kernel_stats, piece;
    char *phase_trace;
} gpu_model;

static atomic_int *sessions_of(const tern_model *m) { return &((gpu_model *)m->gpu)->sessions; }


/* A pointer into the host map of resident.bin, moved to the device copy. */
static const void *dev_of(const tern_model *m, const gpu_model *g, const void *host) {
    if (!host) return NULL;
    const uint8_t *base = m->ts.map, *p = host;
    if (p < base || p >= base + m->ts.map_size) return NULL;   /* not in resident.bin: cannot happen when packed */
    return g->resident + (p - base);
}

static int mat_to_dev(const tern_model *m, const gpu_model *g, tern_mat *w, const char *what, tern_error *err) {
    if (!w->data) return 0;
    const void *d = dev_of(m, g, w->data);
    if (!d) return tern_fail(err, "GPU: matrix %s does not live in resident.bin", what);
    w->data = d;
    w->scales = dev_of(m, g, w->scales);
    w->biases = dev_of(m, g, w->biases);
    if (!tern_cuda_gemv_supported(w))
        return tern_fail(err, "GPU: matrix %s (%lld x %lld, %d-bit) has an encoding the GPU kernels do not take",
                         what, (long long)w->rows, (long long)w->cols, w->bits);
    return 0;
}

static int vec_to_dev(gpu_model *g, float **v, size_t n, tern_error *err) {
    if (!*v) return 0;
    if (g->n_vecs == g->cap_vecs) {
        g->cap_vecs = g->cap_vecs ? 2 * g->cap_vecs : 256;
        float **p = realloc(g->vecs, (size_t)g->cap_vecs * sizeof *p);
        if (!p) return tern_fail(err, "out of memory");
        g->vecs = p;
    }
    float *d = tern_cuda_alloc(n * sizeof(float), err);
    if (!d || tern_cuda_upload(d, *v, n * sizeof(float), err) != 0) {
        tern_cuda_free(d);
        return -1;
    }
    g->vecs[g->n_vecs++] = d;
    *v = d;
    return 0;
}

static int layer_to_dev(const tern_model *m, gpu_model *g, tern_layer_w *L, tern_error *err) {
    const tern_config *c = &m->cfg;
    size_t H = (size_t)c->hidden;
    if (vec_to_dev(g, &L->in_norm, H, err) || vec_to_dev(g, &L->post_norm, H, err)) return -1;
    if (L->kind == TERN_LAYER_ATTN) {
        tern_attn_w *a = &L->attn;
        if (mat_to_dev(m, g, &a->q, "q_proj", err) || mat_to_dev(m, g, &a->k, "k_proj", err) ||
            mat_to_dev(m, g, &a->v, "v_proj", err) || mat_to_dev(m, g, &a->o, "o_proj", err) ||
            vec_to_dev(g, &a->q_norm, (size_t)c->head_dim, err) || vec_to_dev(g, &a->k_norm, (size_t)c->head_dim, err))
            return -1;
    } else {
        tern_gdn_w *d = &L->gdn;
        size_t conv = (size_t)tern_cfg_gdn_conv_dim(c) * c->gdn_conv_kernel;
        if (mat_to_dev(m, g, &d->qkv, "in_proj_qkv", err) || mat_to_dev(m, g, &d->z, "in_proj_z", err) ||
            mat_to_dev(m, g, &d->b, "in_proj_b", err) || mat_to_dev(m, g, &d->a, "in_proj_a", err) ||
            mat_to_dev(m, g, &d->out, "out_proj", err) || vec_to_dev(g, &d->conv, conv, err) ||
            vec_to_dev(g, &d->dt_bias, (size_t)c->gdn_v_heads, err) ||
            vec_to_dev(g, &d->A_log, (size_t)c->gdn_v_heads, err) || vec_to_dev(g, &d->norm, (size_t)c->gdn_v_dim, err))
            return -1;
    }
    tern_moe_w *e = &L->moe;
    e->experts = NULL;   /* the routed experts are reached through gpu_model.experts */
    return mat_to_dev(m, g, &e->router, "router", err) || mat_to_dev(m, g, &e->shared.gate, "shared gate_proj", err) ||
                   mat_to_dev(m, g, &e->shared.up, "shared up_proj", err) ||
                   mat_to_dev(m, g, &e->shared.down, "shared down_proj", err) ||
                   mat_to_dev(m, g, &e->shared_gate, "shared_expert_gate", err)
               ? -1 : 0;
}

static int upload_experts(tern_model *m, gpu_model *g, tern_error *err) {
    g->n_expert_files = m->man.n_layer_files;   /* the MTP layer's experts stay on the host for now */
    g->experts = calloc((size_t)g->n_expert_files, sizeof *g->experts);
    if (!g->experts) return tern_fail(err, "out of memory");
    size_t bytes = (size_t)m->man.n_experts * m->man.stride;
    for (int f = 0; f < g->n_expert_files; f++) {
        g->experts[f] = tern_cuda_alloc(bytes, err);
        if (!g->experts[f] || tern_cuda_upload(g->experts[f], m->expert_maps[f], bytes, err) != 0) {
            tern_err_prefix(err, "GPU: the experts of layer %d (%zu bytes)", f, bytes);
            return -1;
        }
    }
    return 0;
}

static void gpu_model_free(gpu_model *g) {
    if (!g) return;
    for (int l = 0; g->fused_in && l < g->w_layers; l++) tern_cuda_free(g->fused_in[l].mem);
    free(g->fused_in);
    for (int i = 0; i < g->n_vecs; i++) tern_cuda_free(g->vecs[i]);
    free(g->vecs);
    for (int f = 0; g->experts && f < g->n_expert_files; f++) tern_cuda_free(g->experts[f]);
    free(g->experts);
    tern_cuda_free(g->resident);
    free(g->w.layers);
    free(g->moe_self);
    free(g->fx_prev);
    free(g->phase_trace);
    tern_cuda_ctx_destroy(g->ctx);
    free(g);
}

static size_t row_bytes(const tern_mat *w) {
    return w->bits ? (size_t)w->cols * w->bits / 8 : (size_t)w->cols * 2;
}

/* Stacks parts[0..n) (device matrices of one encoding and width) into f;
 * leaves f empty when they differ. */
static int fuse(fused_mat *f, const tern_mat *const *parts, int n, tern_error *err) {
    const tern_mat *p0 = parts[0];
    int64_t rows = 0;
    for (int i = 0; i < n; i++) {
        const tern_mat *w = parts[i];
        if (w->bits != p0->bits || w->dtype != p0->dtype || w->group != p0->group || w->cols != p0->cols) return 0;
        rows += w->rows;
    }
    size_t rb = row_bytes(p0), sb = p0->bits ? (size_t)(p0->cols / p0->group) * 2 : 0;
    size_t data = (size_t)rows * rb, sc = (size_t)rows * sb, pad = 256;
    f->mem = tern_cuda_alloc(data + 2 * sc + 2 * pad, err);
    if (!f->mem) return -1;
    uint8_t *d = f->mem, *scl = f->mem + data + pad, *bia = scl + sc + pad;
    for (int i = 0; i < n; i++) {
        const tern_mat *w = parts[i];
        if (tern_cuda_copy(d, w->data, (size_t)w->rows * rb, NULL, err) ||
            (sb && (tern_cuda_copy(scl, w->scales, (size_t)w->rows * sb, NULL, err) ||
                    tern_cuda_copy(bia, w->biases, (size_t)w->rows * sb, NULL, err))))
            return -1;
        d += (size_t)w->rows * rb;
        scl += (size_t)w->rows * sb;
        bia += (size_t)w->rows * sb;
    }
    f->m = *p0;
    f->m.rows = rows;
    f->m.data = f->mem;
    f->m.scales = sb ? (const uint16_t *)(f->mem + data + pad) : NULL;
    f->m.biases = sb ? (const uint16_t *)(f->mem + data + pad + sc + pad) : NULL;
    return tern_cuda_sync(NULL, err);
}

static int fuse_inputs(gpu_model *g, int n_layers, tern_error *err) {
    g->fused_in = calloc((size_t)n_layers, sizeof *g->fused_in);
    if (!g->fused_in) return tern_fail(err, "out of memory");
    g->w_layers = n_layers;
    for (int l = 0; l < n_layers; l++) {
        const tern_layer_w *L = &g->w.layers[l];
        const tern_mat *attn[3] = {&L->attn.q, &L->attn.k, &L->attn.v};
        const tern_mat *gdn[4] = {&L->gdn.qkv, &L->gdn.z, &L->gdn.b, &L->gdn.a};
        int rc = L->kind == TERN_LAYER_ATTN ? fuse(&g->fused_in[l], attn, 3, err) : fuse(&g->fused_in[l], gdn, 4, err);
        if (rc != 0) return -1;
    }
    return 0;
}

/* The DeltaNet shapes of the config, with a layer's weights (w NULL: the
 * shapes alone, for checks and workspace sizes). */
static tern_cuda_gdn_w gdn_w_of(const tern_config *c, const tern_gdn_w *w) {
    return (tern_cuda_gdn_w){c->gdn_k_heads, c->gdn_v_heads, c->gdn_k_dim, c->gdn_v_dim, c->gdn_conv_kernel,
                             w ? w->conv : NULL, w ? w->A_log : NULL, w ? w->dt_bias : NULL, w ? w->norm : NULL,
                             c->norm_eps};
}

/* The one-token path takes each layer's stacked input projections, the
 * routers and the lm_head through tern_cuda_gemv1 (their inputs are norms). */
static int one_token_fits(const gpu_model *g, const tern_config *c) {
    if (!tern_cuda_gemv1_supported(&g->w.lm_head) || c->hidden % 4 || c->n_experts > 256 || c->top_k > 32)
        return 0;   /* (the fused router's limits) */
    for (int l = 0; l < c->n_layers; l++) {
        const tern_layer_w *L = &g->w.layers[l];
        if (!g->fused_in[l].m.data || !tern_cuda_gemv1_supported(&g->fused_in[l].m) ||
            !tern_cuda_gemv1_supported(&L->moe.router))
            return 0;
    }
    return 1;
}

static int parse_device(const char *s, int *dev, tern_error *err) {
    char *end;
    if (!strcmp(s, "cuda")) { *dev = 0; return 0; }
    if (strncmp(s, "cuda:", 5) == 0) {
        long v = strtol(s + 5, &end, 10);
        if (s[5] && !*end && v >= 0 && v < 1024) { *dev = (int)v; return 0; }
    }
    return tern_fail(err, "unknown device '%s' (cpu, cuda or cuda:N)", s);
}

static int build(tern_model *m, gpu_model *g, const char *device, tern_error *err) {
    const tern_config *c = &m->cfg;
    char name[256];
    if (parse_device(device, &g->device, err) || tern_cuda_init(g->device, name, sizeof name, err)) return -1;
    snprintf(g->name, sizeof g->name, "cuda:%d (%s)", g->device, name);
    if (!m->packed) return tern_fail(err, "%s: the GPU path runs packed models: tern pack it first", m->dir);
    if (m->experts) return tern_fail(err, "GPU: streaming experts under an expert budget is not on the GPU yet");
    tern_cuda_gdn_w gw = gdn_w_of(c, NULL);
    if (!tern_cuda_gdn_supported(&gw))
        return tern_fail(err, "%s: GPU: DeltaNet heads %d/%d x %d/%d are outside the GPU kernels' shapes", m->dir,
                         c->gdn_k_heads, c->gdn_v_heads, c->gdn_k_dim, c->gdn_v_dim);
    if (!(g->ctx = tern_cuda_ctx_create(0, err))) return -1;
    if (!(g->resident = tern_cuda_alloc(m->ts.map_size, err)) ||
        tern_cuda_upload(g->resident, m->ts.map, m->ts.map_size, err) != 0)
        return -1;
    g->w = m->w;
    g->w.layers = calloc((size_t)c->n_layers, sizeof *g->w.layers);
    if (!g->w.layers) return tern_fail(err, "out of memory");
    memcpy(g->w.layers, m->w.layers, (size_t)c->n_layers * sizeof *g->w.layers);
    g->w.has_mtp = 0;
    if (mat_to_dev(m, g, &g->w.lm_head, "lm_head", err) || vec_to_dev(g, &g->w.final_norm, (size_t)c->hidden, err))
        return -1;
    /* the embedding rows are read on the device (tern_cuda_embed): a step's
     * token ids go up, not its rows */
    g->w.embed.data = dev_of(m, g, m->w.embed.data);
    g->w.embed.scales = dev_of(m, g, m->w.embed.scales);
    g->w.embed.biases = dev_of(m, g, m->w.embed.biases);
    if (!g->w.embed.data) return tern_fail(err, "GPU: the embedding does not live in resident.bin");
    for (int l = 0; l < c->n_layers; l++)
        if (layer_to_dev(m, g, &g->w.layers[l], err) != 0) {
            tern_err_prefix(err, "layer %d", l);
            return -1;
        }
    /* the RoPE table joins the vectors (and is freed with them) */
    g->inv_freq = m->inv_freq;
    if (vec_to_dev(g, &g->inv_freq, (size_t)c->rope_dim / 2, err) != 0) return -1;
    if (fuse_inputs(g, c->n_layers, err) != 0) return -1;
    g->one_token = one_token_fits(g, c);
    return upload_experts(m, g, err);
}

/* The debugging aids of the load parameters (tern.h). */
static int take_debug(gpu_model *g, const tern_load_params *p, tern_error *err) {
    if (!p) return 0;
    g->no_graphs = p->debug.no_graphs;
    g->cpu_sampling = p->debug.cpu_sampling;
    g->kernel_stats = p->debug.kernel_stats;
    g->piece = p->debug.piece;
    if (g->kernel_stats < TERN_STATS_OFF || g->kernel_stats > TERN_STATS_GRAPH)
        return tern_fail(err, "debug.kernel_stats %d is not an enum tern_kernel_stats", g->kernel_stats);
    if (g->piece && (g->piece < 16 || g->piece > 65536))
        return tern_fail(err, "debug.piece must be 16..65536 tokens (got %d)", g->piece);
    if (p->debug.phase_trace && *p->debug.phase_trace && !(g->phase_trace = strdup(p->debug.phase_trace)))
        return tern_fail(err, "out of memory");
    return 0;
}

static int plan_moe_self(tern_model *m, tern_error *err);
static int plan_moe_fx(tern_model *m, tern_error *err);

int tern_gpu_model_init(tern_model *m, const char *device, const tern_load_params *params, tern_error *err) {
    gpu_model *g = calloc(1, sizeof *g);
    if (!g) return tern_fail(err, "out of memory");
    atomic_init(&g->sessions, 0);
    g->serial = params && params->serial_sessions;
    if (take_debug(g, params, err) != 0 || build(m, g, device, err) != 0) {
        gpu_model_free(g);
        return -1;
    }
    m->gpu = g;
    if (plan_moe_self(m, err) != 0 || plan_moe_fx(m, err) != 0) {
        tern_gpu_model_free(m);
        return -1;
    }
    return 0;
}

void tern_gpu_model_free(tern_model *m) {
    gpu_model_free(m->gpu);
    m->gpu = NULL;
}

const char *tern_gpu_name(const tern_model *m) { return ((const gpu_model *)m->gpu)->name; }

/* ---- the session -------------------------------------------------------- */

/* Kernel statistics (tern_load_params.debug.kernel_stats): GPU time per
 * op role of every decode step (one token, TERN_STATS_DECODE) or of the
 * prefill pieces (more than SUB tokens, per prompt token,
 * TERN_STATS_PREFILL), from events recorded around each role's ops, and
 * the share of the step the GPU was busy; printed when the session ends. */
enum { R_NORM, R_ATTN_PROJ, R_ATTN, R_GDN_PROJ, R_GDN, R_ROUTER, R_MOE, R_HEAD, R_COUNT };
static const char *const role_names[R_COUNT] = {"rmsnorm + residual", "attention projections", "attention core",
                                                "DeltaNet projections", "DeltaNet core", "router + top-k",
                                                "experts (routed + shared)", "final norm + lm_head"};
#define MAX_MARKS 4096

typedef struct stats {
    tern_cuda_marks *marks;
    int n_marks, role[MAX_MARKS / 2];
    double ms[R_COUNT], busy_ms, span_ms, wall_ms;
    long tokens, pieces;
    int graph;                    /* TERN_STATS_GRAPH: whole captured steps, timed as one */
    int prefill;                  /* TERN_STATS_PREFILL: prefill pieces instead of decode steps */
    double graph_ms, graph_wall_ms;
    long graph_steps;
} stats;

typedef struct gpu_session {
    tern_stream stream;
    /* The decode step's graphs, one per input block (blk): a step launched
     * while the one before is in flight writes the other block, so each
     * graph's copy node and id word are its own. */
    tern_graph graph[2];
    int use_graph;
    int piece;                    /* tokens per forward piece */
    struct { int T, rows, n_plan, one_launch, kv_gen; } key[2];   /* what graph[b] was captured for */
    int kv_gen;                   /* counts the KV caches' moves (kv_key) */
    int counted;                  /* in the model's sessions */
    int one_launch;               /* this step may take the experts' one launch (the only session) */
    const uint8_t **kv_key;       /* and the KV caches it points at: [layer][k, v] */
    const int *pos_dev;           /* during a capture: the step's position, read on the device */
    int n_plan;                   /* and the context the attention's splits are planned for */
    stats *st;
    float *x, *x2, *out2, *xn, *out, *qg, *k, *v, *o, *qkv, *z, *b, *a, *g_out, *rlog, *wts, *logits;
    float *fused_out;             /* one token's stacked input projections */
    void *sample_work;            /* argmax / top-k workspace */
    int32_t *d_id;                /* the sampled id */
    unsigned *route_counters;     /* per layer: the fused router's last-block counter (zero between calls) */
    int32_t *ids;
    void *moe_work, *att_work, *gdn_work, *grouped_work;
    size_t att_bytes, gdn_bytes, grouped_bytes;
    /* the experts' fixed-point slots, one a layer (gpu_model.fx_prev),
     * fx_bytes each: zero but for the slots of the last layers run */
    uint8_t *fx;
    size_t fx_bytes;
    /* A piece's input, [u (double), position, tokens...]: written on the
     * host into page-locked memory, copied up in the stream (the embedding,
     * the captured step and the sampler read it on the device). Two blocks:
     * blk is the one the step being enqueued reads. */
    uint8_t *step_host[2], *step_dev;
    const int32_t *tok_dev;       /* the tokens in step_dev */
    int32_t *id_host[2];          /* the drawn ids, one a block (page-locked, behind the blocks) */
    int blk;
    /* Sampled decode steps launched and not yet waited for (at most two,
     * oldest first): their blocks, and an event after each. */
    int n_flight, flight[2];
    tern_event done[2];
    int drawn;                    /* a sampled step was launched: d_id holds its draw */
    struct { int on; tern_gpu_rule r; } key_rule[2];   /* the sampler captured in graph[b], if any */
    int32_t *host_ids;            /* routing observer */
} gpu_session;

/* Whether a step of s may take the experts' one launch, whose blocks wait
 * for each other, so no other session's such grid may share the SMs: when
 * s is the model's only session, or when the sessions' calls never overlap
 * (serial); then a session's first step after another's waits for that
 * one's stream. -1 when that wait fails. */
static int claim_one_launch(tern_session *s, tern_error *err) {
    gpu_model *gm = s->m->gpu;
    if (!gm->serial) return atomic_load(&gm->sessions) == 1;
    if (gm->last && gm->last != s && tern_cuda_sync(((gpu_session *)gm->last->gpu)->stream, err)) return -1;
    gm->last = s;
    return 1;
}

static void print_stats(const stats *st);


static float *dalloc(size_t n, int *ok, tern_error *err) {
    float *p = *ok ? tern_cuda_alloc((n ? n : 1) * sizeof(float), err) : NULL;
    if (!p) *ok = 0;
    return p;
}

static tern_cuda_attn_dims attn_dims(const tern_config *c) {
    return (tern_cuda_attn_dims){c->n_heads, c->n_kv_heads, c->head_dim, c->rope_dim, c->norm_eps};
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
    tern_cuda_attn_dims d = attn_dims(c);
    tern_cuda_gdn_w gw = gdn_w_of(c, NULL);
    g->att_bytes = tern_cuda_attention_workspace(&d, SUB, max_ctx);
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
    g->use_graph = !gm->no_graphs;
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
static int alloc_gdn_state(tern_session *s, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    int ok = 1;
    for (int l = 0; ok && l < c->n_layers; l++) {
        if (c->layer_kind[l] != TERN_LAYER_GDN) continue;
        s->gdn[l].conv = dalloc(tern_cfg_gdn_conv_floats(c), &ok, err);
        s->gdn[l].S = dalloc(tern_cfg_gdn_state_floats(c), &ok, err);
        if (ok && (tern_cuda_fill(s->gdn[l].conv, 0, tern_cfg_gdn_conv_floats(c) * sizeof(float), NULL, err) ||
                   tern_cuda_fill(s->gdn[l].S, 0, tern_cfg_gdn_state_floats(c) * sizeof(float), NULL, err)))
            ok = 0;
    }
    return ok ? tern_cuda_sync(NULL, err) : -1;
}

int tern_gpu_session_init(tern_session *s, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    if (s->kvf.bits == 32)
        return tern_fail(err, "GPU: the KV cache is 16, 8 or 4-bit on the GPU (kv_bits 32 is the CPU reference's)");
    gpu_session *g = calloc(1, sizeof *g);
    if (!g) return tern_fail(err, "out of memory");
    s->gpu = g;   /* tern_gpu_session_free releases whatever was allocated */
    if (configure(g, s->m->gpu, s->max_ctx, err) || alloc_activations(g, c, err) ||
        alloc_workspaces(g, c, s->max_ctx, err) || !(g->stream = tern_cuda_stream_create(err)) ||
        alloc_gdn_state(s, err))
        return -1;
    atomic_fetch_add(sessions_of(s->m), 1);
    g->counted = 1;
    return 0;
}

void tern_gpu_session_free(tern_session *s) {
    gpu_session *g = s->gpu;
    const tern_config *c = &s->m->cfg;
    for (int l = 0; l < c->n_layers; l++) {
        if (s->kv) {
            tern_cuda_free(s->kv[l].k);
            tern_cuda_free(s->kv[l].v);
            s->kv[l].k = s->kv[l].v = NULL;
        }
        if (s->gdn) {
            tern_cuda_free(s->gdn[l].conv);
            tern_cuda_free(s->gdn[l].S);
            s->gdn[l].conv = NULL;
            s->gdn[l].S = NULL;
        }
    }
    if (!g) return;
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
    s->gpu = NULL;
}

int tern_gpu_grow(uint8_t **p, size_t old_bytes, size_t new_bytes, tern_error *err) {
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

/* The DeltaNet state back to zero, as a new session has them. */
int tern_gpu_session_reset(tern_session *s, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    gpu_session *g = s->gpu;
    if (tern_cuda_sync(g->stream, err)) return -1;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kind[l] != TERN_LAYER_GDN) continue;
        if (tern_cuda_fill(s->gdn[l].conv, 0, tern_cfg_gdn_conv_floats(c) * sizeof(float), g->stream, err) ||
            tern_cuda_fill(s->gdn[l].S, 0, tern_cfg_gdn_state_floats(c) * sizeof(float), g->stream, err))
            return -1;
    }
    return tern_cuda_sync(g->stream, err);
}

void *tern_gpu_alloc(size_t n, tern_error *err) { return tern_cuda_alloc(n, err); }

void tern_gpu_free(void *p) { tern_cuda_free(p); }

int tern_gpu_copy_d2d(void *dst, const void *src, size_t n, tern_error *err) {
    return tern_cuda_copy(dst, src, n, NULL, err);
}

int tern_gpu_wait(tern_error *err) { return tern_cuda_sync(NULL, err); }

int tern_gpu_copy(void *host, void *dev, size_t n, int to_host, tern_error *err) {
    if (tern_cuda_sync(NULL, err) != 0) return -1;
    return to_host ? tern_cuda_download(host, dev, n, err) : tern_cuda_upload(dev, host, n, err);
}

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
static void stage(gpu_session *g, int role, int end) {
    stats *st = g->st;
    if (!st || st->n_marks < 0 || st->n_marks >= MAX_MARKS) return;
    if (!end) st->role[st->n_marks / 2] = role;
    tern_cuda_mark(st->marks, st->n_marks++, g->stream);
}

/* After a step's final sync: add its marks' times (T tokens). */
static void collect(stats *st, double wall_ms, int T) {
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

/* ---- the forward pass ----------------------------------------------------- */

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
static int mm(const gpu_model *gm, const gpu_session *g, float *y, const float *x, int T, const tern_mat *W,
              tern_error *err) {
    if (T <= TERN_CUDA_GEMV_MAX_T) return mm_fp32(g, y, x, T, W, err);
    return tern_cuda_gemm(gm->ctx, W, x, T, y, g->stream, err);
}

/* A decode-sized step's attention (T <= SUB): K/V rows into the cache,
 * then the split-K attention into g->o. While a graph is captured the
 * position is read on the device and the splits are planned for g->n_plan,
 * so the graph serves the following tokens too. */
static int attend_small(tern_session *s, const tern_cuda_attn_dims *d, float *qg, float *k, float *v,
                        const tern_attn_w *w, int l, int T, tern_error *err) {
    const gpu_model *gm = s->m->gpu;
    gpu_session *g = s->gpu;
    float scale = 1.0f / sqrtf((float)s->m->cfg.head_dim);
    if (g->pos_dev)
        return tern_cuda_attn_prep_at(d, &s->kvf.q, qg, k, v, w->q_norm, w->k_norm, gm->inv_freq, T, g->pos_dev,
                                      s->kv[l].k, s->kv[l].v, g->stream, err) ||
                       tern_cuda_attention_at(d, &s->kvf.q, qg, s->kv[l].k, s->kv[l].v, T, g->pos_dev, g->n_plan, scale,
                                              g->att_work, g->att_bytes, g->o, g->stream, err)
                   ? -1 : 0;
    return tern_cuda_attn_prep(d, &s->kvf.q, qg, k, v, w->q_norm, w->k_norm, gm->inv_freq, T, s->pos, s->kv[l].k,
                               s->kv[l].v, g->stream, err) ||
                   tern_cuda_attention(d, &s->kvf.q, qg, s->kv[l].k, s->kv[l].v, T, s->pos, scale, g->att_work,
                                       g->att_bytes, g->o, g->stream, err)
               ? -1 : 0;
}

/* The end of the attention role and the output projection of g->o. */
static int attn_out(tern_session *s, const tern_attn_w *w, int T, tern_error *err) {
    gpu_session *g = s->gpu;
    stage(g, R_ATTN, 1);
    stage(g, R_ATTN_PROJ, 0);
    int rc = mm(s->m->gpu, g, g->out, g->o, T, &w->o, err);
    stage(g, R_ATTN_PROJ, 1);
    return rc;
}

static int attn_layer(tern_session *s, const tern_attn_w *w, int l, int T, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    const gpu_model *gm = s->m->gpu;
    gpu_session *g = s->gpu;
    tern_cuda_attn_dims d = attn_dims(c);
    stage(g, R_ATTN_PROJ, 0);
    const fused_mat *fz = gm->fused_in ? &gm->fused_in[l] : NULL;
    float *qg = g->qg, *k = g->k, *v = g->v;
    if (T == 1 && fz && fz->m.data) {
        /* one token: the stacked output's slices are q|gate, k and v */
        if (mm(gm, g, g->fused_out, g->xn, 1, &fz->m, err)) return -1;
        qg = g->fused_out;
        k = qg + w->q.rows;
        v = k + w->k.rows;
    } else if (mm(gm, g, g->qg, g->xn, T, &w->q, err) || mm(gm, g, g->k, g->xn, T, &w->k, err) ||
               mm(gm, g, g->v, g->xn, T, &w->v, err)) {
        return -1;
    }
    stage(g, R_ATTN_PROJ, 1);
    stage(g, R_ATTN, 0);
    if (T <= SUB) return attend_small(s, &d, qg, k, v, w, l, T, err) ? -1 : attn_out(s, w, T, err);
    if (tern_cuda_attn_prep(&d, &s->kvf.q, qg, k, v, w->q_norm, w->k_norm, gm->inv_freq, T, s->pos, s->kv[l].k,
                            s->kv[l].v, g->stream, err))
        return -1;
    size_t qrow = (size_t)c->n_heads * 2 * c->head_dim, orow = (size_t)c->n_heads * c->head_dim;
    float scale = 1.0f / sqrtf((float)c->head_dim);
    int hd = c->head_dim;
    if (T > SUB && (hd == 32 || hd == 64 || hd == 128 || hd == 256)) {
        if (tern_cuda_attention_prefill(&d, &s->kvf.q, qg, s->kv[l].k, s->kv[l].v, T, s->pos, scale, g->o,
                                        g->stream, err))
            return -1;
        return attn_out(s, w, T, err);
    }
    /* every row of the piece is in the cache now: each run of SUB tokens
     * attends causally from its own first position */
    for (int t0 = 0; t0 < T; t0 += SUB) {
        int n = T - t0 < SUB ? T - t0 : SUB;
        if (tern_cuda_attention(&d, &s->kvf.q, qg + t0 * qrow, s->kv[l].k, s->kv[l].v, n, s->pos + t0, scale,
                                g->att_work, g->att_bytes, g->o + t0 * orow, g->stream, err))
            return -1;
    }
    return attn_out(s, w, T, err);
}

static int gdn_layer(tern_session *s, const tern_gdn_w *w, int l, int T, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    const gpu_model *gm = s->m->gpu;
    gpu_session *g = s->gpu;
    tern_cuda_gdn_w gw = gdn_w_of(c, w);
    stage(g, R_GDN_PROJ, 0);
    const fused_mat *fz = gm->fused_in ? &gm->fused_in[l] : NULL;
    float *qkv = g->qkv, *z = g->z, *b = g->b, *a = g->a;
    if (T == 1 && fz && fz->m.data) {
        /* one token: the stacked output's slices are qkv, z, b and a */
        if (mm(gm, g, g->fused_out, g->xn, 1, &fz->m, err)) return -1;
        qkv = g->fused_out;
        z = qkv + w->qkv.rows;
        b = z + w->z.rows;
        a = b + w->b.rows;
    } else if (mm(gm, g, g->qkv, g->xn, T, &w->qkv, err) || mm(gm, g, g->z, g->xn, T, &w->z, err) ||
               mm(gm, g, g->b, g->xn, T, &w->b, err) || mm(gm, g, g->a, g->xn, T, &w->a, err)) {
        return -1;
    }
    stage(g, R_GDN_PROJ, 1);
    stage(g, R_GDN, 0);
    /* a prefill runs the chunked form (chunk 64), decode the step */
    int rc = T > SUB ? tern_cuda_gdn_chunked(&gw, qkv, z, b, a, T, s->gdn[l].conv, s->gdn[l].S, g->gdn_work, g->gdn_bytes,
                                         g->g_out, g->stream, err)
                 : tern_cuda_gdn_step(&gw, qkv, z, b, a, T, s->gdn[l].conv, s->gdn[l].S, g->g_out, g->stream, err);
    stage(g, R_GDN, 1);
    stage(g, R_GDN_PROJ, 0);
    rc = rc || mm(gm, g, g->out, g->g_out, T, &w->out, err) ? -1 : 0;
    stage(g, R_GDN_PROJ, 1);
    return rc;
}

static tern_cuda_expert_part part_of(const tern_pk_tensor *t) {
    return (tern_cuda_expert_part){t->data.off, t->scales.off, t->biases.off, t->shape[0], t->shape[1],
                                   t->encoding == TERN_ENC_Q4 ? 4 : 8, t->group};
}

/* Layer l's routed experts on the device (base + e * stride). */
static tern_cuda_experts experts_of(const tern_model *m, int l) {
    const gpu_model *gm = m->gpu;
    return (tern_cuda_experts){NULL, gm->experts[l], m->man.stride, part_of(&m->man.parts[0]),
                               part_of(&m->man.parts[1]), part_of(&m->man.parts[2]), 0, NULL, NULL};
}

/* gpu_model.moe_self: asked once per layer (with the one launch allowed;
 * a step still takes it only while the model has one session). */
static int plan_moe_self(tern_model *m, tern_error *err) {
    gpu_model *gm = m->gpu;
    const tern_config *c = &m->cfg;
    if (!(gm->moe_self = calloc((size_t)c->n_layers, 1))) return tern_fail(err, "out of memory");
    for (int l = 0; l < c->n_layers; l++) {
        const tern_moe_w *w = &gm->w.layers[l].moe;
        tern_cuda_experts ex = experts_of(m, l);
        ex.one_launch = 1;
        gm->moe_self[l] = (unsigned char)tern_cuda_moe_routes_itself(&ex, &w->shared, &w->shared_gate, c->top_k,
                                                                    c->n_experts);
    }
    return 0;
}

/* prev[l] for the layers with on[l]: the one before it among them,
 * cyclically (the first takes the last one's, of the step before); -1 for
 * the others, and for a layer alone (a launch cannot zero its own slot). */
static void chain_prev(int *prev, const unsigned char *on, int n) {
    int first = -1, last = -1;
    for (int l = 0; l < n; l++) {
        prev[l] = -1;
        if (!on[l]) continue;
        if (first < 0) first = l;
        else prev[l] = last;
        last = l;
    }
    if (last != first) prev[first] = last;
}

/* gpu_model.fx_prev: the layers whose experts route themselves take the
 * fixed-point sums, each zeroing the slot of the one before it (chained by
 * chain_prev). A step runs them all in order or none (whether the one
 * launch is taken is decided per step), so the slot a launch adds into
 * was zeroed by the next one in the step before. */
static int plan_moe_fx(tern_model *m, tern_error *err) {
    gpu_model *gm = m->gpu;
    const int n = m->cfg.n_layers;
    if (!(gm->fx_prev = malloc((size_t)n * sizeof *gm->fx_prev))) return tern_fail(err, "out of memory");
    chain_prev(gm->fx_prev, gm->moe_self, n);
    return 0;
}

static int observe(tern_session *s, int l, int T, tern_error *err) {
    gpu_session *g = s->gpu;
    int K = s->m->cfg.top_k;
    if (tern_cuda_sync(g->stream, err) || tern_cuda_download(g->host_ids, g->ids, (size_t)T * K * sizeof(int32_t), err))
        return -1;
    for (int t = 0; t < T; t++) s->route_fn(s->route_ud, l, s->pos + t, g->host_ids + (size_t)t * K, K);
    return 0;
}

static int moe_layer(tern_session *s, const tern_moe_w *w, int l, int T, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    const tern_model *m = s->m;
    const gpu_model *gm = m->gpu;
    gpu_session *g = s->gpu;
    int E = c->n_experts, K = c->top_k;
    stage(g, R_ROUTER, 0);
    if (mm(gm, g, g->rlog, g->xn, T, &w->router, err) ||
        tern_cuda_route(g->rlog, T, E, K, c->norm_topk, g->ids, g->wts, g->stream, err))
        return -1;
    stage(g, R_ROUTER, 1);
    if (s->route_fn && observe(s, l, T, err)) return -1;
    tern_cuda_experts ex = experts_of(m, l);
    size_t H = (size_t)c->hidden;
    const tern_pk_tensor *pt = m->man.parts;
    int groupable = pt[0].encoding == pt[2].encoding && pt[0].group == pt[1].group && pt[0].group == pt[2].group &&
                    H % 32 == 0 && c->expert_inter % 32 == 0;
    stage(g, R_MOE, 0);
    if (T > SUB && groupable) {   /* grouped by expert: each expert's weights read once per 64 of its tokens */
        int rc = tern_cuda_moe_grouped(&ex, E, &w->shared, &w->shared_gate, g->xn, T, K, g->ids, g->wts,
                                       g->grouped_work, g->grouped_bytes, g->out, g->stream, err);
        stage(g, R_MOE, 1);
        return rc;
    }
    for (int t0 = 0; t0 < T; t0 += SUB) {
        int n = T - t0 < SUB ? T - t0 : SUB;
        if (tern_cuda_moe(&ex, &w->shared, &w->shared_gate, g->xn + t0 * H, n, K, g->ids + (size_t)t0 * K,
                          g->wts + (size_t)t0 * K, g->moe_work, g->out + t0 * H, g->stream, err))
            return -1;
    }
    stage(g, R_MOE, 1);
    return 0;
}

/* x += out (the previous block's output, when there is one), xn = norm(x). */
static int norm_in(gpu_session *g, const float *w, int add, int H, int T, float eps, tern_error *err) {
    stage(g, R_NORM, 0);
    int rc = tern_cuda_rmsnorm(g->xn, g->x, add ? g->out : NULL, w, 1, H, T, eps, g->stream, err);
    stage(g, R_NORM, 1);
    return rc;
}

/* The lm_head over n normed rows, LOGIT_ROWS at a time, copied to logits. */
static int head(gpu_session *g, const gpu_model *gm, const float *xn, int n, int H, int V, float *logits,
                tern_error *err) {
    for (int r0 = 0; r0 < n; r0 += LOGIT_ROWS) {
        int k = n - r0 < LOGIT_ROWS ? n - r0 : LOGIT_ROWS;
        if (mm(gm, g, g->logits, xn + (size_t)r0 * H, k, &gm->w.lm_head, err) || tern_cuda_sync(g->stream, err) ||
            tern_cuda_download(logits + (size_t)r0 * V, g->logits, (size_t)k * V * sizeof(float), err))
            return -1;
    }
    return 0;
}

/* Every layer and the final norm, enqueued on the session's stream. */
static int layers(tern_session *s, int T, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    const gpu_model *gm = s->m->gpu;
    gpu_session *g = s->gpu;
    int H = c->hidden;
    for (int l = 0; l < c->n_layers; l++) {
        const tern_layer_w *L = &gm->w.layers[l];
        int rc = norm_in(g, L->in_norm, l > 0, H, T, c->norm_eps, err);
        if (rc == 0) rc = L->kind == TERN_LAYER_ATTN ? attn_layer(s, &L->attn, l, T, err) : gdn_layer(s, &L->gdn, l, T, err);
        if (rc == 0) rc = norm_in(g, L->post_norm, 1, H, T, c->norm_eps, err);
        if (rc == 0) rc = moe_layer(s, &L->moe, l, T, err);
        if (rc != 0) {
            tern_err_prefix(err, "GPU layer %d", l);
            return -1;
        }
    }
    return norm_in(g, gm->w.final_norm, 1, H, T, c->norm_eps, err);
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
    if (!tern_cuda_gemv1_supported(W)) return mm(gm, g, y, x, 1, W, err);
    tern_cuda_vec_in in = {x, NULL, NULL, NULL, 0, 0.0f, NULL, NULL};
    return tern_cuda_gemv1(W, &in, y, g->stream, err);
}

/* A layer's stacked input projections of x (+ the pending output), normed
 * with in_norm, into g->fused_out: one launch. */
static int in_proj1(gpu_session *g, const gpu_model *gm, int l, const float *in_norm, float eps, int role, resid *r,
                    tern_error *err) {
    stage(g, role, 0);
    tern_cuda_vec_in in = resid_in(r, in_norm, eps, NULL);
    if (tern_cuda_gemv1(&gm->fused_in[l].m, &in, g->fused_out, g->stream, err)) return -1;
    resid_taken(r);
    stage(g, role, 1);
    return 0;
}

/* The block's output projection into g->out, pending for the next norm. */
static int out_proj1(tern_session *s, const tern_mat *W, const float *x, int role, resid *r, tern_error *err) {
    gpu_session *g = s->gpu;
    stage(g, role, 0);
    int rc = gemv_plain(s->m->gpu, g, W, x, g->out, err);
    r->delta = g->out;
    stage(g, role, 1);
    return rc;
}

static int attn1(tern_session *s, const tern_attn_w *w, const float *in_norm, int l, resid *r, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    const gpu_model *gm = s->m->gpu;
    gpu_session *g = s->gpu;
    tern_cuda_attn_dims d = attn_dims(c);
    if (in_proj1(g, gm, l, in_norm, c->norm_eps, R_ATTN_PROJ, r, err)) return -1;
    float *qg = g->fused_out, *k = qg + w->q.rows, *v = k + w->k.rows;
    stage(g, R_ATTN, 0);
    if (attend_small(s, &d, qg, k, v, w, l, 1, err)) return -1;
    stage(g, R_ATTN, 1);
    return out_proj1(s, &w->o, g->o, R_ATTN_PROJ, r, err);
}

static int gdn1(tern_session *s, const tern_gdn_w *w, const float *in_norm, int l, resid *r, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    const gpu_model *gm = s->m->gpu;
    gpu_session *g = s->gpu;
    tern_cuda_gdn_w gw = gdn_w_of(c, w);
    if (in_proj1(g, gm, l, in_norm, c->norm_eps, R_GDN_PROJ, r, err)) return -1;
    float *qkv = g->fused_out, *z = qkv + w->qkv.rows, *b = z + w->z.rows, *a = b + w->b.rows;
    stage(g, R_GDN, 0);
    if (tern_cuda_gdn_step(&gw, qkv, z, b, a, 1, s->gdn[l].conv, s->gdn[l].S, g->g_out, g->stream, err)) return -1;
    stage(g, R_GDN, 1);
    return out_proj1(s, &w->out, g->g_out, R_GDN_PROJ, r, err);
}

static int moe1(tern_session *s, const tern_moe_w *w, const float *post_norm, int l, resid *r, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    gpu_session *g = s->gpu;
    const gpu_model *gm = s->m->gpu;
    tern_cuda_experts ex = experts_of(s->m, l);
    ex.one_launch = g->one_launch;
    /* the experts' one launch may take the top k itself (no router
     * epilogue, its count and its last block in the chain); not when the
     * host observes the ids between the two */
    int self = g->one_launch && !s->route_fn && gm->moe_self[l];
    stage(g, R_ROUTER, 0);
    tern_cuda_vec_in in = resid_in(r, post_norm, c->norm_eps, g->xn);
    tern_cuda_route_out ro = {c->n_experts, c->top_k, c->norm_topk, g->ids, g->wts, g->route_counters + l};
    if (self ? tern_cuda_gemv1(&w->router, &in, g->rlog, g->stream, err)
             : tern_cuda_gemv1_route(&w->router, &in, g->rlog, &ro, g->stream, err))
        return -1;
    resid_taken(r);
    stage(g, R_ROUTER, 1);
    if (s->route_fn && observe(s, l, 1, err)) return -1;
    stage(g, R_MOE, 0);
    const int fx = self && gm->fx_prev[l] >= 0;
    if (fx) {
        ex.fx = g->fx + (size_t)l * g->fx_bytes;
        ex.fx_zero = g->fx + (size_t)gm->fx_prev[l] * g->fx_bytes;
    }
    int rc = self ? tern_cuda_moe_route(&ex, &w->shared, &w->shared_gate, g->xn, c->top_k, g->rlog, c->n_experts,
                                        c->norm_topk, g->ids, g->wts, g->moe_work, g->out2, g->stream, err)
                  : tern_cuda_moe(&ex, &w->shared, &w->shared_gate, g->xn, 1, c->top_k, g->ids, g->wts, g->moe_work,
                                  g->out2, g->stream, err);
    stage(g, R_MOE, 1);
    if (fx) r->delta_fx = tern_cuda_moe_fx_sums(ex.fx);
    else r->delta = g->out2;
    return rc;
}

/* One token: every layer, then the final norm into xn and (rows) the
 * logits. */
static int step1(tern_session *s, int rows, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    const gpu_model *gm = s->m->gpu;
    gpu_session *g = s->gpu;
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
    stage(g, R_HEAD, 0);
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
    stage(g, R_HEAD, 1);
    return rc;
}

/* The piece's input block goes up (in a captured step, as the graph's
 * first node: the host writes step_host[blk] and launches), then the
 * embedding rows into g->x from the token ids in it; an id of -1 (a step
 * launched before the host read the draw it evaluates) is the step
 * before's draw, which the sampler also left in d_id. */
static int embed(tern_session *s, int T, tern_error *err) {
    const gpu_model *gm = s->m->gpu;
    gpu_session *g = s->gpu;
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
    if (r->greedy) return tern_cuda_argmax(g->logits, r->n_valid, g->sample_work, id, id2, g->stream, err);
    return tern_cuda_sample(g->logits, r->n_valid, r->temperature, r->top_k, r->top_p, r->min_p, u, g->sample_work,
                            id, id2, g->stream, err);
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
    gpu_session *g = s->gpu;
    int H = c->hidden, rc;
    if (embed(s, T, err)) return -1;
    if (T == 1 && gm->one_token) {
        rc = step1(s, rows, err);
    } else {
        rc = layers(s, T, err);
        if (rc == 0 && rows) {
            stage(g, R_HEAD, 0);
            rc = mm(gm, g, g->logits, g->xn + (size_t)(T - rows) * H, rows, &gm->w.lm_head, err);
            stage(g, R_HEAD, 1);
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
    gpu_session *g = s->gpu;
    const tern_config *c = &s->m->cfg;
    int moved = 0;
    for (int l = 0; l < c->n_layers; l++) {
        moved |= g->kv_key[2 * l] != s->kv[l].k || g->kv_key[2 * l + 1] != s->kv[l].v;
        g->kv_key[2 * l] = s->kv[l].k;
        g->kv_key[2 * l + 1] = s->kv[l].v;
    }
    g->kv_gen += moved;
    int b = g->blk;
    int other_rule = g->key_rule[b].on != (rule != NULL) || (rule && memcmp(&g->key_rule[b].r, rule, sizeof *rule));
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
    gpu_session *g = s->gpu;
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
        if (rule) g->key_rule[b].r = *rule;
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
    gpu_session *g = s->gpu;
    int32_t pos = (int32_t)s->pos;
    memcpy(g->step_host[g->blk] + STEP_U, &u, sizeof u);
    memcpy(g->step_host[g->blk] + STEP_POS, &pos, sizeof pos);
    memcpy(g->step_host[g->blk] + STEP_TOK, tokens, (size_t)T * sizeof *tokens);
}

/* After a step that failed to enqueue: the layers it ran left sums in
 * their slots that the next ones did not zero. */
static void clear_slots(tern_session *s) {
    gpu_session *g = s->gpu;
    const tern_config *c = &s->m->cfg;
    tern_cuda_fill(g->fx, 0, g->fx_bytes * (size_t)c->n_layers, g->stream, NULL);
}

/* Whether this session's steps may be captured and replayed: not with
 * debug.no_graphs, and per-role marks on decode steps (TERN_STATS_DECODE)
 * and the route observer need them uncaptured. */
static int graphs_allowed(const tern_session *s) {
    const gpu_session *g = s->gpu;
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
    gpu_session *g = s->gpu;
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
    else rc = embed(s, T, err) || layers(s, T, err) ? -1 : 0;
    if (rc != 0) {
        clear_slots(s);
        return -1;
    }
    const float *last = g->xn + (size_t)(T - 1) * H;
    if (small && rows) {
        if (tern_cuda_sync(g->stream, err) || tern_cuda_download(logits, g->logits, (size_t)rows * V * sizeof(float), err))
            return -1;
    } else if (rows && head(g, gm, all ? g->xn : last, rows, H, V, logits, err)) {
        return -1;
    }
    if (tern_cuda_sync(g->stream, err)) return -1;
    if (g->st && g->st->n_marks > 0) collect(g->st, tern_now_s() * 1e3 - t0, T);
    s->hidden_dev = last;
    s->has_hidden = 1;
    s->pos += T;
    return 0;
}

/* The tokens in pieces of g->piece. */
int tern_gpu_forward(tern_session *s, const int32_t *tokens, int T, float *logits, int all_logits,
                     tern_error *err) {
    size_t V = (size_t)s->m->cfg.vocab;
    int P = ((gpu_session *)s->gpu)->piece;
    for (int done = 0; done < T; done += P) {
        int n = T - done < P ? T - done : P;
        int last = done + n == T;
        float *out = logits && all_logits ? logits + (size_t)done * V : logits && last ? logits : NULL;
        if (piece(s, tokens + done, n, out, all_logits, err) != 0) {
            s->broken = 1;
            return -1;
        }
    }
    return 0;
}

int tern_gpu_sampling_enabled(const tern_session *s) {
    return s->gpu && !((const gpu_model *)s->m->gpu)->cpu_sampling;
}

int tern_gpu_sample_fits(int n_valid, int top_k) { return tern_cuda_sample_fits(n_valid, top_k); }

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
    gpu_session *g = s->gpu;
    if (g->n_flight == 2) return tern_fail(err, "GPU sampling: two steps are in flight already");
    if (token < 0 && !g->n_flight && !g->drawn)
        return tern_fail(err, "GPU sampling: no step before drew the token to evaluate");
    if (s->pos + 1 > s->cap && (drain(g, err) || tern_session_reserve(s, s->pos + 1, err))) return -1;
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
        if (g->st && g->st->n_marks > 0) collect(g->st, tern_now_s() * 1e3 - t0, 1);
        if (g->st && g->st->graph) {
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
    gpu_session *g = s->gpu;
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
    const gpu_session *g = s->gpu;
    return g ? g->n_flight : 0;
}

int tern_gpu_forward_sample(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, int32_t *next,
                            tern_error *err) {
    if (((gpu_session *)s->gpu)->n_flight) return tern_fail(err, "GPU sampling: a step is in flight");
    return tern_gpu_sample_launch(s, token, rule, u, err) || tern_gpu_sample_wait(s, next, err) ? -1 : 0;
}

#endif
