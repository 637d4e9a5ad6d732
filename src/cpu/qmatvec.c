/* Fast GEMV kernels (see qmatvec.h). One file in three banners, one per
 * instruction set, each holding the same kernels:
 *
 *   q4     affine 4-bit rows: 16 packed bytes (32 elements) per step
 *   q8     affine 8-bit rows: 16 bytes per step
 *   float  bf16 / f16 / f32 rows
 *
 * Every kernel is written once as an always-inline template over T (tokens)
 * and instantiated for T = 1..TERN_GEMV_MAX_T by a switch, so the compiler
 * keeps the T accumulators in registers. Per token the operations do not
 * depend on T, which is why a batch reproduces single calls bit for bit.
 *
 * The SIMD variants are compiled with per-function target attributes (the
 * build has no -march flag) and only ever called after tern_isa_supported. */
#include "cpu/qmatvec.h"

#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "cpu/simd.h"
#include "cpu/quant.h"
#include "model/safetensors.h"
#include "util/half.h"

/* ---- CPU features ------------------------------------------------------ */

#if TERN_X86
/* F16C by cpuid leaf 1: clang's __builtin_cpu_supports does not know the
 * name. (The OS's saving of the AVX state is covered by the avx2 check.) */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

int tern_isa_supported(tern_isa isa) {
    if (isa == TERN_ISA_C) return 1;
#if TERN_X86
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    if (isa == TERN_ISA_AVX2) return avx2;
    if (isa == TERN_ISA_AVX512)
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
    return 0;
}

tern_isa tern_isa_best(void) {
    if (tern_isa_supported(TERN_ISA_AVX512)) return TERN_ISA_AVX512;
    if (tern_isa_supported(TERN_ISA_AVX2)) return TERN_ISA_AVX2;
    return TERN_ISA_C;
}

const char *tern_isa_name(tern_isa isa) {
    switch (isa) {
    case TERN_ISA_C: return "c";
    case TERN_ISA_AVX2: return "avx2";
    case TERN_ISA_AVX512: return "avx512";
    default: return "?";
    }
}

/* ---- prepared input ---------------------------------------------------- */

int tern_gemv_supported(const tern_mat *W) {
    if (W->bits == 0)
        return W->dtype == TERN_DTYPE_F32 || W->dtype == TERN_DTYPE_F16 || W->dtype == TERN_DTYPE_BF16;
    if (W->bits != 4 && W->bits != 8) return 0;
    return W->group > 0 && W->group % 32 == 0 && W->cols % W->group == 0;
}

size_t tern_gemv_prep_len(const tern_mat *W) {
    return (size_t)W->cols + (W->bits ? (size_t)(W->cols / W->group) : 0);
}

void tern_gemv_prep(const tern_mat *W, const float *x, float *prep) {
    int64_t K = W->cols;
    if (W->bits == 4) {
        for (int64_t c = 0; c < K; c += 32)
            for (int j = 0; j < 16; j++) {
                prep[c + j] = x[c + 2 * j];
                prep[c + 16 + j] = x[c + 2 * j + 1];
            }
    } else {
        memcpy(prep, x, (size_t)K * sizeof(float));
    }
    if (W->bits) {
        /* accumulated in double: the group sum multiplies the bias, the
         * largest term of a group, so it is worth getting exactly right */
        float *gs = prep + K;
        for (int64_t g = 0; g < K / W->group; g++) {
            double s = 0;
            for (int64_t c = g * W->group; c < (g + 1) * W->group; c++) s += x[c];
            gs[g] = (float)s;
        }
    }
}

/* Arguments every row kernel takes: rows [r0, r1) of W, T prepared vectors
 * plen floats apart, y[t * ldy + n]. */
typedef void (*rows_fn)(const tern_mat *W, int64_t r0, int64_t r1, const float *prep, size_t plen, int T,
                        float *y, int64_t ldy);

/* Expands to a function `name` that calls the template `tmpl` with a
 * compile-time T. */
#define INSTANTIATE_T(name, tmpl, attr)                                                                    \
    static attr void name(const tern_mat *W, int64_t r0, int64_t r1, const float *prep, size_t plen, int T, \
                          float *y, int64_t ldy) {                                                         \
        switch (T) {                                                                                       \
        case 1: tmpl(W, r0, r1, prep, plen, 1, y, ldy); break;                                             \
        case 2: tmpl(W, r0, r1, prep, plen, 2, y, ldy); break;                                             \
        case 3: tmpl(W, r0, r1, prep, plen, 3, y, ldy); break;                                             \
        case 4: tmpl(W, r0, r1, prep, plen, 4, y, ldy); break;                                             \
        case 5: tmpl(W, r0, r1, prep, plen, 5, y, ldy); break;                                             \
        case 6: tmpl(W, r0, r1, prep, plen, 6, y, ldy); break;                                             \
        case 7: tmpl(W, r0, r1, prep, plen, 7, y, ldy); break;                                             \
        default: tmpl(W, r0, r1, prep, plen, 8, y, ldy); break;                                            \
        }                                                                                                  \
    }

#define MAXT TERN_GEMV_MAX_T

/* ==== portable C ========================================================= */

/* 16 lanes of partial sums, folded pairwise: the shape the SIMD variants
 * have, so the portable path has the same short accumulation chains. */
INLINE float sum16(const float *a) {
    float s[8];
    for (int i = 0; i < 8; i++) s[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++) s[i] += s[i + 4];
    return (s[0] + s[2]) + (s[1] + s[3]);
}

/* Both quantized formats: per group, 16-lane sums of q * x, then
 * scale * that + bias * sum(x). `bits` is a compile-time constant. */
INLINE void quant_c(const tern_mat *W, int64_t r0, int64_t r1, const float *prep, size_t plen, const int T,
                    float *y, int64_t ldy, const int bits) {
    int64_t K = W->cols, G = W->group, ng = K / G;
    size_t rb = tern_q_row_bytes(K, bits);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *q = (const uint8_t *)W->data + (size_t)r * rb;
        const uint16_t *sc = W->scales + r * ng, *bi = W->biases + r * ng;
        float tot[MAXT] = {0}, bsum[MAXT] = {0};
        for (int64_t g = 0; g < ng; g++) {
            float acc[MAXT][16] = {{0}};
            int64_t step = bits == 4 ? 32 : 16;
            for (int64_t c = g * G; c < (g + 1) * G; c += step) {
                float w[32];
                if (bits == 4) {
                    const uint8_t *b = q + c / 2;
                    for (int j = 0; j < 16; j++) { w[j] = (float)(b[j] & 15); w[16 + j] = (float)(b[j] >> 4); }
                } else {
                    for (int j = 0; j < 16; j++) w[j] = (float)q[c + j];
                }
                UNROLL
                for (int t = 0; t < T; t++) {
                    const float *xt = prep + (size_t)t * plen + c;
                    for (int j = 0; j < 16; j++) acc[t][j] += w[j] * xt[j];
                    if (bits == 4)
                        for (int j = 0; j < 16; j++) acc[t][j] += w[16 + j] * xt[16 + j];
                }
            }
            float s = tern_bf16_to_f32(sc[g]), b = tern_bf16_to_f32(bi[g]);
            UNROLL
            for (int t = 0; t < T; t++) {
                tot[t] += s * sum16(acc[t]);
                bsum[t] += b * prep[(size_t)t * plen + K + g];
            }
        }
        UNROLL
        for (int t = 0; t < T; t++) y[t * ldy + r] = tot[t] + bsum[t];
    }
}

INLINE void q4_c_t(const tern_mat *W, int64_t r0, int64_t r1, const float *prep, size_t plen, const int T,
                   float *y, int64_t ldy) {
    quant_c(W, r0, r1, prep, plen, T, y, ldy, 4);
}
INLINE void q8_c_t(const tern_mat *W, int64_t r0, int64_t r1, const float *prep, size_t plen, const int T,
                   float *y, int64_t ldy) {
    quant_c(W, r0, r1, prep, plen, T, y, ldy, 8);
}

INLINE float widen(const void *row, int64_t i, int dtype) {
    if (dtype == TERN_DTYPE_F32) return ((const float *)row)[i];
    if (dtype == TERN_DTYPE_BF16) return tern_bf16_to_f32(((const uint16_t *)row)[i]);
    return tern_f16_to_f32(((const uint16_t *)row)[i]);
}

INLINE void float_c(const tern_mat *W, int64_t r0, int64_t r1, const float *prep, size_t plen, const int T,
                    float *y, int64_t ldy, const int dtype) {
    int64_t K = W->cols;
    size_t esz = dtype == TERN_DTYPE_F32 ? 4 : 2;
    for (int64_t r = r0; r < r1; r++) {
        const void *row = (const uint8_t *)W->data + (size_t)r * (size_t)K * esz;
        float acc[MAXT][16] = {{0}};
        int64_t c = 0;
        for (; c + 16 <= K; c += 16) {
            float w[16];
            for (int j = 0; j < 16; j++) w[j] = widen(row, c + j, dtype);
            UNROLL
            for (int t = 0; t < T; t++)
                for (int j = 0; j < 16; j++) acc[t][j] += w[j] * prep[(size_t)t * plen + c + j];
        }
        UNROLL
        for (int t = 0; t < T; t++) {
            float s = sum16(acc[t]);
            for (int64_t i = c; i < K; i++) s += widen(row, i, dtype) * prep[(size_t)t * plen + i];
            y[t * ldy + r] = s;
        }
    }
}

INLINE void f32_c_t(const tern_mat *W, int64_t r0, int64_t r1, const float *prep, size_t plen, const int T,
                    float *y, int64_t ldy) {
    float_c(W, r0, r1, prep, plen, T, y, ldy, TERN_DTYPE_F32);
}
INLINE void f16_c_t(const tern_mat *W, int64_t r0, int64_t r1, const float *prep, size_t plen, const int T,
                    float *y, int64_t ldy) {
    float_c(W, r0, r1, prep, plen, T, y, ldy, TERN_DTYPE_F16);
}
INLINE void bf16_c_t(const tern_mat *W, int64_t r0, int64_t r1, const float *prep, size_t plen, const int T,
                     float *y, int64_t ldy) {
    float_c(W, r0, r1, prep, plen, T, y, ldy, TERN_DTYPE_BF16);
}

INSTANTIATE_T(q4_c, q4_c_t, )
INSTANTIATE_T(q8_c, q8_c_t, )
INSTANTIATE_T(f32_c, f32_c_t, )
INSTANTIATE_T(f16_c, f16_c_t, )
INSTANTIATE_T(bf16_c, bf16_c_t, )

/* The SIMD kernels read the prepared x of every token once per weight
 * block; when T tokens' x outgrow L1 (48 KiB here), those reads come from
 * L2 and dominate: at 512x2048 q4, T = 8 took 3.4x the time of T = 4.
 * So a row walks its groups in chunks whose x for all tokens takes at most
 * X_CHUNK_FLOATS (16 KiB), ROW_BLOCK rows per chunk, parking the running
 * sums in between: T = 8 then takes 1.8x the time of T = 4 (chunks of 8 to
 * 32 KiB measured the same). Per token the operations and their order are
 * those of the unchunked loop. */
#define X_CHUNK_FLOATS 4096
#define ROW_BLOCK 16

static inline int64_t chunk_groups(int T, int64_t G) {
    int64_t gc = X_CHUNK_FLOATS / ((int64_t)T * G);
    return gc < 1 ? 1 : gc;
}

/* Weights stream from DRAM (routed experts are used once per token, and
 * the resident weights are far larger than any cache), and the hardware
 * prefetcher alone kept too few lines in flight for a loop this dense: a
 * software prefetch 4 KiB ahead, one per 64-byte line, raised cold
 * 1-thread AVX-512 GEMV at 512x2048 from 6.6 to ~9.0 GB/s (q4) and from
 * 8.4 to ~12 GB/s (q8); 1 KiB ahead gave 8.2 (q4), 2 KiB 8.9. It costs
 * ~10% when the matrix sits in L2. A burst of prefetches for a whole row
 * at the row's start gained nothing. Past a matrix's end it touches the
 * next blob, which is harmless. */
#define PREFETCH_AHEAD 4096

#if TERN_X86

/* ==== AVX2 + FMA ========================================================= */

/* Quantized rows, 8 lanes: groups [g0, g1) of one row into the per-token
 * running sums tot (vector) and bsum (bias * sum(x)). 4-bit: the 16 bytes
 * of a 32-element block widen in two halves (bytes 0-7, 8-15); their low
 * nibbles meet prepared x[0..15] and high nibbles x[16..31] (see
 * tern_gemv_prep). */
AVX2 INLINE void groups_avx2(const uint8_t *q, const uint16_t *sc, const uint16_t *bi, int64_t g0, int64_t g1,
                             int64_t G, int64_t K, const float *prep, size_t plen, const int T, const int bits,
                             __m256 *tot, float *bsum) {
    const __m256i m15 = _mm256_set1_epi32(15);
    /* one prefetch per 64-byte line: every pf_mask + 1 groups */
    int64_t gbytes = G * bits / 8, pf_mask = gbytes >= 64 ? 0 : 64 / gbytes - 1;
    for (int64_t g = g0; g < g1; g++) {
        if (!(g & pf_mask)) _mm_prefetch((const char *)q + g * gbytes + PREFETCH_AHEAD, _MM_HINT_T0);
        __m256 acc[MAXT];
        UNROLL
        for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
        if (bits == 4) {
            for (int64_t c = g * G; c < (g + 1) * G; c += 32) {
                __m128i b16 = _mm_loadu_si128((const __m128i *)(q + c / 2));
                __m256i v0 = _mm256_cvtepu8_epi32(b16), v1 = _mm256_cvtepu8_epi32(_mm_srli_si128(b16, 8));
                __m256 l0 = _mm256_cvtepi32_ps(_mm256_and_si256(v0, m15));
                __m256 l1 = _mm256_cvtepi32_ps(_mm256_and_si256(v1, m15));
                __m256 h0 = _mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4));
                __m256 h1 = _mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4));
                UNROLL
                for (int t = 0; t < T; t++) {
                    const float *xt = prep + (size_t)t * plen + c;
                    acc[t] = _mm256_fmadd_ps(l0, _mm256_loadu_ps(xt), acc[t]);
                    acc[t] = _mm256_fmadd_ps(l1, _mm256_loadu_ps(xt + 8), acc[t]);
                    acc[t] = _mm256_fmadd_ps(h0, _mm256_loadu_ps(xt + 16), acc[t]);
                    acc[t] = _mm256_fmadd_ps(h1, _mm256_loadu_ps(xt + 24), acc[t]);
                }
            }
        } else {
            for (int64_t c = g * G; c < (g + 1) * G; c += 8) {
                __m256 w = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + c))));
                UNROLL
                for (int t = 0; t < T; t++)
                    acc[t] = _mm256_fmadd_ps(w, _mm256_loadu_ps(prep + (size_t)t * plen + c), acc[t]);
            }
        }
        __m256 s = _mm256_set1_ps(tern_bf16_to_f32(sc[g]));
        float b = tern_bf16_to_f32(bi[g]);
        UNROLL
        for (int t = 0; t < T; t++) {
            tot[t] = _mm256_fmadd_ps(acc[t], s, tot[t]);
            bsum[t] += b * prep[(size_t)t * plen + K + g];
        }
    }
}

/* The entry points of one ISA: a kernel per weight kind (the quantized
 * ones through quant_ISA, the float ones through float_ISA), each
 * instantiated for 1..8 tokens. */
#define DEFINE_ROW_KERNELS(isa, ATTR)                                                                       \
    ATTR INLINE void q4_##isa##_t(const tern_mat *W, int64_t r0, int64_t r1, const float *prep, size_t plen, \
                                  const int T, float *y, int64_t ldy) {                                     \
        quant_##isa(W, r0, r1, prep, plen, T, y, ldy, 4);                                                   \
    }                                                                                                       \
    ATTR INLINE void q8_##isa##_t(const tern_mat *W, int64_t r0, int64_t r1, const float *prep, size_t plen, \
                                  const int T, float *y, int64_t ldy) {                                     \
        quant_##isa(W, r0, r1, prep, plen, T, y, ldy, 8);                                                   \
    }                                                                                                       \
    ATTR INLINE void f32_##isa##_t(const tern_mat *W, int64_t r0, int64_t r1, const float *prep,             \
                                   size_t plen, const int T, float *y, int64_t ldy) {                       \
        float_##isa(W, r0, r1, prep, plen, T, y, ldy, TERN_DTYPE_F32);                                      \
    }                                                                                                       \
    ATTR INLINE void f16_##isa##_t(const tern_mat *W, int64_t r0, int64_t r1, const float *prep,             \
                                   size_t plen, const int T, float *y, int64_t ldy) {                       \
        float_##isa(W, r0, r1, prep, plen, T, y, ldy, TERN_DTYPE_F16);                                      \
    }                                                                                                       \
    ATTR INLINE void bf16_##isa##_t(const tern_mat *W, int64_t r0, int64_t r1, const float *prep,            \
                                    size_t plen, const int T, float *y, int64_t ldy) {                      \
        float_##isa(W, r0, r1, prep, plen, T, y, ldy, TERN_DTYPE_BF16);                                     \
    }                                                                                                       \
    INSTANTIATE_T(q4_##isa, q4_##isa##_t, ATTR)                                                             \
    INSTANTIATE_T(q8_##isa, q8_##isa##_t, ATTR)                                                             \
    INSTANTIATE_T(f32_##isa, f32_##isa##_t, ATTR)                                                           \
    INSTANTIATE_T(f16_##isa, f16_##isa##_t, ATTR)                                                           \
    INSTANTIATE_T(bf16_##isa, bf16_##isa##_t, ATTR)

/* The row driver of the quantized products, written once for both ISAs:
 * VEC the vector type, ZERO its zero, GROUPS its groups_ function (the
 * ISA's own inner loop), SUM its horizontal sum. */
#define DEFINE_QUANT_ROWS(NAME, ISA, VEC, ZERO, GROUPS, SUM)                                                  \
ISA INLINE void NAME(const tern_mat *W, int64_t r0, int64_t r1, const float *prep, size_t plen,               \
                            const int T, float *y, int64_t ldy, const int bits) {                             \
    int64_t K = W->cols, G = W->group, ng = K / G, gc = chunk_groups(T, G);                                   \
    size_t rb = tern_q_row_bytes(K, bits);                                                                    \
    const uint8_t *Q = W->data;                                                                               \
    if (gc >= ng) {                                                                                           \
        for (int64_t r = r0; r < r1; r++) {                                                                   \
            VEC tot[MAXT];                                                                                    \
            float bsum[MAXT] = {0};                                                                           \
            UNROLL                                                                                            \
            for (int t = 0; t < T; t++) tot[t] = ZERO();                                                      \
            GROUPS(Q + (size_t)r * rb, W->scales + r * ng, W->biases + r * ng, 0, ng, G, K, prep, plen, T,    \
                        bits, tot, bsum);                                                                     \
            UNROLL                                                                                            \
            for (int t = 0; t < T; t++) y[t * ldy + r] = SUM(tot[t]) + bsum[t];                               \
        }                                                                                                     \
        return;                                                                                               \
    }                                                                                                         \
    /* x of all tokens would not stay in L1: blocks of ROW_BLOCK rows walk                                    \
     * the columns in chunks, parking their running sums between chunks */                                    \
    VEC ptot[ROW_BLOCK][MAXT];                                                                                \
    float pbsum[ROW_BLOCK][MAXT];                                                                             \
    for (int64_t rb0 = r0; rb0 < r1; rb0 += ROW_BLOCK) {                                                      \
        int64_t nr = r1 - rb0 < ROW_BLOCK ? r1 - rb0 : ROW_BLOCK;                                             \
        for (int64_t i = 0; i < nr; i++)                                                                      \
            for (int t = 0; t < T; t++) { ptot[i][t] = ZERO(); pbsum[i][t] = 0; }                             \
        for (int64_t g0 = 0; g0 < ng; g0 += gc) {                                                             \
            int64_t g1 = g0 + gc < ng ? g0 + gc : ng;                                                         \
            for (int64_t i = 0; i < nr; i++) {                                                                \
                int64_t r = rb0 + i;                                                                          \
                VEC tot[MAXT];                                                                                \
                float bsum[MAXT];                                                                             \
                UNROLL                                                                                        \
                for (int t = 0; t < T; t++) { tot[t] = ptot[i][t]; bsum[t] = pbsum[i][t]; }                   \
                GROUPS(Q + (size_t)r * rb, W->scales + r * ng, W->biases + r * ng, g0, g1, G, K, prep, plen,  \
                            T, bits, tot, bsum);                                                              \
                UNROLL                                                                                        \
                for (int t = 0; t < T; t++) { ptot[i][t] = tot[t]; pbsum[i][t] = bsum[t]; }                   \
            }                                                                                                 \
        }                                                                                                     \
        for (int64_t i = 0; i < nr; i++)                                                                      \
            for (int t = 0; t < T; t++) y[t * ldy + rb0 + i] = SUM(ptot[i][t]) + pbsum[i][t];                 \
    }                                                                                                         \
}

DEFINE_QUANT_ROWS(quant_avx2, AVX2, __m256, _mm256_setzero_ps, groups_avx2, hsum256)

AVX2 INLINE __m256 load8_avx2(const void *row, int64_t i, int dtype) {
    if (dtype == TERN_DTYPE_F32) return _mm256_loadu_ps((const float *)row + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    if (dtype == TERN_DTYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Float rows. One accumulator per token would make a single token wait on
 * the FMA latency, so each token keeps NA = 2 interleaved ones; NA does not
 * depend on T (a per-T choice would break batch == single calls), and with
 * 2 per token 8 tokens still fit the registers of AVX-512. */
#define NA 2
AVX2 INLINE void float_avx2(const tern_mat *W, int64_t r0, int64_t r1, const float *prep, size_t plen,
                            const int T, float *y, int64_t ldy, const int dtype) {
    int64_t K = W->cols;
    size_t esz = dtype == TERN_DTYPE_F32 ? 4 : 2;
    for (int64_t r = r0; r < r1; r++) {
        const void *row = (const uint8_t *)W->data + (size_t)r * (size_t)K * esz;
        __m256 acc[MAXT][NA];
        UNROLL
        for (int t = 0; t < T; t++)
            UNROLL
            for (int a = 0; a < NA; a++) acc[t][a] = _mm256_setzero_ps();
        int64_t c = 0;
        for (; c + 8 * NA <= K; c += 8 * NA) {
            /* one prefetch a step: 32 bytes of 16-bit weights, 64 of f32 */
            _mm_prefetch((const char *)row + (size_t)c * esz + PREFETCH_AHEAD, _MM_HINT_T0);
            UNROLL
            for (int a = 0; a < NA; a++) {
                __m256 w = load8_avx2(row, c + 8 * a, dtype);
                UNROLL
                for (int t = 0; t < T; t++)
                    acc[t][a] = _mm256_fmadd_ps(w, _mm256_loadu_ps(prep + (size_t)t * plen + c + 8 * a), acc[t][a]);
            }
        }
        for (; c + 8 <= K; c += 8) {
            __m256 w = load8_avx2(row, c, dtype);
            UNROLL
            for (int t = 0; t < T; t++)
                acc[t][0] = _mm256_fmadd_ps(w, _mm256_loadu_ps(prep + (size_t)t * plen + c), acc[t][0]);
        }
        UNROLL
        for (int t = 0; t < T; t++) {
            float s = hsum256(_mm256_add_ps(acc[t][0], acc[t][1]));
            for (int64_t i = c; i < K; i++) s += widen(row, i, dtype) * prep[(size_t)t * plen + i];
            y[t * ldy + r] = s;
        }
    }
}

DEFINE_ROW_KERNELS(avx2, AVX2)

AVX2 static float dot_avx2(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ==== AVX-512 ============================================================ */

/* Quantized rows, 16 lanes: groups [g0, g1) of one row into the per-token
 * running sums tot (vector) and bsum (bias * sum(x)). 4-bit: the low
 * nibbles of 16 packed bytes meet prepared x[0..15], the high ones
 * x[16..31]. */
AVX512 INLINE void groups_avx512(const uint8_t *q, const uint16_t *sc, const uint16_t *bi, int64_t g0, int64_t g1,
                             int64_t G, int64_t K, const float *prep, size_t plen, const int T, const int bits,
                             __m512 *tot, float *bsum) {
    const __m512i m15 = _mm512_set1_epi32(15);
    /* one prefetch per 64-byte line: every pf_mask + 1 groups */
    int64_t gbytes = G * bits / 8, pf_mask = gbytes >= 64 ? 0 : 64 / gbytes - 1;
    for (int64_t g = g0; g < g1; g++) {
        if (!(g & pf_mask)) _mm_prefetch((const char *)q + g * gbytes + PREFETCH_AHEAD, _MM_HINT_T0);
        __m512 acc[MAXT];
        UNROLL
        for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
        if (bits == 4) {
            for (int64_t c = g * G; c < (g + 1) * G; c += 32) {
                __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + c / 2)));
                __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, m15));
                __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
                UNROLL
                for (int t = 0; t < T; t++) {
                    const float *xt = prep + (size_t)t * plen + c;
                    acc[t] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xt), acc[t]);
                    acc[t] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xt + 16), acc[t]);
                }
            }
        } else {
            for (int64_t c = g * G; c < (g + 1) * G; c += 16) {
                __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + c))));
                UNROLL
                for (int t = 0; t < T; t++)
                    acc[t] = _mm512_fmadd_ps(w, _mm512_loadu_ps(prep + (size_t)t * plen + c), acc[t]);
            }
        }
        __m512 s = _mm512_set1_ps(tern_bf16_to_f32(sc[g]));
        float b = tern_bf16_to_f32(bi[g]);
        UNROLL
        for (int t = 0; t < T; t++) {
            tot[t] = _mm512_fmadd_ps(acc[t], s, tot[t]);
            bsum[t] += b * prep[(size_t)t * plen + K + g];
        }
    }
}

DEFINE_QUANT_ROWS(quant_avx512, AVX512, __m512, _mm512_setzero_ps, groups_avx512, _mm512_reduce_add_ps)

/* 16 elements of a float row from i, lanes past `mask` zero. */
AVX512 INLINE __m512 load16_avx512(const void *row, int64_t i, int dtype, __mmask16 mask) {
    if (dtype == TERN_DTYPE_F32) return _mm512_maskz_loadu_ps(mask, (const float *)row + i);
    __m256i h = _mm256_maskz_loadu_epi16(mask, (const uint16_t *)row + i);
    if (dtype == TERN_DTYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AVX512 INLINE void float_avx512(const tern_mat *W, int64_t r0, int64_t r1, const float *prep, size_t plen,
                                const int T, float *y, int64_t ldy, const int dtype) {
    int64_t K = W->cols;
    size_t esz = dtype == TERN_DTYPE_F32 ? 4 : 2;
    for (int64_t r = r0; r < r1; r++) {
        const void *row = (const uint8_t *)W->data + (size_t)r * (size_t)K * esz;
        __m512 acc[MAXT][NA];
        UNROLL
        for (int t = 0; t < T; t++)
            UNROLL
            for (int a = 0; a < NA; a++) acc[t][a] = _mm512_setzero_ps();
        int64_t c = 0;
        for (; c + 16 * NA <= K; c += 16 * NA) {
            /* one prefetch a step: 64 bytes of 16-bit weights, 128 of f32
             * (the second line of f32 is left to the hardware) */
            _mm_prefetch((const char *)row + (size_t)c * esz + PREFETCH_AHEAD, _MM_HINT_T0);
            UNROLL
            for (int a = 0; a < NA; a++) {
                __m512 w = load16_avx512(row, c + 16 * a, dtype, 0xffff);
                UNROLL
                for (int t = 0; t < T; t++)
                    acc[t][a] = _mm512_fmadd_ps(w, _mm512_loadu_ps(prep + (size_t)t * plen + c + 16 * a), acc[t][a]);
            }
        }
        for (; c < K; c += 16) {
            /* the last step masks off lanes past the row end */
            __mmask16 m = K - c >= 16 ? 0xffff : (__mmask16)((1u << (K - c)) - 1);
            __m512 w = load16_avx512(row, c, dtype, m);
            UNROLL
            for (int t = 0; t < T; t++)
                acc[t][0] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m, prep + (size_t)t * plen + c), acc[t][0]);
        }
        UNROLL
        for (int t = 0; t < T; t++) {
            y[t * ldy + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]));
        }
    }
}

DEFINE_ROW_KERNELS(avx512, AVX512)

AVX512 static float dot_avx512(const float *a, const float *b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

#endif /* TERN_X86 */

/* ---- dispatch ---------------------------------------------------------- */

static rows_fn pick(tern_isa isa, const tern_mat *W) {
    /* [isa][format]: q4, q8, f32, f16, bf16 */
    static const rows_fn table[TERN_ISA_COUNT][5] = {
        {q4_c, q8_c, f32_c, f16_c, bf16_c},
#if TERN_X86
        {q4_avx2, q8_avx2, f32_avx2, f16_avx2, bf16_avx2},
        {q4_avx512, q8_avx512, f32_avx512, f16_avx512, bf16_avx512},
#else
        {q4_c, q8_c, f32_c, f16_c, bf16_c},
        {q4_c, q8_c, f32_c, f16_c, bf16_c},
#endif
    };
    int f = W->bits == 4 ? 0 : W->bits == 8 ? 1 : W->dtype == TERN_DTYPE_F32 ? 2 : W->dtype == TERN_DTYPE_F16 ? 3 : 4;
    int i = isa >= 0 && isa < TERN_ISA_COUNT ? (int)isa : 0;
    return table[i][f];
}

void tern_gemv_batch(tern_isa isa, const tern_mat *W, int64_t r0, int64_t r1, const float *prep, int T,
                     float *y) {
    if (T < 1 || r0 >= r1) return;
    pick(isa, W)(W, r0, r1, prep, tern_gemv_prep_len(W), T > MAXT ? MAXT : T, y, W->rows);
}

void tern_gemv(tern_isa isa, const tern_mat *W, int64_t r0, int64_t r1, const float *prep, float *y) {
    if (r0 >= r1) return;
    pick(isa, W)(W, r0, r1, prep, tern_gemv_prep_len(W), 1, y, W->rows);
}

float tern_dot_fast(tern_isa isa, const float *a, const float *b, int64_t n) {
#if TERN_X86
    if (isa == TERN_ISA_AVX512) return dot_avx512(a, b, n);
    if (isa == TERN_ISA_AVX2) return dot_avx2(a, b, n);
#endif
    return tern_dot(a, b, n);
}

/* ---- the parallel driver ----------------------------------------------- */

/* Prefill-sized T: the prepared inputs of a block of BLOCK_T tokens stay
 * in cache while each thread walks its rows ROW_TILE at a time, running
 * every group of MAXT tokens over the tile before the next: a weight row is
 * fetched from memory once per block, not once per group. Each token's
 * result is still the kernel's own, bit for bit. */
#define BLOCK_T 64
#define ROW_TILE 16

typedef struct {
    tern_isa isa;
    const tern_mat *W;
    const float *prep;        /* the block's tokens, plen floats apart */
    size_t plen;
    int T;                    /* tokens in the block */
    float *y;                 /* the block's first output row */
} qmatmul_job;

static void qmatmul_range(void *ctx, int64_t begin, int64_t end) {
    const qmatmul_job *j = ctx;
    for (int64_t r0 = begin; r0 < end; r0 += ROW_TILE) {
        int64_t r1 = r0 + ROW_TILE < end ? r0 + ROW_TILE : end;
        for (int t0 = 0; t0 < j->T; t0 += MAXT) {
            int n = j->T - t0 < MAXT ? j->T - t0 : MAXT;
            tern_gemv_batch(j->isa, j->W, r0, r1, j->prep + (size_t)t0 * j->plen, n,
                            j->y + (size_t)t0 * (size_t)j->W->rows);
        }
    }
}

int tern_qmatmul(tern_pool *pool, tern_isa isa, float *y, const float *x, int64_t T, const tern_mat *W) {
    size_t plen = tern_gemv_prep_len(W);
    int tb = T < BLOCK_T ? (int)T : BLOCK_T;
    if (T <= 0) return 0;
    float *prep = malloc((size_t)tb * plen * sizeof(float));
    if (!prep) return -1;
    for (int64_t t0 = 0; t0 < T; t0 += BLOCK_T) {
        int n = T - t0 < BLOCK_T ? (int)(T - t0) : BLOCK_T;
        for (int t = 0; t < n; t++) tern_gemv_prep(W, x + (size_t)(t0 + t) * (size_t)W->cols, prep + (size_t)t * plen);
        qmatmul_job j = {isa, W, prep, plen, n, y + (size_t)t0 * (size_t)W->rows};
        /* tiny products are not worth waking the workers (as tern_matmul) */
        if (W->rows * W->cols * n < (1 << 15)) qmatmul_range(&j, 0, W->rows);
        else tern_pool_for(pool, W->rows, qmatmul_range, &j);
    }
    free(prep);
    return 0;
}
