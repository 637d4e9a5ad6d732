/* The MoE block for a prefill of T tokens, grouped by expert: each expert
 * multiplies all the tokens that chose it at once, so its weights are read
 * once per 64 tokens instead of once per token.
 *
 *   plan      one block: tokens per expert (integer atomics), offsets,
 *             every (token, k) a row ("slot") of its expert's group, and
 *             the list of 64-row tiles (expert, first row, end row). Slots
 *             within an expert are in arrival order, which varies, but no
 *             result depends on it: each row's products are computed alone
 *             and the combine sums per token in ascending expert order.
 *   gate/up   tile GEMM over the list: 64 gathered rows of x (bf16) times
 *             64 gate and 64 up rows of the expert, dequantized from the
 *             q4/q8 blob to bf16 in shared memory, mma.sync m16n8k16 with
 *             fp32 accumulation; h = silu(gate) * up (fp32) per slot.
 *   down      the same GEMM, h (bf16) times 128 down rows: y per slot.
 *   shared    sigmoid(x . w_sg) per token (fp32), then gate/up and down of
 *             the shared expert over all T rows with the same kernels.
 *   combine   per token: sum_k wts * y in ascending expert id, then +
 *             sigmoid gate * shared: moe_layer's order, no atomics.
 *
 * Weights are found on the device through the tile's expert id (blob
 * table or base + e * stride), so the host never waits for the router; the
 * grids are sized for the most tiles any routing can make
 * (T * top_k / 64 + n_experts) and blocks past the plan's count return. */
#include <float.h>

#include "cuda/common.cuh"
#include "cuda/mma.cuh"

#define BM 64          /* gathered rows per tile */
#define BN 128         /* weight rows per tile: 64 gate + 64 up, or 128 down */
#define BK 32          /* k per stage: one quantization group at least */
#define LDS (BK + 8)   /* row stride in 16-bit values: fragment loads hit 32 distinct banks */
#define GEMM_THREADS 256

enum { MODE_GATE_UP = 0, MODE_DOWN = 1 };

/* Where a weight part lives: address = (blobs ? blobs[e] : base + e *
 * stride) + offset, computed as integers so that the shared expert (one
 * matrix, absolute addresses in the offsets, base 0) takes the same path. */
typedef struct {
    const uint8_t *const *blobs;
    uintptr_t base;
    size_t stride;
    size_t q_off[2], s_off[2], b_off[2];   /* [0] gate or down, [1] up */
    int gsh;                               /* log2 group (quantized kinds) */
} wsrc;

typedef struct {
    wsrc w;
    const float *a;          /* A rows (fp32), lda floats apart */
    const int32_t *a_rows;   /* row of A for each slot (NULL: the slot itself) */
    int lda;
    int K, N;                /* reduction length; weight rows (I for gate/up, H for down) */
    const int32_t *tile_e, *tile_r0, *tile_r1, *n_tiles;   /* NULL: one group of `rows` rows */
    int rows;
    float *out;              /* [slot, ldo] */
    int ldo;
} gemm_args;

__device__ __forceinline__ uintptr_t part_addr(const wsrc &w, int e) {
    return w.blobs ? (uintptr_t)w.blobs[e] : w.base + (uintptr_t)e * w.stride;
}

/* ---- the tile GEMM ------------------------------------------------------------ */

/* 16-byte chunks of weight row data a thread stages per k step. */
template <int KIND> struct bchunks {
    enum { E = kind_traits<KIND>::E, CPR = BK / E, N = (BN * CPR + GEMM_THREADS - 1) / GEMM_THREADS };
};

/* Eight dequantized values as bf16 into dst (16 bytes). */
__device__ __forceinline__ void put8(uint16_t *dst, const float (&v)[8]) {
    uint4 u = {pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]), pack_bf16(v[6], v[7])};
    *(uint4 *)dst = u;
}

/* A 16-byte chunk (E values) into bf16 at dst: w = q * scale + bias in
 * fp32 (the CPU's dequantization) rounded once to bf16. */
template <int KIND>
__device__ __forceinline__ void dequant_chunk(uint4 raw, float s, float b, uint16_t *dst) {
    const uint32_t wv[4] = {raw.x, raw.y, raw.z, raw.w};
    if (KIND == KIND_Q4) {
#pragma unroll
        for (int h = 0; h < 4; h++) {   /* a word: elements 8h .. 8h + 7, low nibble first */
            uint32_t lo = wv[h] & 0x0f0f0f0fu, hi = (wv[h] >> 4) & 0x0f0f0f0fu;
            float v[8] = {byte_f<0>(lo), byte_f<0>(hi), byte_f<1>(lo), byte_f<1>(hi),
                          byte_f<2>(lo), byte_f<2>(hi), byte_f<3>(lo), byte_f<3>(hi)};
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = fmaf(v[i], s, b);
            put8(dst + 8 * h, v);
        }
    } else if (KIND == KIND_Q8) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t x = wv[2 * h], y = wv[2 * h + 1];
            float v[8] = {byte_f<0>(x), byte_f<1>(x), byte_f<2>(x), byte_f<3>(x),
                          byte_f<0>(y), byte_f<1>(y), byte_f<2>(y), byte_f<3>(y)};
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = fmaf(v[i], s, b);
            put8(dst + 8 * h, v);
        }
    } else if (KIND == KIND_BF16) {
        *(uint4 *)dst = raw;   /* already bf16 */
    } else {
        float v[8];
#pragma unroll
        for (int i = 0; i < 4; i++) { v[2 * i] = f16_lo(wv[i]); v[2 * i + 1] = f16_hi(wv[i]); }
        put8(dst, v);
    }
}

/* One block: rows [r0, r1) of the group of expert e against BN weight
 * rows; 8 warps as 2 (rows) x 4 (columns), each 32 x 32 (2 x 4 mma
 * tiles). In gate/up mode warp wn's four n8 tiles are gate columns wn * 16
 * + {0, 8} and the up columns at the same places, so h = silu(gate) * up
 * pairs accumulators of one thread. */
template <int KIND, int MODE>
__global__ void __launch_bounds__(GEMM_THREADS) moeg_gemm_kernel(gemm_args g) {
    __shared__ __align__(16) uint16_t As[2][BM * LDS];
    __shared__ __align__(16) uint16_t Bs[2][BN * LDS];
    typedef bchunks<KIND> BC;
    int tile = blockIdx.y, e = 0, r0, r1;
    if (g.tile_e) {
        if (tile >= *g.n_tiles) return;
        e = g.tile_e[tile];
        r0 = g.tile_r0[tile];
        r1 = g.tile_r1[tile];
    } else {
        r0 = tile * BM;
        if (r0 >= g.rows) return;
        r1 = g.rows;
    }
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3;
    int n0 = blockIdx.x * (MODE == MODE_GATE_UP ? BN / 2 : BN);
    uintptr_t blob = part_addr(g.w, e);
    /* this thread's staging: two float4 of A, BC::N chunks of B */
    const float *arow[2];
    int acol[2], adst[2];
#pragma unroll
    for (int s = 0; s < 2; s++) {
        int idx = tid + s * GEMM_THREADS, r = idx / (BK / 4), r_abs = r0 + r;
        acol[s] = (idx % (BK / 4)) * 4;
        adst[s] = r * LDS + acol[s];
        arow[s] = r_abs < r1 ? g.a + (size_t)(g.a_rows ? g.a_rows[r_abs] : r_abs) * g.lda : NULL;
    }
    const uint8_t *bq[BC::N];
    const uint16_t *bs[BC::N], *bb[BC::N];
    int bk[BC::N], bdst[BC::N];
#pragma unroll
    for (int s = 0; s < BC::N; s++) {
        int c = tid + s * GEMM_THREADS, brow = c / BC::CPR, part = c % BC::CPR;
        int which = MODE == MODE_GATE_UP && brow >= BN / 2;
        int n = MODE == MODE_GATE_UP ? n0 + brow - which * (BN / 2) : n0 + brow;
        bk[s] = part * BC::E;
        bdst[s] = brow * LDS + bk[s];
        bq[s] = NULL;
        if (c < BN * BC::CPR && n < g.N) {
            bq[s] = (const uint8_t *)(blob + g.w.q_off[which]) + (size_t)n * kind_row_bytes(KIND, g.K);
            size_t ng = (size_t)(g.K >> g.w.gsh);
            bs[s] = (const uint16_t *)(blob + g.w.s_off[which]) + (size_t)n * ng;
            bb[s] = (const uint16_t *)(blob + g.w.b_off[which]) + (size_t)n * ng;
        }
        if (c >= BN * BC::CPR) bdst[s] = -1;
    }
    float4 ra[2];
    uint4 rb[BC::N];
    float rs[BC::N], rbias[BC::N];
    auto load = [&](int k0) {
#pragma unroll
        for (int s = 0; s < 2; s++)
            ra[s] = arow[s] ? *(const float4 *)(arow[s] + k0 + acol[s]) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int s = 0; s < BC::N; s++) {
            rb[s] = make_uint4(0, 0, 0, 0);
            rs[s] = rbias[s] = 0.0f;
            if (bq[s]) {
                int k = k0 + bk[s];
                rb[s] = ld_stream(bq[s] + kind_row_bytes(KIND, k));
                if (kind_traits<KIND>::QUANT) {
                    rs[s] = bf16f(__ldg(bs[s] + (k >> g.w.gsh)));
                    rbias[s] = bf16f(__ldg(bb[s] + (k >> g.w.gsh)));
                }
            }
        }
    };
    auto store = [&](int buf) {
#pragma unroll
        for (int s = 0; s < 2; s++) {
            uint2 u = {pack_bf16(ra[s].x, ra[s].y), pack_bf16(ra[s].z, ra[s].w)};
            *(uint2 *)(As[buf] + adst[s]) = u;
        }
#pragma unroll
        for (int s = 0; s < BC::N; s++) {
            if (bdst[s] < 0) continue;
            if (bq[s]) {
                dequant_chunk<KIND>(rb[s], rs[s], rbias[s], Bs[buf] + bdst[s]);
            } else {   /* rows past N */
#pragma unroll
                for (int i = 0; i < BC::E; i += 8) *(uint4 *)(Bs[buf] + bdst[s] + i) = make_uint4(0, 0, 0, 0);
            }
        }
    };
    int nb[4];
#pragma unroll
    for (int q = 0; q < 4; q++) nb[q] = MODE == MODE_GATE_UP ? (q >> 1) * (BN / 2) + wn * 16 + (q & 1) * 8 : wn * 32 + q * 8;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int q = 0; q < 4; q++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][q][c] = 0.0f;
    int nk = g.K / BK;
    load(0);
    store(0);
    __syncthreads();
    for (int kt = 0; kt < nk; kt++) {
        int buf = kt & 1;
        if (kt + 1 < nk) load((kt + 1) * BK);   /* global loads in flight during the products */
#pragma unroll
        for (int ks = 0; ks < BK; ks += 16) {
            uint32_t af[2][4], bf[4][2];
#pragma unroll
            for (int i = 0; i < 2; i++) frag_a(af[i], As[buf], LDS, wm * 32 + i * 16, ks, lane);
#pragma unroll
            for (int q = 0; q < 4; q++) frag_b(bf[q], Bs[buf], LDS, nb[q], ks, lane);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int q = 0; q < 4; q++) mma_bf16(acc[i][q], af[i], bf[q]);
        }
        if (kt + 1 < nk) store(buf ^ 1);   /* the other buffer: its readers passed the last barrier */
        __syncthreads();
    }
    int gr = lane >> 2, t2 = 2 * (lane & 3);
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int r = r0 + wm * 32 + i * 16 + gr + 8 * h;
            if (r >= r1) continue;
            float *o = g.out + (size_t)r * g.ldo;
            if (MODE == MODE_GATE_UP) {
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    int col = n0 + wn * 16 + q * 8 + t2;
                    if (col >= g.N) continue;
                    float2 v = {silu_f(acc[i][q][2 * h]) * acc[i][q + 2][2 * h],
                                silu_f(acc[i][q][2 * h + 1]) * acc[i][q + 2][2 * h + 1]};
                    *(float2 *)(o + col) = v;
                }
            } else {
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    int col = n0 + wn * 32 + q * 8 + t2;
                    if (col >= g.N) continue;
                    *(float2 *)(o + col) = make_float2(acc[i][q][2 * h], acc[i][q][2 * h + 1]);
                }
            }
        }
}

/* ---- plan, shared gate, combine ------------------------------------------------- */

typedef struct {
    int32_t *row_of;    /* [T * K] slot of each (token, k); -1 for an id out of range */
    int32_t *tok_of;    /* [T * K] token of each slot */
    int32_t *tile_e, *tile_r0, *tile_r1, *n_tiles;
} plan_bufs;

__global__ void __launch_bounds__(1024) moeg_plan_kernel(const int32_t *ids, int TK, int K, int E, plan_bufs p) {
    extern __shared__ int sh[];
    int *cnt = sh, *off = sh + E, *fill = sh + 2 * E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = fill[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < TK; i += blockDim.x) {
        int e = ids[i];
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {   /* offsets of rows and of tiles (E steps) */
        int s = 0, ts = 0;
        for (int e = 0; e < E; e++) {
            off[e] = s;
            s += cnt[e];
            fill[e] = ts;   /* the expert's first tile, until the tiles are listed */
            ts += (cnt[e] + BM - 1) / BM;
        }
        *p.n_tiles = ts;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        for (int j = 0; j * BM < cnt[e]; j++) {
            p.tile_e[fill[e] + j] = e;
            p.tile_r0[fill[e] + j] = off[e] + j * BM;
            p.tile_r1[fill[e] + j] = off[e] + cnt[e];
        }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) fill[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < TK; i += blockDim.x) {
        int e = ids[i];
        if (e < 0 || e >= E) { p.row_of[i] = -1; continue; }
        int slot = off[e] + atomicAdd(&fill[e], 1);
        p.row_of[i] = slot;
        p.tok_of[slot] = i / K;
    }
}

/* sigmoid(x_t . w_sg), a warp per token, the row dequantized as the CPU
 * does (q * scale + bias in fp32). */
__global__ void moeg_shared_gate_kernel(const float *x, int T, int H, const uint8_t *q, const uint16_t *sc,
                                        const uint16_t *bi, int kind, int gsh, float *sg) {
    int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (t >= T) return;
    const float *xt = x + (size_t)t * H;
    float acc = 0.0f;
    for (int i = lane; i < H; i += 32) {
        float w;
        if (kind == KIND_Q8) w = (float)q[i] * bf16f(sc[i >> gsh]) + bf16f(bi[i >> gsh]);
        else if (kind == KIND_Q4) w = (float)((q[i / 2] >> (4 * (i & 1))) & 15) * bf16f(sc[i >> gsh]) + bf16f(bi[i >> gsh]);
        else if (kind == KIND_BF16) w = bf16f(((const uint16_t *)q)[i]);
        else w = __half2float(__ushort_as_half(((const uint16_t *)q)[i]));
        acc = fmaf(xt[i], w, acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) sg[t] = sigmoid_f(acc);
}

#define MAXK 32

/* out[t] = sum over t's k in ascending expert id of wts * y[slot], then +
 * sg[t] * ys[t] (moe_layer's order). Block per token. */
__global__ void moeg_combine_kernel(const int32_t *ids, const float *wts, const int32_t *row_of, const float *y,
                                    const float *sg, const float *ys, int K, int H, float *out) {
    __shared__ int order[MAXK];
    int t = blockIdx.x;
    if (threadIdx.x == 0) {   /* insertion sort of K <= 32 ids */
        for (int k = 0; k < K; k++) {
            int j = k, e = ids[t * K + k];
            while (j > 0 && ids[t * K + order[j - 1]] > e) { order[j] = order[j - 1]; j--; }
            order[j] = k;
        }
    }
    __syncthreads();
    for (int d = threadIdx.x; d < H; d += blockDim.x) {
        float o = 0.0f;
        for (int i = 0; i < K; i++) {
            int k = order[i], slot = row_of[t * K + k];
            if (slot >= 0) o += wts[t * K + k] * y[(size_t)slot * H + d];
        }
        if (ys) o += sg[t] * ys[(size_t)t * H + d];
        out[(size_t)t * H + d] = o;
    }
}

/* ---- host side --------------------------------------------------------------------- */

static size_t al256(size_t n) { return (n + 255) & ~(size_t)255; }

static int max_tiles(int T, int K, int E) { return (int)(((int64_t)T * K + BM - 1) / BM) + E; }

typedef struct {
    plan_bufs p;
    float *h, *y, *sg, *hs, *ys;
} moeg_work;

static size_t carve(void *work, int T, int K, int E, int64_t H, int64_t I, int64_t Is, moeg_work *w) {
    size_t TK = (size_t)T * K, mt = (size_t)max_tiles(T, K, E), at = 0;
    char *b = (char *)work;   /* NULL: only the size is wanted */
    moeg_work dummy, *x = w ? w : &dummy;
#define TAKE(ptr, type, n) do { ptr = (type *)(b + at); at += al256((size_t)(n) * sizeof(type)); } while (0)
    TAKE(x->p.row_of, int32_t, TK);
    TAKE(x->p.tok_of, int32_t, TK);
    TAKE(x->p.tile_e, int32_t, mt);
    TAKE(x->p.tile_r0, int32_t, mt);
    TAKE(x->p.tile_r1, int32_t, mt);
    TAKE(x->p.n_tiles, int32_t, 1);
    TAKE(x->h, float, TK * I);
    TAKE(x->y, float, TK * H);
    TAKE(x->sg, float, T);
    TAKE(x->hs, float, (size_t)T * Is);
    TAKE(x->ys, float, (size_t)T * H);
#undef TAKE
    return at;
}

size_t tern_cuda_moe_grouped_workspace(int T, int top_k, int n_experts, int64_t hidden, int64_t inter,
                                       int64_t shared_inter) {
    return carve(NULL, T, top_k, n_experts, hidden, inter, shared_inter, NULL);
}

template <int MODE>
static void launch_gemm(int kind, const gemm_args &g, int grid_y, cudaStream_t s) {
    dim3 grid(ceil_div(g.N, MODE == MODE_GATE_UP ? BN / 2 : BN), grid_y);
    switch (kind) {
    case KIND_Q4: moeg_gemm_kernel<KIND_Q4, MODE><<<grid, GEMM_THREADS, 0, s>>>(g); break;
    case KIND_Q8: moeg_gemm_kernel<KIND_Q8, MODE><<<grid, GEMM_THREADS, 0, s>>>(g); break;
    case KIND_BF16: moeg_gemm_kernel<KIND_BF16, MODE><<<grid, GEMM_THREADS, 0, s>>>(g); break;
    default: moeg_gemm_kernel<KIND_F16, MODE><<<grid, GEMM_THREADS, 0, s>>>(g); break;
    }
}

static int gparts_ok(const tern_cuda_expert_part *p, int64_t rows, int64_t cols) {
    int g = p->group;
    return (p->bits == 4 || p->bits == 8) && p->rows == rows && p->cols == cols && (g == 32 || g == 64 || g == 128) &&
           cols % g == 0 && cols % BK == 0 && p->q_off % 16 == 0 && p->s_off % 2 == 0 && p->b_off % 2 == 0;
}

static int check_grouped(const tern_cuda_experts *ex, int E, const tern_expert_w *sh, const tern_mat *sg, int T, int K,
                         tern_error *err) {
    int64_t I = ex->gate.rows, H = ex->gate.cols;
    if (!gparts_ok(&ex->gate, I, H) || !gparts_ok(&ex->up, I, H) || !gparts_ok(&ex->down, H, I) ||
        ex->up.bits != ex->gate.bits || ex->down.bits != ex->gate.bits || ex->up.group != ex->gate.group ||
        ex->down.group != ex->gate.group)
        return tern_fail(err, "moe_grouped: expert parts must be q4/q8 [I, H], [I, H], [H, I] of one encoding, "
                              "H and I multiples of %d", BK);
    if (!ex->blobs && !ex->base) return tern_fail(err, "moe_grouped: no expert weights (blobs or base)");
    if (T < 1 || K < 1 || K > MAXK || E < 1 || E > 4096 || H % 4 || I % 4)
        return tern_fail(err, "moe_grouped: T = %d, top_k = %d, %d experts outside the kernels' range", T, K, E);
    if (!sh) return 0;
    int64_t Is = sh->gate.rows;
    int kind = mat_kind(&sh->gate);
    if (kind < 0 || mat_kind(&sh->up) != kind || mat_kind(&sh->down) != kind || !sg || mat_kind(sg) < 0 ||
        sh->gate.cols != H || sh->up.rows != Is || sh->up.cols != H || sh->down.rows != H || sh->down.cols != Is ||
        sg->rows != 1 || sg->cols != H || Is % BK || (sh->gate.bits && (sh->gate.group != sh->up.group ||
                                                                       sh->gate.group != sh->down.group)))
        return tern_fail(err, "moe_grouped: shared expert or its gate: unsupported encoding or shapes");
    return 0;
}

/* A weight source for one expert part pair from the routed experts' blobs. */
static wsrc routed_src(const tern_cuda_experts *ex, const tern_cuda_expert_part *a, const tern_cuda_expert_part *b) {
    wsrc w;
    memset(&w, 0, sizeof w);
    w.blobs = ex->blobs;
    w.base = (uintptr_t)ex->base;
    w.stride = ex->stride;
    w.q_off[0] = a->q_off; w.s_off[0] = a->s_off; w.b_off[0] = a->b_off;
    w.q_off[1] = b->q_off; w.s_off[1] = b->s_off; w.b_off[1] = b->b_off;
    w.gsh = log2i(a->group);
    return w;
}

/* The shared expert's matrices: absolute addresses, base 0. */
static wsrc shared_src(const tern_mat *a, const tern_mat *b) {
    wsrc w;
    memset(&w, 0, sizeof w);
    w.q_off[0] = (uintptr_t)a->data; w.s_off[0] = (uintptr_t)a->scales; w.b_off[0] = (uintptr_t)a->biases;
    w.q_off[1] = (uintptr_t)b->data; w.s_off[1] = (uintptr_t)b->scales; w.b_off[1] = (uintptr_t)b->biases;
    w.gsh = a->bits ? log2i(a->group) : 0;
    return w;
}

int tern_cuda_moe_grouped(const tern_cuda_experts *ex, int n_experts, const tern_expert_w *shared,
                          const tern_mat *shared_gate, const float *x, int T, int top_k, const int32_t *ids,
                          const float *wts, void *work, size_t work_bytes, float *out, tern_stream s,
                          tern_error *err) {
    if (check_grouped(ex, n_experts, shared, shared_gate, T, top_k, err)) return -1;
    int64_t H = ex->gate.cols, I = ex->gate.rows, Is = shared ? shared->gate.rows : 0;
    int E = n_experts, K = top_k;
    size_t need = tern_cuda_moe_grouped_workspace(T, K, E, H, I, Is);
    if (work_bytes < need) return tern_fail(err, "moe_grouped: workspace %zu bytes, %zu needed", work_bytes, need);
    moeg_work w;
    carve(work, T, K, E, H, I, Is, &w);
    size_t plan_smem = (size_t)3 * E * sizeof(int);
    cudaFuncSetAttribute(moeg_plan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)plan_smem);
    moeg_plan_kernel<<<1, 1024, plan_smem, s>>>(ids, T * K, K, E, w.p);
    if (launch_check("moe_grouped plan", err)) return -1;
    int rkind = ex->gate.bits == 4 ? KIND_Q4 : KIND_Q8, mt = max_tiles(T, K, E);
    gemm_args g;
    memset(&g, 0, sizeof g);
    g.w = routed_src(ex, &ex->gate, &ex->up);
    g.a = x; g.a_rows = w.p.tok_of; g.lda = (int)H; g.K = (int)H; g.N = (int)I;
    g.tile_e = w.p.tile_e; g.tile_r0 = w.p.tile_r0; g.tile_r1 = w.p.tile_r1; g.n_tiles = w.p.n_tiles;
    g.out = w.h; g.ldo = (int)I;
    launch_gemm<MODE_GATE_UP>(rkind, g, mt, s);
    if (launch_check("moe_grouped gate/up", err)) return -1;
    g.w = routed_src(ex, &ex->down, &ex->down);
    g.a = w.h; g.a_rows = NULL; g.lda = (int)I; g.K = (int)I; g.N = (int)H;
    g.out = w.y; g.ldo = (int)H;
    launch_gemm<MODE_DOWN>(rkind, g, mt, s);
    if (launch_check("moe_grouped down", err)) return -1;
    if (shared) {
        const tern_mat *sgm = shared_gate;
        moeg_shared_gate_kernel<<<ceil_div(T, 8), 256, 0, s>>>(x, T, (int)H, (const uint8_t *)sgm->data, sgm->scales,
                                                              sgm->biases, mat_kind(sgm),
                                                              sgm->bits ? log2i(sgm->group) : 0, w.sg);
        if (launch_check("moe_grouped shared gate", err)) return -1;
        int skind = mat_kind(&shared->gate), st = ceil_div(T, BM);
        memset(&g, 0, sizeof g);
        g.w = shared_src(&shared->gate, &shared->up);
        g.a = x; g.lda = (int)H; g.K = (int)H; g.N = (int)Is; g.rows = T;
        g.out = w.hs; g.ldo = (int)Is;
        launch_gemm<MODE_GATE_UP>(skind, g, st, s);
        if (launch_check("moe_grouped shared gate/up", err)) return -1;
        g.w = shared_src(&shared->down, &shared->down);
        g.a = w.hs; g.lda = (int)Is; g.K = (int)Is; g.N = (int)H;
        g.out = w.ys; g.ldo = (int)H;
        launch_gemm<MODE_DOWN>(skind, g, st, s);
        if (launch_check("moe_grouped shared down", err)) return -1;
    }
    moeg_combine_kernel<<<T, 256, 0, s>>>(ids, wts, w.p.row_of, w.y, w.sg, shared ? w.ys : NULL, K, (int)H, out);
    return launch_check("moe_grouped combine", err);
}
