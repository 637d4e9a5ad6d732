#include "packutil.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cpu/quant.h"
#include "model/tensors.h"
#include "pack/verify.h"
#include "util/half.h"

/* ---- synthetic checkpoint ----------------------------------------------- */

synth_spec synth_default(void) {
    return (synth_spec){.hidden = 64, .layers = 2, .experts = 4, .inter = 32, .shared_inter = 32, .vocab = 128,
                        .heads = 2, .kv_heads = 1, .head_dim = 32, .mtp = 0, .seed = 1};
}

typedef struct {
    json_t *hdr;
    uint64_t off;
    char (*names)[160];
    int n, cap;
    int64_t *numel;
} st_builder;

static void add(st_builder *b, const char *name, int ndim, const int64_t *shape) {
    json_t *sh = json_array();
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        json_array_append_new(sh, json_integer(shape[d]));
        n *= shape[d];
    }
    json_object_set_new(b->hdr, name, json_pack("{s:s, s:o, s:[I, I]}", "dtype", "BF16", "shape", sh, "data_offsets",
                                                 (json_int_t)b->off, (json_int_t)(b->off + (uint64_t)n * 2)));
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 256;
        b->names = realloc(b->names, (size_t)b->cap * sizeof *b->names);
        b->numel = realloc(b->numel, (size_t)b->cap * sizeof *b->numel);
    }
    snprintf(b->names[b->n], sizeof b->names[0], "%s", name);
    b->numel[b->n++] = n;
    b->off += (uint64_t)n * 2;
}

#define ADD(b, name, ...) add(b, name, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})

static void add_layer(st_builder *b, const synth_spec *s, const char *p, int attn) {
    char n[160];
    int64_t H = s->hidden, I = s->inter, E = s->experts;
    int64_t q = (int64_t)s->heads * s->head_dim, kv = (int64_t)s->kv_heads * s->head_dim;
#define N(suffix) (snprintf(n, sizeof n, "%s%s", p, suffix), n)
    ADD(b, N("input_layernorm.weight"), H);
    ADD(b, N("post_attention_layernorm.weight"), H);
    if (attn) {
        ADD(b, N("self_attn.q_proj.weight"), 2 * q, H);
        ADD(b, N("self_attn.k_proj.weight"), kv, H);
        ADD(b, N("self_attn.v_proj.weight"), kv, H);
        ADD(b, N("self_attn.o_proj.weight"), H, q);
        ADD(b, N("self_attn.q_norm.weight"), s->head_dim);
        ADD(b, N("self_attn.k_norm.weight"), s->head_dim);
    } else {
        /* GDN: 2 key heads x 16, 4 value heads x 16 */
        ADD(b, N("linear_attn.in_proj_qkv.weight"), 128, H);
        ADD(b, N("linear_attn.in_proj_z.weight"), 64, H);
        ADD(b, N("linear_attn.in_proj_a.weight"), 4, H);
        ADD(b, N("linear_attn.in_proj_b.weight"), 4, H);
        ADD(b, N("linear_attn.out_proj.weight"), H, 64);
        ADD(b, N("linear_attn.conv1d.weight"), 128, 1, 4);
        ADD(b, N("linear_attn.A_log"), 4);
        ADD(b, N("linear_attn.dt_bias"), 4);
        ADD(b, N("linear_attn.norm.weight"), 16);
    }
    ADD(b, N("mlp.gate.weight"), E, H);
    ADD(b, N("mlp.shared_expert_gate.weight"), 1, H);
    ADD(b, N("mlp.shared_expert.gate_proj.weight"), s->shared_inter, H);
    ADD(b, N("mlp.shared_expert.up_proj.weight"), s->shared_inter, H);
    ADD(b, N("mlp.shared_expert.down_proj.weight"), H, s->shared_inter);
    if (!s->per_expert) {
        ADD(b, N("mlp.experts.gate_up_proj"), E, 2 * I, H);
        ADD(b, N("mlp.experts.down_proj"), E, H, I);
        return;
    }
    for (int e = 0; e < E; e++) {
        snprintf(n, sizeof n, "%smlp.experts.%d.gate_proj.weight", p, e);
        ADD(b, n, I, H);
        snprintf(n, sizeof n, "%smlp.experts.%d.up_proj.weight", p, e);
        ADD(b, n, I, H);
        snprintf(n, sizeof n, "%smlp.experts.%d.down_proj.weight", p, e);
        ADD(b, n, H, I);
    }
#undef N
}

static int write_config(const char *dir, const synth_spec *s) {
    json_t *types = json_array();
    for (int i = 0; i < s->layers; i++) json_array_append_new(types, json_string(i % 2 ? "full_attention" : "linear_attention"));
    json_t *c = json_pack(
        "{s:s, s:s, s:i, s:i, s:i, s:o, s:i, s:i, s:i, s:b, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, "
        "s:f, s:{s:s, s:f, s:f}, s:i}",
        "model_type", "qwen3_5_moe_text", "dtype", "bfloat16", "hidden_size", s->hidden, "num_hidden_layers",
        s->layers, "vocab_size", s->vocab, "layer_types", types, "num_attention_heads", s->heads,
        "num_key_value_heads", s->kv_heads, "head_dim", s->head_dim, "tie_word_embeddings", 0,
        "linear_num_key_heads", 2, "linear_num_value_heads", 4, "linear_key_head_dim", 16, "linear_value_head_dim",
        16, "linear_conv_kernel_dim", 4, "num_experts", s->experts, "num_experts_per_tok", 2,
        "moe_intermediate_size", s->inter, "shared_expert_intermediate_size", s->shared_inter,
        "mtp_num_hidden_layers", s->mtp, "max_position_embeddings", 4096, "rms_norm_eps", 1e-6, "rope_parameters",
        "rope_type", "default", "rope_theta", 10000.0, "partial_rotary_factor", 0.25, "eos_token_id", 1);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = c ? json_dump_file(c, path, JSON_INDENT(1) | JSON_SORT_KEYS) : -1;
    json_decref(c);
    return rc;
}

static uint32_t xorshift(uint32_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 17;
    *x ^= *x << 5;
    return *x;
}

/* Random bf16 of a few scales (groups of very different ranges test the
 * quantizer better than one distribution). */
static void fill(uint16_t *out, int64_t n, uint32_t *rng) {
    float scale = (float)(1 + xorshift(rng) % 8) * 0.01f;
    for (int64_t i = 0; i < n; i++) {
        float u = (float)(xorshift(rng) >> 8) / 16777216.0f - 0.5f;
        out[i] = tern_f32_to_bf16(u * scale);
    }
}

static int write_data(FILE *f, const st_builder *b, uint32_t seed) {
    uint32_t rng = seed * 2654435761u + 1;
    enum { CHUNK = 1 << 20 };
    uint16_t *buf = malloc(CHUNK * sizeof *buf);
    if (!buf) return -1;
    for (int i = 0; i < b->n; i++)
        for (int64_t left = b->numel[i]; left > 0;) {
            int64_t k = left < CHUNK ? left : CHUNK;
            fill(buf, k, &rng);
            fwrite(buf, 2, (size_t)k, f);
            left -= k;
        }
    free(buf);
    return 0;
}

uint64_t synth_model(const char *dir, const synth_spec *s) {
    if (write_config(dir, s) != 0) return 0;
    st_builder b = {.hdr = json_object()};
    char p[96];
    ADD(&b, "lm_head.weight", s->vocab, s->hidden);
    ADD(&b, "model.language_model.embed_tokens.weight", s->vocab, s->hidden);
    ADD(&b, "model.language_model.norm.weight", s->hidden);
    for (int i = 0; i < s->layers; i++) {
        snprintf(p, sizeof p, "model.language_model.layers.%d.", i);
        add_layer(&b, s, p, i % 2);
    }
    if (s->mtp) {
        ADD(&b, "mtp.fc.weight", s->hidden, 2 * s->hidden);
        ADD(&b, "mtp.norm.weight", s->hidden);
        ADD(&b, "mtp.pre_fc_norm_embedding.weight", s->hidden);
        ADD(&b, "mtp.pre_fc_norm_hidden.weight", s->hidden);
        add_layer(&b, s, "mtp.layers.0.", 1);
    }
    if (s->extra_name) ADD(&b, s->extra_name, 4, 64);
    char *text = json_dumps(b.hdr, JSON_COMPACT | JSON_SORT_KEYS);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    size_t hl = strlen(text), padded = (hl + 7) / 8 * 8;
    uint64_t total = 0;
    if (f) {
        uint8_t len[8];
        for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)padded >> (8 * i));
        fwrite(len, 1, 8, f);
        fwrite(text, 1, hl, f);
        for (size_t i = hl; i < padded; i++) fputc(' ', f);
        write_data(f, &b, s->seed);
        total = fclose(f) == 0 ? 8 + padded + b.off : 0;
    }
    free(text);
    free(b.names);
    free(b.numel);
    json_decref(b.hdr);
    return total;
}

/* ---- files -------------------------------------------------------------- */

uint8_t *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (size) *size = (size_t)n;
    return buf;
}

int flip_byte(const char *path, uint64_t off) {
    int fd = open(path, O_RDWR);
    if (fd < 0) return -1;
    uint8_t b;
    int rc = pread(fd, &b, 1, (off_t)off) == 1 ? 0 : -1;
    b ^= 0x5a;
    if (rc == 0 && pwrite(fd, &b, 1, (off_t)off) != 1) rc = -1;
    close(fd);
    return rc;
}

/* ---- values ------------------------------------------------------------- */

static float widen(int enc_or_dtype_f32, int is_f16, const uint8_t *p, int64_t i) {
    if (enc_or_dtype_f32) { float f; memcpy(&f, p + 4 * i, 4); return f; }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return is_f16 ? tern_f16_to_f32(h) : tern_bf16_to_f32(h);
}

static int64_t numel_of(const tern_pk_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

float *packed_values(const tern_pk_tensor *t, const uint8_t *base) {
    int64_t n = numel_of(t), cols = t->shape[t->ndim - 1], rows = n / cols;
    float *out = malloc((size_t)n * sizeof *out);
    if (!out) return NULL;
    if (t->encoding == TERN_ENC_Q4 || t->encoding == TERN_ENC_Q8) {
        const uint16_t *sc = (const uint16_t *)(base + t->scales.off), *bi = (const uint16_t *)(base + t->biases.off);
        for (int64_t r = 0; r < rows; r++)
            tern_dequantize_row(base + t->data.off, sc, bi, r, cols, t->encoding == TERN_ENC_Q4 ? 4 : 8, t->group,
                                out + r * cols);
        return out;
    }
    for (int64_t i = 0; i < n; i++)
        out[i] = widen(t->encoding == TERN_ENC_F32, t->encoding == TERN_ENC_F16, base + t->data.off, i);
    return out;
}

/* E4M3 "fn", written independently of the packer's decoder. */
static float f8_value(uint8_t v) {
    int e = (v >> 3) & 15, m = v & 7;
    float x = e ? ldexpf(1.0f + (float)m / 8.0f, e - 7) : ldexpf((float)m / 8.0f, -6);
    return (v & 0x80) ? -x : x;
}

/* Source values of tensor t rows [row0, row0 + rows) of slice `slice`
 * (3-D stacked tensors), as fp32. FP8 weights are multiplied by their
 * weight_scale_inv blocks. */
static float *source_values(const tern_tensor_set *ts, const tern_tensor *t, int64_t slice, int64_t row0, int64_t rows,
                            int64_t cols) {
    float *out = malloc((size_t)(rows * cols) * sizeof *out);
    int64_t slice_rows = t->ndim == 3 ? t->shape[1] : t->ndim == 2 ? t->shape[0] : 1;
    int64_t first = (slice * slice_rows + row0) * cols;
    const tern_tensor *si = NULL;
    if (t->dtype == TERN_DTYPE_F8_E4M3) {
        char name[600];
        snprintf(name, sizeof name, "%s_scale_inv", t->name);
        si = tern_tensors_get(ts, name);
        cr_assert(si && si->dtype == TERN_DTYPE_F32, "no F32 %s", name);
    }
    for (int64_t i = 0; i < rows * cols; i++) {
        int64_t k = first + i;
        if (si) {
            int64_t r = k / cols, c = k % cols, bc = si->shape[1];
            out[i] = f8_value(((const uint8_t *)t->data)[k]) * ((const float *)si->data)[(r / 128) * bc + c / 128];
        } else {
            out[i] = widen(t->dtype == TERN_DTYPE_F32, t->dtype == TERN_DTYPE_F16, t->data, k);
        }
    }
    return out;
}

/* ---- comparison --------------------------------------------------------- */

double quant_bound(const float *w, int n, float scale, float bias, int bits) {
    float mn = w[0], mx = w[0];
    for (int i = 1; i < n; i++) { mn = w[i] < mn ? w[i] : mn; mx = w[i] > mx ? w[i] : mx; }
    int levels = (1 << bits) - 1;
    double exact = ((double)mx - bias) / levels;
    return 0.5 * fabs(scale) + fabs((double)bias - mn) + levels * fabs(exact - scale) +
           1e-6 * (fabs(mx) + fabs(mn)) + 1e-30;
}

static void compare(const char *what, const tern_pk_tensor *t, const uint8_t *base, const float *src, int64_t rows,
                    int64_t cols, int src_is_fp8) {
    float *got = packed_values(t, base);
    cr_assert(got);
    if (t->encoding == TERN_ENC_Q4 || t->encoding == TERN_ENC_Q8) {
        int bits = t->encoding == TERN_ENC_Q4 ? 4 : 8;
        int64_t ng = cols / t->group;
        const uint16_t *sc = (const uint16_t *)(base + t->scales.off), *bi = (const uint16_t *)(base + t->biases.off);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t g = 0; g < ng; g++) {
                const float *w = src + r * cols + g * t->group;
                double bound = quant_bound(w, t->group, tern_bf16_to_f32(sc[r * ng + g]),
                                           tern_bf16_to_f32(bi[r * ng + g]), bits);
                for (int i = 0; i < t->group; i++) {
                    double d = fabs((double)got[r * cols + g * t->group + i] - w[i]);
                    cr_assert(d <= bound, "%s row %lld col %lld: |%g - %g| = %g > bound %g", what, (long long)r,
                              (long long)(g * t->group + i), got[r * cols + g * t->group + i], w[i], d, bound);
                }
            }
    } else {
        for (int64_t i = 0; i < rows * cols; i++) {
            /* a float copy is exact; FP8 -> bf16 rounds once */
            double tol = src_is_fp8 ? fabs(src[i]) / 256.0 : 0.0;
            cr_assert(fabs((double)got[i] - src[i]) <= tol, "%s value %lld: %g != source %g", what, (long long)i,
                      got[i], src[i]);
        }
    }
    free(got);
}

static const tern_tensor *source_tensor(const tern_tensor_set *ts, const char *canon) {
    const tern_tensor *t = tern_tensors_get(ts, canon);
    if (!t && !strncmp(canon, "model.language_model.", 21)) {
        char bare[600];
        snprintf(bare, sizeof bare, "model.%s", canon + 21);
        t = tern_tensors_get(ts, bare);
    }
    return t;
}

static uint64_t check_resident(const tern_manifest *m, const tern_tensor_set *ts, const uint8_t *res) {
    uint64_t checked = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const tern_pk_tensor *t = &m->tensors[i];
        const tern_tensor *s = source_tensor(ts, t->name);
        cr_assert(s, "packed tensor %s has no source", t->name);
        int64_t n = numel_of(t), cols = t->shape[t->ndim - 1];
        cr_assert_eq(n, s->numel, "%s: %lld values, source %lld", t->name, (long long)n, (long long)s->numel);
        float *src = source_values(ts, s, 0, 0, n / cols, cols);
        compare(t->name, t, res, src, n / cols, cols, s->dtype == TERN_DTYPE_F8_E4M3);
        free(src);
        checked += (uint64_t)n;
    }
    return checked;
}

/* The source of expert e's part of the experts under prefix P. */
static float *expert_source(const tern_tensor_set *ts, const char *P, int e, int part, int64_t I, int64_t H) {
    static const char *names[3] = {"gate", "up", "down"};
    char name[600];
    snprintf(name, sizeof name, "%sexperts.gate_up_proj", P);
    const tern_tensor *gu = source_tensor(ts, name);
    if (gu) {
        snprintf(name, sizeof name, "%sexperts.down_proj", P);
        const tern_tensor *dn = source_tensor(ts, name);
        cr_assert(dn);
        return part == 2 ? source_values(ts, dn, e, 0, H, I) : source_values(ts, gu, e, part ? I : 0, I, H);
    }
    snprintf(name, sizeof name, "%sexperts.%d.%s_proj.weight", P, e, names[part]);
    const tern_tensor *t = source_tensor(ts, name);
    cr_assert(t, "no source for %s", name);
    return source_values(ts, t, 0, 0, part == 2 ? H : I, part == 2 ? I : H);
}

static uint64_t check_experts(const char *dst, const tern_manifest *m, const tern_tensor_set *ts) {
    uint64_t checked = 0;
    int files = m->n_layer_files + (m->mtp_file ? 1 : 0);
    int64_t I = m->arch.expert_inter, H = m->arch.hidden;
    cr_assert_eq(m->stride % 4096, 0);
    for (int f = 0; f < files; f++) {
        char path[4096], P[128], what[4300];
        snprintf(path, sizeof path, "%s/%s", dst, f < m->n_layer_files ? m->layer_files[f] : m->mtp_file);
        if (f < m->n_layer_files) snprintf(P, sizeof P, "model.language_model.layers.%d.mlp.", f);
        else snprintf(P, sizeof P, "mtp.layers.0.mlp.");
        size_t size;
        uint8_t *blob = read_all(path, &size);
        cr_assert(blob && size == (size_t)m->n_experts * m->stride, "%s: size %zu", path, size);
        for (int e = 0; e < m->n_experts; e++)
            for (int part = 0; part < 3; part++) {
                const tern_pk_tensor *t = &m->parts[part];
                float *src = expert_source(ts, P, e, part, I, H);
                snprintf(what, sizeof what, "%s expert %d part %d", path, e, part);
                compare(what, t, blob + (size_t)e * m->stride, src, t->shape[0], t->shape[1], 0);
                free(src);
                checked += (uint64_t)(t->shape[0] * t->shape[1]);
            }
        /* the padding after the last part is zero */
        uint64_t end = m->parts[2].biases.size ? m->parts[2].biases.off + m->parts[2].biases.size
                                               : m->parts[2].data.off + m->parts[2].data.size;
        for (uint64_t k = end; k < m->stride; k++) cr_assert_eq(blob[k], 0, "%s: padding byte %llu", path, (unsigned long long)k);
        free(blob);
    }
    return checked;
}

uint64_t check_pack(const char *src, const char *dst) {
    tern_manifest m;
    tern_error err = {{0}};
    cr_assert_eq(tern_manifest_read(&m, dst, &err), 0, "%s", err.msg);
    int how = -1;
    cr_assert_eq(tern_packed_check_how(dst, &m, &how, &err), 0, "%s", err.msg);
    cr_assert_eq(how, TERN_CHECK_RECEIPT, "a fresh pack's receipt should be valid");
    tern_tensor_set ts;
    cr_assert_eq(tern_tensors_open(&ts, src, 0, &err), 0, "%s", err.msg);
    char path[4096];
    snprintf(path, sizeof path, "%s/resident.bin", dst);
    size_t size;
    uint8_t *res = read_all(path, &size);
    cr_assert(res);
    cr_assert_eq(size, tern_manifest_file(&m, "resident.bin")->size);
    for (int i = 0; i < m.n_tensors; i++) {
        cr_assert_eq(m.tensors[i].data.off % 64, 0, "%s misaligned", m.tensors[i].name);
        cr_assert_eq(m.tensors[i].scales.off % 64, 0);
        cr_assert_eq(m.tensors[i].biases.off % 64, 0);
        cr_assert(strncmp(m.tensors[i].name, "model.visual", 12) != 0, "vision tensor %s kept", m.tensors[i].name);
    }
    uint64_t checked = check_resident(&m, &ts, res) + check_experts(dst, &m, &ts);
    free(res);
    tern_tensors_close(&ts);
    tern_manifest_free(&m);
    return checked;
}
