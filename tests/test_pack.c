/* tern pack / tern verify (docs/FORMAT.md): the quantizer's error bound,
 * packs of every fixture checked value by value against the source,
 * MLX bits copied exactly, FP8 blocks, integrity (flipped byte, truncated
 * file, the receipt's fast path and when it must not be taken), install
 * semantics (kill + resume, symlinks, lock, existing DST, disk space) and
 * tensor-name validation. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cpu/quant.h"
#include "model/manifest.h"
#include "model/tensors.h"
#include "pack/source.h"
#include "pack/verify.h"
#include "packutil.h"
#include "tern.h"
#include "testutil.h"
#include "util/half.h"
#include "util/clock.h"

static char *dir;
static void setup(void) { dir = make_temp_dir(); cr_assert(dir); }
static void teardown(void) { rm_rf(dir); free(dir); }

TestSuite(pack, .init = setup, .fini = teardown, .timeout = 120);

static const char *in_dir(const char *name) { return dir_path(dir, name); }

static tern_pack_params params(const char *src, const char *dst, int bits) {
    return (tern_pack_params){.src = src, .dst = dst, .bits = bits, .n_threads = 2};
}

static void pack_ok(const tern_pack_params *p) {
    tern_error err = {{0}};
    cr_assert_eq(tern_pack(p, &err), 0, "pack %s -> %s: %s", p->src, p->dst, err.msg);
}

static void expect_pack_error(const tern_pack_params *p, const char *frag1, const char *frag2) {
    tern_error err = {{0}};
    cr_assert_eq(tern_pack(p, &err), -1, "expected the pack of %s to fail", p->src);
    cr_assert(strstr(err.msg, frag1), "message '%s' lacks '%s'", err.msg, frag1);
    if (frag2) cr_assert(strstr(err.msg, frag2), "message '%s' lacks '%s'", err.msg, frag2);
    cr_assert(!strchr(err.msg, '\n'), "message is not one line: %s", err.msg);
}

static void read_manifest(tern_manifest *m, const char *d) {
    tern_error err = {{0}};
    cr_assert_eq(tern_manifest_read(m, d, &err), 0, "%s", err.msg);
}

/* ---- the quantizer ------------------------------------------------------ */

static float rnd(uint32_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 17;
    *x ^= *x << 5;
    return (float)(*x >> 8) / 16777216.0f - 0.5f;
}

/* Rows of different character: wide, narrow, offset, constant, one
 * outlier, subnormal-small. */
static void make_rows(float *w, int rows, int cols, uint32_t seed) {
    uint32_t x = seed;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            float v = rnd(&x);
            switch (r % 6) {
            case 0: w[r * cols + c] = v * 2.0f; break;
            case 1: w[r * cols + c] = v * 1e-3f; break;
            case 2: w[r * cols + c] = 5.0f + v; break;
            case 3: w[r * cols + c] = 0.25f; break;
            case 4: w[r * cols + c] = c == 7 ? 40.0f : v * 0.01f; break;
            default: w[r * cols + c] = v * 1e-30f; break;
            }
        }
}

Test(pack, quantize_roundtrip_within_bound) {
    enum { R = 24, C = 256 };
    static float w[R * C], out[C];
    static uint8_t q[R * C];
    static uint16_t s[R * C / 32], b[R * C / 32];
    for (int bits = 4; bits <= 8; bits += 4)
        for (int group = 32; group <= 128; group *= 2) {
            make_rows(w, R, C, (uint32_t)(bits * 1000 + group));
            tern_quantize(w, R, C, bits, group, q, s, b);
            int ng = C / group;
            for (int r = 0; r < R; r++) {
                tern_dequantize_row(q, s, b, r, C, bits, group, out);
                for (int g = 0; g < ng; g++) {
                    const float *src = w + r * C + g * group;
                    double bound = quant_bound(src, group, tern_bf16_to_f32(s[r * ng + g]),
                                               tern_bf16_to_f32(b[r * ng + g]), bits);
                    for (int i = 0; i < group; i++)
                        cr_assert(fabs((double)out[g * group + i] - src[i]) <= bound,
                                  "bits %d group %d row %d col %d: |%g - %g| > %g", bits, group, r, g * group + i,
                                  out[g * group + i], src[i], bound);
                }
            }
        }
}

Test(pack, quantize_bound_is_tight_enough) {
    /* the bound must not hide a broken quantizer: for a plain group it is
     * about half a step (plus the bf16 rounding of the scale) */
    float w[64];
    for (int i = 0; i < 64; i++) w[i] = (float)i / 63.0f;
    uint8_t q[64];
    uint16_t s, b;
    tern_quantize(w, 1, 64, 4, 64, q, &s, &b);
    double bound = quant_bound(w, 64, tern_bf16_to_f32(s), tern_bf16_to_f32(b), 4);
    cr_assert(bound < 0.6 * (1.0 / 15.0), "bound %g is loose", bound);
    /* element 2j in the low nibble of byte j */
    cr_assert_eq(q[0] & 15, 0);
    cr_assert_eq(q[31] >> 4, 15);
}

/* ---- packing the oracle fixtures ---------------------------------------- */

static void check_encodings(const char *d, int attn_enc, int expert_enc) {
    tern_manifest m;
    read_manifest(&m, d);
    const tern_pk_tensor *q = tern_manifest_tensor(&m, "model.language_model.layers.3.self_attn.q_proj.weight");
    const tern_pk_tensor *n = tern_manifest_tensor(&m, "model.language_model.layers.3.input_layernorm.weight");
    const tern_pk_tensor *c = tern_manifest_tensor(&m, "model.language_model.layers.0.linear_attn.conv1d.weight");
    cr_assert(q && n && c);
    cr_assert_eq(q->encoding, attn_enc);
    cr_assert_eq(n->encoding, TERN_ENC_BF16, "norms keep their float type");
    cr_assert_eq(c->ndim, 3);
    cr_assert_eq(c->shape[1], 1, "conv1d keeps HF's [C, 1, K]");
    cr_assert_eq(m.parts[0].encoding, expert_enc);
    cr_assert(!tern_manifest_tensor(&m, "model.visual.pos_embed.weight"), "vision tensors are dropped");
    cr_assert(m.mtp_file && m.arch.mtp);
    cr_assert_eq(m.n_layer_files, 4);
    tern_manifest_free(&m);
}

Test(pack, tiny_8bit) {
    tern_pack_params p = params(fixture_dir("tiny"), in_dir("out"), 8);
    pack_ok(&p);
    cr_assert(check_pack(fixture_dir("tiny"), in_dir("out")) > 700000);
    check_encodings(in_dir("out"), TERN_ENC_Q8, TERN_ENC_Q8);
}

Test(pack, tiny_4bit) {
    tern_pack_params p = params(fixture_dir("tiny"), in_dir("out"), 4);
    pack_ok(&p);
    check_pack(fixture_dir("tiny"), in_dir("out"));
    check_encodings(in_dir("out"), TERN_ENC_Q4, TERN_ENC_Q4);
}

Test(pack, tiny_defaults_and_class_bits) {
    tern_pack_params p = params(fixture_dir("tiny"), in_dir("out"), 0);
    p.head_bits = 16;
    p.router_bits = 4;
    pack_ok(&p);
    check_pack(fixture_dir("tiny"), in_dir("out"));
    tern_manifest m;
    read_manifest(&m, in_dir("out"));
    cr_assert_eq(m.parts[0].encoding, TERN_ENC_Q4, "experts default to 4 bits");
    cr_assert_eq(tern_manifest_tensor(&m, "model.language_model.embed_tokens.weight")->encoding, TERN_ENC_Q8);
    cr_assert_eq(tern_manifest_tensor(&m, "lm_head.weight")->encoding, TERN_ENC_BF16, "16 keeps float");
    cr_assert_eq(tern_manifest_tensor(&m, "model.language_model.layers.0.mlp.gate.weight")->encoding, TERN_ENC_Q4);
    cr_assert_eq(tern_manifest_tensor(&m, "mtp.fc.weight")->encoding, TERN_ENC_Q8);
    cr_assert_eq(m.quant[TERN_QC_HEAD].bits, 16);
    cr_assert_eq(m.quant[TERN_QC_EXPERTS].bits, 4);
    tern_manifest_free(&m);
}

Test(pack, qwen35_sharded_per_expert_mtp) {
    tern_pack_params p8 = params(fixture_dir("qwen35"), in_dir("out8"), 8);
    pack_ok(&p8);
    check_pack(fixture_dir("qwen35"), in_dir("out8"));
    tern_pack_params p = params(fixture_dir("qwen35"), in_dir("out"), 4);
    pack_ok(&p);
    check_pack(fixture_dir("qwen35"), in_dir("out"));
    tern_manifest m;
    read_manifest(&m, in_dir("out"));
    cr_assert(m.source_index_sha256, "a sharded source records its index hash");
    cr_assert_eq(tern_manifest_tensor(&m, "model.language_model.layers.0.linear_attn.A_log")->encoding, TERN_ENC_F32);
    tern_manifest_free(&m);
}

Test(pack, odd_f16_bare_prefix_float_rows) {
    tern_pack_params p4 = params(fixture_dir("odd"), in_dir("out4"), 4);
    pack_ok(&p4);
    check_pack(fixture_dir("odd"), in_dir("out4"));
    tern_pack_params p = params(fixture_dir("odd"), in_dir("out"), 8);
    pack_ok(&p);
    check_pack(fixture_dir("odd"), in_dir("out"));
    tern_manifest m;
    read_manifest(&m, in_dir("out"));
    /* rows of 48 are not a multiple of 32: float; rows of 96 get group 32 */
    cr_assert_eq(tern_manifest_tensor(&m, "model.language_model.embed_tokens.weight")->encoding, TERN_ENC_F16);
    const tern_pk_tensor *o = tern_manifest_tensor(&m, "model.language_model.layers.1.self_attn.o_proj.weight");
    cr_assert(o && o->encoding == TERN_ENC_Q8 && o->group == 32);
    cr_assert_eq(m.parts[2].encoding, TERN_ENC_F16);
    tern_manifest_free(&m);
}

Test(pack, progress_lines_when_not_a_tty) {
    FILE *log = tmpfile();
    tern_pack_params p = params(fixture_dir("tiny"), in_dir("out"), 8);
    p.progress = log;
    pack_ok(&p);
    rewind(log);
    char text[16384];
    size_t n = fread(text, 1, sizeof text - 1, log);
    text[n] = '\0';
    fclose(log);
    cr_assert(strstr(text, "pack: ") && strstr(text, "MB/s") && strstr(text, "ETA"), "%s", text);
    cr_assert(strstr(text, "pack: done"), "%s", text);
    cr_assert(!strchr(text, '\r'), "no carriage returns in a log file");
}

Test(pack, group_32_option) {
    tern_pack_params p = params(fixture_dir("tiny"), in_dir("out"), 4);
    p.group = 32;
    pack_ok(&p);
    check_pack(fixture_dir("tiny"), in_dir("out"));
    tern_manifest m;
    read_manifest(&m, in_dir("out"));
    cr_assert_eq(tern_manifest_tensor(&m, "lm_head.weight")->group, 32);
    tern_manifest_free(&m);
}

Test(pack, all_float_is_byte_identical_copy) {
    tern_pack_params p = params(fixture_dir("tiny"), in_dir("out"), 0);
    p.embed_bits = p.attn_bits = p.router_bits = p.shared_bits = p.expert_bits = p.head_bits = p.mtp_fc_bits = 16;
    pack_ok(&p);
    check_pack(fixture_dir("tiny"), in_dir("out"));   /* float encodings compare exactly */
}

static void file_hashes(const char *d, tern_manifest *m) {
    read_manifest(m, d);
    cr_assert(m->n_files >= 7);
}

Test(pack, deterministic) {
    tern_pack_params a = params(fixture_dir("qwen35"), in_dir("a"), 8), b = params(fixture_dir("qwen35"), in_dir("b"), 8);
    b.n_threads = 1;   /* thread count must not change a byte */
    pack_ok(&a);
    pack_ok(&b);
    tern_manifest ma, mb;
    file_hashes(in_dir("a"), &ma);
    file_hashes(in_dir("b"), &mb);
    cr_assert_str_eq(ma.manifest_sha256, mb.manifest_sha256, "same inputs, same manifest bytes");
    tern_manifest_free(&ma);
    tern_manifest_free(&mb);
}

/* ---- MLX and FP8 sources ------------------------------------------------ */

typedef struct {
    pk_source src;
    const uint8_t *res;
    tern_manifest m;
} mlx_fx;

/* The MLX source's own dequantization, written here from the layout:
 * U32 words, element i of a word at bits [i*bits, (i+1)*bits). */
static void mlx_row(const pk_raw *w, const pk_raw *sc, const pk_raw *bi, int64_t row, int bits, int group, int64_t cols,
                    float *out) {
    const uint32_t *words = (const uint32_t *)w->data + row * (cols * bits / 32);
    const uint16_t *s = (const uint16_t *)sc->data + row * (cols / group), *b = (const uint16_t *)bi->data + row * (cols / group);
    int per = 32 / bits;
    for (int64_t c = 0; c < cols; c++) {
        uint32_t q = (words[c / per] >> (bits * (c % per))) & ((1u << bits) - 1);
        out[c] = (float)q * tern_bf16_to_f32(s[c / group]) + tern_bf16_to_f32(b[c / group]);
    }
}

/* A packed quantized matrix against the MLX tensors it was copied from:
 * identical bytes for q, scales and biases, identical values. */
static void mlx_compare(mlx_fx *f, const char *src_base, int64_t slice, const tern_pk_tensor *t, const uint8_t *base) {
    char n[300];
    snprintf(n, sizeof n, "%sweight", src_base);
    const pk_raw *w = pk_source_get(&f->src, n);
    snprintf(n, sizeof n, "%sscales", src_base);
    const pk_raw *sc = pk_source_get(&f->src, n);
    snprintf(n, sizeof n, "%sbiases", src_base);
    const pk_raw *bi = pk_source_get(&f->src, n);
    cr_assert(w && sc && bi, "MLX tensors of %s", src_base);
    int bits = t->encoding == TERN_ENC_Q4 ? 4 : 8;
    int64_t rows = t->shape[0], cols = t->shape[1], rb = cols * bits / 8, ng = cols / t->group;
    cr_assert(t->encoding == TERN_ENC_Q4 || t->encoding == TERN_ENC_Q8, "%s not quantized", src_base);
    cr_assert_eq(memcmp(base + t->data.off, w->data + slice * rows * rb, (size_t)(rows * rb)), 0, "%s q bits", src_base);
    cr_assert_eq(memcmp(base + t->scales.off, sc->data + slice * rows * ng * 2, (size_t)(rows * ng * 2)), 0);
    cr_assert_eq(memcmp(base + t->biases.off, bi->data + slice * rows * ng * 2, (size_t)(rows * ng * 2)), 0);
    float *got = packed_values(t, base), *want = malloc((size_t)cols * sizeof *want);
    const pk_raw ws = {.data = w->data + slice * rows * rb}, ss = {.data = sc->data + slice * rows * ng * 2},
                 bs = {.data = bi->data + slice * rows * ng * 2};
    for (int64_t r = 0; r < rows; r++) {
        mlx_row(&ws, &ss, &bs, r, bits, t->group, cols, want);
        for (int64_t c = 0; c < cols; c++)
            cr_assert_eq(got[r * cols + c], want[c], "%s [%lld, %lld]", src_base, (long long)r, (long long)c);
    }
    free(got);
    free(want);
}

static void mlx_source_base(const char *canon, char *out, size_t n) {
    /* model.language_model.X.weight -> language_model.model.X. (canonical names are what pk_source indexes) */
    snprintf(out, n, "%.*s", (int)(strlen(canon) - 6), canon);
}

Test(pack, mlx_bits_copied_exactly) {
    const char *src = fixture_dir("mlx-tiny");
    tern_pack_params p = params(src, in_dir("out"), 0);
    pack_ok(&p);
    mlx_fx f;
    tern_error err = {{0}};
    cr_assert_eq(pk_source_open(&f.src, src, &err), 0, "%s", err.msg);
    read_manifest(&f.m, in_dir("out"));
    size_t size;
    uint8_t *res = read_all(in_dir("out/resident.bin"), &size);
    int quantized = 0;
    for (int i = 0; i < f.m.n_tensors; i++) {
        const tern_pk_tensor *t = &f.m.tensors[i];
        if (t->encoding != TERN_ENC_Q4 && t->encoding != TERN_ENC_Q8) continue;
        char base[300];
        mlx_source_base(t->name, base, sizeof base);
        mlx_compare(&f, base, 0, t, res);
        quantized++;
    }
    cr_assert_gt(quantized, 40);
    for (int layer = 0; layer <= f.m.n_layer_files; layer++) {
        char path[1100], base[200];
        static const char *parts[3] = {"gate", "up", "down"};
        snprintf(path, sizeof path, "%s/%s", in_dir("out"), layer < f.m.n_layer_files ? f.m.layer_files[layer] : f.m.mtp_file);
        uint8_t *blob = read_all(path, &size);
        cr_assert(blob);
        for (int e = 0; e < f.m.n_experts; e++)
            for (int part = 0; part < 3; part++) {
                if (layer < f.m.n_layer_files)
                    snprintf(base, sizeof base, "model.language_model.layers.%d.mlp.switch_mlp.%s_proj.", layer, parts[part]);
                else
                    snprintf(base, sizeof base, "mtp.layers.0.mlp.switch_mlp.%s_proj.", parts[part]);
                mlx_compare(&f, base, e, &f.m.parts[part], blob + (size_t)e * f.m.stride);
            }
        free(blob);
    }
    free(res);
    pk_source_close(&f.src);
    tern_manifest_free(&f.m);
}

/* The MLX fixture was made from tiny: after undoing MLX's layout the
 * packed values must be tiny's within the quantization error, which a
 * wrong name mapping, a gate/up swap or a missed norm shift would break. */
Test(pack, mlx_matches_its_bf16_origin) {
    tern_pack_params p = params(fixture_dir("mlx-tiny"), in_dir("out"), 0);
    pack_ok(&p);
    tern_manifest m;
    read_manifest(&m, in_dir("out"));
    tern_tensor_set ts;
    tern_error err = {{0}};
    cr_assert_eq(tern_tensors_open(&ts, fixture_dir("tiny"), 0, &err), 0, "%s", err.msg);
    size_t size;
    uint8_t *res = read_all(in_dir("out/resident.bin"), &size);
    for (int i = 0; i < m.n_tensors; i++) {
        const tern_pk_tensor *t = &m.tensors[i];
        const tern_tensor *o = tern_tensors_get(&ts, t->name);
        cr_assert(o, "%s has no origin", t->name);
        cr_assert_eq(o->ndim, t->ndim, "%s", t->name);
        for (int d = 0; d < t->ndim; d++) cr_assert_eq(o->shape[d], t->shape[d], "%s shape", t->name);
        float *got = packed_values(t, res);
        const uint16_t *ref = o->data;
        int q = t->encoding == TERN_ENC_Q4 || t->encoding == TERN_ENC_Q8;
        int64_t cols = t->shape[t->ndim - 1];
        for (int64_t k = 0; k < o->numel; k++) {
            float want = tern_bf16_to_f32(ref[k]);
            /* MLX stored bf16(w + 1): half a bf16 step of |w + 1| is lost for good */
            double tol = fabs(want + 1.0) / 256.0;
            if (q) {
                const uint16_t *sc = (const uint16_t *)(res + t->scales.off);
                tol = 2.0 * fabs(tern_bf16_to_f32(sc[(k / cols) * (cols / t->group) + (k % cols) / t->group])) + 1e-4;
            } else if (!strstr(t->name, "norm") || strstr(t->name, "linear_attn.norm")) {
                tol = 0;   /* copied as stored */
            }
            cr_assert(fabs(got[k] - want) <= tol, "%s[%lld]: %g vs origin %g", t->name, (long long)k, got[k], want);
        }
        free(got);
    }
    free(res);
    tern_tensors_close(&ts);
    tern_manifest_free(&m);
}

Test(pack, mlx_refuses_requantization) {
    tern_pack_params p = params(fixture_dir("mlx-tiny"), in_dir("out"), 0);
    p.expert_bits = 8;
    expect_pack_error(&p, "does not re-quantize", "switch_mlp");
}

Test(pack, fp8_blocks_dequantized_then_quantized) {
    const char *src = fixture_dir("fp8-small");
    tern_pack_params p = params(src, in_dir("out"), 8);
    pack_ok(&p);
    check_pack(src, in_dir("out"));
    tern_manifest m;
    read_manifest(&m, in_dir("out"));
    const tern_pk_tensor *q = tern_manifest_tensor(&m, "model.language_model.layers.1.self_attn.q_proj.weight");
    cr_assert(q && q->encoding == TERN_ENC_Q8 && q->group == 32, "160-wide rows get group 32");
    tern_manifest_free(&m);
    /* kept float: FP8 becomes bf16 */
    tern_pack_params f = params(src, in_dir("f"), 0);
    f.attn_bits = 16;
    pack_ok(&f);
    check_pack(src, in_dir("f"));
    read_manifest(&m, in_dir("f"));
    cr_assert_eq(tern_manifest_tensor(&m, "model.language_model.layers.1.self_attn.q_proj.weight")->encoding,
                 TERN_ENC_BF16);
    tern_manifest_free(&m);
}

/* ---- integrity: verify, check, receipt ---------------------------------- */

static void pack_tiny(const char *name) {
    tern_pack_params p = params(fixture_dir("tiny"), in_dir(name), 8);
    pack_ok(&p);
}

Test(pack, verify_names_any_flipped_file) {
    pack_tiny("out");
    tern_manifest m;
    read_manifest(&m, in_dir("out"));
    tern_error err = {{0}};
    cr_assert_eq(tern_verify(in_dir("out"), NULL, &err), 0, "%s", err.msg);
    for (int i = 0; i < m.n_files; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", in_dir("out"), m.files[i].path);
        uint64_t off = m.files[i].size / 2 + (uint64_t)i;
        cr_assert_eq(flip_byte(path, off), 0);
        cr_assert_eq(tern_verify(in_dir("out"), NULL, &err), -1, "flipped %s not detected", m.files[i].path);
        cr_assert(strstr(err.msg, m.files[i].path), "'%s' does not name %s", err.msg, m.files[i].path);
        cr_assert(strstr(err.msg, "SHA-256 mismatch"), "%s", err.msg);
        cr_assert_eq(flip_byte(path, off), 0);
    }
    cr_assert_eq(tern_verify(in_dir("out"), NULL, &err), 0, "%s", err.msg);
    tern_manifest_free(&m);
}

Test(pack, verify_reports_missing_file_and_writes_receipt) {
    pack_tiny("out");
    char receipt[1100];
    snprintf(receipt, sizeof receipt, "%s/%s", in_dir("out"), TERN_RECEIPT_NAME);
    cr_assert_eq(unlink(receipt), 0);
    tern_error err = {{0}};
    FILE *log = tmpfile();
    cr_assert_eq(tern_verify(in_dir("out"), log, &err), 0, "%s", err.msg);
    fclose(log);
    cr_assert_eq(access(receipt, F_OK), 0, "verify writes the receipt");
    cr_assert_eq(unlink(in_dir("out/experts/layer_002.bin")), 0);
    cr_assert_eq(tern_verify(in_dir("out"), NULL, &err), -1);
    cr_assert(strstr(err.msg, "experts/layer_002.bin") && strstr(err.msg, "missing"), "%s", err.msg);
}

Test(pack, truncated_expert_file_named) {
    pack_tiny("out");
    tern_manifest m;
    read_manifest(&m, in_dir("out"));
    cr_assert_eq(truncate(in_dir("out/experts/layer_001.bin"), (off_t)(m.stride * 3)), 0);
    tern_error err = {{0}};
    int how = -1;
    /* the receipt still matches the manifest: the fast path runs, and its size check fails */
    cr_assert_eq(tern_packed_check_how(in_dir("out"), &m, &how, &err), -1);
    cr_assert_eq(how, TERN_CHECK_RECEIPT);
    cr_assert(strstr(err.msg, "experts/layer_001.bin"), "%s", err.msg);
    cr_assert_eq(tern_verify(in_dir("out"), NULL, &err), -1);
    cr_assert(strstr(err.msg, "experts/layer_001.bin") && strstr(err.msg, "size"), "%s", err.msg);
    tern_manifest_free(&m);
}

Test(pack, receipt_fast_path_only_when_bound) {
    pack_tiny("out");
    tern_manifest m;
    read_manifest(&m, in_dir("out"));
    tern_error err = {{0}};
    int how = -1;
    cr_assert_eq(tern_packed_check_how(in_dir("out"), &m, &how, &err), 0, "%s", err.msg);
    cr_assert_eq(how, TERN_CHECK_RECEIPT);
    /* same size, other content: the receipt binds the file's mtime, so the fast path refuses it */
    cr_assert_eq(flip_byte(in_dir("out/experts/layer_003.bin"), 100), 0);
    cr_assert_eq(tern_packed_check_how(in_dir("out"), &m, &how, &err), -1);
    cr_assert_eq(how, TERN_CHECK_RECEIPT);
    cr_assert(strstr(err.msg, "experts/layer_003.bin") && strstr(err.msg, "tern verify"), "%s", err.msg);
    /* moved: the receipt binds the old path, so everything is rehashed */
    cr_assert_eq(rename(in_dir("out"), in_dir("moved")), 0);
    cr_assert_eq(tern_packed_check_how(in_dir("moved"), &m, &how, &err), -1);
    cr_assert_eq(how, TERN_CHECK_REHASH);
    cr_assert(strstr(err.msg, "experts/layer_003.bin"), "%s", err.msg);
    cr_assert_eq(flip_byte(in_dir("moved/experts/layer_003.bin"), 100), 0);
    cr_assert_eq(tern_packed_check_how(in_dir("moved"), &m, &how, &err), 0, "%s", err.msg);
    cr_assert_eq(how, TERN_CHECK_REHASH);
    /* verify rebinds the receipt to the new place */
    cr_assert_eq(tern_verify(in_dir("moved"), NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(tern_packed_check_how(in_dir("moved"), &m, &how, &err), 0, "%s", err.msg);
    cr_assert_eq(how, TERN_CHECK_RECEIPT);
    tern_manifest_free(&m);
}

static void edit_receipt(const char *d, const char *file, const char *sha) {
    char path[1100];
    snprintf(path, sizeof path, "%s/%s", d, TERN_RECEIPT_NAME);
    json_t *r = json_load_file(path, 0, NULL);
    cr_assert(r);
    json_t *f = json_object_get(json_object_get(r, "files"), file);
    cr_assert(f, "receipt lacks %s", file);
    json_object_set_new(f, "sha256", json_string(sha));
    cr_assert_eq(json_dump_file(r, path, JSON_INDENT(1)), 0);
    json_decref(r);
}

Test(pack, receipt_edit_forces_rehash) {
    pack_tiny("out");
    tern_manifest m;
    read_manifest(&m, in_dir("out"));
    tern_error err = {{0}};
    int how = -1;
    edit_receipt(in_dir("out"), "resident.bin", "0000000000000000000000000000000000000000000000000000000000000000");
    cr_assert_eq(tern_packed_check_how(in_dir("out"), &m, &how, &err), 0, "%s", err.msg);
    cr_assert_eq(how, TERN_CHECK_REHASH, "an edited receipt is not trusted");
    /* a receipt that claims a wrong file's hash as right changes nothing: the file is rehashed */
    cr_assert_eq(flip_byte(in_dir("out/resident.bin"), 64), 0);
    cr_assert_eq(tern_packed_check_how(in_dir("out"), &m, &how, &err), -1);
    cr_assert(strstr(err.msg, "resident.bin"), "%s", err.msg);
    tern_manifest_free(&m);
}

Test(pack, edited_manifest_forces_rehash) {
    pack_tiny("out");
    char path[1100];
    snprintf(path, sizeof path, "%s/manifest.json", in_dir("out"));
    FILE *f = fopen(path, "ab");
    fputs("\n", f);   /* same JSON, other bytes: the receipt's manifest hash no longer matches */
    fclose(f);
    tern_manifest m;
    read_manifest(&m, in_dir("out"));
    tern_error err = {{0}};
    int how = -1;
    cr_assert_eq(tern_packed_check_how(in_dir("out"), &m, &how, &err), 0, "%s", err.msg);
    cr_assert_eq(how, TERN_CHECK_REHASH);
    tern_manifest_free(&m);
}

/* ---- install semantics -------------------------------------------------- */

/* A synthetic checkpoint large enough that a pack takes a good fraction
 * of a second on two cores. */
static void synth_big(const char *d) {
    mkdir(d, 0755);
    synth_spec s = synth_default();
    s.hidden = 512;
    s.layers = 4;
    s.experts = 32;
    s.inter = 256;
    s.shared_inter = 256;
    s.vocab = 4096;
    s.heads = 8;
    s.head_dim = 64;
    s.kv_heads = 2;
    s.mtp = 1;
    cr_assert(synth_model(d, &s) > 50000000);
}

/* Runs tern_pack in a child and SIGKILLs it after `delay` seconds, or as
 * soon as DST.partial/pack-state.json exists if delay < 0. Returns 1 if
 * the child was killed before finishing. */
static int pack_and_kill(const tern_pack_params *p, double delay) {
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        tern_error err;
        _exit(tern_pack(p, &err) == 0 ? 0 : 3);
    }
    char state[1200];
    snprintf(state, sizeof state, "%s.partial/pack-state.json", p->dst);
    double t0 = tern_now_s();
    int status;
    for (;;) {
        if (waitpid(pid, &status, WNOHANG) == pid) return 0;   /* finished first */
        if (delay >= 0 ? tern_now_s() - t0 >= delay : access(state, F_OK) == 0) break;
        usleep(1000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return WIFSIGNALED(status);
}

static void same_files(const char *a, const char *b) {
    tern_manifest ma, mb;
    read_manifest(&ma, a);
    read_manifest(&mb, b);
    cr_assert_eq(ma.n_files, mb.n_files);
    for (int i = 0; i < ma.n_files; i++) {
        cr_assert_str_eq(ma.files[i].path, mb.files[i].path);
        cr_assert_eq(ma.files[i].size, mb.files[i].size);
        cr_assert_str_eq(ma.files[i].sha256, mb.files[i].sha256, "%s differs", ma.files[i].path);
    }
    cr_assert_str_eq(ma.manifest_sha256, mb.manifest_sha256);
    tern_manifest_free(&ma);
    tern_manifest_free(&mb);
}

Test(pack, killed_and_resumed_equals_uninterrupted, .timeout = 300) {
    synth_big(in_dir("src"));
    tern_pack_params a = params(in_dir("src"), in_dir("a"), 0);
    double t0 = tern_now_s();
    pack_ok(&a);
    double took = tern_now_s() - t0;
    unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    srand(seed);
    tern_pack_params b = params(in_dir("src"), in_dir("b"), 0);
    b.resume = 1;
    int kills = 0;
    for (int round = 0; round < 3; round++) {
        double delay = took * (0.05 + 0.85 * rand() / (double)RAND_MAX);
        kills += pack_and_kill(&b, delay);
        if (access(in_dir("b"), F_OK) == 0) break;   /* it finished before the kill */
    }
    cr_log_info("uninterrupted pack %.2f s, %d kills (seed %u)", took, kills, seed);
    if (access(in_dir("b"), F_OK) != 0) pack_ok(&b);
    same_files(in_dir("a"), in_dir("b"));
    tern_error err = {{0}};
    cr_assert_eq(tern_verify(in_dir("b"), NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(access(in_dir("b.partial"), F_OK), -1, "the partial directory is gone");
    cr_assert_eq(access(in_dir("b/pack-state.json"), F_OK), -1);
}

Test(pack, resume_reverifies_written_files, .timeout = 300) {
    synth_big(in_dir("src"));
    tern_pack_params a = params(in_dir("src"), in_dir("a"), 0);
    pack_ok(&a);
    tern_pack_params b = params(in_dir("src"), in_dir("b"), 0);
    b.resume = 1;
    cr_assert(pack_and_kill(&b, -1), "the child finished before it could be killed");
    /* the state lists resident.bin as done: corrupt it behind the state's back */
    cr_assert_eq(flip_byte(in_dir("b.partial/resident.bin"), 4096), 0);
    /* without resume an existing DST.partial is refused */
    tern_pack_params nr = b;
    nr.resume = 0;
    expect_pack_error(&nr, ".partial", "set resume");
    pack_ok(&b);
    same_files(in_dir("a"), in_dir("b"));
    /* the manifest's hashes come from the state: the bytes must match them too */
    tern_error err = {{0}};
    cr_assert_eq(tern_verify(in_dir("b"), NULL, &err), 0, "%s", err.msg);
}

Test(pack, resume_with_other_options_refused, .timeout = 300) {
    synth_big(in_dir("src"));
    tern_pack_params b = params(in_dir("src"), in_dir("b"), 0);
    b.resume = 1;
    cr_assert(pack_and_kill(&b, -1));
    b.bits = 8;
    expect_pack_error(&b, "different pack", NULL);
}

Test(pack, dst_symlink_refused) {
    mkdir(in_dir("real"), 0755);
    cr_assert_eq(symlink(in_dir("real"), in_dir("link")), 0);
    tern_pack_params p = params(fixture_dir("tiny"), in_dir("link"), 8);
    expect_pack_error(&p, "link", "symbolic link");
    cr_assert_eq(symlink(in_dir("real"), in_dir("x.partial")), 0);
    p.dst = in_dir("x");
    p.resume = 1;
    expect_pack_error(&p, "x.partial", "symbolic link");
    cr_assert_eq(symlink(in_dir("real/lock"), in_dir("y.install.lock")), 0);
    p.dst = in_dir("y");
    expect_pack_error(&p, "y.install.lock", "symbolic link");
    cr_assert_eq(access(in_dir("real/lock"), F_OK), -1, "nothing was created through the link");
}

Test(pack, lock_contention_is_install_busy) {
    int fd = open(in_dir("out.install.lock"), O_RDWR | O_CREAT, 0644);
    cr_assert(fd >= 0);
    cr_assert_eq(flock(fd, LOCK_EX | LOCK_NB), 0);
    tern_pack_params p = params(fixture_dir("tiny"), in_dir("out"), 8);
    expect_pack_error(&p, "install busy", NULL);
    close(fd);
    pack_ok(&p);
    cr_assert_eq(access(in_dir("out.install.lock"), F_OK), -1, "the lock file is removed after a pack");
}

Test(pack, existing_dst_refused) {
    mkdir(in_dir("out"), 0755);
    tern_pack_params p = params(fixture_dir("tiny"), in_dir("out"), 8);
    expect_pack_error(&p, "already exists", NULL);
}

Test(pack, not_enough_space) {
    tern_pack_params p = params(fixture_dir("tiny"), in_dir("out"), 8);
    p.min_free_bytes = 1ull << 62;
    expect_pack_error(&p, "not enough disk space", NULL);
    cr_assert_eq(access(in_dir("out"), F_OK), -1);
}

Test(pack, bad_options_refused) {
    tern_pack_params p = params(fixture_dir("tiny"), in_dir("out"), 6);
    expect_pack_error(&p, "bits must", NULL);
    p.bits = 0;
    p.attn_bits = 5;
    expect_pack_error(&p, "attn_bits must", NULL);
    p.attn_bits = 0;
    p.group = 48;
    expect_pack_error(&p, "group must", NULL);
}

/* ---- tensor names ------------------------------------------------------- */

static void bad_name(const char *name, const char *why) {
    mkdir(in_dir("src"), 0755);
    synth_spec s = synth_default();
    s.extra_name = name;
    cr_assert(synth_model(in_dir("src"), &s));
    tern_pack_params p = params(in_dir("src"), in_dir("out"), 8);
    expect_pack_error(&p, "refused", why);
    cr_assert_eq(access(in_dir("out.partial"), F_OK), -1, "nothing written for a refused source");
}

Test(pack, name_with_dotdot_refused) { bad_name("model.language_model.layers.0/../../etc/passwd", "'..'"); }
Test(pack, name_starting_with_slash_refused) { bad_name("/etc/passwd", "absolute"); }
Test(pack, name_with_control_char_refused) { bad_name("model.language_model.x\n.weight", "control character"); }

Test(pack, synthetic_per_expert_and_unknown_tensor) {
    mkdir(in_dir("src"), 0755);
    synth_spec s = synth_default();
    s.per_expert = 1;
    s.mtp = 1;
    s.extra_name = "model.language_model.layers.0.extra_scale.weight";   /* unknown: kept float */
    cr_assert(synth_model(in_dir("src"), &s));
    tern_pack_params p = params(in_dir("src"), in_dir("out"), 4);
    pack_ok(&p);
    check_pack(in_dir("src"), in_dir("out"));
    tern_manifest m;
    read_manifest(&m, in_dir("out"));
    cr_assert_eq(tern_manifest_tensor(&m, "model.language_model.layers.0.extra_scale.weight")->encoding, TERN_ENC_BF16);
    tern_manifest_free(&m);
}

Test(pack, missing_expert_named) {
    mkdir(in_dir("src"), 0755);
    synth_spec s = synth_default();
    s.per_expert = 1;
    s.experts = 5;   /* the config says 5 ... */
    cr_assert(synth_model(in_dir("src"), &s));
    /* ... but rewrite it to 6: expert 5 is missing */
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", in_dir("src"));
    json_t *c = json_load_file(path, 0, NULL);
    json_object_set_new(c, "num_experts", json_integer(6));
    json_dump_file(c, path, 0);
    json_decref(c);
    tern_pack_params p = params(in_dir("src"), in_dir("out"), 4);
    expect_pack_error(&p, "missing tensor", "experts.5.gate_proj.weight");
}
