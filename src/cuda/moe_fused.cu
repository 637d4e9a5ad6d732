/* The MoE half of a decode layer in one launch: the router's input (the
 * residual plus the attention/DeltaNet output, RMSNorm'd), its logits and
 * top-k, the 8 routed experts' gate/up and down and the shared expert, as
 * three phases of one grid separated by two grid-wide barriers.
 *
 * Why: as three launches (the fused router, gate/up, down) the block costs
 * ~22 us per layer at Qwen3.6's shapes on the H200 against ~4 us of bytes
 * (14 MB at q4): each launch waits for the whole previous one, then pays
 * the DRAM latency of its first weights, and the routed experts' 12 MB
 * are requested in two rounds (gate/up, then down). Here one resident grid
 * (at most the blocks the SMs hold at once: every block is resident, so a
 * block may wait for all others) requests, before waiting for its
 * predecessor, everything that does not depend on the token's routing:
 * the router rows, the shared gate row, the shared expert's gate/up rows
 * and its down rows. Once the ids are known every block requests its share
 * of the routed experts' gate/up AND down rows at once, ~47 KB a block in
 * flight, so the 12 MB stream at the DRAM's rate while the shared expert is
 * computed. All weights travel by cp.async into shared memory (no
 * registers held while in flight); a warp's lanes copy the 16-byte chunks
 * that they then use themselves.
 *
 *   phase 1: x + delta (block 0 writes the sum), the norm, the digits of
 *            xn (idot.cuh) in every block; the router's rows and the
 *            shared gate's (row r: block r % nb, warp (r / nb) % 8).
 *   barrier
 *   phase 2: every block runs the same top-k over the logits (route.cuh,
 *            the code of the fused router: the same ids bit for bit),
 *            requests its routed rows, computes its gate/up pairs
 *            (silu(gate_i x) * up_i x into the workspace h): routed pair
 *            p = (expert k, row i) by warp p % NW, the shared expert's row
 *            i by block i % nb.
 *   barrier
 *   phase 3: every block loads h; output row d by warp d % NW: its routed
 *            segments' down rows (weighted) and the shared one's (gated),
 *            summed over the warp.
 *
 * The router's logits and the gate/up values are those of the three-launch
 * path bit for bit (the same products in the same order: gemv1.cuh for the
 * router, the integer dots of moe.cu's gate/up, float dots for a shared
 * expert of another kind); only the down sums are ordered differently.
 *
 * The barrier is a counter (the route counter of the layer, zero between
 * calls): phase barriers wait for n and 2n arrivals, and a third arrival
 * at exit lets the last block reset it. The next kernel (a PDL launch)
 * starts only once every block of this grid has let it (after the first
 * barrier), so only once every block is resident: its blocks may then
 * wait on this grid's end without holding places this grid needs. Two such grids on two streams of one GPU could each hold part
 * of the SMs and wait for places the other holds, so the engine runs one
 * decode stream at a time; a barrier still waiting after 5 s traps (an
 * error, not a hang). */
#include <float.h>
#include <stdio.h>

#include "cuda/common.cuh"
#include "cuda/gemv1.cuh"
#include "cuda/idot.cuh"
#include "cuda/route.cuh"

#define MF_MAXK 32          /* route_row's top-k: one lane each */
#define MF_MAXE 256         /* route_row<8>: 8 logits a lane */

/* A matrix the kernel reads rows of: packed data, bf16 scales and biases
 * (quantized kinds), its kind and group shift. */
typedef struct {
    const uint8_t *q;
    const uint16_t *s, *b;
    int kind, gsh;
} mf_mat;

typedef struct {
    /* router and input */
    mf_mat router, sgate;              /* sgate.q NULL: no shared expert */
    tern_cuda_vec_in in;
    int H, E, K, renorm;
    float *logits;
    int32_t *ids;
    float *wts;
    unsigned *sync;
    /* routed experts (parts relative to a blob) */
    const uint8_t *const *blobs;
    const uint8_t *base;
    size_t stride;
    tern_cuda_expert_part gate, up, down;
    int gsh_g, gsh_u, gsh_d;
    /* shared expert */
    mf_mat sh_gate, sh_up, sh_down;
    int I, Is, Imax;
    float *h, *sg;                     /* workspace: h [K + 1][Imax], then the shared gate */
    float *out;
    /* the plan (host): warps, slots per warp, slot sizes, shared-memory offsets */
    int NW, RB, JR, JS, D;
    int r_cap, r_sb, gr_cap, gs_cap, g_sb, dn_sb_r, dn_sb_s, slot_r, slot_gr, slot_gs, slot_dn;
    int off_xf, off_xd, off_r, off_gr, off_gs, off_dn;
    unsigned long long *trace;         /* TERN_MOE_FUSED_TRACE: [block][MF_MARKS] times, or NULL */
} mf_args;

#define MF_MARKS 15

/* ---- staging and reading rows ------------------------------------------ */

/* Bytes for a row's scales (or biases): the 16-byte blocks that hold
 * ng bf16 values at any 2-byte alignment. */
__host__ __device__ static inline int mf_sb_bytes(int ng) { return ((2 * ng + 15) & ~15) + 16; }

/* A warp copies n bytes (a multiple of 16, both ends 16-aligned): lane l
 * takes 16-byte pieces l, l + 32, ..., so chunk c of a row lands by lane
 * c % 32, the lane that reads it. */
__device__ __forceinline__ void mf_copy(uint8_t *dst, const uint8_t *src, int n, int lane) {
    for (int i = 16 * lane; i < n; i += 512) cp_async<16>(dst + i, src + i);
}

/* ng bf16 values at src into dst by the 16-byte blocks that hold them. */
__device__ __forceinline__ void mf_copy_sb(uint8_t *dst, const uint16_t *src, int ng, int lane) {
    const uintptr_t st = (uintptr_t)src, a0 = st & ~(uintptr_t)15;
    mf_copy(dst, (const uint8_t *)a0, ((int)(st - a0) + 2 * ng + 15) & ~15, lane);
}

/* Value j of an array staged by mf_copy_sb from src. */
__device__ __forceinline__ float mf_sb(const uint8_t *dst, const uint16_t *src, int j) {
    return bf16f(*(const uint16_t *)(dst + ((uintptr_t)src & 15) + 2 * j));
}

/* Row `row` of a [rows, cols] matrix: its data, scales and biases. */
typedef struct {
    const uint8_t *q;
    const uint16_t *s, *b;
} mf_row;

__device__ __forceinline__ mf_row mf_row_of(const mf_mat &m, int64_t row, int cols) {
    const int64_t ng = m.s ? cols >> m.gsh : 0;
    mf_row r = {m.q + row * (int64_t)kind_row_bytes(m.kind, cols), m.s ? m.s + row * ng : m.s,
                m.b ? m.b + row * ng : m.b};
    return r;
}


/* A staged row in shared memory: data, scales, biases. */
typedef struct {
    uint8_t *d, *s, *b;
} mf_slot;

/* Copies row r (kind, cols, group shift) into slot t. */
__device__ __forceinline__ void mf_stage(const mf_slot &t, const mf_row &r, int kind, int cols, int gsh, int lane) {
    mf_copy(t.d, r.q, (int)kind_row_bytes(kind, cols), lane);
    if (kind == KIND_Q4 || kind == KIND_Q8) {
        mf_copy_sb(t.s, r.s, cols >> gsh, lane);
        mf_copy_sb(t.b, r.b, cols >> gsh, lane);
    }
}

__device__ __forceinline__ const uint8_t *mf_blob(const mf_args &a, int e) {
    return a.blobs ? a.blobs[e] : a.base + (size_t)e * a.stride;
}

__device__ __forceinline__ mf_mat mf_part(const uint8_t *blob, const tern_cuda_expert_part &p, int kind, int gsh) {
    mf_mat m = {blob + p.q_off, (const uint16_t *)(blob + p.s_off), (const uint16_t *)(blob + p.b_off), kind, gsh};
    return m;
}

/* ---- row dots (each the arithmetic of the three-launch path) ------------ */

/* gemv1's register-tile dot (the fused router): per chunk
 * fmaf(s, g1_chunk_dot, b * sum(x)), chunks lane, lane + 32, ... */
template <int KIND>
__device__ float mf_dot_g1(const mf_slot &t, const mf_row &r, int cols, int gsh, const float *xf, int lane) {
    constexpr int E = kind_traits<KIND>::E, F = E / 4;
    const int nch = cols / E;
    float acc = 0.0f;
    for (int ci = lane; ci < nch; ci += 32) {
        const uint4 raw = *(const uint4 *)(t.d + 16 * ci);
        float4 xv[F];
#pragma unroll
        for (int q = 0; q < F; q++) xv[q] = ((const float4 *)xf)[ci * F + q];
        const float p = g1_chunk_dot<KIND>(raw, xv);
        if (kind_traits<KIND>::QUANT) {
            float cs = 0.0f;
#pragma unroll
            for (int q = 0; q < F; q++) cs += (xv[q].x + xv[q].y) + (xv[q].z + xv[q].w);
            const int g = (ci * E) >> gsh;
            acc += fmaf(mf_sb(t.s, r.s, g), p, mf_sb(t.b, r.b, g) * cs);
        } else {
            acc += p;
        }
    }
    return warp_sum(acc);
}

__device__ float mf_router_dot(int kind, const mf_slot &t, const mf_row &r, int cols, int gsh, const float *xf,
                               int lane) {
    switch (kind) {
    case KIND_Q4: return mf_dot_g1<KIND_Q4>(t, r, cols, gsh, xf, lane);
    case KIND_Q8: return mf_dot_g1<KIND_Q8>(t, r, cols, gsh, xf, lane);
    case KIND_BF16: return mf_dot_g1<KIND_BF16>(t, r, cols, gsh, xf, lane);
    default: return mf_dot_g1<KIND_F16>(t, r, cols, gsh, xf, lane);
    }
}

/* rows_dot's arithmetic (common.cuh; moe.cu's shared gate and float
 * gate/up): per chunk the word_dot chain, then fmaf(s, p, b * sum(x)), sum(x)
 * from the first row. R staged rows of one kind, summed over the warp. */
template <int KIND, int R>
__device__ void mf_dot_rows(const mf_slot (&t)[R], const mf_row (&r)[R], const int (&gsh)[R], int cols,
                            const float *xf, int lane, float (&acc)[R]) {
    constexpr int E = kind_traits<KIND>::E;
    const int nch = cols / E;
#pragma unroll
    for (int k = 0; k < R; k++) acc[k] = 0.0f;
    for (int ci = lane; ci < nch; ci += 32) {
        const float *xc = xf + (size_t)ci * E;
        float xsum[1] = {0.0f};
#pragma unroll
        for (int k = 0; k < R; k++) {
            const uint4 raw = *(const uint4 *)(t[k].d + 16 * ci);
            const uint32_t wv[4] = {raw.x, raw.y, raw.z, raw.w};
            float p[1] = {0.0f};
#pragma unroll
            for (int wi = 0; wi < 4; wi++) word_dot<KIND, 1>(wv[wi], xc + wi * word_elems<KIND>(), 0, p, xsum, k == 0);
            if (kind_traits<KIND>::QUANT) {
                const int g = (ci * E) >> gsh[k];
                acc[k] += fmaf(mf_sb(t[k].s, r[k].s, g), p[0], mf_sb(t[k].b, r[k].b, g) * xsum[0]);
            } else {
                acc[k] += p[0];
            }
        }
    }
#pragma unroll
    for (int k = 0; k < R; k++) acc[k] = warp_sum(acc[k]);
}

/* The shared gate's row (any kind), as moe.cu's row_dot1. */
__device__ float mf_gate_dot(int kind, const mf_slot &t, const mf_row &r, int cols, int gsh, const float *xf,
                             int lane) {
    const mf_slot tt[1] = {t};
    const mf_row rr[1] = {r};
    const int gs[1] = {gsh};
    float acc[1];
    switch (kind) {
    case KIND_Q4: mf_dot_rows<KIND_Q4, 1>(tt, rr, gs, cols, xf, lane, acc); break;
    case KIND_Q8: mf_dot_rows<KIND_Q8, 1>(tt, rr, gs, cols, xf, lane, acc); break;
    case KIND_BF16: mf_dot_rows<KIND_BF16, 1>(tt, rr, gs, cols, xf, lane, acc); break;
    default: mf_dot_rows<KIND_F16, 1>(tt, rr, gs, cols, xf, lane, acc); break;
    }
    return acc[0];
}

/* moe.cu's integer-dot gate/up (gud_accum): per chunk
 * fmaf(s, xd_dot * dx, b * sum(x)); then silu(gate) * up. */
template <int KIND>
__device__ float mf_pair_digits(const mf_slot &g, const mf_slot &u, const mf_row &gr, const mf_row &ur, int ggsh,
                                int ugsh, int cols, const uint4 *xd, const xd_chunk *cx, int lane) {
    constexpr int E = kind_traits<KIND>::E;
    const int nch = cols / E;
    float ag = 0.0f, au = 0.0f;
    for (int ci = lane; ci < nch; ci += 32) {
        uint4 d[XD_VEC4];
        xd_load<KIND>(xd, nch, ci, d);
        const xd_chunk c = cx[ci];
        const float pg = xd_dot<KIND>(*(const uint4 *)(g.d + 16 * ci), d) * c.dx;
        const float pu = xd_dot<KIND>(*(const uint4 *)(u.d + 16 * ci), d) * c.dx;
        const int gg = (ci * E) >> ggsh, gu = (ci * E) >> ugsh;
        ag += fmaf(mf_sb(g.s, gr.s, gg), pg, mf_sb(g.b, gr.b, gg) * c.sum);
        au += fmaf(mf_sb(u.s, ur.s, gu), pu, mf_sb(u.b, ur.b, gu) * c.sum);
    }
    return silu_f(warp_sum(ag)) * warp_sum(au);
}

/* The shared expert's pair in another kind than the routed one: moe.cu's
 * float gate_up_rows. */
template <int KIND>
__device__ float mf_pair_float(const mf_slot &g, const mf_slot &u, const mf_row &gr, const mf_row &ur, int ggsh,
                               int ugsh, int cols, const float *xf, int lane) {
    const mf_slot t[2] = {g, u};
    const mf_row rr[2] = {gr, ur};
    const int gs[2] = {ggsh, ugsh};
    float acc[2];
    mf_dot_rows<KIND, 2>(t, rr, gs, cols, xf, lane, acc);
    return silu_f(acc[0]) * acc[1];
}

/* A down chunk: sum over its E elements of w_i h_i, dequantized
 * (scale * sum(q h) + bias * sum(h)); float4 q of its h at h4[q * stride]. */
template <int KIND>
__device__ __forceinline__ float mf_down_chunk(const uint8_t *d, float s, float b, const float4 *h4, int stride) {
    constexpr int F = kind_traits<KIND>::E / 4;
    float4 xv[F];
    float xs = 0.0f;
#pragma unroll
    for (int q = 0; q < F; q++) {
        xv[q] = h4[q * stride];
        xs += (xv[q].x + xv[q].y) + (xv[q].z + xv[q].w);
    }
    return fmaf(s, g1_chunk_dot<KIND>(*(const uint4 *)d, xv), b * xs);
}

/* ---- grid barrier -------------------------------------------------------- */

__device__ __forceinline__ unsigned mf_ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ uint64_t mf_clock_ns(void) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Thread 0's time at mark i of its block (the phase trace). */
__device__ __forceinline__ void mf_mark(const mf_args &a, int i) {
    if (a.trace && threadIdx.x == 0) a.trace[(size_t)blockIdx.x * MF_MARKS + i] = mf_clock_ns();
}

/* Every block's writes before it are visible to every block after it:
 * this block arrives, then waits for `target` arrivals (the header). */
__device__ void mf_barrier(unsigned *sync, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(sync, 1u);
        const uint64_t t0 = mf_clock_ns();
        while (mf_ld_acquire(sync) < target)
            if (mf_clock_ns() - t0 > 5000000000ull) __trap();   /* not every block resident: fail, not hang */
        __threadfence();
    }
    __syncthreads();
}

/* ---- the kernel ------------------------------------------------------------- */

/* Shared-memory slots. Per block: router rows (row r in block r % nb,
 * slot r / nb, computed by warp slot % 8) and the shared expert's pairs
 * (row i likewise); per warp: routed pairs (pair p = (k, i) = warp w, w +
 * NW, ..., slot j) and down rows. A pair slot is the gate row's data, the
 * up row's, then gate scales, gate biases, up scales, up biases; a down
 * slot the K routed segments' data, the shared one's, then each routed
 * segment's scales and biases, the shared one's. */
__device__ __forceinline__ mf_slot mf_rslot(const mf_args &a, uint8_t *sm, int j) {
    uint8_t *p = sm + a.off_r + (size_t)j * a.slot_r;
    mf_slot t = {p, p + a.r_cap, p + a.r_cap + a.r_sb};
    return t;
}

__device__ __forceinline__ void mf_pair_slots(uint8_t *p, int cap, int sb, mf_slot &g, mf_slot &u) {
    uint8_t *s = p + 2 * cap;
    g = mf_slot{p, s, s + sb};
    u = mf_slot{p + cap, s + 2 * sb, s + 3 * sb};
}

/* Segment k (< K routed, K shared) of down slot j. */
template <int RK, int SK>
__device__ __forceinline__ mf_slot mf_dnslot(const mf_args &a, uint8_t *sm, int wb, int j, int k) {
    uint8_t *p = sm + a.off_dn + (size_t)(wb * a.D + j) * a.slot_dn;
    const int rr = (int)kind_row_bytes(RK, a.I), rs = SK >= 0 ? (int)kind_row_bytes(SK < 0 ? KIND_Q4 : SK, a.Is) : 0;
    uint8_t *sb = p + a.K * rr + rs;
    if (k < a.K) return mf_slot{p + k * rr, sb + 2 * k * a.dn_sb_r, sb + (2 * k + 1) * a.dn_sb_r};
    uint8_t *ss = sb + 2 * a.K * a.dn_sb_r;
    return mf_slot{p + a.K * rr, ss, ss + a.dn_sb_s};
}

template <int RK, int SK>
__global__ void __launch_bounds__(G1_THREADS, 2) moe_fused_kernel(mf_args a) {
    constexpr int SK2 = SK < 0 ? KIND_Q4 : SK, ER = kind_traits<RK>::E, ES = kind_traits<SK2>::E;
    extern __shared__ float4 mf_smem[];
    __shared__ float red[G1_WARPS];
    __shared__ int32_t s_ids[MF_MAXK];
    __shared__ float s_wts[MF_MAXK];
    __shared__ const uint8_t *s_blob[MF_MAXK];
    uint8_t *sm = (uint8_t *)mf_smem;
    float *xf = (float *)(sm + a.off_xf);
    uint4 *xd = (uint4 *)(sm + a.off_xd);
    xd_chunk *cx = (xd_chunk *)(xd + XD_VEC4 * (a.H / ER));
    const int lane = threadIdx.x & 31, wb = threadIdx.x >> 5, w = blockIdx.x * G1_WARPS + wb, NW = a.NW;
    const int H = a.H, K = a.K, I = a.I, Is = a.Is, KI = K * I, nb = gridDim.x, bi = blockIdx.x;
    const int NR = a.E + (SK >= 0 ? 1 : 0);

    mf_mark(a, 0);
    /* 1. before the wait: the rows that do not depend on this token */
    for (int j = wb; j < a.RB; j += G1_WARPS) {
        const int r = bi + j * nb;
        if (r < a.E) mf_stage(mf_rslot(a, sm, j), mf_row_of(a.router, r, H), a.router.kind, H, a.router.gsh, lane);
        else if (r < NR) mf_stage(mf_rslot(a, sm, j), mf_row_of(a.sgate, 0, H), a.sgate.kind, H, a.sgate.gsh, lane);
    }
    mf_mark(a, 1);
    if (SK >= 0) {
        for (int j = wb; j < a.JS; j += G1_WARPS) {
            const int i = bi + j * nb;
            if (i >= Is) break;
            mf_slot g, u;
            mf_pair_slots(sm + a.off_gs + (size_t)j * a.slot_gs, a.gs_cap, a.g_sb, g, u);
            mf_stage(g, mf_row_of(a.sh_gate, i, H), SK2, H, a.sh_gate.gsh, lane);
            mf_stage(u, mf_row_of(a.sh_up, i, H), SK2, H, a.sh_up.gsh, lane);
        }
        for (int j = 0; j < a.D; j++) {
            const int d = w + j * NW;
            if (d >= H) break;
            mf_stage(mf_dnslot<RK, SK>(a, sm, wb, j, K), mf_row_of(a.sh_down, d, Is), SK2, Is, a.sh_down.gsh, lane);
        }
    }
    cp_async_commit();
    mf_mark(a, 2);
    pdl_wait();   /* x and delta are the previous kernel's */
    mf_mark(a, 3);

    /* 2. the input, as the fused router makes it; its digits */
    {
        float4 v[G1_MAXV];
        g1_input(a.in, H, red, v);
#pragma unroll
        for (int k = 0; k < G1_MAXV; k++) {
            const int i = threadIdx.x + k * G1_THREADS;
            if (i < H / 4) ((float4 *)xf)[i] = v[k];
        }
    }
    __syncthreads();
    xd_build<RK>(xf, H, xd, cx, G1_WARPS);
    cp_async_wait_all();
    __syncwarp();
    mf_mark(a, 4);

    /* 3. router logits and the shared gate */
    for (int j = wb; j < a.RB; j += G1_WARPS) {
        const int r = bi + j * nb;
        if (r < a.E) {
            const float v = mf_router_dot(a.router.kind, mf_rslot(a, sm, j), mf_row_of(a.router, r, H), H,
                                          a.router.gsh, xf, lane);
            if (lane == 0) a.logits[r] = v;
        } else if (r < NR) {
            const float v = mf_gate_dot(a.sgate.kind, mf_rslot(a, sm, j), mf_row_of(a.sgate, 0, H), H, a.sgate.gsh,
                                        xf, lane);
            if (lane == 0) *a.sg = sigmoid_f(v);
        }
    }
    mf_mark(a, 5);
    mf_barrier(a.sync, nb);
    mf_mark(a, 6);
    /* the next kernel (a PDL launch) may start now: every block of this
     * grid is resident. Letting it start at this grid's start (as safe:
     * it starts only once every block has let it) measured slower, its
     * blocks' weight requests competing with the routed rows' (docs/
     * PERFORMANCE.md, step 34) */
    pdl_trigger();

    /* 4. top-k in every block; the routed rows requested at once */
    if (wb == 0) {
        route_row<8>(a.logits, a.E, K, a.renorm, s_ids, s_wts);
        mf_mark(a, 7);
        __syncwarp();
        if (lane < K) s_blob[lane] = mf_blob(a, s_ids[lane]);
    }
    __syncthreads();
    if (bi == 0 && threadIdx.x < K) {
        a.ids[threadIdx.x] = s_ids[threadIdx.x];
        a.wts[threadIdx.x] = s_wts[threadIdx.x];
    }
    mf_mark(a, 8);
    for (int j = 0; j < a.JR; j++) {
        const int p = w + j * NW;
        if (p >= KI) break;
        const uint8_t *blob = s_blob[p / I];
        mf_slot g, u;
        mf_pair_slots(sm + a.off_gr + (size_t)(wb * a.JR + j) * a.slot_gr, a.gr_cap, a.g_sb, g, u);
        mf_stage(g, mf_row_of(mf_part(blob, a.gate, RK, a.gsh_g), p % I, H), RK, H, a.gsh_g, lane);
        mf_stage(u, mf_row_of(mf_part(blob, a.up, RK, a.gsh_u), p % I, H), RK, H, a.gsh_u, lane);
    }
    for (int j = 0; j < a.D; j++) {
        const int d = w + j * NW;
        if (d >= H) break;
        for (int k = 0; k < K; k++)
            mf_stage(mf_dnslot<RK, SK>(a, sm, wb, j, k), mf_row_of(mf_part(s_blob[k], a.down, RK, a.gsh_d), d, I), RK,
                     I, a.gsh_d, lane);
    }
    cp_async_commit();
    mf_mark(a, 9);

    /* 5. gate/up: the shared expert's pairs (staged in step 1), then the
     * routed ones as they land */
    if (SK >= 0) {
        for (int j = wb; j < a.JS; j += G1_WARPS) {
            const int i = bi + j * nb;
            if (i >= Is) break;
            mf_slot g, u;
            mf_pair_slots(sm + a.off_gs + (size_t)j * a.slot_gs, a.gs_cap, a.g_sb, g, u);
            const mf_row gr = mf_row_of(a.sh_gate, i, H), ur = mf_row_of(a.sh_up, i, H);
            const float hv = SK == RK ? mf_pair_digits<RK>(g, u, gr, ur, a.sh_gate.gsh, a.sh_up.gsh, H, xd, cx, lane)
                                      : mf_pair_float<SK2>(g, u, gr, ur, a.sh_gate.gsh, a.sh_up.gsh, H, xf, lane);
            if (lane == 0) a.h[(size_t)K * a.Imax + i] = hv;
        }
    }
    mf_mark(a, 10);
    cp_async_wait_all();
    __syncwarp();
    for (int j = 0; j < a.JR; j++) {
        const int p = w + j * NW;
        if (p >= KI) break;
        const uint8_t *blob = s_blob[p / I];
        mf_slot g, u;
        mf_pair_slots(sm + a.off_gr + (size_t)(wb * a.JR + j) * a.slot_gr, a.gr_cap, a.g_sb, g, u);
        const mf_row gr = mf_row_of(mf_part(blob, a.gate, RK, a.gsh_g), p % I, H);
        const mf_row ur = mf_row_of(mf_part(blob, a.up, RK, a.gsh_u), p % I, H);
        const float hv = mf_pair_digits<RK>(g, u, gr, ur, a.gsh_g, a.gsh_u, H, xd, cx, lane);
        if (lane == 0) a.h[(size_t)(p / I) * a.Imax + p % I] = hv;
    }
    mf_mark(a, 11);
    mf_barrier(a.sync, 2 * nb);
    mf_mark(a, 12);

    /* 6. down: h into the spent routed pair slots, then a warp per output
     * row. h is laid out by chunk (float4 q of chunk c at q * nc + c, the
     * routed segments' chunks, then the shared one's), so the 32 lanes
     * reading 32 consecutive chunks read 32 consecutive float4: a row-major
     * h put a lane's 128 bytes on the same banks as its neighbours' (10 us
     * of bank conflicts at Qwen3.6's shapes). */
    float4 *hs = (float4 *)(sm + a.off_gr);
    const int ncr = I / ER, ncs = SK >= 0 ? Is / ES : 0, nc = K * ncr + ncs;
    const int nr4 = K * (I / 4), nh4 = nr4 + (SK >= 0 ? Is / 4 : 0);
    for (int i = threadIdx.x; i < nh4; i += G1_THREADS) {
        int seg, u, E, c0;
        if (i < nr4) {
            seg = i / (I / 4);
            u = i - seg * (I / 4);
            E = ER;
            c0 = seg * ncr;
        } else {
            seg = K;
            u = i - nr4;
            E = ES;
            c0 = K * ncr;
        }
        const int e = 4 * u;   /* through L2: other blocks wrote h (by cp.async.cg: 3.5 us slower) */
        hs[(e % E) / 4 * nc + c0 + e / E] = __ldcg((const float4 *)(a.h + (size_t)seg * a.Imax) + u);
    }
    const float gate = SK >= 0 ? __ldcg(a.sg) : 0.0f;
    __syncthreads();
    mf_mark(a, 13);
    for (int j = 0; j < a.D; j++) {
        const int d = w + j * NW;
        if (d >= H) break;
        float acc = 0.0f;
        for (int c = lane; c < nc; c += 32) {
            if (c < K * ncr) {
                const int k = c / ncr, cc = c - k * ncr, g = (cc * ER) >> a.gsh_d;
                const mf_slot t = mf_dnslot<RK, SK>(a, sm, wb, j, k);
                const mf_row r = mf_row_of(mf_part(s_blob[k], a.down, RK, a.gsh_d), d, I);
                acc += s_wts[k] * mf_down_chunk<RK>(t.d + 16 * cc, mf_sb(t.s, r.s, g), mf_sb(t.b, r.b, g), hs + c, nc);
            } else if (SK >= 0) {
                const int cc = c - K * ncr, g = (cc * ES) >> a.sh_down.gsh;
                const mf_slot t = mf_dnslot<RK, SK>(a, sm, wb, j, K);
                const mf_row r = mf_row_of(a.sh_down, d, Is);
                acc += gate * mf_down_chunk<SK2>(t.d + 16 * cc, mf_sb(t.s, r.s, g), mf_sb(t.b, r.b, g), hs + c, nc);
            }
        }
        acc = warp_sum(acc);
        if (lane == 0) a.out[d] = acc;
    }

    mf_mark(a, 14);
    /* 7. the third arrival: the last block resets the counter */
    if (threadIdx.x == 0 && atomicAdd(a.sync, 1u) == 3u * nb - 1u) atomicExch(a.sync, 0u);
}

/* ---- host side ----------------------------------------------------------- */

static int mf_round16(size_t v) { return (int)((v + 15) & ~(size_t)15); }
static int mf_quant(int kind) { return kind == KIND_Q4 || kind == KIND_Q8; }
static int mf_imax(int a, int b) { return a > b ? a : b; }

static int mf_aligned(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* A tern_mat the kernel can stage: a known kind, whole 16-byte chunks in
 * 16-aligned rows, groups of 32/64/128 (quantized kinds). */
static int mf_mat_of(const tern_mat *W, int64_t rows, int64_t cols, mf_mat *m) {
    int kind = mat_kind(W);
    if (kind < 0 || W->rows != rows || W->cols != cols || !mf_aligned(W->data)) return 0;
    if (kind_row_bytes(kind, cols) % 16) return 0;
    if (mf_quant(kind) && ((W->group != 32 && W->group != 64 && W->group != 128) || cols % W->group ||
                           !W->scales || !W->biases))
        return 0;
    *m = mf_mat{(const uint8_t *)W->data, W->scales, W->biases, kind, mf_quant(kind) ? log2i(W->group) : 0};
    return 1;
}

static int mf_part_ok(const tern_cuda_expert_part *p, int64_t rows, int64_t cols) {
    int g = p->group;
    return (p->bits == 4 || p->bits == 8) && p->rows == rows && p->cols == cols && (g == 32 || g == 64 || g == 128) &&
           cols % g == 0 && (cols * p->bits / 8) % 16 == 0 && p->q_off % 16 == 0 && p->s_off % 2 == 0 &&
           p->b_off % 2 == 0;
}

/* The slots and shared-memory offsets for nb blocks; returns the bytes. */
static size_t mf_plan(mf_args &a, int nb, int RK, int SK) {
    const int ER = RK == KIND_Q4 ? 32 : 16;
    a.NW = nb * G1_WARPS;
    a.RB = ceil_div(a.E + (SK >= 0 ? 1 : 0), nb);
    a.JR = ceil_div((int64_t)a.K * a.I, a.NW);
    a.JS = SK >= 0 ? ceil_div(a.Is, nb) : 0;
    a.D = ceil_div(a.H, a.NW);
    size_t rb = kind_row_bytes(a.router.kind, a.H);
    int ng = mf_quant(a.router.kind) ? a.H >> a.router.gsh : 0;
    int gng = mf_imax(a.H >> a.gsh_g, a.H >> a.gsh_u);
    if (SK >= 0) {
        size_t sb = kind_row_bytes(a.sgate.kind, a.H);
        rb = rb > sb ? rb : sb;
        if (mf_quant(a.sgate.kind)) ng = mf_imax(ng, a.H >> a.sgate.gsh);
        gng = mf_imax(gng, mf_imax(a.H >> a.sh_gate.gsh, a.H >> a.sh_up.gsh));
    }
    a.r_cap = mf_round16(rb);
    a.r_sb = ng ? mf_sb_bytes(ng) : 0;
    a.slot_r = a.r_cap + 2 * a.r_sb;
    a.g_sb = mf_sb_bytes(gng);
    a.gr_cap = mf_round16(kind_row_bytes(RK, a.H));
    a.slot_gr = 2 * a.gr_cap + 4 * a.g_sb;
    a.gs_cap = SK >= 0 ? mf_round16(kind_row_bytes(SK, a.H)) : 0;
    a.slot_gs = SK >= 0 ? 2 * a.gs_cap + 4 * a.g_sb : 0;
    a.dn_sb_r = mf_sb_bytes(a.I >> a.gsh_d);
    a.dn_sb_s = SK >= 0 ? mf_sb_bytes(a.Is >> a.sh_down.gsh) : 0;
    a.slot_dn = a.K * (int)kind_row_bytes(RK, a.I) + (SK >= 0 ? (int)kind_row_bytes(SK, a.Is) : 0) +
                2 * a.K * a.dn_sb_r + 2 * a.dn_sb_s;
    /* xn as floats first. (Inside the routed pairs' slots, dead once the
     * router's dots are done, it saved 8 KB a block, enough for the next
     * kernel's blocks to become resident beside this grid's, and measured
     * slower: their weight requests compete with the routed rows') */
    a.off_xf = 0;
    size_t off = (size_t)mf_round16((size_t)a.H * sizeof(float));
    a.off_xd = (int)off;
    off += (size_t)mf_round16((size_t)(a.H / ER) * (XD_VEC4 * 16 + sizeof(xd_chunk)));
    a.off_r = (int)off;
    off += (size_t)a.RB * a.slot_r;
    a.off_gr = (int)off;   /* then h, in phase 3 */
    /* h by chunk: max(float4 a chunk) x chunks */
    const int ES = SK == KIND_Q8 ? 16 : 32, F = (ER > ES ? ER : ES) / 4;
    const size_t nch = (size_t)a.K * (a.I / ER) + (SK >= 0 ? (size_t)(a.Is / ES) : 0);
    size_t gr = (size_t)G1_WARPS * a.JR * a.slot_gr, hb = (size_t)F * nch * 16;
    off += (size_t)mf_round16(gr > hb ? gr : hb);
    a.off_gs = (int)off;
    off += (size_t)a.JS * a.slot_gs;
    a.off_dn = (int)off;
    off += (size_t)G1_WARPS * a.D * a.slot_dn;
    return off;
}

typedef void (*mf_kernel_t)(mf_args);

static mf_kernel_t mf_kernel(int RK, int SK) {
    static const mf_kernel_t k[2][3] = {
        {moe_fused_kernel<KIND_Q4, -1>, moe_fused_kernel<KIND_Q4, KIND_Q4>, moe_fused_kernel<KIND_Q4, KIND_Q8>},
        {moe_fused_kernel<KIND_Q8, -1>, moe_fused_kernel<KIND_Q8, KIND_Q4>, moe_fused_kernel<KIND_Q8, KIND_Q8>}};
    return k[RK == KIND_Q8][SK + 1];
}

/* Resident blocks of a kernel at `smem` bytes, cached (the queries cost
 * microseconds; a pure function of the kernel, the size and the device).
 * A kernel's shared-memory limit is raised to the largest size asked, never
 * lowered (a smaller launch of the same kernel may follow a larger one). */
static int mf_occupancy(mf_kernel_t kern, size_t smem) {
    static struct {
        mf_kernel_t k;
        size_t smem;
        int occ;
    } cache[32];
    static struct {
        mf_kernel_t k;
        size_t limit;
    } lim[6];
    static int n = 0, nl = 0;
    for (int i = 0; i < n; i++)
        if (cache[i].k == kern && cache[i].smem == smem) return cache[i].occ;
    int li = 0;
    while (li < nl && lim[li].k != kern) li++;
    if (li == nl && nl < 6) lim[nl++] = {kern, 0};   /* the attribute set before any launch, whatever its size */
    int occ = 0, allowed = li < nl && smem <= lim[li].limit;
    if (!allowed && li < nl &&
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess) {
        lim[li].limit = smem;
        allowed = 1;
    }
    if (!allowed || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, G1_THREADS, smem) != cudaSuccess)
        occ = 0;   /* no place for it */
    cudaGetLastError();
    if (n < 32) cache[n++] = {kern, smem, occ};
    return occ;
}

/* SMs and the shared memory a block may opt into, read once (as g1_sms in
 * gemv_fused.cu: one device per process). */
static int mf_sms(int *optin) {
    static int n = 0, o = 0;
    if (!n) {
        int dev = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&o, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
        if (n < 1) n = 1;
    }
    *optin = o;
    return n;
}

/* TERN_MOE_FUSED_BPS=1: one block per SM even where two fit (comparisons). */
static int mf_bps_max(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("TERN_MOE_FUSED_BPS");
        v = e && !strcmp(e, "1") ? 1 : 2;
    }
    return v;
}

/* TERN_MOE_FUSED_COOP=1: launched as a cooperative grid too (the driver
 * refuses a grid that cannot be resident at once instead of leaving the
 * barrier to trap), if the driver takes it with PDL. */
static int mf_coop(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("TERN_MOE_FUSED_COOP");
        v = e && !strcmp(e, "1");
    }
    return v;
}

/* Everything but the buffers: shapes, encodings, and a grid that is
 * resident at once. On success a holds the plan, *grid and *smem the launch. */
static int mf_setup(const tern_mat *router, const tern_cuda_route_out *route, const tern_cuda_experts *ex,
                    const tern_expert_w *shared, const tern_mat *shared_gate, mf_args &a, int *grid, size_t *smem,
                    mf_kernel_t *kern, tern_error *err) {
    memset(&a, 0, sizeof a);
    const int64_t H = ex->gate.cols, I = ex->gate.rows;
    if (H % XD_SPAN || H > 4 * G1_MAXV * G1_THREADS || H < XD_SPAN)
        return tern_fail(err, "moe_fused: hidden size %lld (a multiple of 64, at most %d)", (long long)H,
                         4 * G1_MAXV * G1_THREADS);
    if (!route || route->n_experts < 1 || route->n_experts > MF_MAXE || route->top_k < 1 || route->top_k > MF_MAXK ||
        route->top_k > route->n_experts)
        return tern_fail(err, "moe_fused: %d experts, top %d (at most %d and %d)", route ? route->n_experts : 0,
                         route ? route->top_k : 0, MF_MAXE, MF_MAXK);
    if (!mf_mat_of(router, route->n_experts, H, &a.router))
        return tern_fail(err, "moe_fused: router must be [%d, %lld] in a staged encoding", route->n_experts,
                         (long long)H);
    if (!mf_part_ok(&ex->gate, I, H) || !mf_part_ok(&ex->up, I, H) || !mf_part_ok(&ex->down, H, I) ||
        ex->up.bits != ex->gate.bits || ex->down.bits != ex->gate.bits || (!ex->blobs && !ex->base) ||
        (ex->base && (ex->stride % 16 || !mf_aligned(ex->base))))
        return tern_fail(err, "moe_fused: routed experts must be q4/q8 [I, H], [I, H], [H, I] with 16-byte rows");
    const int RK = ex->gate.bits == 4 ? KIND_Q4 : KIND_Q8;
    int SK = -1;
    int64_t Is = 0;
    if (shared) {
        Is = shared->gate.rows;
        mf_mat g, u, d, sg;
        if (!mf_mat_of(&shared->gate, Is, H, &g) || !mf_mat_of(&shared->up, Is, H, &u) ||
            !mf_mat_of(&shared->down, H, Is, &d) || !mf_quant(g.kind) || u.kind != g.kind || d.kind != g.kind ||
            !shared_gate || !mf_mat_of(shared_gate, 1, H, &sg))
            return tern_fail(err, "moe_fused: shared expert must be q4/q8 [Is, H], [Is, H], [H, Is] with its gate [1, H]");
        SK = g.kind;
        a.sh_gate = g;
        a.sh_up = u;
        a.sh_down = d;
        a.sgate = sg;
    }
    a.H = (int)H;
    a.E = route->n_experts;
    a.K = route->top_k;
    a.renorm = route->renorm;
    a.I = (int)I;
    a.Is = (int)Is;
    a.Imax = a.I > a.Is ? a.I : a.Is;
    a.gsh_g = log2i(ex->gate.group);
    a.gsh_u = log2i(ex->up.group);
    a.gsh_d = log2i(ex->down.group);
    int optin = 0, sms = mf_sms(&optin);
    *kern = mf_kernel(RK, SK);
    for (int bps = mf_bps_max(); bps >= 1; bps--) {
        size_t bytes = mf_plan(a, sms * bps, RK, SK);
        if (bytes > (size_t)optin) continue;
        if (mf_occupancy(*kern, bytes) < bps) continue;
        *grid = sms * bps;
        *smem = bytes;
        return 0;
    }
    return tern_fail(err, "moe_fused: the experts' rows do not fit the shared memory of a resident grid");
}

/* ---- the phase trace (TERN_MOE_FUSED_TRACE=1, eager calls only) ----------
 * Each call synchronises and keeps, per mark, the median and the largest
 * time over the blocks since the earliest block's start; the report prints
 * the median of those over the calls. A development tool: it costs a sync
 * per call and cannot be captured. */
#define MF_TRACE_CALLS 256
static struct {
    unsigned long long *dev;
    int nb, calls;
    float med[MF_TRACE_CALLS][MF_MARKS], max[MF_TRACE_CALLS][MF_MARKS];
} mf_tr;

static int mf_tracing(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("TERN_MOE_FUSED_TRACE");
        v = e && !strcmp(e, "1");
    }
    return v;
}

static int mf_cmp_f(const void *x, const void *y) {
    float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

static void mf_trace_take(int nb, cudaStream_t s) {
    if (cudaStreamSynchronize(s) != cudaSuccess || mf_tr.calls >= MF_TRACE_CALLS) return;
    unsigned long long *h = (unsigned long long *)malloc((size_t)nb * MF_MARKS * sizeof *h);
    float *col = (float *)malloc((size_t)nb * sizeof(float));
    if (h && col && cudaMemcpy(h, mf_tr.dev, (size_t)nb * MF_MARKS * sizeof *h, cudaMemcpyDeviceToHost) == cudaSuccess) {
        unsigned long long t0 = h[0];
        for (int b = 0; b < nb; b++) t0 = h[(size_t)b * MF_MARKS] < t0 ? h[(size_t)b * MF_MARKS] : t0;
        for (int i = 0; i < MF_MARKS; i++) {
            for (int b = 0; b < nb; b++) col[b] = (float)(h[(size_t)b * MF_MARKS + i] - t0) * 1e-3f;
            qsort(col, (size_t)nb, sizeof(float), mf_cmp_f);
            mf_tr.med[mf_tr.calls][i] = col[nb / 2];
            mf_tr.max[mf_tr.calls][i] = col[nb - 1];
        }
        mf_tr.calls++;
    }
    free(h);
    free(col);
}

void tern_cuda_moe_fused_trace_report(FILE *f) {
    static const char *const names[MF_MARKS] = {
        "start", "router rows requested", "shared rows requested", "after the wait", "input, digits, rows landed",
        "router dots", "barrier 1", "route_row", "top-k", "routed rows requested", "shared pairs", "routed pairs",
        "barrier 2", "h loaded", "down"};
    if (!mf_tr.calls || !f) {
        mf_tr.calls = 0;
        return;
    }
    fprintf(f, "moe_fused phases over %d calls (%d blocks): us since the first block's start, median over calls\n",
            mf_tr.calls, mf_tr.nb);
    fprintf(f, "| mark | median block | last block |\n|---|---:|---:|\n");
    float v[MF_TRACE_CALLS];
    for (int i = 0; i < MF_MARKS; i++) {
        float m[2];
        for (int k = 0; k < 2; k++) {
            for (int c = 0; c < mf_tr.calls; c++) v[c] = k ? mf_tr.max[c][i] : mf_tr.med[c][i];
            qsort(v, (size_t)mf_tr.calls, sizeof(float), mf_cmp_f);
            m[k] = v[mf_tr.calls / 2];
        }
        fprintf(f, "| %s | %.2f | %.2f |\n", names[i], m[0], m[1]);
    }
    mf_tr.calls = 0;
}

int tern_cuda_moe_fused_supported(const tern_mat *router, const tern_cuda_route_out *route,
                                  const tern_cuda_experts *ex, const tern_expert_w *shared,
                                  const tern_mat *shared_gate) {
    mf_args a;
    int grid;
    size_t smem;
    mf_kernel_t k;
    tern_error err;
    return mf_setup(router, route, ex, shared, shared_gate, a, &grid, &smem, &k, &err) == 0;
}

int tern_cuda_moe_fused(const tern_mat *router, const tern_cuda_vec_in *in, const tern_cuda_route_out *route,
                        float *logits, const tern_cuda_experts *ex, const tern_expert_w *shared,
                        const tern_mat *shared_gate, void *work, float *out, tern_stream s, tern_error *err) {
    mf_args a;
    int grid = 0;
    size_t smem = 0;
    mf_kernel_t kern;
    if (mf_setup(router, route, ex, shared, shared_gate, a, &grid, &smem, &kern, err)) return -1;
    if (!in || !in->x) return tern_fail(err, "moe_fused: no input");
    if (in->delta && !in->x_out) return tern_fail(err, "moe_fused: a residual needs x_out");
    if ((in->x_out && (in->x_out == in->x || in->x_out == in->delta)) ||
        (in->xn_out && (in->xn_out == in->x || in->xn_out == in->delta)))
        return tern_fail(err, "moe_fused: x_out and xn_out must not be inputs (other blocks still read them)");
    if (!route->counter || !route->ids || !route->wts || !logits || !work || !out)
        return tern_fail(err, "moe_fused: no counter, ids, weights, logits, workspace or output");
    a.in = *in;
    a.logits = logits;
    a.ids = route->ids;
    a.wts = route->wts;
    a.sync = route->counter;
    a.blobs = ex->blobs;
    a.base = ex->base;
    a.stride = ex->stride;
    a.gate = ex->gate;
    a.up = ex->up;
    a.down = ex->down;
    a.h = (float *)work;
    a.sg = a.h + (size_t)(a.K + (shared ? 1 : 0)) * a.Imax;
    a.out = out;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (mf_tracing() && cudaStreamIsCapturing((cudaStream_t)s, &cap) == cudaSuccess && cap == cudaStreamCaptureStatusNone) {
        if (!mf_tr.dev && cudaMalloc((void **)&mf_tr.dev, (size_t)4096 * MF_MARKS * sizeof *mf_tr.dev) != cudaSuccess)
            return tern_fail(err, "moe_fused: no memory for the trace");
        if (grid > 4096) return tern_fail(err, "moe_fused: trace for at most 4096 blocks");
        a.trace = mf_tr.dev;
        mf_tr.nb = grid;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)grid);
    cfg.blockDim = dim3(G1_THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = (cudaStream_t)s;
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = tern_cuda_pdl_enabled();
    at[1].id = cudaLaunchAttributeCooperative;   /* the driver then guarantees the grid is resident at once */
    at[1].val.cooperative = 1;
    cfg.attrs = at;
    cfg.numAttrs = mf_coop() ? 2 : 1;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kern, a);
    if (e != cudaSuccess) return tern_fail(err, "moe_fused: %s", cudaGetErrorString(e));
    if (a.trace) mf_trace_take(grid, (cudaStream_t)s);
    return 0;
}
