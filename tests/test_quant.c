/* The fast kernels against their plain twins: every GEMV variant (portable,
 * AVX2, AVX-512; variants the CPU lacks are skipped with a log line) and
 * every weight encoding against a double-precision dot of the row
 * dequantized by the reference tern_dequantize_row; the batch and parallel
 * entry points against single calls, bit for bit; the KV cache rows'
 * round trip against the bound the quantizer promises; and the attention
 * loops on quantized rows against the same loops on the rows dequantized to
 * fp32.
 *
 * Tolerances. Every kernel sums in fp32 along chains of at most k
 * operations, so by the standard bound (Higham, Accuracy and Stability of
 * Numerical Algorithms, §3.1/§4.2) its error is at most k * u * M, u = 2^-24,
 * M = the sum of the magnitudes of the terms it adds. For a quantized row
 * the terms are scale*q*x and bias*x (the factored form), so M = sum |x| *
 * (|scale*q| + |bias|), which is >= sum |w x| and at most ~3x it for
 * min/max groups. The longest chain is: within a group, group/8 FMAs per
 * lane (AVX2) or fewer; across groups, cols/group; the lane fold, 4; the
 * final adds and the reference's own rounding of w, a few. So
 * k = group/8 + 2*cols/group + 8 (float rows: cols/8 + 8). A layout or
 * indexing mistake errs by a sizeable fraction of M and fails by orders of
 * magnitude. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/attention.h"
#include "cpu/kvquant.h"
#include "cpu/ops.h"
#include "cpu/qmatvec.h"
#include "cpu/quant.h"
#include "model/safetensors.h"
#include "util/half.h"

#define U 5.9604644775390625e-8   /* 2^-24 */

TestSuite(quant);

/* ---- deterministic random numbers -------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd_u64(void) {
    /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rnd_uniform(void) { return (double)(rnd_u64() >> 11) * (1.0 / 9007199254740992.0); }

static float rnd_normal(void) {
    double u1 = rnd_uniform(), u2 = rnd_uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    cr_assert(p, "out of memory");
    return p;
}

static tern_isa ISAS[] = {TERN_ISA_C, TERN_ISA_AVX2, TERN_ISA_AVX512};
#define N_ISAS 3

static int isa_runs(tern_isa isa) {
    if (tern_isa_supported(isa)) return 1;
    cr_log_info("quant: skipping variant %s, not supported by this CPU", tern_isa_name(isa));
    return 0;
}

/* ---- test matrices ----------------------------------------------------- */

/* A quantized or float matrix with its storage. */
typedef struct {
    tern_mat W;
    void *data;
    uint16_t *scales, *biases;
} test_mat;

/* Weights like a trained layer's, with what stresses a quantizer: a per-row
 * offset (so the bias term matters), varied spread, a few outliers and one
 * constant group per row when the row has more than one group. */
static float *random_weights(int64_t rows, int64_t cols, int group) {
    float *w = xmalloc((size_t)(rows * cols) * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        float off = 0.02f * rnd_normal(), spread = 0.01f + 0.05f * (float)rnd_uniform();
        for (int64_t c = 0; c < cols; c++) {
            float v = off + spread * rnd_normal();
            if (rnd_u64() % 97 == 0) v *= 8;
            w[r * cols + c] = v;
        }
        if (group && cols / group > 1) {
            int64_t g = (int64_t)(rnd_u64() % (uint64_t)(cols / group));
            for (int64_t c = g * group; c < (g + 1) * group; c++) w[r * cols + c] = 0.25f;
        }
    }
    return w;
}

static test_mat make_quant(int64_t rows, int64_t cols, int bits, int group) {
    test_mat m = {0};
    float *w = random_weights(rows, cols, group);
    int64_t ng = cols / group;
    m.data = xmalloc(tern_q_row_bytes(cols, bits) * (size_t)rows);
    m.scales = xmalloc((size_t)(rows * ng) * 2);
    m.biases = xmalloc((size_t)(rows * ng) * 2);
    tern_quantize(w, rows, cols, bits, group, m.data, m.scales, m.biases);
    free(w);
    m.W = (tern_mat){.data = m.data, .dtype = TERN_DTYPE_U8, .rows = rows, .cols = cols, .bits = bits,
                     .group = group, .scales = m.scales, .biases = m.biases};
    return m;
}

/* f16 bit patterns with exponents spanning 2^-9 .. 2^2, random sign. */
static uint16_t random_f16(void) {
    uint64_t r = rnd_u64();
    uint16_t e = (uint16_t)(6 + r % 12), man = (uint16_t)((r >> 8) & 0x3ff), s = (uint16_t)((r >> 20) & 1);
    return (uint16_t)(s << 15 | e << 10 | man);
}

static test_mat make_float(int64_t rows, int64_t cols, int dtype) {
    test_mat m = {0};
    size_t n = (size_t)(rows * cols);
    if (dtype == TERN_DTYPE_F16) {
        uint16_t *h = xmalloc(n * 2);
        for (size_t i = 0; i < n; i++) h[i] = random_f16();
        m.data = h;
    } else {
        float *w = random_weights(rows, cols, 0);
        if (dtype == TERN_DTYPE_BF16) {
            uint16_t *h = xmalloc(n * 2);
            for (size_t i = 0; i < n; i++) h[i] = tern_f32_to_bf16(w[i]);
            free(w);
            m.data = h;
        } else {
            m.data = w;
        }
    }
    m.W = (tern_mat){.data = m.data, .dtype = dtype, .rows = rows, .cols = cols};
    return m;
}

static void free_mat(test_mat *m) {
    free(m->data);
    free(m->scales);
    free(m->biases);
}

static float *random_x(int64_t n) {
    float *x = xmalloc((size_t)n * sizeof(float));
    float mean = 0.3f * rnd_normal();   /* a nonzero mean makes sum(x) per group large */
    for (int64_t i = 0; i < n; i++) x[i] = mean + rnd_normal();
    return x;
}

/* Row r's exact product (double) and the magnitude M and chain length k of
 * the error bound (file comment). */
static void reference_row(const tern_mat *W, int64_t r, const float *x, double *dot, double *M, double *k) {
    int64_t K = W->cols;
    float *w = xmalloc((size_t)K * sizeof(float));
    tern_mat_row(W, r, w);
    double d = 0, m = 0;
    for (int64_t c = 0; c < K; c++) {
        d += (double)w[c] * x[c];
        if (W->bits) {
            int64_t g = c / W->group, ng = K / W->group;
            double b = tern_bf16_to_f32(W->biases[r * ng + g]);
            m += fabs((double)x[c]) * (fabs((double)w[c] - b) + fabs(b));
        } else {
            m += fabs((double)w[c] * x[c]);
        }
    }
    free(w);
    *dot = d;
    *M = m;
    *k = W->bits ? (double)W->group / 8 + 2.0 * (double)(K / W->group) + 8 : (double)K / 8 + 8;
}

/* Every row of W times x on variant isa, checked against the reference. */
static void check_gemv(tern_isa isa, const tern_mat *W, const char *what) {
    float *x = random_x(W->cols);
    float *prep = xmalloc(tern_gemv_prep_len(W) * sizeof(float));
    float *y = xmalloc((size_t)W->rows * sizeof(float));
    tern_gemv_prep(W, x, prep);
    tern_gemv(isa, W, 0, W->rows, prep, y);
    double worst = 0;
    for (int64_t r = 0; r < W->rows; r++) {
        double ref, M, k;
        reference_row(W, r, x, &ref, &M, &k);
        double err = fabs((double)y[r] - ref), tol = k * U * M;
        cr_assert(err <= tol, "%s %s %lldx%lld row %lld: got %.9g want %.9g (err %.3g > tol %.3g)", what,
                  tern_isa_name(isa), (long long)W->rows, (long long)W->cols, (long long)r, y[r], ref, err, tol);
        if (tol > 0 && err / tol > worst) worst = err / tol;
    }
    cr_log_info("quant: %s %s %lldx%lld worst err/tol %.3f", what, tern_isa_name(isa), (long long)W->rows,
                (long long)W->cols, worst);
    free(x);
    free(prep);
    free(y);
}

/* ---- GEMV -------------------------------------------------------------- */

static const int64_t QCOLS[] = {32, 64, 96, 2048 + 64};
static const int64_t ROWS[] = {1, 7, 17, 33};

Test(quant, gemv_quantized_every_variant) {
    for (int bits = 4; bits <= 8; bits += 4)
        for (int group = 32; group <= 64; group += 32)
            for (size_t ci = 0; ci < sizeof QCOLS / sizeof *QCOLS; ci++)
                for (size_t ri = 0; ri < sizeof ROWS / sizeof *ROWS; ri++) {
                    if (QCOLS[ci] % group) continue;
                    test_mat m = make_quant(ROWS[ri], QCOLS[ci], bits, group);
                    cr_assert(tern_gemv_supported(&m.W));
                    char what[32];
                    snprintf(what, sizeof what, "q%d/g%d", bits, group);
                    for (int v = 0; v < N_ISAS; v++)
                        if (isa_runs(ISAS[v])) check_gemv(ISAS[v], &m.W, what);
                    free_mat(&m);
                }
}

Test(quant, gemv_float_every_variant) {
    static const int64_t cols[] = {1, 15, 17, 32, 96, 2055, 2048 + 64};
    static const int dtypes[] = {TERN_DTYPE_F32, TERN_DTYPE_F16, TERN_DTYPE_BF16};
    static const char *names[] = {"f32", "f16", "bf16"};
    for (int d = 0; d < 3; d++)
        for (size_t ci = 0; ci < sizeof cols / sizeof *cols; ci++)
            for (size_t ri = 0; ri < 3; ri++) {
                test_mat m = make_float(ROWS[ri], cols[ci], dtypes[d]);
                cr_assert(tern_gemv_supported(&m.W));
                for (int v = 0; v < N_ISAS; v++)
                    if (isa_runs(ISAS[v])) check_gemv(ISAS[v], &m.W, names[d]);
                free_mat(&m);
            }
}

Test(quant, gemv_supported_shapes) {
    tern_mat W = {.dtype = TERN_DTYPE_U8, .rows = 4, .cols = 96, .bits = 4, .group = 64};
    cr_expect_not(tern_gemv_supported(&W), "cols not a multiple of group");
    W.group = 16;
    W.cols = 64;
    cr_expect_not(tern_gemv_supported(&W), "group 16");
    W.group = 32;
    W.bits = 6;
    cr_expect_not(tern_gemv_supported(&W), "6-bit");
    W = (tern_mat){.dtype = TERN_DTYPE_F64, .rows = 4, .cols = 8};
    cr_expect_not(tern_gemv_supported(&W), "f64");
}

/* A row range writes exactly its rows, with the bits of a full run. */
Test(quant, gemv_row_range) {
    test_mat m = make_quant(37, 128, 4, 64);
    float *x = random_x(128), *prep = xmalloc(tern_gemv_prep_len(&m.W) * sizeof(float));
    float full[37], part[37];
    tern_gemv_prep(&m.W, x, prep);
    for (int v = 0; v < N_ISAS; v++) {
        if (!isa_runs(ISAS[v])) continue;
        tern_gemv(ISAS[v], &m.W, 0, 37, prep, full);
        for (int i = 0; i < 37; i++) part[i] = -12345.0f;
        tern_gemv(ISAS[v], &m.W, 5, 22, prep, part);
        for (int i = 0; i < 37; i++) {
            if (i >= 5 && i < 22) cr_assert_eq(memcmp(&part[i], &full[i], 4), 0, "%s row %d", tern_isa_name(ISAS[v]), i);
            else cr_assert_eq(part[i], -12345.0f, "%s wrote row %d outside the range", tern_isa_name(ISAS[v]), i);
        }
    }
    free(x);
    free(prep);
    free_mat(&m);
}

/* tern_gemv_batch does per token exactly what tern_gemv does, so the bits
 * must agree (a batch that mixed tokens or reordered sums would not). */
static void check_batch(const tern_mat *W, const char *what) {
    size_t plen = tern_gemv_prep_len(W);
    float *prep = xmalloc(plen * TERN_GEMV_MAX_T * sizeof(float));
    float *yb = xmalloc((size_t)W->rows * TERN_GEMV_MAX_T * sizeof(float));
    float *ys = xmalloc((size_t)W->rows * sizeof(float));
    for (int t = 0; t < TERN_GEMV_MAX_T; t++) {
        float *x = random_x(W->cols);
        tern_gemv_prep(W, x, prep + t * plen);
        free(x);
    }
    for (int v = 0; v < N_ISAS; v++) {
        if (!isa_runs(ISAS[v])) continue;
        for (int T = 1; T <= TERN_GEMV_MAX_T; T++) {
            tern_gemv_batch(ISAS[v], W, 0, W->rows, prep, T, yb);
            for (int t = 0; t < T; t++) {
                tern_gemv(ISAS[v], W, 0, W->rows, prep + t * plen, ys);
                cr_assert_eq(memcmp(ys, yb + (size_t)t * W->rows, (size_t)W->rows * sizeof(float)), 0,
                             "%s %s: batch of %d differs from single calls at token %d", what,
                             tern_isa_name(ISAS[v]), T, t);
            }
        }
    }
    free(prep);
    free(yb);
    free(ys);
}

Test(quant, batch_equals_single_calls) {
    test_mat q4 = make_quant(19, 2048 + 64, 4, 64), q8 = make_quant(19, 96, 8, 32);
    test_mat f32 = make_float(11, 2055, TERN_DTYPE_F32), f16 = make_float(11, 33, TERN_DTYPE_F16);
    test_mat bf16 = make_float(11, 512, TERN_DTYPE_BF16);
    check_batch(&q4.W, "q4");
    check_batch(&q8.W, "q8");
    check_batch(&f32.W, "f32");
    check_batch(&f16.W, "f16");
    check_batch(&bf16.W, "bf16");
    free_mat(&q4);
    free_mat(&q8);
    free_mat(&f32);
    free_mat(&f16);
    free_mat(&bf16);
}

/* The parallel driver: T = 75 runs as a block of 64 tokens (8 groups of 8)
 * and one of 11 (8 + 3) on two threads; each token must equal its single
 * call, and the whole must agree with the reference tern_matmul within the
 * bound. */
Test(quant, qmatmul_matches_single_calls_and_reference) {
    tern_pool *pool = tern_pool_create(2);
    cr_assert(pool);
    test_mat m = make_quant(300, 256, 4, 64);
    int T = 75;
    int64_t N = m.W.rows, K = m.W.cols;
    float *x = xmalloc((size_t)(T * K) * sizeof(float));
    for (int t = 0; t < T; t++) {
        float *xt = random_x(K);
        memcpy(x + t * K, xt, (size_t)K * sizeof(float));
        free(xt);
    }
    float *y = xmalloc((size_t)(T * N) * sizeof(float)), *ys = xmalloc((size_t)N * sizeof(float));
    float *yref = xmalloc((size_t)(T * N) * sizeof(float));
    float *prep = xmalloc(tern_gemv_prep_len(&m.W) * sizeof(float));
    tern_matmul(pool, yref, x, T, &m.W);
    for (int v = 0; v < N_ISAS; v++) {
        if (!isa_runs(ISAS[v])) continue;
        cr_assert_eq(tern_qmatmul(pool, ISAS[v], y, x, T, &m.W), 0);
        for (int t = 0; t < T; t++) {
            tern_gemv_prep(&m.W, x + t * K, prep);
            tern_gemv(ISAS[v], &m.W, 0, N, prep, ys);
            cr_assert_eq(memcmp(ys, y + t * N, (size_t)N * sizeof(float)), 0, "%s token %d",
                         tern_isa_name(ISAS[v]), t);
            for (int64_t r = 0; r < N; r++) {
                double ref, M, k;
                reference_row(&m.W, r, x + t * K, &ref, &M, &k);
                /* tern_matmul's own error is bounded like ours */
                cr_assert(fabs((double)y[t * N + r] - yref[t * N + r]) <= 2 * k * U * M + (double)K / 8 * U * M,
                          "%s token %d row %lld vs tern_matmul", tern_isa_name(ISAS[v]), t, (long long)r);
            }
        }
    }
    free(x);
    free(y);
    free(ys);
    free(yref);
    free(prep);
    free_mat(&m);
    tern_pool_destroy(pool);
}

Test(quant, dot_fast) {
    static const int64_t ns[] = {0, 1, 15, 16, 17, 63, 64, 65, 1000, 2048};
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
        int64_t n = ns[i];
        float *a = random_x(n + 1), *b = random_x(n + 1);
        double ref = 0, M = 0;
        for (int64_t j = 0; j < n; j++) {
            ref += (double)a[j] * b[j];
            M += fabs((double)a[j] * b[j]);
        }
        for (int v = 0; v < N_ISAS; v++) {
            if (!isa_runs(ISAS[v])) continue;
            float d = tern_dot_fast(ISAS[v], a, b, n);
            cr_assert(fabs(d - ref) <= ((double)n / 8 + 8) * U * M, "%s n=%lld: %g vs %g", tern_isa_name(ISAS[v]),
                      (long long)n, d, ref);
        }
        free(a);
        free(b);
    }
}

/* ---- KV cache rows ----------------------------------------------------- */

Test(quant, kv_layout) {
    tern_kvq L;
    /* Qwen3.6: 2 KV heads x 256 (seed-system.md §2c) */
    cr_assert_eq(tern_kvq_init(&L, 2, 256, 16), 0);
    cr_expect_eq(L.row_bytes, 1024);
    cr_assert_eq(tern_kvq_init(&L, 2, 256, 8), 0);
    cr_expect_eq(L.row_bytes, 544);
    cr_expect_eq(L.group, 64);
    cr_expect_eq(L.n_groups, 8);
    cr_assert_eq(tern_kvq_init(&L, 2, 256, 4), 0);
    cr_expect_eq(L.row_bytes, 288);
    cr_expect_eq(L.q_bytes, 256);
    cr_expect_eq(tern_kv_group(96), 32);
    cr_expect_eq(tern_kv_group(16), 16);
    cr_expect_eq(tern_kv_group(40), 40);
    /* 3 heads of 10 at 4 bits: 15 bytes of q padded to 16 */
    cr_assert_eq(tern_kvq_init(&L, 3, 10, 4), 0);
    cr_expect_eq(L.q_bytes, 16);
    cr_expect_eq(L.row_bytes, 16 + 4 * 3);
    cr_expect_eq(tern_kv_row_bytes(30, 10, 4), 28);
    cr_expect_eq(tern_kvq_init(&L, 2, 256, 6), -1);
    cr_expect_eq(tern_kvq_init(&L, 2, 0, 8), -1);
    cr_expect_eq(tern_kvq_init(&L, 2, TERN_KV_MAX_HEAD_DIM + 2, 8), -1);
    cr_expect_eq(tern_kvq_init(&L, 1, 15, 4), -1);
}

/* A K/V-like row: per head a different scale, some outliers, one constant
 * group, and values past the f16 range (which must saturate). */
static void random_kv_row(const tern_kvq *L, float *x) {
    for (int h = 0; h < L->n_heads; h++) {
        float sc = (float)pow(10, 3 * rnd_uniform() - 2), off = sc * rnd_normal();
        for (int d = 0; d < L->head_dim; d++) {
            float v = off + sc * rnd_normal();
            if (rnd_u64() % 53 == 0) v *= 20;
            x[h * L->head_dim + d] = v;
        }
    }
    if (L->row_len >= 2 * L->group) {
        int ng = L->row_len / L->group, g = (int)(rnd_u64() % (uint64_t)ng);
        for (int d = 0; d < L->group; d++) x[g * L->group + d] = -1.5f;
        /* a narrow group far from zero: its spread is below the f16 step at
         * its offset, where rounding bias or scale to nearest would break
         * the half-step bound */
        g = (g + 1) % ng;
        float off = (rnd_u64() & 1 ? 1 : -1) * (float)(100 + 900 * rnd_uniform());
        for (int d = 0; d < L->group; d++) x[g * L->group + d] = off + 0.001f * rnd_normal();
    }
    if (rnd_u64() % 4 == 0) x[rnd_u64() % (uint64_t)L->row_len] = 1e6f;
}

static float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return tern_f16_to_f32(h);
}

Test(quant, kv_roundtrip_within_half_a_step) {
    static const int dims[][2] = {{2, 256}, {1, 16}, {3, 32}, {2, 96}, {2, 40}, {4, 64}};
    for (size_t c = 0; c < sizeof dims / sizeof *dims; c++)
        for (int bits = 4; bits <= 16; bits *= 2) {
            tern_kvq L;
            cr_assert_eq(tern_kvq_init(&L, dims[c][0], dims[c][1], bits), 0);
            float *x = xmalloc((size_t)L.row_len * sizeof(float)), *y = xmalloc((size_t)L.row_len * sizeof(float));
            uint8_t *row = xmalloc(L.row_bytes);
            for (int rep = 0; rep < 20; rep++) {
                random_kv_row(&L, x);
                tern_kv_quantize_row(&L, x, row);
                tern_kv_dequantize_row(&L, row, y);
                for (int i = 0; i < L.row_len; i++) {
                    double xi = x[i] > 65504 ? 65504 : x[i] < -65504 ? -65504 : x[i];
                    double tol;
                    if (bits == 16) {
                        /* round to nearest f16: half an ulp (2^-11 relative,
                         * 2^-25 absolute among subnormals) */
                        tol = fmax(fabs(xi) * 0x1p-11, 0x1p-25);
                    } else {
                        int g = i / L.group;
                        double s = f16_at(row + L.q_bytes + 2 * g), b = f16_at(row + L.q_bytes + 2 * (L.n_groups + g));
                        /* half a step, plus fp32 rounding of q*s+b and of
                         * (x-b)/s at a rounding tie */
                        tol = s / 2 + 4 * U * (fabs(xi) + fabs(b) + s);
                        int constant = 1;
                        for (int d = 0; d < L.group; d++) constant &= x[g * L.group + d] == -1.5f;
                        if (constant) {
                            /* -1.5 is an f16: scale 0, exact */
                            cr_assert_eq(s, 0.0, "constant group %d got scale %g", g, s);
                            cr_assert_eq(y[i], -1.5f);
                        }
                    }
                    cr_assert(fabs(y[i] - xi) <= tol, "kv%d %dx%d elem %d: %.9g -> %.9g (tol %.3g)", bits,
                              L.n_heads, L.head_dim, i, xi, y[i], tol);
                }
            }
            free(x);
            free(y);
            free(row);
        }
}

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("f16c"))) static uint16_t hw_f16(float f) { return (uint16_t)_cvtss_sh(f, 0); }

/* bits 16 stores exactly what the hardware's round-to-nearest-even does,
 * ties and subnormals included. */
Test(quant, kv16_matches_hardware_rounding) {
    if (!tern_isa_supported(TERN_ISA_AVX2)) cr_skip_test("no F16C");
    tern_kvq L;
    cr_assert_eq(tern_kvq_init(&L, 1, 512, 16), 0);
    float x[512];
    uint8_t row[1024];
    for (int rep = 0; rep < 200; rep++) {
        for (int i = 0; i < 512; i++) {
            uint32_t u = (uint32_t)rnd_u64();
            if (i % 4 == 0) u = (u & 0x80000000u) | ((uint32_t)(100 + rnd_u64() % 45) << 23) | (u & 0x7fffffu);
            if (i % 4 == 1) u = (u & 0xffffe000u) | 0x1000u;   /* a tie */
            memcpy(&x[i], &u, 4);
            if (!(fabsf(x[i]) <= 65504)) x[i] = 1.0f;
        }
        tern_kv_quantize_row(&L, x, row);
        for (int i = 0; i < 512; i++) {
            uint16_t h;
            memcpy(&h, row + 2 * i, 2);
            cr_assert_eq(h, hw_f16(x[i]), "%a -> %04x, hardware %04x", x[i], h, hw_f16(x[i]));
        }
    }
}
#endif

/* K and V caches of n rows (stride bytes apart, >= row_bytes) holding
 * random rows, and their fp32 dequantization [n, row_len]. */
typedef struct {
    tern_kvq L;
    size_t stride;
    uint8_t *rows;
    float *deq;
} kv_cache;

static kv_cache make_cache(int n_heads, int head_dim, int bits, int n, size_t extra) {
    kv_cache c;
    cr_assert_eq(tern_kvq_init(&c.L, n_heads, head_dim, bits), 0);
    c.stride = c.L.row_bytes + extra;
    c.rows = xmalloc(c.stride * (size_t)n);
    memset(c.rows, 0xa5, c.stride * (size_t)n);
    c.deq = xmalloc((size_t)n * c.L.row_len * sizeof(float));
    float *x = xmalloc((size_t)c.L.row_len * sizeof(float));
    for (int j = 0; j < n; j++) {
        random_kv_row(&c.L, x);
        tern_kv_quantize_row(&c.L, x, c.rows + j * c.stride);
        tern_kv_dequantize_row(&c.L, c.rows + j * c.stride, c.deq + (size_t)j * c.L.row_len);
    }
    free(x);
    return c;
}

static void free_cache(kv_cache *c) {
    free(c->rows);
    free(c->deq);
}

/* |bias| of the group holding element e of row j (0 for bits 16). */
static double bias_at(const kv_cache *c, int j, int e) {
    if (c->L.bits == 16) return 0;
    return fabs(f16_at(c->rows + j * c->stride + c->L.q_bytes + 2 * (c->L.n_groups + e / c->L.group)));
}

static const int KV_DIMS[][2] = {{2, 256}, {1, 16}, {2, 32}, {3, 96}, {2, 40}};

/* scores on quantized rows vs the double dot with the dequantized rows. */
Test(quant, kv_scores_match_dequantized) {
    int n = 37;
    static const int nqs[] = {1, 3, 8, 11};
    for (size_t dc = 0; dc < sizeof KV_DIMS / sizeof *KV_DIMS; dc++)
        for (int bits = 4; bits <= 16; bits *= 2)
            for (size_t qi = 0; qi < sizeof nqs / sizeof *nqs; qi++) {
                int nh = KV_DIMS[dc][0], hd = KV_DIMS[dc][1], nq = nqs[qi];
                kv_cache c = make_cache(nh, hd, bits, n, qi % 2 ? 0 : 6);
                size_t q_stride = 2 * (size_t)hd;   /* as the engine's [query | gate] rows */
                float *q = random_x((int64_t)(nq * q_stride));
                float *s = xmalloc((size_t)(nq * n) * sizeof(float));
                float scale = 1.0f / sqrtf((float)hd);
                for (int head = 0; head < nh; head++)
                    for (int v = 0; v < N_ISAS; v++) {
                        if (!isa_runs(ISAS[v])) continue;
                        tern_kv_scores(ISAS[v], &c.L, head, q, nq, q_stride, c.rows, c.stride, n, scale, s);
                        for (int i = 0; i < nq; i++)
                            for (int j = 0; j < n; j++) {
                                const float *k = c.deq + (size_t)j * c.L.row_len + head * hd;
                                const float *qv = q + i * q_stride;
                                double ref = 0, M = 0;
                                for (int d = 0; d < hd; d++) {
                                    ref += (double)qv[d] * k[d];
                                    M += fabs((double)qv[d]) * (fabs((double)k[d]) + 2 * bias_at(&c, j, head * hd + d));
                                }
                                double kk = (double)hd / 8 + 2.0 * hd / c.L.group + 8;
                                double tol = (kk * U * M + U * fabs(ref)) * scale;
                                double err = fabs((double)s[i * n + j] - ref * scale);
                                cr_assert(err <= tol, "kv%d %dx%d head %d %s q%d row %d: %.9g vs %.9g (tol %.3g)",
                                          bits, nh, hd, head, tern_isa_name(ISAS[v]), i, j, s[i * n + j],
                                          ref * scale, tol);
                            }
                    }
                free(q);
                free(s);
                free_cache(&c);
            }
}

/* o += p V on quantized rows vs the same sum over the dequantized rows. */
Test(quant, kv_accum_matches_dequantized) {
    int n = 37;
    static const int nqs[] = {1, 2, 8, 9};
    for (size_t dc = 0; dc < sizeof KV_DIMS / sizeof *KV_DIMS; dc++)
        for (int bits = 4; bits <= 16; bits *= 2)
            for (size_t qi = 0; qi < sizeof nqs / sizeof *nqs; qi++) {
                int nh = KV_DIMS[dc][0], hd = KV_DIMS[dc][1], nq = nqs[qi];
                kv_cache c = make_cache(nh, hd, bits, n, qi % 2 ? 10 : 0);
                float *p = xmalloc((size_t)(nq * n) * sizeof(float));
                for (int i = 0; i < nq * n; i++) p[i] = (float)rnd_uniform() / (float)n;
                size_t o_stride = (size_t)hd + 3;
                float *o0 = random_x((int64_t)(nq * o_stride)), *o = xmalloc(nq * o_stride * sizeof(float));
                for (int head = 0; head < nh; head++)
                    for (int v = 0; v < N_ISAS; v++) {
                        if (!isa_runs(ISAS[v])) continue;
                        memcpy(o, o0, nq * o_stride * sizeof(float));
                        tern_kv_accum(ISAS[v], &c.L, head, p, nq, c.rows, c.stride, n, o, o_stride);
                        for (int i = 0; i < nq; i++)
                            for (int d = 0; d < hd; d++) {
                                double ref = o0[i * o_stride + d], M = fabs(ref);
                                for (int j = 0; j < n; j++) {
                                    double vj = c.deq[(size_t)j * c.L.row_len + head * hd + d];
                                    ref += p[i * n + j] * vj;
                                    M += p[i * n + j] * (fabs(vj) + 2 * bias_at(&c, j, head * hd + d));
                                }
                                double tol = ((double)n + 8) * U * M;
                                double err = fabs((double)o[i * o_stride + d] - ref);
                                cr_assert(err <= tol, "kv%d %dx%d head %d %s q%d d%d: %.9g vs %.9g (tol %.3g)", bits,
                                          nh, hd, head, tern_isa_name(ISAS[v]), i, d, o[i * o_stride + d], ref, tol);
                            }
                        /* the padding between queries' outputs is left alone */
                        for (int i = 0; i < nq; i++)
                            for (size_t d = (size_t)hd; d < o_stride; d++)
                                cr_assert_eq(o[i * o_stride + d], o0[i * o_stride + d]);
                    }
                free(p);
                free(o0);
                free(o);
                free_cache(&c);
            }
}

/* The whole step, softmax included, on quantized rows vs tern_attend (the
 * fp32 reference) on the same rows dequantized. Score errors e_j (bounded
 * as above, ~1e-6 of the score's magnitude) move each probability by a
 * factor exp(e_j - sum p e), so the output moves by at most 2 max e_j
 * max|v|; both softmaxes and sums add (n + 16) u max|v| each. */
Test(quant, kv_attend_matches_tern_attend) {
    static const int nqs[] = {1, 8};
    for (size_t dc = 0; dc < sizeof KV_DIMS / sizeof *KV_DIMS; dc++)
        for (int bits = 4; bits <= 16; bits *= 2)
            for (size_t qi = 0; qi < 2; qi++)
                for (int n = 1; n <= 300; n += 299) {
                    int nh = KV_DIMS[dc][0], hd = KV_DIMS[dc][1], nq = nqs[qi];
                    kv_cache k = make_cache(nh, hd, bits, n, 0), v = make_cache(nh, hd, bits, n, 0);
                    size_t q_stride = 2 * (size_t)hd;
                    float *q = random_x((int64_t)(nq * q_stride));
                    float *s = xmalloc((size_t)(nq * n) * sizeof(float)), *sref = xmalloc((size_t)n * sizeof(float));
                    float *o = xmalloc((size_t)(nq * hd) * sizeof(float)), *oref = xmalloc((size_t)hd * sizeof(float));
                    float scale = 1.0f / sqrtf((float)hd);
                    for (int head = 0; head < nh; head++)
                        for (int vi = 0; vi < N_ISAS; vi++) {
                            if (!isa_runs(ISAS[vi])) continue;
                            tern_kv_attend(ISAS[vi], &k.L, head, q, nq, q_stride, k.rows, v.rows, k.stride, n, scale,
                                           s, o, hd);
                            for (int i = 0; i < nq; i++) {
                                const float *qv = q + i * q_stride;
                                tern_attend(oref, qv, k.deq + head * hd, v.deq + head * hd, n, k.L.row_len, hd, scale,
                                            sref);
                                double emax = 0, vmax = 0;
                                for (int j = 0; j < n; j++) {
                                    double M = 0;
                                    for (int d = 0; d < hd; d++) {
                                        double kd = k.deq[(size_t)j * k.L.row_len + head * hd + d];
                                        M += fabs((double)qv[d]) * (fabs(kd) + 2 * bias_at(&k, j, head * hd + d));
                                        vmax = fmax(vmax, fabs((double)v.deq[(size_t)j * v.L.row_len + head * hd + d]));
                                    }
                                    /* ours and tern_attend's (chain hd/8 + 3) */
                                    emax = fmax(emax, 2 * ((double)hd / 8 + 2.0 * hd / k.L.group + 8) * U * M * scale);
                                }
                                double tol = (2 * emax + 2 * ((double)n + 16) * U) * vmax;
                                for (int d = 0; d < hd; d++)
                                    cr_assert(fabs((double)o[i * hd + d] - oref[d]) <= tol,
                                              "kv%d %dx%d head %d %s n=%d q%d d%d: %.9g vs %.9g (tol %.3g)", bits, nh,
                                              hd, head, tern_isa_name(ISAS[vi]), n, i, d, o[i * hd + d], oref[d], tol);
                            }
                        }
                    free(q);
                    free(s);
                    free(sref);
                    free(o);
                    free(oref);
                    free_cache(&k);
                    free_cache(&v);
                }
}
