#include "synth/synth.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"
#include "util/half.h"

/* ---- shapes ------------------------------------------------------------- */

static const synth_shape shapes[] = {
    {"qwen3.6-35b-a3b", "Qwen 3.6 35B-A3B exactly (34.66 B parameters, 2.95 B active, MTP)",
     2048, 40, 4, 248320, 16, 2, 256, 16, 32, 128, 128, 256, 8, 512, 512, 1},
    {"qwen3.6-router", "the real routing dimensions (hidden 2048, 40 layers, 256 experts, top-8) with small "
     "attention, DeltaNet, experts and vocabulary: routing statistics at a fraction of the cost",
     2048, 40, 4, 4096, 2, 1, 256, 4, 8, 128, 128, 256, 8, 64, 64, 0},
    {"small", "4 layers, hidden 256, 16 experts top-4, MTP: for tests",
     256, 4, 4, 1024, 4, 2, 64, 4, 8, 32, 32, 16, 4, 64, 64, 1},
    {0},
};

const synth_shape *synth_shapes(void) { return shapes; }

const synth_shape *synth_shape_find(const char *name) {
    for (const synth_shape *s = shapes; s->name; s++)
        if (!strcmp(s->name, name)) return s;
    return NULL;
}

const char *synth_routing_name(int routing) { return routing == SYNTH_ROUTING_UNIFORM ? "uniform" : "prose"; }

int synth_routing_parse(const char *name, int *routing) {
    if (!strcmp(name, "uniform")) *routing = SYNTH_ROUTING_UNIFORM;
    else if (!strcmp(name, "prose")) *routing = SYNTH_ROUTING_PROSE;
    else return -1;
    return 0;
}

/* Prose routing parameters fitted by tools/synth/calibrate_routing.py to
 * the published routing trace (docs/experiments/synth-bench.md). */
#define PROSE_POP 1.5
#define PROSE_CTX 1.5
#define PROSE_RHO 0.8

/* ---- random numbers: counter-based, one stream per (tensor, slice, row) --- */

static inline uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct { uint64_t x; } rng;

static inline rng rng_row(uint64_t key, int64_t slice, int64_t row) {
    return (rng){mix64(key ^ mix64(((uint64_t)slice << 32) + (uint64_t)row + 1))};
}

static inline uint64_t rng_next(rng *r) { return mix64(r->x += 0x9E3779B97F4A7C15ull); }

/* Irwin-Hall(4): the sum of four 16-bit uniforms, centred and scaled to
 * unit variance. Close to normal, and bounded by +-2 sqrt(3). */
static inline float rng_gauss(rng *r) {
    uint64_t v = rng_next(r);
    uint32_t s = (uint32_t)(v & 0xffff) + (uint32_t)((v >> 16) & 0xffff) + (uint32_t)((v >> 32) & 0xffff) +
                 (uint32_t)(v >> 48);
    return ((float)s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

static inline float rng_unit(rng *r) { return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f); }

static uint64_t name_key(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    return mix64(h ^ mix64(seed));
}

/* ---- the hidden state's expected make-up (prose routing) ---------------- */

/* Per-dimension standard deviation of what one residual branch writes into
 * the token band (attention o_proj, experts, shared expert) and what one
 * DeltaNet layer writes into the context band. Small, so the RMSNorm in
 * front of every router sees nearly the same scale at every depth. */
#define KAPPA_TOK 0.03
#define KAPPA_CTX 0.05
/* E[SiLU(N(mu, 1))] = 0 at mu = -0.4996: the DeltaNet's v is centred, so
 * the moving average has no constant part. */
#define V_MU (-0.4996)
#define Z_GATE 4.0

typedef struct {
    double xb;                   /* value of a bias-band dim after the RMSNorm */
    double var_t, var_c;         /* variance per dim of the token / context band after it */
} band_stats;

static int is_gdn(const synth *s, int l) { return l < s->cfg.n_layers && s->cfg.layer_kind[l] == TERN_LAYER_GDN; }

/* The expected bands in front of layer l's input norm (after = 0) or its
 * router (after = 1: the layer's own attention or DeltaNet has written). */
static band_stats bands_at(const synth *s, int l, int after) {
    int n_ctx = 0, n_tok = 0;
    for (int i = 0; i < l + after && i < s->cfg.n_layers; i++) {
        if (is_gdn(s, i)) n_ctx++;
        else n_tok++;
        if (i < l) n_tok++;      /* layer i's MoE */
    }
    double H = s->cfg.hidden, B = s->band_b, T = s->band_t - s->band_b, C = H - s->band_t;
    double tok = 1.0 + KAPPA_TOK * KAPPA_TOK * n_tok, ctx = KAPPA_CTX * KAPPA_CTX * n_ctx;
    double rms2 = (B + T * tok + C * ctx) / H;
    return (band_stats){1.0 / sqrt(rms2), tok / rms2, ctx / rms2};
}

/* ---- values ------------------------------------------------------------- */

static int prose(const synth_tensor *t) {
    return t->s->routing == SYNTH_ROUTING_PROSE && t->layer < t->s->cfg.n_layers;
}

static double residual_scale(const synth *s) { return 1.0 / sqrt(2.0 * s->cfg.n_layers); }

/* Standard deviation of an iid row (every role but the structured ones). */
static double plain_sigma(const synth_tensor *t, int64_t row) {
    const synth *s = t->s;
    double cols = (double)t->shape[t->ndim - 1];
    int in_tok = row >= s->band_b && row < s->band_t;
    switch (t->role) {
    case SR_EMBED: return 1.0;
    case SR_ATTN_O:
        if (prose(t)) return in_tok ? KAPPA_TOK / sqrt(cols * 0.1) : 0.0;
        return residual_scale(s) / sqrt(cols);
    case SR_GDN_OUT: return residual_scale(s) / sqrt(cols);
    case SR_SHARED_DOWN:
    case SR_EXPERT_DOWN:
        if (prose(t)) return in_tok ? KAPPA_TOK / sqrt(cols * 0.35) : 0.0;
        return residual_scale(s) / sqrt(cols);
    default: return 1.0 / sqrt(cols);
    }
}

/* Uniform-mode small tensors, Hugging Face's initialisation. */
static float small_value(const synth_tensor *t, rng *r, int64_t i) {
    const synth *s = t->s;
    switch (t->role) {
    case SR_NORM1P: return 0.0f;
    case SR_GDN_NORM: return 1.0f;
    case SR_GDN_CONV:
        if (prose(t)) return i % s->cfg.gdn_conv_kernel == s->cfg.gdn_conv_kernel - 1 ? 1.0f : 0.0f;
        return rng_gauss(r) / sqrtf(3.0f * (float)s->cfg.gdn_conv_kernel);
    case SR_GDN_DT: {
        if (prose(t)) return 0.0f;
        double dt = exp(log(1e-3) + rng_unit(r) * (log(0.1) - log(1e-3)));
        return (float)(dt + log(-expm1(-dt)));
    }
    case SR_GDN_ALOG:
        if (prose(t)) return -30.0f;   /* decay exp(g) = 1: the moving average's rate is beta's alone */
        return logf(1.0f + 15.0f * rng_unit(r));
    default: return rng_gauss(r);
    }
}

/* A row reading only the bias band: `v` spread evenly over its B dims (so
 * the row contributes v after the norm). */
static void bias_row(const synth *s, double v, double xb, int64_t cols, float *o) {
    memset(o, 0, (size_t)cols * sizeof *o);
    for (int c = 0; c < s->band_b; c++) o[c] = (float)(v / (s->band_b * xb));
}

static void gdn_row(const synth_tensor *t, rng *r, int64_t row, int64_t cols, float *o) {
    const synth *s = t->s;
    band_stats b = bands_at(s, t->layer, 0);
    int64_t kd = tern_cfg_gdn_key_dim(&s->cfg);
    switch (t->role) {
    case SR_GDN_QKV:
        if (row < 2 * kd) {
            /* q and k channel i equal and constant: the delta rule becomes
             * a moving average along one fixed key */
            rng u = rng_row(t->key, 0, -1 - (row % kd));
            bias_row(s, 1.0 + 0.5 * rng_gauss(&u), b.xb, cols, o);
            return;
        }
        bias_row(s, V_MU, b.xb, cols, o);
        for (int64_t c = s->band_b; c < s->band_t; c++)
            o[c] = (float)(rng_gauss(r) / sqrt((s->band_t - s->band_b) * b.var_t));
        return;
    case SR_GDN_Z: bias_row(s, Z_GATE, b.xb, cols, o); return;
    case SR_GDN_B: bias_row(s, log((1.0 - s->rho) / s->rho), b.xb, cols, o); return;   /* beta = 1 - rho */
    case SR_GDN_A: memset(o, 0, (size_t)cols * sizeof *o); return;
    default: {   /* SR_GDN_OUT: into the context band */
        double z = Z_GATE / (1.0 + exp(-Z_GATE));
        double sd = row >= s->band_t ? KAPPA_CTX / (z * sqrt((double)cols)) : 0.0;
        for (int64_t c = 0; c < cols; c++) o[c] = (float)(sd * rng_gauss(r));
    }
    }
}

static void router_row(const synth_tensor *t, rng *r, int64_t row, int64_t cols, float *o) {
    const synth *s = t->s;
    band_stats b = bands_at(s, t->layer, 1);
    rng p = rng_row(t->key, 0, -1 - row);
    bias_row(s, s->pop * rng_gauss(&p), b.xb, cols, o);
    double sd_t = 1.0 / sqrt((s->band_t - s->band_b) * b.var_t);
    double sd_c = b.var_c > 0 ? s->ctx / sqrt((cols - s->band_t) * b.var_c) : 0.0;
    for (int64_t c = s->band_b; c < cols; c++) o[c] = (float)((c < s->band_t ? sd_t : sd_c) * rng_gauss(r));
}

static void embed_row(const synth *s, rng *r, int64_t cols, float *o) {
    for (int64_t c = 0; c < cols; c++) o[c] = c < s->band_b ? 1.0f : c < s->band_t ? rng_gauss(r) : 0.0f;
}

static int structured(const synth_tensor *t) {
    if (!prose(t)) return 0;
    switch (t->role) {
    case SR_EMBED: case SR_GDN_QKV: case SR_GDN_Z: case SR_GDN_B: case SR_GDN_A: case SR_GDN_OUT: case SR_ROUTER:
        return 1;
    default: return 0;
    }
}

void synth_rows_f32(const synth_tensor *t, int64_t slice, int64_t r0, int64_t n, int64_t cols, float *out) {
    int matrix = t->ndim >= 2 && t->shape[t->ndim - 1] == cols && t->role != SR_GDN_CONV;
    for (int64_t i = 0; i < n; i++) {
        int64_t row = r0 + i;
        float *o = out + i * cols;
        rng r = rng_row(t->key, slice, row);
        if (!matrix) {
            for (int64_t c = 0; c < cols; c++) o[c] = small_value(t, &r, c);
        } else if (structured(t)) {
            if (t->role == SR_EMBED) embed_row(t->s, &r, cols, o);
            else if (t->role == SR_ROUTER) router_row(t, &r, row, cols, o);
            else gdn_row(t, &r, row, cols, o);
        } else {
            float sd = (float)plain_sigma(t, row);
            for (int64_t c = 0; c < cols; c++) o[c] = sd * rng_gauss(&r);
        }
    }
}

int synth_direct_q(const synth_tensor *t) { return t->role == SR_FFN_IN ? strstr(t->name, ".experts.") != NULL
                                                                        : t->role == SR_EXPERT_DOWN; }

void synth_rows_q(const synth_tensor *t, int64_t slice, int64_t r0, int64_t n, int64_t cols, int bits, int group,
                  uint8_t *q, uint16_t *scales, uint16_t *biases) {
    double levels = bits == 4 ? 15.0 : 255.0, std_q = sqrt((levels + 1) * (levels + 1) - 1) / sqrt(12.0);
    int64_t qb = cols * bits / 8, ng = cols / group;
    for (int64_t i = 0; i < n; i++) {
        rng r = rng_row(t->key, slice, r0 + i);
        double sd = plain_sigma(t, r0 + i);
        uint8_t *qr = q + i * qb;
        for (int64_t b = 0; b < qb; b += 8) {
            uint64_t v = rng_next(&r);
            memcpy(qr + b, &v, qb - b < 8 ? (size_t)(qb - b) : 8);
        }
        for (int64_t g = 0; g < ng; g++) {
            uint16_t sc = tern_f32_to_bf16((float)(sd * (0.75 + 0.5 * rng_unit(&r)) / std_q));
            scales[i * ng + g] = sc;
            biases[i * ng + g] = tern_f32_to_bf16((float)(-levels / 2 * tern_bf16_to_f32(sc)));
        }
    }
}

/* ---- config.json -------------------------------------------------------- */

static json_t *layer_types(const synth_shape *sh) {
    json_t *a = json_array();
    for (int i = 0; i < sh->layers; i++)
        json_array_append_new(a, json_string((i + 1) % sh->interval == 0 ? "full_attention" : "linear_attention"));
    return a;
}

static char *config_text(const synth *s) {
    const synth_shape *sh = &s->shape;
    int eos = sh->vocab > 248044 ? 248044 : sh->vocab - 1;
    json_t *text = json_pack(
        "{s:s, s:i, s:i, s:o, s:i, s:i, s:i, s:i, s:b, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:f,"
        " s:{s:s, s:f, s:f}, s:f, s:i, s:i, s:b, s:i, s:i, s:s}",
        "model_type", "qwen3_5_moe_text", "hidden_size", sh->hidden, "num_hidden_layers", sh->layers,
        "layer_types", layer_types(sh), "full_attention_interval", sh->interval, "num_attention_heads", sh->heads,
        "num_key_value_heads", sh->kv_heads, "head_dim", sh->head_dim, "attn_output_gate", 1,
        "linear_num_key_heads", sh->gdn_k_heads, "linear_num_value_heads", sh->gdn_v_heads,
        "linear_key_head_dim", sh->gdn_k_dim, "linear_value_head_dim", sh->gdn_v_dim, "linear_conv_kernel_dim", 4,
        "num_experts", sh->experts, "num_experts_per_tok", sh->top_k, "moe_intermediate_size", sh->moe_inter,
        "shared_expert_intermediate_size", sh->shared_inter, "hidden_act", "silu", "rms_norm_eps", 1e-6,
        "rope_parameters", "rope_type", "default", "rope_theta", 1e7, "partial_rotary_factor", 0.25,
        "partial_rotary_factor", 0.25, "max_position_embeddings", 262144, "vocab_size", sh->vocab,
        "tie_word_embeddings", 0, "mtp_num_hidden_layers", sh->mtp, "eos_token_id", eos, "dtype", "bfloat16");
    json_t *mark = json_pack("{s:s, s:I, s:s, s:{s:f, s:f, s:f}}", "shape", sh->name, "seed", (json_int_t)s->seed,
                             "routing", synth_routing_name(s->routing), "routing_params", "pop", s->pop, "ctx",
                             s->ctx, "rho", s->rho);
    json_t *root = json_pack("{s:[s], s:s, s:b, s:o, s:o}", "architectures", "Qwen3_5MoeForConditionalGeneration",
                             "model_type", "qwen3_5_moe", "tie_word_embeddings", 0, "text_config", text,
                             "tern_synthetic", mark);
    char *out = root ? json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(root);
    return out;
}

/* ---- the tensor list ---------------------------------------------------- */

typedef struct {
    synth *s;
    int cap;
    tern_error *err;
} lister;

static int add(lister *L, int role, int layer, int f32, int ndim, int64_t d0, int64_t d1, int64_t d2,
               const char *fmt, const char *pfx, const char *name) {
    synth *s = L->s;
    if (s->n_tensors == L->cap) {
        L->cap = L->cap ? 2 * L->cap : 256;
        synth_tensor *t = realloc(s->tensors, (size_t)L->cap * sizeof *t);
        if (!t) return tern_fail(L->err, "out of memory");
        s->tensors = t;
    }
    synth_tensor *t = &s->tensors[s->n_tensors];
    memset(t, 0, sizeof *t);
    if (asprintf(&t->name, fmt, pfx, name) < 0) { t->name = NULL; return tern_fail(L->err, "out of memory"); }
    s->n_tensors++;
    t->s = s;
    t->role = role;
    t->layer = layer;
    t->f32 = f32;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
    t->key = name_key(s->seed, t->name);
    return 0;
}

#define ADD1(role, n, name) add(L, role, l, 0, 1, n, 0, 0, "%s%s", p, name)
#define ADD2(role, r, c, name) add(L, role, l, 0, 2, r, c, 0, "%s%s", p, name)

static int list_attn(lister *L, const tern_config *c, int l, const char *p) {
    int64_t H = c->hidden, hd = c->head_dim;
    return ADD2(SR_ATTN_QKV, c->n_heads * hd * 2, H, "self_attn.q_proj.weight") ||
           ADD2(SR_ATTN_QKV, c->n_kv_heads * hd, H, "self_attn.k_proj.weight") ||
           ADD2(SR_ATTN_QKV, c->n_kv_heads * hd, H, "self_attn.v_proj.weight") ||
           ADD2(SR_ATTN_O, H, c->n_heads * hd, "self_attn.o_proj.weight") ||
           ADD1(SR_NORM1P, hd, "self_attn.q_norm.weight") || ADD1(SR_NORM1P, hd, "self_attn.k_norm.weight");
}

static int list_gdn(lister *L, const tern_config *c, int l, const char *p) {
    int64_t H = c->hidden, vd = tern_cfg_gdn_value_dim(c), nv = c->gdn_v_heads;
    return ADD2(SR_GDN_QKV, tern_cfg_gdn_conv_dim(c), H, "linear_attn.in_proj_qkv.weight") ||
           ADD2(SR_GDN_Z, vd, H, "linear_attn.in_proj_z.weight") || ADD2(SR_GDN_B, nv, H, "linear_attn.in_proj_b.weight") ||
           ADD2(SR_GDN_A, nv, H, "linear_attn.in_proj_a.weight") || ADD2(SR_GDN_OUT, H, vd, "linear_attn.out_proj.weight") ||
           add(L, SR_GDN_CONV, l, 0, 3, tern_cfg_gdn_conv_dim(c), 1, c->gdn_conv_kernel, "%s%s", p,
               "linear_attn.conv1d.weight") ||
           add(L, SR_GDN_DT, l, 1, 1, nv, 0, 0, "%s%s", p, "linear_attn.dt_bias") ||
           add(L, SR_GDN_ALOG, l, 1, 1, nv, 0, 0, "%s%s", p, "linear_attn.A_log") ||
           ADD1(SR_GDN_NORM, c->gdn_v_dim, "linear_attn.norm.weight");
}

static int list_moe(lister *L, const tern_config *c, int l, const char *p) {
    int64_t H = c->hidden, E = c->n_experts, I = c->expert_inter, S = c->shared_inter;
    return ADD2(SR_ROUTER, E, H, "mlp.gate.weight") ||
           add(L, SR_FFN_IN, l, 0, 3, E, 2 * I, H, "%s%s", p, "mlp.experts.gate_up_proj") ||
           add(L, SR_EXPERT_DOWN, l, 0, 3, E, H, I, "%s%s", p, "mlp.experts.down_proj") ||
           ADD2(SR_FFN_IN, S, H, "mlp.shared_expert.gate_proj.weight") ||
           ADD2(SR_FFN_IN, S, H, "mlp.shared_expert.up_proj.weight") ||
           ADD2(SR_SHARED_DOWN, H, S, "mlp.shared_expert.down_proj.weight") ||
           ADD2(SR_SHARED_GATE, 1, H, "mlp.shared_expert_gate.weight");
}

static int list_layer(lister *L, const tern_config *c, int l, int attn, const char *p) {
    return ADD1(SR_NORM1P, c->hidden, "input_layernorm.weight") ||
           ADD1(SR_NORM1P, c->hidden, "post_attention_layernorm.weight") ||
           (attn ? list_attn(L, c, l, p) : list_gdn(L, c, l, p)) || list_moe(L, c, l, p);
}

static int list_tensors(synth *s, tern_error *err) {
    lister L0 = {s, 0, err}, *L = &L0;
    const tern_config *c = &s->cfg;
    int64_t H = c->hidden, V = c->vocab;
    const char *p = "model.language_model.";
    int l = -1;
    if (ADD2(SR_EMBED, V, H, "embed_tokens.weight") || ADD1(SR_NORM1P, H, "norm.weight") ||
        add(L, SR_HEAD, -1, 0, 2, V, H, 0, "%s%s", "", "lm_head.weight"))
        return -1;
    for (l = 0; l < c->n_layers; l++) {
        char lp[96];
        snprintf(lp, sizeof lp, "%slayers.%d.", p, l);
        if (list_layer(L, c, l, c->layer_kind[l] == TERN_LAYER_ATTN, lp) != 0) return -1;
    }
    if (!c->mtp_layers) return 0;
    l = c->n_layers;
    p = "mtp.";
    return ADD2(SR_MTP_FC, H, 2 * H, "fc.weight") || ADD1(SR_NORM1P, H, "pre_fc_norm_embedding.weight") ||
           ADD1(SR_NORM1P, H, "pre_fc_norm_hidden.weight") || ADD1(SR_NORM1P, H, "norm.weight") ||
           list_layer(L, c, l, 1, "mtp.layers.0.");
}

#undef ADD1
#undef ADD2

/* ---- create / free ------------------------------------------------------ */

int synth_create(synth *s, const tern_synth_params *p, tern_error *err) {
    memset(s, 0, sizeof *s);
    const char *name = p->shape ? p->shape : "qwen3.6-35b-a3b";
    const synth_shape *sh = synth_shape_find(name);
    if (!sh) {
        char list[512] = "";
        for (const synth_shape *x = shapes; x->name; x++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", x == shapes ? "" : ", ", x->name);
        return tern_fail(err, "unknown shape '%s' (known: %s)", name, list);
    }
    s->shape = *sh;
    s->seed = p->seed;
    s->routing = SYNTH_ROUTING_PROSE;
    if (p->routing && synth_routing_parse(p->routing, &s->routing) != 0)
        return tern_fail(err, "unknown routing mode '%s' (known: prose, uniform)", p->routing);
    s->pop = PROSE_POP;
    s->ctx = PROSE_CTX;
    s->rho = PROSE_RHO;
    s->band_b = sh->hidden / 32 > 0 ? sh->hidden / 32 : 1;
    s->band_t = sh->hidden / 2;
    s->config_json = config_text(s);
    if (!s->config_json) return tern_fail(err, "out of memory");
    if (tern_config_parse(&s->cfg, s->config_json, "config.json (synthetic)", err) != 0 ||
        list_tensors(s, err) != 0) {
        synth_free(s);
        return -1;
    }
    return 0;
}

void synth_free(synth *s) {
    for (int i = 0; i < s->n_tensors; i++) free(s->tensors[i].name);
    free(s->tensors);
    free(s->config_json);
    memset(s, 0, sizeof *s);
}

void tern_synth_list(FILE *out) {
    for (const synth_shape *s = shapes; s->name; s++) fprintf(out, "  %-18s %s\n", s->name, s->about);
}
