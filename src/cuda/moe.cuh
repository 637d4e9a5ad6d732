/* The MoE block at decode: the router's top-k, then the routed experts and
 * the shared expert in two launches (one token's in one launch where it
 * applies). Its files (moe_grouped.cu is the prefill's form):
 *   moe_gate_up.cu  launch 1 on floats (shapes the integer dots do not take)
 *   moe_seg.cu      launch 1 on integer dots, and gate/up and down in one
 *                   launch at one token (one kernel template holds both)
 *   moe_down.cu     launch 2: down
 *   moe_host.cu     the checks, the workspace, the plans and the launches
 *   route.cu        the router's top k (tern_cuda_route)
 * This header: the launch arguments, the row helpers more than one kernel
 * reads with, and the kernels' host-side accessors.
 *
 * Segments: for each token t the top_k routed experts and (if present) the
 * shared expert are segments t * S + k, S = top_k + 1 (or top_k). Expert
 * weights are read through the ids on the device, so the host never waits
 * for the router.
 *   gate_up: grid (intermediate rows / 8, T * S); a warp computes rows i
 *            and i + 1 of gate and up together (4 rows in flight per lane)
 *            and writes h = silu(gate) * up; the shared segment's first
 *            warp also computes sigmoid(x . w_sg).
 *   down:    a block computes R output rows of one token (R: 16 KB of
 *            routed rows, 8 at q4 and top 8, 4 at q8) and stages all its
 *            weights first: the R rows of every routed expert and of the
 *            shared expert, with their scales and biases, go to shared
 *            memory by asynchronous 16-byte copies (cp.async) issued at once
 *            (~20 KB per block in flight without holding registers: one DRAM
 *            round trip; the shared expert's before the ids are read). h is
 *            cut into pieces of 32 floats; a lane (segment k, piece p) holds
 *            its piece in registers with its sum (a piece never straddles a
 *            quantization group: a row's share is scale * sum(q x) + bias *
 *            sum(x)) and loops over the staged rows (a short loop, so the
 *            code stays small), scaling by its routing weight or the shared
 *            gate. The lanes' shares are summed through shared memory in
 *            thread order: no atomics, so the result does not depend on
 *            timing. Shapes past one pass (K x pieces(I) over 128 lanes)
 *            loop over the extra units.
 */
#ifndef TERN_CUDA_MOE_CUH
#define TERN_CUDA_MOE_CUH

#include <float.h>

#include "cuda/common.cuh"
#include "cuda/idot.cuh"
#include "cuda/route.cuh"
#include "cuda/trace.cuh"

typedef struct {
    const uint8_t *q;
    const uint16_t *s, *b;
    int gsh;
} part_ptr;

#define DN_ROW_BYTES 16384   /* packed bytes of a down block's routed rows */

typedef struct {
    /* routed experts */
    const uint8_t *const *blobs;
    const uint8_t *base;
    size_t stride;
    tern_cuda_expert_part gate, up, down;
    int r_kind;
    /* shared expert and its gate (kind -1: none) */
    int s_kind, sg_kind;
    part_ptr sgate_p, sup_p, sdown_p, sg_p;
    int s_inter;
    /* shapes and buffers */
    int H, I, Imax, K, S;
    const int32_t *ids;
    const float *wts, *x;
    float *h;          /* [T * S, Imax] */
    float *sg;         /* [T] */
    /* down: rows per block; routed, shared and all threads; shared-memory
     * bytes for a routed segment's rows, the shared expert's, a routed
     * segment's scale or bias array, the shared expert's */
    int R, ntr, nts, nt, dn_wr, dn_ws, dn_sbr, dn_sbs;
    /* one launch for gate/up and down (moe_gate_up_d_kernel<.., true>):
     * per-expert partial outputs [S][H], and the counters: per segment,
     * per row chunk, and the blocks done (zero between calls) */
    float *part;
    unsigned *seg_cnt, *chunk_cnt, *done_cnt;
    int one_launch;    /* the caller allows it (tern_cuda_experts.one_launch) */
    int dc;            /* down rows of a block's chunk */
    float *out;
    /* tern_cuda_experts.fx: the sums each block adds its rows into (then
     * seg_cnt is the slot's counters, and no chunk is summed over the
     * segments), and the slot the launch zeroes, in 16-byte units */
    long long *fx_sum;
    uint4 *fx_zero;
    int fx_zero_n;
    /* routing inside the one launch (tern_cuda_moe_route): the router's
     * logits [n_e] instead of ids and weights, which block 0 of segment 0
     * writes to ids_out / wts_out; NULL: ids and wts are given */
    const float *logits;
    int n_e, renorm;
    int32_t *ids_out;
    float *wts_out;
    int dn_digits;     /* the one launch's down takes h as digits (else as floats: shapes the digits do not fit) */
} moe_args;

/* The launch routes the token itself (from the router's logits) instead
 * of reading ids and weights. */
__host__ __device__ __forceinline__ bool routes_itself(const moe_args &a) { return a.logits; }

__device__ __forceinline__ const uint8_t *expert_blob(const moe_args &a, int e) {
    return a.blobs ? a.blobs[e] : a.base + (size_t)e * a.stride;
}

__device__ __forceinline__ part_ptr blob_part(const uint8_t *blob, const tern_cuda_expert_part &p) {
    part_ptr r = {blob + p.q_off, (const uint16_t *)(blob + p.s_off), (const uint16_t *)(blob + p.b_off), 0};
    int g = p.group, s = 0;
    while ((1 << s) < g) s++;
    r.gsh = s;
    return r;
}

/* Warps of an integer-dot gate/up block (moe_seg.cu says why 9). */
#define GUD_WARPS 9

/* The one launch's shared memory after the digits' region (moe_seg.cu):
 * a chunk's down rows, its scales and biases, h, a flag and an mbarrier. */
struct seg_layout {
    int rbd, ng, sbb, sb_off, h_off, flag_off, bytes;
};

__host__ __device__ static inline seg_layout seg_layout_of(int I, int gsh, int dc) {
    seg_layout L;
    L.rbd = I / 2;   /* q4 */
    L.ng = I >> gsh;
    L.sbb = (dc * L.ng * 2 + 32 + 15) & ~15;
    L.sb_off = (dc * L.rbd + 15) & ~15;
    L.h_off = L.sb_off + 2 * L.sbb;
    L.flag_off = L.h_off + I * 4;
    L.bytes = L.flag_off + 16;
    return L;
}

/* ---- rows of a part --------------------------------------------------------- */

/* Row `row` of a part: packed data and its scale/bias row. */
__device__ __forceinline__ void part_row(const part_ptr &p, int kind, int64_t row, int cols, const uint8_t *&q,
                                         const uint16_t *&sc, const uint16_t *&bi) {
    q = p.q + row * kind_row_bytes(kind, cols);
    int64_t ng = cols >> p.gsh;
    sc = p.s ? p.s + row * ng : p.s;
    bi = p.b ? p.b + row * ng : p.b;
}

/* h[i] = silu(gate_i . x) * (up_i . x) for rows i0, i0 + 1 (< n). */
template <int KIND>
__device__ void gate_up_rows(const part_ptr &g, const part_ptr &u, int i0, int n, int H, const float *x, float *h) {
    int lane = threadIdx.x & 31;
    int i1 = i0 + 1 < n ? i0 + 1 : i0;
    const uint8_t *q[4];
    const uint16_t *sc[4], *bi[4];
    int gs[4] = {g.gsh, u.gsh, g.gsh, u.gsh};
    part_row(g, KIND, i0, H, q[0], sc[0], bi[0]);
    part_row(u, KIND, i0, H, q[1], sc[1], bi[1]);
    part_row(g, KIND, i1, H, q[2], sc[2], bi[2]);
    part_row(u, KIND, i1, H, q[3], sc[3], bi[3]);
    float acc[4][1] = {{0.0f}, {0.0f}, {0.0f}, {0.0f}};
    rows_dot<KIND, 1, 4>(q, sc, bi, gs, H, x, 0, lane, 32, acc);
    float g0 = warp_sum(acc[0][0]), u0 = warp_sum(acc[1][0]), g1 = warp_sum(acc[2][0]), u1 = warp_sum(acc[3][0]);
    if (lane == 0) {
        h[i0] = silu_f(g0) * u0;
        if (i0 + 1 < n) h[i0 + 1] = silu_f(g1) * u1;
    }
}

template <int KIND>
__device__ float row_dot1(const part_ptr &p, int cols, const float *x) {
    const uint8_t *q[1];
    const uint16_t *sc[1], *bi[1];
    int gs[1] = {p.gsh};
    part_row(p, KIND, 0, cols, q[0], sc[0], bi[0]);
    float acc[1][1] = {{0.0f}};
    rows_dot<KIND, 1, 1>(q, sc, bi, gs, cols, x, 0, threadIdx.x & 31, 32, acc);
    return warp_sum(acc[0][0]);
}

static __device__ float dot_any(int kind, const part_ptr &p, int cols, const float *x) {
    switch (kind) {
    case KIND_Q4: return row_dot1<KIND_Q4>(p, cols, x);
    case KIND_Q8: return row_dot1<KIND_Q8>(p, cols, x);
    case KIND_BF16: return row_dot1<KIND_BF16>(p, cols, x);
    default: return row_dot1<KIND_F16>(p, cols, x);
    }
}

/* ---- staging into shared memory (down and the one launch) ---------------- */

/* nbytes (a multiple of 16; src 16-byte aligned) into dst by threads tid,
 * tid + nt, ... */
__device__ __forceinline__ void stage(uint8_t *dst, const uint8_t *src, int nbytes, int tid, int nt) {
#pragma unroll 4
    for (int i = 16 * tid; i < nbytes; i += 16 * nt) cp_async<16>(dst + i, src + i);
}

/* nbytes from a 2-byte aligned src (scales, biases) are staged as the
 * 16-byte blocks that hold them (start p, n bytes), so the data starts at
 * dst + ((uintptr_t)src & 15). The extra bytes read lie in the same 16-byte
 * blocks, so on mapped pages. */
struct sb_span {
    const uint8_t *p;
    int n;
};
__device__ __forceinline__ sb_span sb_span_of(const uint16_t *src, int nbytes) {
    const uintptr_t st = (uintptr_t)src, a0 = st & ~(uintptr_t)15;
    return {(const uint8_t *)a0, ((int)(st - a0) + nbytes + 15) & ~15};
}
__device__ __forceinline__ void stage_sb(uint8_t *dst, const uint16_t *src, int nbytes, int tid, int nt) {
    const sb_span b = sb_span_of(src, nbytes);
    stage(dst, b.p, b.n, tid, nt);
}

/* Entry i of a scale or bias array staged by stage_sb from src. */
__device__ __forceinline__ uint32_t sb_at(const uint8_t *dst, const uint16_t *src, int i) {
    return *(const uint16_t *)(dst + ((uintptr_t)src & 15) + 2 * i);
}

/* 16-byte chunks per piece of 32 elements */
template <int KIND> struct piece_traits {
    enum { CPP = 32 / kind_traits<KIND>::E };
};

__device__ __forceinline__ float piece_sum(const float (&x)[32]) {
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 32; i++) s[i & 3] += x[i];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

/* A staged row's share of piece p: row its packed data in shared memory
 * (cols columns; chunks past the row's end count as zero), x the piece,
 * xs its sum, s/b the raw bf16 scale and bias of the piece's group
 * (quantized kinds). */
template <int KIND>
__device__ __forceinline__ float row_dot(const uint8_t *row, int p, int cols, const float (&x)[32], float xs,
                                         uint32_t s, uint32_t b) {
    constexpr int CPP = piece_traits<KIND>::CPP;
    const int nch = cols / kind_traits<KIND>::E;
    float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
    for (int u = 0; u < CPP; u++) {
        const int c = p * CPP + u;
        const uint4 q = c < nch ? *(const uint4 *)(row + 16 * c) : make_uint4(0, 0, 0, 0);
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int wi = 0; wi < 4; wi++) {
            if (KIND == KIND_Q4) {
                /* element i of a word is nibble i: low nibbles of the bytes
                 * are elements 0,2,4,6, high ones 1,3,5,7 */
                const float *xx = x + 8 * wi;
                uint32_t lo = w[wi] & 0x0f0f0f0fu, hi = (w[wi] >> 4) & 0x0f0f0f0fu;
                d0 = fmaf(byte_f<0>(lo), xx[0], d0);
                d1 = fmaf(byte_f<0>(hi), xx[1], d1);
                d0 = fmaf(byte_f<1>(lo), xx[2], d0);
                d1 = fmaf(byte_f<1>(hi), xx[3], d1);
                d0 = fmaf(byte_f<2>(lo), xx[4], d0);
                d1 = fmaf(byte_f<2>(hi), xx[5], d1);
                d0 = fmaf(byte_f<3>(lo), xx[6], d0);
                d1 = fmaf(byte_f<3>(hi), xx[7], d1);
            } else if (KIND == KIND_Q8) {
                const float *xx = x + 16 * u + 4 * wi;
                d0 = fmaf(byte_f<0>(w[wi]), xx[0], d0);
                d1 = fmaf(byte_f<1>(w[wi]), xx[1], d1);
                d0 = fmaf(byte_f<2>(w[wi]), xx[2], d0);
                d1 = fmaf(byte_f<3>(w[wi]), xx[3], d1);
            } else {
                const float *xx = x + 8 * u + 2 * wi;
                d0 = fmaf(KIND == KIND_BF16 ? bf16_lo(w[wi]) : f16_lo(w[wi]), xx[0], d0);
                d1 = fmaf(KIND == KIND_BF16 ? bf16_hi(w[wi]) : f16_hi(w[wi]), xx[1], d1);
            }
        }
    }
    const float d = d0 + d1;
    if (kind_traits<KIND>::QUANT) return fmaf(bf16f((uint16_t)s), d, bf16f((uint16_t)b) * xs);
    return d;
}

/* ---- the kernels, for the host (moe_host.cu) ---------------------------------- */

typedef void (*moe_kernel)(moe_args);
typedef void (*moe_down_fn)(moe_args, float *);
/* launch 1 on floats: a block of 4 warps, two rows of gate and up a warp */
void moe_gate_up_launch(dim3 grid, cudaStream_t s, const moe_args &a);
/* launch 1 on integer dots for routed kind r_kind and shared kind s_kind
 * (-1: none) */
moe_kernel moe_gate_up_d_of(int r_kind, int s_kind);
/* the one launch: v = (a shared expert) + 2 (routing itself) */
moe_kernel moe_seg_of(int v);
/* launch 2 */
moe_down_fn moe_down_of(int r_kind, int s_kind);

#endif
