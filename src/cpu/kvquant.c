/* KV cache rows in 16/8/4 bits and the attention loops over them (see
 * kvquant.h). Banners: layout, f16 rounding, quantize/dequantize, the
 * portable loops, AVX2, AVX-512, dispatch.
 *
 * The portable loops widen each row's head slice to fp32 in a stack buffer
 * and then run the plain dot / axpy, so they double as the reference.
 *
 * The SIMD loops never write a widened row: they dequantize 32 values at a
 * time in registers (q * scale + bias, one FMA) and use them for every
 * query of the call, i.e. the GQA group of query heads sharing the KV head
 * (8 for Qwen3.6), so the widening is paid once per 8 queries. An earlier
 * version factored the dot per group as in the weight GEMV (scale *
 * sum(q x) + bias * sum(x)); with 8 queries its per-group and per-row
 * bookkeeping (8 scale FMAs and 8 bias terms per group, 8 full horizontal
 * sums per row) outweighed the one FMA it saves per 16 values: scores went
 * from ~98 to ~57 ns per 8-bit row and 8 queries, the weighted sum from ~95
 * to ~45 (head_dim 256, this 2-core AVX-512 box, busy, so +-20%).
 *   scores:  rows outer; per query 2 accumulators; 8 queries' sums leave
 *            through one transpose-and-add tree.
 *   V sum:   tiles of ROW_TILE rows; for each 32-value chunk of the head
 *            the outputs of all queries stay in registers across the tile.
 * They need head_dim % 32 == 0 (Qwen3.6: 256) and otherwise run the
 * portable code (tiny test models). */
#include "cpu/kvquant.h"

#include <math.h>
#include <string.h>

#include "cpu/ops.h"
#include "cpu/simd.h"
#include "util/half.h"

#define MAXQ 8              /* queries per register-blocked pass */
#define F16_MAX 65504.0f

/* ---- layout ------------------------------------------------------------ */

int tern_kv_group(int head_dim) {
    if (head_dim % 64 == 0) return 64;
    if (head_dim % 32 == 0) return 32;
    return head_dim;
}

size_t tern_kv_row_bytes(int row_len, int group, int bits) {
    if (bits == 16) return (size_t)row_len * 2;
    size_t q = ((size_t)row_len * (size_t)bits / 8 + 1) & ~(size_t)1;   /* even, so the f16 stay aligned */
    return q + (size_t)4 * (size_t)(row_len / group);
}

int tern_kvq_init(tern_kvq *L, int n_heads, int head_dim, int bits) {
    if (bits != 16 && bits != 8 && bits != 4) return -1;
    if (n_heads < 1 || head_dim < 1 || head_dim > TERN_KV_MAX_HEAD_DIM) return -1;
    /* a 4-bit head slice must start on a byte */
    if (bits == 4 && head_dim % 2) return -1;
    memset(L, 0, sizeof *L);
    L->bits = bits;
    L->n_heads = n_heads;
    L->head_dim = head_dim;
    L->row_len = n_heads * head_dim;
    L->group = bits == 16 ? head_dim : tern_kv_group(head_dim);
    L->n_groups = bits == 16 ? 0 : L->row_len / L->group;
    L->row_bytes = tern_kv_row_bytes(L->row_len, L->group, bits);
    L->q_bytes = L->row_bytes - (size_t)4 * (size_t)L->n_groups;
    return 0;
}

/* One head's slice of a row: its values, and (8/4-bit) its scales and
 * biases (head_dim / group of each). */
typedef struct {
    const uint8_t *vals;
    const uint8_t *scales, *biases;   /* f16, possibly unaligned: read with rd16 */
} head_slice;

static inline head_slice slice_of(const tern_kvq *L, const uint8_t *row, int head) {
    head_slice s;
    size_t first = (size_t)head * (size_t)L->head_dim;
    s.vals = row + first * (size_t)L->bits / 8;
    size_t g0 = first / (size_t)L->group;
    s.scales = row + L->q_bytes + 2 * g0;
    s.biases = row + L->q_bytes + 2 * ((size_t)L->n_groups + g0);
    return s;
}

static inline uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* ---- f16 rounding ------------------------------------------------------ */

/* Round to nearest even; |f| must be <= 65504 (callers clamp). */
static uint16_t f16_rne(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x38800000u) {            /* normal: 2^-14 and up */
        uint32_t h = ((a >> 23) - 127 + 15) << 10 | ((a & 0x7fffffu) >> 13);
        uint32_t rem = a & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;   /* a carry moves into the exponent */
        return (uint16_t)(sign | h);
    }
    /* subnormal: multiples of 2^-24; the scaling is exact, lrintf rounds
     * to nearest even (1024 comes out as the smallest normal's bits) */
    return (uint16_t)(sign | (uint16_t)lrintf(fabsf(f) * 16777216.0f));
}

static float f16f(uint16_t h) { return tern_f16_to_f32(h); }

/* The f16 neighbours of a finite h towards +inf and -inf. */
static uint16_t f16_step_up(uint16_t h) { return (uint16_t)(h == 0x8000u ? 1u : (h & 0x8000u) ? h - 1u : h + 1u); }
static uint16_t f16_step_down(uint16_t h) { return (uint16_t)(h == 0 ? 0x8001u : (h & 0x8000u) ? h + 1u : h - 1u); }

/* Largest f16 <= x and smallest f16 >= x (x within the f16 range). */
static uint16_t f16_down(float x) {
    uint16_t h = f16_rne(x);
    return f16f(h) > x ? f16_step_down(h) : h;
}
static uint16_t f16_up(double x) {
    uint16_t h = f16_rne((float)x);
    return (double)f16f(h) < x ? f16_step_up(h) : h;
}

static inline float clamp16(float x) { return x > F16_MAX ? F16_MAX : x < -F16_MAX ? -F16_MAX : x; }

/* ---- quantize / dequantize --------------------------------------------- */

void tern_kv_quantize_row(const tern_kvq *L, const float *x, uint8_t *row) {
    memset(row, 0, L->row_bytes);
    if (L->bits == 16) {
        for (int i = 0; i < L->row_len; i++) {
            uint16_t h = f16_rne(clamp16(x[i]));
            memcpy(row + 2 * (size_t)i, &h, 2);
        }
        return;
    }
    int levels = (1 << L->bits) - 1, G = L->group;
    for (int g = 0; g < L->n_groups; g++) {
        const float *xg = x + (size_t)g * G;
        float mn = clamp16(xg[0]), mx = mn;
        for (int i = 1; i < G; i++) {
            float v = clamp16(xg[i]);
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
        uint16_t b16 = f16_down(mn);
        float b = f16f(b16);
        double span = ((double)mx - b) / levels;          /* exact enough: double */
        uint16_t s16 = span > 0 ? f16_up(span) : 0;
        float s = f16f(s16);
        memcpy(row + L->q_bytes + 2 * (size_t)g, &s16, 2);
        memcpy(row + L->q_bytes + 2 * ((size_t)L->n_groups + g), &b16, 2);
        for (int i = 0; i < G; i++) {
            long v = 0;
            if (s > 0) {
                v = lrint(((double)clamp16(xg[i]) - b) / s);
                v = v < 0 ? 0 : v > levels ? levels : v;
            }
            size_t e = (size_t)g * G + i;
            if (L->bits == 8) row[e] = (uint8_t)v;
            else row[e / 2] |= (uint8_t)(v << (4 * (e & 1)));
        }
    }
}

/* One head's slice widened to fp32: value = q * scale + bias. */
static void dequant_head(const tern_kvq *L, const uint8_t *row, int head, float *out) {
    head_slice h = slice_of(L, row, head);
    int hd = L->head_dim;
    if (L->bits == 16) {
        for (int d = 0; d < hd; d++) out[d] = f16f(rd16(h.vals + 2 * (size_t)d));
        return;
    }
    int G = L->group;
    for (int g = 0; g < hd / G; g++) {
        float s = f16f(rd16(h.scales + 2 * g)), b = f16f(rd16(h.biases + 2 * g));
        for (int d = g * G; d < (g + 1) * G; d++) {
            int v = L->bits == 8 ? h.vals[d] : (h.vals[d / 2] >> (4 * (d & 1))) & 15;
            out[d] = (float)v * s + b;
        }
    }
}

void tern_kv_dequantize_row(const tern_kvq *L, const uint8_t *row, float *out) {
    for (int h = 0; h < L->n_heads; h++) dequant_head(L, row, h, out + (size_t)h * L->head_dim);
}

/* ---- portable loops: widen the slice, then plain fp32 ------------------ */

static void scores_c(const tern_kvq *L, int head, const float *q, int nq, size_t q_stride, const uint8_t *K,
                     size_t k_stride, int n, float scale, float *scores) {
    float k[TERN_KV_MAX_HEAD_DIM];
    for (int j = 0; j < n; j++) {
        dequant_head(L, K + (size_t)j * k_stride, head, k);
        for (int i = 0; i < nq; i++) {
            scores[(size_t)i * n + j] = scale * tern_dot(q + (size_t)i * q_stride, k, L->head_dim);
        }
    }
}

static void accum_c(const tern_kvq *L, int head, const float *p, int nq, const uint8_t *V, size_t v_stride,
                    int n, float *o, size_t o_stride) {
    float v[TERN_KV_MAX_HEAD_DIM];
    int hd = L->head_dim;
    for (int j = 0; j < n; j++) {
        dequant_head(L, V + (size_t)j * v_stride, head, v);
        for (int i = 0; i < nq; i++) {
            float pj = p[(size_t)i * n + j], *oi = o + (size_t)i * o_stride;
            for (int d = 0; d < hd; d++) oi[d] += pj * v[d];
        }
    }
}

/* ---- shared by the SIMD loops ------------------------------------------ */

/* The queries in kernel order: as given for 16/8-bit; for 4-bit each block
 * of 32 permuted to [x0 x2 .. x30 | x1 x3 .. x31] so the low and high
 * nibbles of 16 packed bytes meet contiguous values (as tern_gemv_prep). */
typedef struct {
    float x[MAXQ][TERN_KV_MAX_HEAD_DIM];
} query_prep;

static void prep_queries(const tern_kvq *L, const float *q, int nq, size_t q_stride, query_prep *P) {
    int hd = L->head_dim;
    for (int i = 0; i < nq; i++) {
        const float *qi = q + (size_t)i * q_stride;
        if (L->bits == 4) {
            for (int c = 0; c < hd; c += 32)
                for (int j = 0; j < 16; j++) {
                    P->x[i][c + j] = qi[c + 2 * j];
                    P->x[i][c + 16 + j] = qi[c + 2 * j + 1];
                }
        } else {
            memcpy(P->x[i], qi, (size_t)hd * sizeof(float));
        }
    }
}

/* Rows per tile of the weighted sum: the tile's slices (up to 32 x 512
 * bytes) stay in L1 while the loop walks the head in chunks of 32 values
 * with the output chunk of every query in registers. */
#define ROW_TILE 32

#define INSTANTIATE_Q(name, tmpl, attr, params, ...)                                  \
    static attr void name params {                                                    \
        switch (nq) {                                                                 \
        case 1: tmpl(__VA_ARGS__, 1); break;                                          \
        case 2: tmpl(__VA_ARGS__, 2); break;                                          \
        case 3: tmpl(__VA_ARGS__, 3); break;                                          \
        case 4: tmpl(__VA_ARGS__, 4); break;                                          \
        case 5: tmpl(__VA_ARGS__, 5); break;                                          \
        case 6: tmpl(__VA_ARGS__, 6); break;                                          \
        case 7: tmpl(__VA_ARGS__, 7); break;                                          \
        default: tmpl(__VA_ARGS__, 8); break;                                         \
        }                                                                             \
    }

/* An ISA's entry points: scores_ISA and accum_ISA for 1..8 queries. */
#define INSTANTIATE_ISA(isa, ATTR)                                                                          \
    INSTANTIATE_Q(scores_##isa, scores_##isa##_t, ATTR,                                                     \
                  (const tern_kvq *L, int head, const query_prep *P, const uint8_t *K, size_t k_stride, int n, \
                   float scale, float *scores, int nq),                                                     \
                  L, head, P, K, k_stride, n, scale, scores)                                                \
    INSTANTIATE_Q(accum_##isa, accum_##isa##_t, ATTR,                                                       \
                  (const tern_kvq *L, int head, const float *p, const uint8_t *V, size_t v_stride, int n,   \
                   float *o, size_t o_stride, int nq),                                                      \
                  L, head, p, V, v_stride, n, o, o_stride)

#if TERN_X86

/* ==== AVX2 =============================================================== */

AVX2 INLINE float h2f_avx2(const uint8_t *p) { return _cvtsh_ss(rd16(p)); }

/* A slice's scales and biases (n_g groups) widened once per row: per
 * 32-value chunk they are then one broadcast load each, where widening
 * them there cost more vector work than the chunk's own values. */
AVX2 INLINE void widen_sb_avx2(head_slice h, int n_g, float *sv, float *bv) {
    int g = 0;
    for (; g + 4 <= n_g; g += 4) {
        _mm_storeu_ps(sv + g, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(h.scales + 2 * g))));
        _mm_storeu_ps(bv + g, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(h.biases + 2 * g))));
    }
    for (; g < n_g; g++) {
        sv[g] = h2f_avx2(h.scales + 2 * g);
        bv[g] = h2f_avx2(h.biases + 2 * g);
    }
}

/* Values [c, c + 2N) of a slice as two vectors of N lanes, widened and
 * dequantized (q * *sv + *bv, the scale and bias of c's group), written
 * once for both ISAs: VEC/VECI the float and int vector types, LD_PH the
 * load of N halves, LD_Q the load of N bytes, the rest the ISA's own
 * intrinsics. 16/8-bit: [c, c+N) and [c+N, c+2N); 4-bit: the N bytes from
 * c/2 give the even elements in w[0] and the odd ones in w[1] (kernel
 * order: prepared query offsets, see koff). */
#define DEFINE_DEQ(NAME, ISA, VEC, VECI, N, LD_PH, CVTPH, LD_Q, CVTU8, AND, SRLI, SET1I, SET1, CVTI, FMADD)          \
ISA INLINE void NAME(head_slice h, int c, const float *sv, const float *bv, int bits, VEC w[2]) {                   \
    if (bits == 16) {                                                                                              \
        w[0] = CVTPH(LD_PH(h.vals + 2 * (size_t)c));                                                               \
        w[1] = CVTPH(LD_PH(h.vals + 2 * (size_t)c + 2 * N));                                                       \
        return;                                                                                                    \
    }                                                                                                              \
    VEC s = SET1(*sv), b = SET1(*bv);                                                                              \
    VECI v0, v1;                                                                                                   \
    if (bits == 8) {                                                                                               \
        v0 = CVTU8(LD_Q(h.vals + c));                                                                              \
        v1 = CVTU8(LD_Q(h.vals + c + N));                                                                          \
    } else {                                                                                                       \
        VECI v = CVTU8(LD_Q(h.vals + c / 2));                                                                      \
        v0 = AND(v, SET1I(15));                                                                                    \
        v1 = SRLI(v, 4);                                                                                           \
    }                                                                                                              \
    w[0] = FMADD(CVTI(v0), s, b);                                                                                  \
    w[1] = FMADD(CVTI(v1), s, b);                                                                                  \
}

#define LD64(p) _mm_loadl_epi64((const __m128i *)(p))
#define LD128(p) _mm_loadu_si128((const __m128i *)(p))
#define LD256(p) _mm256_loadu_si256((const __m256i *)(p))

DEFINE_DEQ(deq16_avx2, AVX2, __m256, __m256i, 8, LD128, _mm256_cvtph_ps, LD64, _mm256_cvtepu8_epi32, _mm256_and_si256,
           _mm256_srli_epi32, _mm256_set1_epi32, _mm256_set1_ps, _mm256_cvtepi32_ps, _mm256_fmadd_ps)

/* Offsets in the prepared query of deq16_avx2's two vectors: 4-bit block
 * b = c / 32, half k = (c % 32) / 16 holds kernel positions 32b + 8k
 * (even) and 32b + 16 + 8k (odd). */
static inline int koff(int c, int bits, int which) {
    if (bits != 4) return c + 8 * which;
    return (c & ~31) + ((c & 31) >> 1) + 16 * which;
}

/* Sums of 8 vectors, lane i = sum of v[i] (a hadd transpose). */
AVX2 INLINE __m256 reduce8_avx2(const __m256 *v) {
    __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
    __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* q K^T for one head, written once for both ISAs: VEC the vector type and
 * STEP the values two of them hold; WIDEN and DEQ the ISA's scale widening
 * and dequantization, KOFF where DEQ's two vectors sit in the prepared
 * query, HSUM one vector's sum and REDUCE8 eight vectors' sums at once
 * (it pays from 4 queries on). */
#define DEFINE_SCORES(NAME, ISA, VEC, STEP, ZERO, LOADU, FMADD, ADD, WIDEN, DEQ, KOFF, HSUM, REDUCE8)              \
ISA INLINE void NAME(const tern_kvq *L, int head, const query_prep *P, const uint8_t *K, size_t k_stride, int n,   \
                     float scale, float *scores, const int NQ) {                                                   \
    int hd = L->head_dim, G = L->group, bits = L->bits;                                                            \
    for (int j = 0; j < n; j++) {                                                                                  \
        head_slice h = slice_of(L, K + (size_t)j * k_stride, head);                                                \
        float sv[16], bv[16];                                                                                      \
        if (bits != 16) WIDEN(h, hd / G, sv, bv);                                                                  \
        VEC acc[8][2];                                                                                             \
        UNROLL                                                                                                     \
        for (int i = 0; i < 8; i++) acc[i][0] = acc[i][1] = ZERO();                                                \
        for (int c = 0; c < hd; c += STEP) {                                                                       \
            VEC w[2];                                                                                              \
            DEQ(h, c, sv + c / G, bv + c / G, bits, w);                                                            \
            UNROLL                                                                                                 \
            for (int i = 0; i < NQ; i++) {                                                                         \
                acc[i][0] = FMADD(w[0], LOADU(P->x[i] + KOFF(c, bits, 0)), acc[i][0]);                             \
                acc[i][1] = FMADD(w[1], LOADU(P->x[i] + KOFF(c, bits, 1)), acc[i][1]);                             \
            }                                                                                                      \
        }                                                                                                          \
        VEC v[8];                                                                                                  \
        UNROLL                                                                                                     \
        for (int i = 0; i < 8; i++) v[i] = ADD(acc[i][0], acc[i][1]);                                              \
        if (NQ < 4) {                                                                                              \
            UNROLL                                                                                                 \
            for (int i = 0; i < NQ; i++) scores[(size_t)i * n + j] = scale * HSUM(v[i]);                           \
            continue;                                                                                              \
        }                                                                                                          \
        float out[8];                                                                                              \
        _mm256_storeu_ps(out, _mm256_mul_ps(REDUCE8(v), _mm256_set1_ps(scale)));                                   \
        UNROLL                                                                                                     \
        for (int i = 0; i < NQ; i++) scores[(size_t)i * n + j] = out[i];                                           \
    }                                                                                                              \
}

DEFINE_SCORES(scores_avx2_t, AVX2, __m256, 16, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_fmadd_ps, _mm256_add_ps,
              widen_sb_avx2, deq16_avx2, koff, hsum256, reduce8_avx2)

/* Adds acc (kernel order, from deq16_avx2 at c) into o at c. 4-bit: even
 * and odd elements interleave back to natural order. */
AVX2 INLINE void add_out_avx2(float *o, int c, int bits, __m256 a0, __m256 a1) {
    if (bits == 4) {
        __m256 lo = _mm256_unpacklo_ps(a0, a1), hi = _mm256_unpackhi_ps(a0, a1);
        a0 = _mm256_permute2f128_ps(lo, hi, 0x20);
        a1 = _mm256_permute2f128_ps(lo, hi, 0x31);
    }
    _mm256_storeu_ps(o + c, _mm256_add_ps(_mm256_loadu_ps(o + c), a0));
    _mm256_storeu_ps(o + c + 8, _mm256_add_ps(_mm256_loadu_ps(o + c + 8), a1));
}

/* p V for one head, written once for both ISAs: VEC the vector type and
 * STEP the values two of them hold; WIDEN, DEQ and ADD_OUT the ISA's own
 * scale widening, dequantization and output add. */
#define DEFINE_ACCUM(NAME, ISA, VEC, STEP, ZERO, SET1, FMADD, WIDEN, DEQ, ADD_OUT)                                 \
ISA INLINE void NAME(const tern_kvq *L, int head, const float *p, const uint8_t *V, size_t v_stride,               \
                              int n, float *o, size_t o_stride, const int NQ) {                                    \
    int hd = L->head_dim, G = L->group, bits = L->bits;                                                            \
    for (int j0 = 0; j0 < n; j0 += ROW_TILE) {                                                                     \
        int j1 = j0 + ROW_TILE < n ? j0 + ROW_TILE : n;                                                            \
        float sv[ROW_TILE][16], bv[ROW_TILE][16];                                                                  \
        if (bits != 16)                                                                                            \
            for (int j = j0; j < j1; j++)                                                                          \
                WIDEN(slice_of(L, V + (size_t)j * v_stride, head), hd / G, sv[j - j0], bv[j - j0]);                \
        for (int c = 0; c < hd; c += STEP) {                                                                       \
            VEC acc[MAXQ][2];                                                                                      \
            UNROLL                                                                                                 \
            for (int i = 0; i < NQ; i++) acc[i][0] = acc[i][1] = ZERO();                                           \
            for (int j = j0; j < j1; j++) {                                                                        \
                VEC w[2];                                                                                          \
                DEQ(slice_of(L, V + (size_t)j * v_stride, head), c, sv[j - j0] + c / G, bv[j - j0] + c / G, bits,  \
                             w);                                                                                   \
                UNROLL                                                                                             \
                for (int i = 0; i < NQ; i++) {                                                                     \
                    VEC pj = SET1(p[(size_t)i * n + j]);                                                           \
                    acc[i][0] = FMADD(w[0], pj, acc[i][0]);                                                        \
                    acc[i][1] = FMADD(w[1], pj, acc[i][1]);                                                        \
                }                                                                                                  \
            }                                                                                                      \
            UNROLL                                                                                                 \
            for (int i = 0; i < NQ; i++) ADD_OUT(o + (size_t)i * o_stride, c, bits, acc[i][0], acc[i][1]);         \
        }                                                                                                          \
    }                                                                                                              \
}

DEFINE_ACCUM(accum_avx2_t, AVX2, __m256, 16, _mm256_setzero_ps, _mm256_set1_ps, _mm256_fmadd_ps, widen_sb_avx2,
             deq16_avx2, add_out_avx2)

INSTANTIATE_ISA(avx2, AVX2)

/* ==== AVX-512 ============================================================ */

/* As widen_sb_avx2; n_g <= 16 (head_dim <= 512, groups >= 32). */
AVX512 INLINE void widen_sb_avx512(head_slice h, int n_g, float *sv, float *bv) {
    __mmask16 m = (__mmask16)((1u << n_g) - 1);
    _mm512_mask_storeu_ps(sv, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, h.scales)));
    _mm512_mask_storeu_ps(bv, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, h.biases)));
}

DEFINE_DEQ(deq32_avx512, AVX512, __m512, __m512i, 16, LD256, _mm512_cvtph_ps, LD128, _mm512_cvtepu8_epi32,
           _mm512_and_si512, _mm512_srli_epi32, _mm512_set1_epi32, _mm512_set1_ps, _mm512_cvtepi32_ps, _mm512_fmadd_ps)

/* Sums of 8 vectors, lane i = sum of v[i]: a transpose-and-add tree
 * (25 shuffles and adds instead of 8 full reductions, ~64). */
AVX512 INLINE __m256 reduce8_avx512(const __m512 *v) {
    __m512 t[4], u[2];
    for (int k = 0; k < 4; k++)   /* lanes 0-7: query 2k, 8-15: query 2k+1 */
        t[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xee));
    for (int k = 0; k < 2; k++)   /* 128-bit lane m: query 4k + m, 4 partials */
        u[k] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * k], t[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * k], t[2 * k + 1], 0xdd));
    /* per 128-bit lane m: [q_m, q_m, q_4+m, q_4+m] halves */
    __m512 w = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], 0x44), _mm512_shuffle_ps(u[0], u[1], 0xee));
    /* per 128-bit lane m: [q_m, q_4+m, q_m, q_4+m] totals */
    __m512 e = _mm512_add_ps(_mm512_shuffle_ps(w, w, 0x88), _mm512_shuffle_ps(w, w, 0xdd));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, e));
}

/* Offsets in the prepared query of deq32_avx512's two vectors: the
 * chunk's two halves (4-bit: its even and odd elements, as prepared). */
static inline int koff512(int c, int bits, int which) {
    (void)bits;
    return c + 16 * which;
}

/* Few queries leave the FMA latency exposed; they keep 2 accumulators
 * each. */
DEFINE_SCORES(scores_avx512_t, AVX512, __m512, 32, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_fmadd_ps, _mm512_add_ps,
              widen_sb_avx512, deq32_avx512, koff512, _mm512_reduce_add_ps, reduce8_avx512)

/* Adds acc (from deq32_avx512 at c) into o at c; 4-bit interleaves the
 * even and odd elements back. */
AVX512 INLINE void add_out_avx512(float *o, int c, int bits, __m512 a0, __m512 a1) {
    if (bits == 4) {
        const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
        __m512 n0 = _mm512_permutex2var_ps(a0, lo, a1), n1 = _mm512_permutex2var_ps(a0, hi, a1);
        a0 = n0;
        a1 = n1;
    }
    _mm512_storeu_ps(o + c, _mm512_add_ps(_mm512_loadu_ps(o + c), a0));
    _mm512_storeu_ps(o + c + 16, _mm512_add_ps(_mm512_loadu_ps(o + c + 16), a1));
}

DEFINE_ACCUM(accum_avx512_t, AVX512, __m512, 32, _mm512_setzero_ps, _mm512_set1_ps, _mm512_fmadd_ps, widen_sb_avx512,
             deq32_avx512, add_out_avx512)

INSTANTIATE_ISA(avx512, AVX512)

#endif /* TERN_X86 */

/* ---- dispatch ---------------------------------------------------------- */

/* The SIMD loops walk a head in whole chunks of 32 values (so a chunk never
 * straddles a group: groups are 32 or 64 then). */
static int simd_ok(tern_isa isa, const tern_kvq *L) {
    return TERN_X86 && isa != TERN_ISA_C && L->head_dim % 32 == 0;
}

void tern_kv_scores(tern_isa isa, const tern_kvq *L, int head, const float *q, int nq, size_t q_stride,
                    const uint8_t *K, size_t k_stride, int n, float scale, float *scores) {
    if (nq <= 0 || n <= 0) return;
    if (!simd_ok(isa, L)) {
        scores_c(L, head, q, nq, q_stride, K, k_stride, n, scale, scores);
        return;
    }
#if TERN_X86
    query_prep P;
    for (int i0 = 0; i0 < nq; i0 += MAXQ) {
        int m = nq - i0 < MAXQ ? nq - i0 : MAXQ;
        prep_queries(L, q + (size_t)i0 * q_stride, m, q_stride, &P);
        float *s = scores + (size_t)i0 * n;
        if (isa == TERN_ISA_AVX512) scores_avx512(L, head, &P, K, k_stride, n, scale, s, m);
        else scores_avx2(L, head, &P, K, k_stride, n, scale, s, m);
    }
#endif
}

void tern_kv_accum(tern_isa isa, const tern_kvq *L, int head, const float *p, int nq, const uint8_t *V,
                   size_t v_stride, int n, float *o, size_t o_stride) {
    if (nq <= 0 || n <= 0) return;
    if (!simd_ok(isa, L)) {
        accum_c(L, head, p, nq, V, v_stride, n, o, o_stride);
        return;
    }
#if TERN_X86
    for (int i0 = 0; i0 < nq; i0 += MAXQ) {
        int m = nq - i0 < MAXQ ? nq - i0 : MAXQ;
        const float *pi = p + (size_t)i0 * n;
        float *oi = o + (size_t)i0 * o_stride;
        if (isa == TERN_ISA_AVX512) accum_avx512(L, head, pi, V, v_stride, n, oi, o_stride, m);
        else accum_avx2(L, head, pi, V, v_stride, n, oi, o_stride, m);
    }
#endif
}

void tern_kv_attend(tern_isa isa, const tern_kvq *L, int head, const float *q, int nq, size_t q_stride,
                    const uint8_t *K, const uint8_t *V, size_t stride, int n, float scale, float *scores, float *o,
                    size_t o_stride) {
    tern_kv_scores(isa, L, head, q, nq, q_stride, K, stride, n, scale, scores);
    for (int i = 0; i < nq; i++) {
        tern_softmax(scores + (size_t)i * n, n);
        memset(o + (size_t)i * o_stride, 0, (size_t)L->head_dim * sizeof(float));
    }
    tern_kv_accum(isa, L, head, scores, nq, V, stride, n, o, o_stride);
}
