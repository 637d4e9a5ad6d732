#include "model/weights.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"
#include "util/half.h"

typedef struct {
    const tern_tensor_set *ts;
    tern_error *err;
} binder;

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t off = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && off < n; d++)
        off += (size_t)snprintf(buf + off, n - off, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (off < n) snprintf(buf + off, n - off, "]");
}

/* The tensor `name` with exactly this shape, in a float dtype. */
static const tern_tensor *get(binder *b, const char *name, int ndim, const int64_t *shape) {
    const tern_tensor *t = tern_tensors_get(b->ts, name);
    if (!t) { tern_fail(b->err, "missing tensor '%s'", name); return NULL; }
    int same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    if (!same) {
        char have[128], want[128];
        shape_str(have, sizeof have, t->ndim, t->shape);
        shape_str(want, sizeof want, ndim, shape);
        tern_fail(b->err, "%s: tensor '%s' has shape %s but the config implies %s", t->file, name, have, want);
        return NULL;
    }
    if (!t->bits && t->dtype != TERN_DTYPE_F32 && t->dtype != TERN_DTYPE_F16 && t->dtype != TERN_DTYPE_BF16) {
        tern_fail(b->err, "%s: tensor '%s' has dtype %s (supported: F32, F16, BF16)", t->file, name,
                  tern_dtype_name(t->dtype));
        return NULL;
    }
    return t;
}

static int bind_mat(binder *b, tern_mat *m, int64_t rows, int64_t cols, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int bind_mat(binder *b, tern_mat *m, int64_t rows, int64_t cols, const char *fmt, ...) {
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int64_t shape[2] = {rows, cols};
    const tern_tensor *t = get(b, name, 2, shape);
    if (!t) return -1;
    *m = (tern_mat){.data = t->data, .dtype = t->dtype, .rows = rows, .cols = cols, .bits = t->bits,
                    .group = t->group, .scales = t->scales, .biases = t->biases};
    return 0;
}

static void widen(float *dst, const void *src, int dtype, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (dtype == TERN_DTYPE_F32) dst[i] = ((const float *)src)[i];
        else if (dtype == TERN_DTYPE_BF16) dst[i] = tern_bf16_to_f32(((const uint16_t *)src)[i]);
        else dst[i] = tern_f16_to_f32(((const uint16_t *)src)[i]);
    }
}

/* A small tensor copied to a new fp32 array. */
static int bind_vec(binder *b, float **out, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int bind_vec(binder *b, float **out, int ndim, const int64_t *shape, const char *fmt, ...) {
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const tern_tensor *t = get(b, name, ndim, shape);
    if (!t) return -1;
    if (t->bits) return tern_fail(b->err, "%s: tensor '%s' is quantized but must be float", t->file, name);
    *out = malloc((size_t)t->numel * sizeof(float));
    if (!*out) return tern_fail(b->err, "out of memory");
    widen(*out, t->data, t->dtype, t->numel);
    return 0;
}

static int bind_norm(binder *b, float **out, int64_t n, const char *pfx, const char *name) {
    return bind_vec(b, out, 1, &n, "%s%s.weight", pfx, name);
}

static int bind_attn(binder *b, tern_attn_w *a, const tern_config *c, const char *p) {
    int64_t H = c->hidden, hd = c->head_dim;
    return bind_mat(b, &a->q, (int64_t)c->n_heads * hd * 2, H, "%sself_attn.q_proj.weight", p) ||
           bind_mat(b, &a->k, (int64_t)c->n_kv_heads * hd, H, "%sself_attn.k_proj.weight", p) ||
           bind_mat(b, &a->v, (int64_t)c->n_kv_heads * hd, H, "%sself_attn.v_proj.weight", p) ||
           bind_mat(b, &a->o, H, (int64_t)c->n_heads * hd, "%sself_attn.o_proj.weight", p) ||
           bind_norm(b, &a->q_norm, hd, p, "self_attn.q_norm") ||
           bind_norm(b, &a->k_norm, hd, p, "self_attn.k_norm")
               ? -1 : 0;
}

static int bind_gdn(binder *b, tern_gdn_w *g, const tern_config *c, const char *p) {
    int64_t H = c->hidden, nv = c->gdn_v_heads, vd = tern_cfg_gdn_value_dim(c);
    int64_t conv_shape[3] = {tern_cfg_gdn_conv_dim(c), 1, c->gdn_conv_kernel};
    int64_t dv = c->gdn_v_dim;
    return bind_mat(b, &g->qkv, tern_cfg_gdn_conv_dim(c), H, "%slinear_attn.in_proj_qkv.weight", p) ||
           bind_mat(b, &g->z, vd, H, "%slinear_attn.in_proj_z.weight", p) ||
           bind_mat(b, &g->b, nv, H, "%slinear_attn.in_proj_b.weight", p) ||
           bind_mat(b, &g->a, nv, H, "%slinear_attn.in_proj_a.weight", p) ||
           bind_mat(b, &g->out, H, vd, "%slinear_attn.out_proj.weight", p) ||
           bind_vec(b, &g->conv, 3, conv_shape, "%slinear_attn.conv1d.weight", p) ||
           bind_vec(b, &g->dt_bias, 1, &nv, "%slinear_attn.dt_bias", p) ||
           bind_vec(b, &g->A_log, 1, &nv, "%slinear_attn.A_log", p) ||
           bind_vec(b, &g->norm, 1, &dv, "%slinear_attn.norm.weight", p)
               ? -1 : 0;
}

/* Fused: gate_up_proj [E, 2I, H] (gate rows first) and down_proj [E, H, I]. */
static int bind_fused_experts(binder *b, tern_moe_w *m, const tern_config *c, const char *p) {
    int64_t E = c->n_experts, I = c->expert_inter, H = c->hidden;
    char name[512];
    snprintf(name, sizeof name, "%smlp.experts.gate_up_proj", p);
    const tern_tensor *gu = get(b, name, 3, (int64_t[]){E, 2 * I, H});
    snprintf(name, sizeof name, "%smlp.experts.down_proj", p);
    const tern_tensor *dn = gu ? get(b, name, 3, (int64_t[]){E, H, I}) : NULL;
    if (!gu || !dn) return -1;
    size_t gsz = tern_dtype_size(gu->dtype), dsz = tern_dtype_size(dn->dtype);
    for (int64_t e = 0; e < E; e++) {
        const char *g0 = (const char *)gu->data + (size_t)(e * 2 * I * H) * gsz;
        m->experts[e].gate = (tern_mat){.data = g0, .dtype = gu->dtype, .rows = I, .cols = H};
        m->experts[e].up = (tern_mat){.data = g0 + (size_t)(I * H) * gsz, .dtype = gu->dtype, .rows = I, .cols = H};
        m->experts[e].down = (tern_mat){.data = (const char *)dn->data + (size_t)(e * H * I) * dsz,
                                         .dtype = dn->dtype, .rows = H, .cols = I};
    }
    return 0;
}

static int bind_swiglu(binder *b, tern_expert_w *x, int64_t I, int64_t H, const char *p) {
    return bind_mat(b, &x->gate, I, H, "%sgate_proj.weight", p) ||
           bind_mat(b, &x->up, I, H, "%sup_proj.weight", p) ||
           bind_mat(b, &x->down, H, I, "%sdown_proj.weight", p)
               ? -1 : 0;
}

static int bind_moe(binder *b, tern_moe_w *m, const tern_config *c, const char *p) {
    int64_t E = c->n_experts, H = c->hidden;
    char name[512];
    if (bind_mat(b, &m->router, E, H, "%smlp.gate.weight", p)) return -1;
    if (b->ts->experts_external) goto shared;   /* routed experts come from expert files */
    m->experts = calloc((size_t)E, sizeof *m->experts);
    if (!m->experts) return tern_fail(b->err, "out of memory");
    snprintf(name, sizeof name, "%smlp.experts.gate_up_proj", p);
    if (tern_tensors_get(b->ts, name)) {
        if (bind_fused_experts(b, m, c, p)) return -1;
    } else {
        for (int64_t e = 0; e < E; e++) {
            snprintf(name, sizeof name, "%smlp.experts.%lld.", p, (long long)e);
            if (bind_swiglu(b, &m->experts[e], c->expert_inter, H, name)) return -1;
        }
    }
shared:
    snprintf(name, sizeof name, "%smlp.shared_expert.", p);
    return bind_swiglu(b, &m->shared, c->shared_inter, H, name) ||
           bind_mat(b, &m->shared_gate, 1, H, "%smlp.shared_expert_gate.weight", p)
               ? -1 : 0;
}

static int bind_layer(binder *b, tern_layer_w *l, int kind, const tern_config *c, const char *p) {
    l->kind = kind;
    if (bind_norm(b, &l->in_norm, c->hidden, p, "input_layernorm") ||
        bind_norm(b, &l->post_norm, c->hidden, p, "post_attention_layernorm"))
        return -1;
    if (kind == TERN_LAYER_ATTN ? bind_attn(b, &l->attn, c, p) : bind_gdn(b, &l->gdn, c, p)) return -1;
    return bind_moe(b, &l->moe, c, p);
}

static int bind_mtp(binder *b, tern_mtp_w *m, const tern_config *c) {
    int64_t H = c->hidden;
    return bind_mat(b, &m->fc, H, 2 * H, "mtp.fc.weight") ||
           bind_norm(b, &m->pre_emb_norm, H, "mtp.", "pre_fc_norm_embedding") ||
           bind_norm(b, &m->pre_hidden_norm, H, "mtp.", "pre_fc_norm_hidden") ||
           bind_norm(b, &m->norm, H, "mtp.", "norm") ||
           bind_layer(b, &m->layer, TERN_LAYER_ATTN, c, "mtp.layers.0.")
               ? -1 : 0;
}

static int find_prefix(binder *b, tern_weights *w) {
    static const char *prefixes[] = {"model.language_model.", "model.", ""};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
        char name[128];
        snprintf(name, sizeof name, "%sembed_tokens.weight", prefixes[i]);
        if (tern_tensors_get(b->ts, name)) {
            snprintf(w->prefix, sizeof w->prefix, "%s", prefixes[i]);
            return 0;
        }
    }
    return tern_fail(b->err, "missing tensor 'model.language_model.embed_tokens.weight' (nor 'model.embed_tokens.weight')");
}

int tern_weights_bind(tern_weights *w, const tern_config *c, const tern_tensor_set *ts, tern_error *err) {
    memset(w, 0, sizeof *w);
    binder b = {ts, err};
    if (find_prefix(&b, w)) return -1;
    const char *p = w->prefix;
    int64_t V = c->vocab, H = c->hidden;
    if (bind_mat(&b, &w->embed, V, H, "%sembed_tokens.weight", p) ||
        bind_norm(&b, &w->final_norm, H, p, "norm"))
        goto fail;
    if (c->tie_embeddings && !tern_tensors_get(ts, "lm_head.weight")) w->lm_head = w->embed;
    else if (bind_mat(&b, &w->lm_head, V, H, "lm_head.weight")) goto fail;
    w->layers = calloc((size_t)c->n_layers, sizeof *w->layers);
    if (!w->layers) { tern_fail(err, "out of memory"); goto fail; }
    for (int i = 0; i < c->n_layers; i++) {
        char lp[96];
        snprintf(lp, sizeof lp, "%slayers.%d.", p, i);
        if (bind_layer(&b, &w->layers[i], c->layer_kind[i], c, lp)) goto fail;
    }
    if (c->mtp_layers > 0 && tern_tensors_get(ts, "mtp.fc.weight")) {
        w->has_mtp = 1;
        if (bind_mtp(&b, &w->mtp, c)) goto fail;
    }
    return 0;
fail:
    tern_weights_free(w, c);
    return -1;
}

static void free_layer(tern_layer_w *l) {
    free(l->in_norm);
    free(l->post_norm);
    free(l->attn.q_norm);
    free(l->attn.k_norm);
    free(l->gdn.conv);
    free(l->gdn.dt_bias);
    free(l->gdn.A_log);
    free(l->gdn.norm);
    free(l->moe.experts);
}

void tern_weights_free(tern_weights *w, const tern_config *c) {
    if (w->layers)
        for (int i = 0; i < c->n_layers; i++) free_layer(&w->layers[i]);
    free(w->layers);
    free(w->final_norm);
    free(w->mtp.pre_emb_norm);
    free(w->mtp.pre_hidden_norm);
    free(w->mtp.norm);
    free_layer(&w->mtp.layer);
    memset(w, 0, sizeof *w);
}
