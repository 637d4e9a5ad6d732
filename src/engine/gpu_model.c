/* The GPU model: a packed model's weights uploaded once (resident.bin
 * whole, the routed experts per layer file, the small fp32 vectors), the
 * one-token path's stacked input projections, and the plans fixed for the
 * model (which layers' experts route themselves, their fixed-point slots). */
#ifdef TERN_CUDA

#include "engine/gpu_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"



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
    if (m->gpu_expert_budget) return tern_gpu_experts_stream(m, g, err);
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
    tern_gpu_experts_free(g);
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
tern_cuda_gdn_w tern_gpu_gdn_w_of(const tern_config *c, const tern_gdn_w *w) {
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
    tern_cuda_gdn_w gw = tern_gpu_gdn_w_of(c, NULL);
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
    if (!p->debug.phase_trace || !*p->debug.phase_trace) return 0;
    if (!tern_cuda_trace_built())
        return tern_fail(err, "debug.phase_trace: this build has no phase trace (build with make CUDA=1 TRACE=1)");
    if (!(g->phase_trace = strdup(p->debug.phase_trace))) return tern_fail(err, "out of memory");
    return 0;
}

static tern_cuda_expert_part part_of(const tern_pk_tensor *t) {
    return (tern_cuda_expert_part){t->data.off, t->scales.off, t->biases.off, t->shape[0], t->shape[1],
                                   t->encoding == TERN_ENC_Q4 ? 4 : 8, t->group};
}

/* Layer l's routed experts on the device (base + e * stride, or under a
 * budget the table of their addresses). */
tern_cuda_experts tern_gpu_experts_of(const tern_model *m, int l) {
    const gpu_model *gm = m->gpu;
    const uint8_t *const *table = gm->table ? gm->table[l] : NULL;
    return (tern_cuda_experts){table, table ? NULL : gm->experts[l], m->man.stride, part_of(&m->man.parts[0]),
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
        tern_cuda_experts ex = tern_gpu_experts_of(m, l);
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

#endif
