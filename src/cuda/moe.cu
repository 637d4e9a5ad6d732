/* The MoE block at decode: the router's top-k, then the routed experts and
 * the shared expert in two launches (one token's in one launch where it
 * applies: "gate/up and down in one launch" below).
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
 * The integer-dot gate/up is launched with programmatic dependent launch
 * (common.cuh) behind the router: its blocks are resident before the
 * router ends, and the shared expert's request their weights before the
 * wait. The down kernel is launched the ordinary way (every PDL form of it
 * measured slower: docs/experiments/cuda-moe.md and cuda-step-timeline.md),
 * but lets its successor launch once its rows are in: the next layer's
 * input projections request their weights while the experts compute, not
 * while their rows are in flight. */
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

/* ---- launch 1: gate and up ------------------------------------------------ */

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

__device__ float dot_any(int kind, const part_ptr &p, int cols, const float *x) {
    switch (kind) {
    case KIND_Q4: return row_dot1<KIND_Q4>(p, cols, x);
    case KIND_Q8: return row_dot1<KIND_Q8>(p, cols, x);
    case KIND_BF16: return row_dot1<KIND_BF16>(p, cols, x);
    default: return row_dot1<KIND_F16>(p, cols, x);
    }
}

__device__ void gate_up_any(int kind, const part_ptr &g, const part_ptr &u, int i0, int n, int H, const float *x,
                            float *h) {
    switch (kind) {
    case KIND_Q4: gate_up_rows<KIND_Q4>(g, u, i0, n, H, x, h); break;
    case KIND_Q8: gate_up_rows<KIND_Q8>(g, u, i0, n, H, x, h); break;
    case KIND_BF16: gate_up_rows<KIND_BF16>(g, u, i0, n, H, x, h); break;
    default: gate_up_rows<KIND_F16>(g, u, i0, n, H, x, h); break;
    }
}

__global__ void __launch_bounds__(128) moe_gate_up_kernel(moe_args a) {
    int seg = blockIdx.y, t = seg / a.S, k = seg % a.S;
    int warp = threadIdx.x >> 5;
    int i0 = (blockIdx.x * 4 + warp) * 2;
    const float *x = a.x + (size_t)t * a.H;
    float *h = a.h + (size_t)seg * a.Imax;
    if (k < a.K) {
        if (i0 >= a.I) return;
        const uint8_t *blob = expert_blob(a, a.ids[t * a.K + k]);
        gate_up_any(a.r_kind, blob_part(blob, a.gate), blob_part(blob, a.up), i0, a.I, a.H, x, h);
        return;
    }
    if (i0 < a.s_inter) gate_up_any(a.s_kind, a.sgate_p, a.sup_p, i0, a.s_inter, a.H, x, h);
    if (blockIdx.x == 0 && warp == 0) {
        float v = dot_any(a.sg_kind, a.sg_p, a.H, x);
        if ((threadIdx.x & 31) == 0) a.sg[t] = sigmoid_f(v);
    }
}

/* ---- launch 1 at 4 and 8 bits: gate and up through integer dots ---------
 * The same rows per warp, with x turned into digits once per block
 * (idot.cuh): a q4 chunk costs 24 dp4a per row instead of 32 float
 * dequantize-and-multiply steps (q8: 12 for 16). A block of GUD_WARPS
 * warps takes 2 x GUD_WARPS rows of gate and of up of one segment; a warp's
 * 4 rows x 2 chunks per lane are loaded before any is used (at q4 and H =
 * 2048 the whole rows). 9 warps, two blocks an SM (the kernel's launch
 * bounds): Qwen3.6's 9 segments x 29 blocks fit the H200's 264 places in
 * one wave, where 8-warp blocks made 288 blocks and a second wave. */
#define GUD_WARPS 9

/* A warp's 4 rows of gate_up_rows_d (gate i0, up i0, gate i1, up i1) and
 * the weights of one step of chunks: chunks c0 and c0 + 32 of each row,
 * with their scales and biases, in registers. */
typedef struct {
    const uint8_t *q[4];
    const uint16_t *sc[4], *bi[4];
    int gs[4];
} gud_rows;

#define GUD_J 2   /* chunks per lane and row a step */
typedef struct {
    uint4 raw[GUD_J][4];
    float s[GUD_J][4], b[GUD_J][4];
} gud_step;

template <int KIND>
__device__ __forceinline__ gud_rows gud_setup(const part_ptr &g, const part_ptr &u, int i0, int n, int H) {
    const int i1 = i0 + 1 < n ? i0 + 1 : i0;
    gud_rows r;
    part_row(g, KIND, i0, H, r.q[0], r.sc[0], r.bi[0]);
    part_row(u, KIND, i0, H, r.q[1], r.sc[1], r.bi[1]);
    part_row(g, KIND, i1, H, r.q[2], r.sc[2], r.bi[2]);
    part_row(u, KIND, i1, H, r.q[3], r.sc[3], r.bi[3]);
    r.gs[0] = r.gs[2] = g.gsh;
    r.gs[1] = r.gs[3] = u.gsh;
    return r;
}

template <int KIND>
__device__ __forceinline__ void gud_fetch(const gud_rows &w, int c0, int nch, gud_step &st) {
#pragma unroll
    for (int j = 0; j < GUD_J; j++) {
        const int ci = c0 + 32 * j < nch ? c0 + 32 * j : c0;
#pragma unroll
        for (int r = 0; r < 4; r++) {
            st.raw[j][r] = ld_stream(w.q[r] + (size_t)ci * 16);
            const int gi = (ci * kind_traits<KIND>::E) >> w.gs[r];
            st.s[j][r] = bf16f(__ldg(w.sc[r] + gi));
            st.b[j][r] = bf16f(__ldg(w.bi[r] + gi));
        }
    }
}

template <int KIND>
__device__ __forceinline__ void gud_accum(const gud_step &st, int c0, int nch, const uint4 *xd,
                                          const xd_chunk *cx, float (&acc)[4]) {
#pragma unroll
    for (int j = 0; j < GUD_J; j++) {
        const int ci = c0 + 32 * j;
        if (ci >= nch) break;
        uint4 d[XD_VEC4];
        xd_load<KIND>(xd, nch, ci, d);
        const xd_chunk c = cx[ci];
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const float p = xd_dot<KIND>(st.raw[j][r], d) * c.dx;
            acc[r] += fmaf(st.s[j][r], p, st.b[j][r] * c.sum);
        }
    }
}

/* h[i] = silu(gate_i . x) * (up_i . x) for rows i0, i0 + 1 (< n) from x as
 * digits; first: the weights of the first step of chunks, fetched by the
 * caller before the digits were built. */
template <int KIND>
__device__ void gate_up_rows_d(const gud_rows &w, const gud_step &first, int i0, int n, int H, const uint4 *xd,
                               const xd_chunk *cx, float *h) {
    const int lane = threadIdx.x & 31, nch = H / kind_traits<KIND>::E;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    gud_accum<KIND>(first, lane, nch, xd, cx, acc);
    for (int c0 = lane + 32 * GUD_J; c0 < nch; c0 += 32 * GUD_J) {
        gud_step st;
        gud_fetch<KIND>(w, c0, nch, st);
        gud_accum<KIND>(st, c0, nch, xd, cx, acc);
    }
    float g0 = warp_sum(acc[0]), u0 = warp_sum(acc[1]), g1 = warp_sum(acc[2]), u1 = warp_sum(acc[3]);
    if (lane == 0) {
        h[i0] = silu_f(g0) * u0;
        if (i0 + 1 < n) h[i0 + 1] = silu_f(g1) * u1;
    }
}

/* x of a gate/up block: float4 tid + j * blockDim of x in registers
 * (GUD_XV of them: H <= 2304 at 288 threads), then into shared memory with
 * whatever lies beyond them read directly. */
#define GUD_XV 2
__device__ __forceinline__ void gud_x_load(const float4 *x4, int H, float4 (&xv)[GUD_XV]) {
#pragma unroll
    for (int j = 0; j < GUD_XV; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < H / 4) xv[j] = x4[i];
    }
}

__device__ __forceinline__ void gud_x_store(const float4 *x4, int H, const float4 (&xv)[GUD_XV], float4 *xf4) {
#pragma unroll
    for (int j = 0; j < GUD_XV; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < H / 4) xf4[i] = xv[j];
    }
    for (int i = threadIdx.x + GUD_XV * blockDim.x; i < H / 4; i += blockDim.x) xf4[i] = x4[i];
}

/* SK: the shared expert's kind (-1: none), a template argument so the
 * kernel holds only the code it runs (a block runs for a few microseconds,
 * so instruction-cache misses of a kernel carrying every kind's loop were
 * a large share of its stalls: docs/experiments/cuda-moe.md). */
/* A routed block's own top k in shared memory: warp 0 stores the ids and
 * what their weights need (route_pick's key, max and sum) before the
 * block's barrier; the weights are made in seg_down, where the block waits
 * for its segment anyway (route_weight's exp and divisions had been on the
 * chain to the first weight request: docs/experiments/cuda-router.md). */
struct route_sm {
    int32_t ids[32];
    float wts[32];
    uint32_t key[32];
    float m, sum;
};

template <int RK>
__device__ void seg_stage(const moe_args &a, const part_ptr &D, uint8_t *sm, bool sh);
template <int RK>
__device__ void seg_down(const moe_args &a, int t, int k, const part_ptr &D, uint8_t *sm, bool sh, float wr,
                         route_sm *rs, unsigned long long *tm);

/* FUSED: the down projection too (one-token decode, q4, the grid in one
 * wave): a block of segment k also owns rows chunk b of that expert's down
 * projection; it requests them (into shared memory after the digits'
 * region) once its expert is known, and after its h rows are written and
 * its segment's blocks have all counted themselves, computes them from
 * that segment's h (seg_down). */
/* EARLY (with FUSED, routing itself): a routed block stores x and builds
 * its digits in warps 1.. while warp 0 takes the top k, instead of after
 * its weight requests, whose issue holds the block back
 * (docs/experiments/cuda-moe.md). */
template <int RK, int SK, bool FUSED = false, bool EARLY = false>
__global__ void __launch_bounds__(GUD_WARPS * 32, 2) moe_gate_up_d_kernel(moe_args a) {
    extern __shared__ float4 gud_smem[];
    const int seg = blockIdx.y, t = seg / a.S, k = seg % a.S, warp = threadIdx.x >> 5;
    const int i0 = (blockIdx.x * GUD_WARPS + warp) * 2;
    const float *x = a.x + (size_t)t * a.H;
    float *h = a.h + (size_t)seg * a.Imax;
    const bool routed = k < a.K;
    /* launched with PDL after the router: the ids and x are the router's,
     * so only the shared expert's weights (in the routed kind) may be
     * requested before the wait */
    const bool early = !routed && SK == RK;
    int eid = 0;       /* FUSED: the routed segment's expert */
    float ew = 0.0f;   /* and its weight when the router gave it (routing itself: rs, in seg_down) */
    __shared__ route_sm rs;   /* routing itself */
    TRACE_DECL;
    TRACE_MARK(0);
    if (!early) pdl_wait();
    TRACE_MARK(1);
    if (routed || SK == RK) {   /* x as digits (every thread of the block takes part) */
        /* the warp's first weights are requested before x turns into
         * digits: the expert id, then its rows, in flight while x is
         * loaded and converted (the chain before the first weight byte is
         * one id read, not x, the digits and the id in a row) */
        const int n = routed ? a.I : a.s_inter;
        const bool mine = i0 < n;
        /* x is requested before the weights when it is ready (after the
         * wait): a load issued behind a block's ~36 KB of weight requests
         * waits for them (docs/experiments/cuda-step-timeline.md) */
        const float4 *x4 = (const float4 *)x;
        float4 xv[GUD_XV];
        const bool x_now = !early;
        if (x_now) gud_x_load(x4, a.H, xv);
        gud_rows w;
        gud_step first;
        constexpr bool DE = EARLY && FUSED;
        if (FUSED && routed) {
            if (routes_itself(a)) {
                /* every routed block routes the token itself (route.cuh: the
                 * same ids and weights in each block, and as the router's
                 * last block gives them), in warp 0 while the others' x
                 * loads are in flight */
                /* warp 0's logits requested now, beside x, not after x's
                 * barrier below: their L2 round trip was in the chain */
                float lg[8];
                if (warp == 0) route_load<8>(a.logits, a.n_e, lg);
                if constexpr (DE) {   /* x complete in shared memory for the digits below */
                    float *xf = (float *)gud_smem;
                    uint4 *xd = (uint4 *)(xf + a.H);
                    gud_x_store(x4, a.H, xv, (float4 *)xf);
                    __syncthreads();
                    /* the word form (idot.cuh; the same bits): with the top
                     * k's weights made later, these digits end after warp
                     * 0's ids and are the block's chain (docs/experiments/cuda-moe.md) */
                    if (warp != 0)
                        xd_build_wide<RK>(xf, a.H, xd, (xd_chunk *)(xd + XD_VEC4 * (a.H / 32)), GUD_WARPS - 1, 1);
                }
                if (warp == 0) {
                    const route_pick pk = route_select<8>(lg, a.n_e, a.K);   /* (route_row's, its load above) */
                    rs.key[threadIdx.x] = pk.key;
                    if (threadIdx.x == 0) {
                        rs.m = pk.m;
                        rs.sum = pk.sum;
                    }
                    if ((threadIdx.x & 31) < a.K) {
                        rs.ids[threadIdx.x] = pk.id;
                        if (blockIdx.x == 0 && k == 0) a.ids_out[threadIdx.x] = pk.id;
                    }
                    TRACE_MARK(7);   /* (warp 0 has routed; the others may still build the digits) */
                }
                __syncthreads();
                TRACE_MARK(8);   /* (the routed blocks' top k done) */
                eid = rs.ids[k];
            } else {
                eid = a.ids[t * a.K + k];
            }
        }
        const uint8_t *blob = routed && (mine || FUSED) ? expert_blob(a, FUSED ? eid : a.ids[t * a.K + k]) : NULL;
        if (mine) {
            if (routed) {
                w = gud_setup<RK>(blob_part(blob, a.gate), blob_part(blob, a.up), i0, n, a.H);
            } else {
                w = gud_setup<RK>(a.sgate_p, a.sup_p, i0, n, a.H);
            }
            gud_fetch<RK>(w, threadIdx.x & 31, a.H / kind_traits<RK>::E, first);
        }
        if (FUSED) {
            const part_ptr D = routed ? blob_part(blob, a.down) : a.sdown_p;
            seg_stage<RK>(a, D, (uint8_t *)gud_smem + xd_smem_bytes(a.H, 32), !routed);
        }
        TRACE_MARK(2);
        if (early) pdl_wait();
        float *xf = (float *)gud_smem;
        uint4 *xd = (uint4 *)(xf + a.H);
        xd_chunk *cx = (xd_chunk *)(xd + XD_VEC4 * (a.H / 32));
        if (!(DE && routed && routes_itself(a))) {   /* (EARLY: built during the top k) */
            if (!x_now) gud_x_load(x4, a.H, xv);
            gud_x_store(x4, a.H, xv, (float4 *)xf);
            __syncthreads();
            xd_build<RK>(xf, a.H, xd, cx, GUD_WARPS);
            __syncthreads();
        }
        TRACE_MARK(3);
        if (mine) gate_up_rows_d<RK>(w, first, i0, n, a.H, xd, cx, h);
        TRACE_MARK(4);
    } else if (SK >= 0 && i0 < a.s_inter) {
        gate_up_rows<SK < 0 ? KIND_Q4 : SK>(a.sgate_p, a.sup_p, i0, a.s_inter, a.H, x, h);
    }
    if (SK >= 0 && !routed && blockIdx.x == 0 && warp == 0) {
        float v = a.sg_kind == SK ? row_dot1<SK < 0 ? KIND_Q4 : SK>(a.sg_p, a.H, x) : dot_any(a.sg_kind, a.sg_p, a.H, x);
        if ((threadIdx.x & 31) == 0) a.sg[t] = sigmoid_f(v);
    }
    if (FUSED) {
        if (!routes_itself(a) && routed) ew = __ldcg(a.wts + t * a.K + k);
        route_sm *rsp = routes_itself(a) && routed ? &rs : NULL;
        const part_ptr D = routed ? blob_part(expert_blob(a, eid), a.down) : a.sdown_p;
        /* one copy of the down's code for routed and shared blocks (a
         * template on it made two, and an SM holding both kinds fetched
         * both: docs/experiments/cuda-moe.md) */
        seg_down<RK>(a, t, k, D, (uint8_t *)gud_smem + xd_smem_bytes(a.H, 32), !routed, ew, rsp, TRACE_PTR);
    }
    TRACE_END(FUSED ? TRACE_MOE_ONE : TRACE_MOE_GATE_UP, routed ? 0u : 1u);
}

/* ---- launch 2: down ------------------------------------------------------- */

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

/* Piece p of a vector of n floats (n a multiple of 4) in global memory,
 * zero past n. */
__device__ __forceinline__ void x_piece_global(const float *v, int p, int n, float (&x)[32]) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int e = 32 * p + 4 * i;
        float4 f = e < n ? *(const float4 *)(v + e) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        x[4 * i] = f.x;
        x[4 * i + 1] = f.y;
        x[4 * i + 2] = f.z;
        x[4 * i + 3] = f.w;
    }
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

/* A down lane's first piece of h (routed lanes: segment tid / NP, piece
 * tid % NP; shared lanes: piece tid - ntr of the shared segment hs) and,
 * for shared lanes, the shared expert's gate. */
template <int SK>
__device__ __forceinline__ void dn_h_first(const moe_args &a, int t, int NP, int I, int Is, int units, const float *hs,
                                           float (&xr)[32], float &sg) {
    const int tid = threadIdx.x;
    if (tid < a.ntr) {
        if (tid < units) x_piece_global(a.h + ((size_t)t * a.S + tid / NP) * a.Imax, tid % NP, I, xr);
    } else if (SK >= 0) {
        x_piece_global(hs, tid - a.ntr, Is, xr);
        sg = a.sg[t];
    }
}

/* RK the routed kind, SK the shared expert's (-1: none). Block (d, t):
 * output rows d0 = d * R .. d0 + nr - 1 of token t. Routed lanes (tid <
 * ntr) take units u = (k, p) = (u / NP, u % NP), u = tid, tid + ntr, ...;
 * shared lanes take pieces tid - ntr, + nts, ... Lane shares of row r
 * accumulate in red[r][tid]. */
template <int RK, int SK>
__global__ void __launch_bounds__(256) moe_down_kernel(moe_args a, float *out) {
    constexpr int SK2 = SK < 0 ? KIND_Q4 : SK;
    extern __shared__ float4 dn_smem[];
    TRACE_DECL;
    TRACE_MARK(0);
    const int K = a.K, R = a.R, nt = a.nt, tid = threadIdx.x, t = blockIdx.y, d0 = blockIdx.x * a.R;
    const int nr = a.H - d0 < R ? a.H - d0 : R;
    uint8_t *wr = (uint8_t *)dn_smem;                    /* [K] routed rows, dn_wr bytes each */
    uint8_t *ws = wr + (size_t)K * a.dn_wr;              /* the shared expert's rows */
    uint8_t *sbr = ws + a.dn_ws;                         /* [K][2] routed scales, biases */
    uint8_t *sbs = sbr + (size_t)K * 2 * a.dn_sbr;       /* shared scales, biases */
    float *red = (float *)(sbs + 2 * a.dn_sbs);          /* [R][nt] */
    const uint8_t **mq = (const uint8_t **)(red + R * nt);   /* [K] first routed row */
    const uint16_t **ms = (const uint16_t **)(mq + K), **mb = ms + K;   /* [K] its scales, biases */
    float *mw = (float *)(mb + K);                       /* [K] routing weights */
    /* the shared expert's rows first: they do not wait for the ids */
    const int Is = a.s_inter, rbs = SK >= 0 ? (int)kind_row_bytes(SK2, Is) : 0;
    const int ngs = Is >> a.sdown_p.gsh;
    if (SK >= 0) {
        stage(ws, a.sdown_p.q + (int64_t)d0 * rbs, nr * rbs, tid, nt);
        if (kind_traits<SK2>::QUANT) {
            stage_sb(sbs, a.sdown_p.s + (int64_t)d0 * ngs, nr * ngs * 2, tid, nt);
            stage_sb(sbs + a.dn_sbs, a.sdown_p.b + (int64_t)d0 * ngs, nr * ngs * 2, tid, nt);
        }
    }
#pragma unroll 1
    for (int r = 0; r < R; r++) red[r * nt + tid] = 0.0f;
    const int I = a.I, rbr = (int)kind_row_bytes(RK, I), NP = I >> 5, units = K * NP;
    int gshr = 0;
    while ((1 << gshr) < a.down.group) gshr++;
    const int ngr = I >> gshr;
#pragma unroll 1
    for (int kk = tid; kk < K; kk += nt) {
        const part_ptr D = blob_part(expert_blob(a, a.ids[t * K + kk]), a.down);
        mq[kk] = D.q + (int64_t)d0 * rbr;
        ms[kk] = D.s + (int64_t)d0 * ngr;
        mb[kk] = D.b + (int64_t)d0 * ngr;
        mw[kk] = a.wts[t * K + kk];
    }
    /* the lane's first piece of h and, for the shared lanes, the shared
     * expert's gate (gate/up's outputs), in flight with the copies */
    float xr[32];
    float sg_early = 0.0f;
    const float *hs = a.h + ((size_t)t * a.S + K) * a.Imax;
    dn_h_first<SK>(a, t, NP, I, Is, units, hs, xr, sg_early);
    __syncthreads();
    TRACE_MARK(1);
    const int n16 = nr * rbr / 16;
#pragma unroll 4
    for (int i = tid; i < K * n16; i += nt) {
        const int kk = i / n16, q = i - kk * n16;
        cp_async<16>(wr + (size_t)kk * a.dn_wr + 16 * q, mq[kk] + 16 * q);
    }
    if (kind_traits<RK>::QUANT) {
#pragma unroll 1
        for (int kk = 0; kk < K; kk++) {
            stage_sb(sbr + (size_t)2 * kk * a.dn_sbr, ms[kk], nr * ngr * 2, tid, nt);
            stage_sb(sbr + (size_t)(2 * kk + 1) * a.dn_sbr, mb[kk], nr * ngr * 2, tid, nt);
        }
    }
    TRACE_MARK(2);
    cp_async_wait_all();
    __syncthreads();
    pdl_trigger();   /* the successor launches once this block's rows are in */
    TRACE_MARK(3);

    if (tid < a.ntr) {
#pragma unroll 1
        for (int u = tid; u < units; u += a.ntr) {
            const int kk = u / NP, p = u - kk * NP, g = (32 * p) >> gshr;
            if (u != tid) x_piece_global(a.h + ((size_t)t * a.S + kk) * a.Imax, p, I, xr);
            const float xs = piece_sum(xr), w = mw[kk];
            const uint8_t *rows = wr + (size_t)kk * a.dn_wr;
            const uint8_t *sc = sbr + (size_t)2 * kk * a.dn_sbr, *bi = sc + a.dn_sbr;
#pragma unroll 1
            for (int r = 0; r < nr; r++) {
                uint32_t s = 0, b = 0;
                if (kind_traits<RK>::QUANT) {
                    s = sb_at(sc, ms[kk], r * ngr + g);
                    b = sb_at(bi, mb[kk], r * ngr + g);
                }
                red[r * nt + tid] += w * row_dot<RK>(rows + r * rbr, p, I, xr, xs, s, b);
            }
        }
    } else if (SK >= 0) {
        const int NPs = (Is + 31) >> 5;
        const float gate = sg_early;
        const uint16_t *s0 = a.sdown_p.s + (int64_t)d0 * ngs, *b0 = a.sdown_p.b + (int64_t)d0 * ngs;
#pragma unroll 1
        for (int p = tid - a.ntr; p < NPs; p += a.nts) {
            const int g = (32 * p) >> a.sdown_p.gsh;
            if (p != tid - a.ntr) x_piece_global(hs, p, Is, xr);
            const float xs = piece_sum(xr);
#pragma unroll 1
            for (int r = 0; r < nr; r++) {
                uint32_t s = 0, b = 0;
                if (kind_traits<SK2>::QUANT) {
                    s = sb_at(sbs, s0, r * ngs + g);
                    b = sb_at(sbs + a.dn_sbs, b0, r * ngs + g);
                }
                red[r * nt + tid] += gate * row_dot<SK2>(ws + r * rbs, p, Is, xr, xs, s, b);
            }
        }
    }
    __syncthreads();
    TRACE_MARK(4);
    /* row r: the nt shares in thread order */
    const int warp = tid >> 5, lane = tid & 31, nw = nt >> 5;
#pragma unroll 1
    for (int r = warp; r < nr; r += nw) {
        float v = 0.0f;
#pragma unroll 1
        for (int i = lane; i < nt; i += 32) v += red[r * nt + i];
        v = warp_sum(v);
        if (lane == 0) out[(size_t)t * a.H + d0 + r] = v;
    }
    TRACE_END(TRACE_MOE_DOWN, 0u);
}

/* ---- gate/up and down in one launch (FUSED) --------------------------------
 * The down projection of expert k needs only that expert's h, so the
 * dependency between the two launches is per segment, not grid-wide: a
 * segment's blocks count themselves done on seg_cnt[k] and wait for the
 * count (every block of the grid is resident: the host launches this only
 * when the grid fits one wave, and the next kernel may launch only once
 * every block has passed its wait). Block b of segment k then computes rows
 * [b dc, b dc + dc) of down_k h_k, weighted, into part[k]; the last of the S
 * segments to finish chunk b (chunk_cnt[b]) sums part[0..S)[chunk] in
 * segment order into out, so the result does not depend on timing. The
 * last block of the grid (done_cnt) puts the segment counters back to 0.
 * Shared memory after the digits' region: the chunk's rows, its scales and
 * biases (stage_sb regions), h permuted like the GEMVs' input (float4 q of
 * chunk c at [q * n_chunks + c]: the 16 lanes of a row read 16 banks), a
 * flag, and at flag + 8 the mbarrier of the rows' bulk copies (seg_bar). */
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

/* The down rows by bulk copies (the TMA unit): thread 0 requests the
 * block's rows, scales and biases as three copies counted on an mbarrier
 * after the flag, where every thread's cp.async issue held the warps from
 * their gate/up products until HBM had taken the requests. Where the rows
 * are not 16-byte aligned, cp.async. */
__device__ __forceinline__ bool seg_bulk_on(const part_ptr &D, int d0, int nr, const seg_layout &L) {
    return nr > 0 && ((uintptr_t)(D.q + (int64_t)d0 * L.rbd) & 15) == 0;
}
__device__ __forceinline__ uint64_t *seg_bar(uint8_t *sm, const seg_layout &L) {
    return (uint64_t *)(sm + L.flag_off + 8);
}

template <int RK>
__device__ void seg_stage(const moe_args &a, const part_ptr &D, uint8_t *sm, bool sh) {
    const int I = sh ? a.s_inter : a.I, d0 = blockIdx.x * a.dc, nr = min(a.dc, a.H - d0);
    const seg_layout L = seg_layout_of(I, D.gsh, a.dc);
    if (nr <= 0) return;
    if (seg_bulk_on(D, d0, nr, L)) {
        if (threadIdx.x == 0) {
            uint64_t *bar = seg_bar(sm, L);
            const sb_span sc = sb_span_of(D.s + (int64_t)d0 * L.ng, nr * L.ng * 2),
                          bi = sb_span_of(D.b + (int64_t)d0 * L.ng, nr * L.ng * 2);
            mbar_init(bar);
            /* the initialised barrier visible to the copy unit (the async
             * proxy) before the copies that complete on it */
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            mbar_expect(bar, (unsigned)(nr * L.rbd + sc.n + bi.n));
            bulk_copy(sm, D.q + (int64_t)d0 * L.rbd, (unsigned)(nr * L.rbd), bar);
            bulk_copy(sm + L.sb_off, sc.p, (unsigned)sc.n, bar);
            bulk_copy(sm + L.sb_off + L.sbb, bi.p, (unsigned)bi.n, bar);
        }
        return;
    }
    stage(sm, D.q + (int64_t)d0 * L.rbd, nr * L.rbd, threadIdx.x, blockDim.x);
    stage_sb(sm + L.sb_off, D.s + (int64_t)d0 * L.ng, nr * L.ng * 2, threadIdx.x, blockDim.x);
    stage_sb(sm + L.sb_off + L.sbb, D.b + (int64_t)d0 * L.ng, nr * L.ng * 2, threadIdx.x, blockDim.x);
}

/* A row's share: its partial, which the chunk's reducer sums over the
 * segments, or (fx, the fixed-point sums) added into the sums. */
__device__ __forceinline__ void seg_put(float *part, long long *fx, int r, float v) {
    if (fx) dfx_add(fx + r, dfx_of(v));
    else part[r] = v;
}

/* The block's nr down rows, a half warp each, lane c of the half chunks
 * c, c + 16, ... of the nch: chunk(r, c) is staged row r's chunk c times
 * h's (the two ways of taking h below), the row's sum weighted by w. */
template <typename CHUNK>
__device__ __forceinline__ void seg_rows(int nr, int nch, float w, float *part, long long *fx, const CHUNK &chunk) {
    const int lane = threadIdx.x & 31, half = lane >> 4, c0 = lane & 15, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll 2   /* two row pairs in flight: fewer spills (docs/experiments/cuda-moe.md) */
    for (int rp = warp; rp * 2 < nr; rp += nw) {
        const int r = rp * 2 + half;
        const bool ok = r < nr;
        float acc = 0.0f;
#pragma unroll 1
        for (int c = c0; c < nch; c += 16) {
            if (!ok) continue;
            acc += chunk(r, c);
        }
#pragma unroll
        for (int o = 8; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (ok && c0 == 0) seg_put(part, fx, r, w * acc);
    }
}

/* The block's staged down rows have landed (this thread's view; a barrier
 * after it: everyone's). */
__device__ __forceinline__ void seg_staged_wait(bool bulk, uint8_t *sm, const seg_layout &L) {
    if (bulk) mbar_wait<false>(seg_bar(sm, L), 0);
    else cp_async_wait_all();
}

/* The block's down rows times the segment's h (hk, I floats in global
 * memory), weighted by w, into part[0..nr) or fx: h in shared memory as
 * floats (permuted like the GEMVs' input: float4 q of chunk c at
 * [q * n_chunks + c], the 16 lanes of a row read 16 banks), where the
 * digits' form below does not fit the shape. */
template <int RK>
__device__ void seg_rows_floats(uint8_t *sm, const seg_layout &L, const float4 *hk, int I, int nr, float w,
                                float *part, long long *fx, const uint16_t *s0, const uint16_t *b0, int gsh,
                                bool bulk, unsigned long long *tm) {
    const int tid = threadIdx.x, nt = blockDim.x, nch = I / 32;
    float4 *h4 = (float4 *)(sm + L.h_off);
    for (int i = tid; i < I / 4; i += nt) h4[(i % 8) * nch + i / 8] = __ldcg(hk + i);
#ifdef TERN_PHASE_TRACE
    {
        const float probe = tid == 0 ? ((const float *)h4)[0] : 0.0f;   /* thread 0's h load has arrived */
        TRACE_MARK_AFTER(tm, 9, probe);
    }
#else
    (void)tm;
#endif
    seg_staged_wait(bulk, sm, L);
    __syncthreads();
    TRACE_MARK_AT(tm, 10);   /* the block's down rows (and the segment's h) in shared memory */
    seg_rows(nr, nch, w, part, fx, [&](int r, int c) {
        float x[32];
#pragma unroll
        for (int q = 0; q < 8; q++) {
            const float4 v = h4[q * nch + c];
            x[4 * q] = v.x;
            x[4 * q + 1] = v.y;
            x[4 * q + 2] = v.z;
            x[4 * q + 3] = v.w;
        }
        const int g = (32 * c) >> gsh;
        const uint32_t sc = sb_at(sm + L.sb_off, s0, r * L.ng + g), bi = sb_at(sm + L.sb_off + L.sbb, b0, r * L.ng + g);
        return row_dot<RK>(sm + (size_t)r * L.rbd, c, I, x, piece_sum(x), sc, bi);
    });
}

/* Chunk c of staged row r (q4) times h as digits d (chunk hc): the
 * gate/up's integer dot (idot.cuh), then scale and bias. */
__device__ __forceinline__ float seg_chunk_d(const uint8_t *sm, const seg_layout &L, const uint16_t *s0,
                                             const uint16_t *b0, int r, int c, int g, const uint4 (&d)[XD_VEC4],
                                             xd_chunk hc) {
    const uint4 raw = *(const uint4 *)(sm + (size_t)r * L.rbd + 16 * c);
    const float p = xd_dot<KIND_Q4>(raw, d) * hc.dx;
    const float sc = bf16f((uint16_t)sb_at(sm + L.sb_off, s0, r * L.ng + g));
    const float bi = bf16f((uint16_t)sb_at(sm + L.sb_off + L.sbb, b0, r * L.ng + g));
    return fmaf(sc, p, bi * hc.sum);
}

/* seg_rows_floats with h as digits, as the gate/up takes x: the float
 * path's dequantize-and-multiply costs several times the instructions of a
 * row and chunk (docs/experiments/cuda-moe.md); a q4 chunk is 24 dp4a here. h lands in the x region at the start of shared memory (the
 * gate/up is done with x and its digits: the segment wait's
 * __syncthreads), its digits after it. A lane reads its chunk's digits
 * again for each of its rows: held across them (24 registers) they added
 * to the kernel's spills, as every phase of the launch shares its 96
 * registers (docs/experiments/cuda-moe.md). */
__device__ void seg_rows_digits(const moe_args &a, uint8_t *sm, const seg_layout &L, const float4 *hk, int I, int nr,
                                float w, float *part, long long *fx, const uint16_t *s0, const uint16_t *b0, int gsh,
                                bool bulk, unsigned long long *tm) {
    const int tid = threadIdx.x, nt = blockDim.x, nch = I / 32;
    float *hf = (float *)(sm - xd_smem_bytes(a.H, 32));
    uint4 *hd = (uint4 *)(hf + I);
    xd_chunk *hcx = (xd_chunk *)(hd + XD_VEC4 * nch);
    for (int i = tid; i < I / 4; i += nt) ((float4 *)hf)[i] = __ldcg(hk + i);
#ifdef TERN_PHASE_TRACE
    {
        const float probe = tid == 0 ? hf[0] : 0.0f;   /* thread 0's h load has arrived */
        TRACE_MARK_AFTER(tm, 9, probe);
    }
#else
    (void)tm;
#endif
    __syncthreads();
    /* the word form (idot.cuh): the same bits as xd_build's; h's digits
     * are on the down's chain, after the segment's wait
     * (docs/experiments/cuda-moe.md) */
    xd_build_wide<KIND_Q4>(hf, I, hd, hcx, nt >> 5);
    seg_staged_wait(bulk, sm, L);
    __syncthreads();
    TRACE_MARK_AT(tm, 10);   /* the block's down rows and the segment's h as digits in shared memory */
    seg_rows(nr, nch, w, part, fx, [&](int r, int c) {
        uint4 d[XD_VEC4];
        xd_load<KIND_Q4>(hd, nch, c, d);
        return seg_chunk_d(sm, L, s0, b0, r, c, (32 * c) >> gsh, d, hcx[c]);
    });
}

template <int RK>
__device__ void seg_down(const moe_args &a, int t, int k, const part_ptr &D, uint8_t *sm, bool sh, float wr,
                         route_sm *rs, unsigned long long *tm) {   /* tm: the trace's marks (a measurement build) */
    const int tid = threadIdx.x, nt = blockDim.x, b = blockIdx.x, B = gridDim.x;
    const int I = sh ? a.s_inter : a.I, d0 = b * a.dc, nr = min(a.dc, a.H - d0);
    const seg_layout L = seg_layout_of(I, D.gsh, a.dc);
    int *flag = (int *)(sm + L.flag_off);
    /* fx: the slot of the launch before, read by now (every block is past
     * its wait), zeroed for the launch after this one; 16-byte stores
     * strided over the grid's threads (one a thread of its first blocks at
     * Qwen3.6's shape) */
    if (a.fx_zero) {
        const int nth = (int)(gridDim.y * B) * nt;
        for (int i = (blockIdx.y * B + b) * nt + tid; i < a.fx_zero_n; i += nth) a.fx_zero[i] = make_uint4(0u, 0u, 0u, 0u);
    }
    /* the segment's h rows: every block of it has written its own */
    __syncthreads();
    if (rs && tid >> 5 == 1) {   /* the top k's weights (route_sm), during thread 0's wait */
        const route_pick pk = {rs->key[tid & 31], 0, rs->m, rs->sum};
        const float wv = route_weight(pk, a.K, a.renorm);
        if ((tid & 31) < a.K) {
            rs->wts[tid & 31] = wv;
            if (b == 0 && k == 0) a.wts_out[tid & 31] = wv;
        }
    }
    if (tid == 0) {
        red_release(a.seg_cnt + k);
        while (ld_acquire(a.seg_cnt + k) < (unsigned)B) __nanosleep(32);
    }
    __syncthreads();
    TRACE_MARK_AT(tm, 5);
    pdl_trigger();   /* every block is resident and past its wait: the next kernel may launch */
    const float4 *hk = (const float4 *)(a.h + ((size_t)t * a.S + k) * a.Imax);
    const uint16_t *s0 = D.s + (int64_t)d0 * L.ng, *b0 = D.b + (int64_t)d0 * L.ng;
    float *part = a.part + ((size_t)t * a.S + k) * a.H + d0;
    long long *fx = a.fx_sum ? a.fx_sum + (size_t)t * a.H + d0 : NULL;
    /* the shared gate: written by that segment's block 0 */
    const float w = sh ? __ldcg(a.sg + t) : rs ? rs->wts[k] : wr;
    const bool bulk = seg_bulk_on(D, d0, nr, L);
    if (a.dn_digits) seg_rows_digits(a, sm, L, hk, I, nr, w, part, fx, s0, b0, D.gsh, bulk, tm);
    else seg_rows_floats<RK>(sm, L, hk, I, nr, w, part, fx, s0, b0, D.gsh, bulk, tm);
    if (fx) {   /* the sums are complete when the grid is; nothing to count */
        TRACE_MARK_AT(tm, 6);
        return;
    }
    /* the chunk over the segments, by the last segment to finish it */
    __syncthreads();
    TRACE_MARK_AT(tm, 6);
    if (tid == 0) *flag = atom_acq_rel(a.chunk_cnt + b) == (unsigned)(a.S - 1);
    __syncthreads();
    if (*flag) {
        const float *p0 = a.part + (size_t)t * a.S * a.H + d0;
        /* the S partials requested together, then summed in segment
         * order (a loop of load-add pairs waits on L2 S times, on the
         * launch's last block's path: the next kernel waits for it) */
        for (int i = tid; i < nr; i += nt) {
            float pv[16], v = 0.0f;
#pragma unroll
            for (int kk = 0; kk < 16; kk++) pv[kk] = kk < a.S ? __ldcg(p0 + (size_t)kk * a.H + i) : 0.0f;
#pragma unroll
            for (int kk = 0; kk < 16; kk++)
                if (kk < a.S) v += pv[kk];
            for (int kk = 16; kk < a.S; kk++) v += __ldcg(p0 + (size_t)kk * a.H + i);
            a.out[(size_t)t * a.H + d0 + i] = v;
        }
        if (tid == 0) a.chunk_cnt[b] = 0;
    }
    /* the last block of the grid: the segment counters back to 0 (every
     * block has left its wait before it counts itself here) */
    if (tid == 0 && atom_acq_rel(a.done_cnt) == (unsigned)(B * gridDim.y - 1)) {
        for (int kk = 0; kk < (int)gridDim.y; kk++) a.seg_cnt[kk] = 0;
        *a.done_cnt = 0;
    }
}

/* ---- host side ----------------------------------------------------------- */

static int part_ok(const tern_cuda_expert_part *p, int64_t rows, int64_t cols) {
    int g = p->group;
    return (p->bits == 4 || p->bits == 8) && p->rows == rows && p->cols == cols && (g == 32 || g == 64 || g == 128) &&
           cols % g == 0 && (cols * p->bits / 8) % 16 == 0 && p->q_off % 16 == 0 && p->s_off % 2 == 0 &&
           p->b_off % 2 == 0;
}

static part_ptr mat_part(const tern_mat *m) {
    part_ptr p = {(const uint8_t *)m->data, m->scales, m->biases, m->bits ? log2i(m->group) : 0};
    return p;
}

static int check_experts(const tern_cuda_experts *ex, tern_error *err) {
    int64_t I = ex->gate.rows, H = ex->gate.cols;
    if (!part_ok(&ex->gate, I, H) || !part_ok(&ex->up, I, H) || !part_ok(&ex->down, H, I))
        return tern_fail(err, "moe: expert parts must be q4/q8 [I, H], [I, H], [H, I] with 16-byte rows");
    if (ex->up.bits != ex->gate.bits || ex->down.bits != ex->gate.bits)
        return tern_fail(err, "moe: gate, up and down of an expert must share their bits");
    if (!ex->blobs && !ex->base) return tern_fail(err, "moe: no expert weights (blobs or base)");
    return 0;
}

static int check_shared(const tern_expert_w *sh, const tern_mat *sg, int64_t H, tern_error *err) {
    int64_t Is = sh->gate.rows;
    if (!tern_cuda_gemv_supported(&sh->gate) || !tern_cuda_gemv_supported(&sh->up) ||
        !tern_cuda_gemv_supported(&sh->down) || !sg || !tern_cuda_gemv_supported(sg))
        return tern_fail(err, "moe: shared expert or its gate in an unsupported encoding");
    if (sh->gate.cols != H || sh->up.rows != Is || sh->up.cols != H || sh->down.rows != H || sh->down.cols != Is ||
        sg->rows != 1 || sg->cols != H || mat_kind(&sh->gate) != mat_kind(&sh->up) ||
        mat_kind(&sh->gate) != mat_kind(&sh->down))
        return tern_fail(err, "moe: shared expert shapes or encodings do not match the routed experts");
    return 0;
}

/* The workspace: first, at offsets that do not depend on T (a call of
 * several tokens must not write over them), the one-launch MoE's counters
 * (S segments, a chunk per gate/up block, one for the grid: zero between
 * calls) and its partial outputs [S][hidden]; then h [T * S, Imax] and the
 * shared gates [T]. */
static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* gate/up blocks per segment: two rows a warp (the grid's x, and the
 * one launch's row chunks) */
static int gud_blocks(int64_t inter) { return ceil_div(inter, 2 * GUD_WARPS); }

static size_t seg_counters(int top_k, int64_t inter) { return (size_t)(top_k + 1) + (size_t)gud_blocks(inter) + 1; }

static size_t moe_seg_bytes(int top_k, int64_t inter, int64_t hidden) {
    return align256(seg_counters(top_k, inter) * sizeof(unsigned)) +
           align256((size_t)(top_k + 1) * (size_t)hidden * sizeof(float));
}

/* a fixed-point slot: 64 segment counters (S <= 64), then the sums */
#define FX_CNT_BYTES 256
size_t tern_cuda_moe_fx_bytes(int64_t hidden) { return FX_CNT_BYTES + align256((size_t)hidden * sizeof(long long)); }
const long long *tern_cuda_moe_fx_sums(const void *fx) { return (const long long *)((const uint8_t *)fx + FX_CNT_BYTES); }

size_t tern_cuda_moe_workspace(int T, int top_k, int64_t inter, int64_t hidden) {
    return moe_seg_bytes(top_k, inter, hidden) +
           ((size_t)T * (size_t)(top_k + 1) * (size_t)inter + (size_t)T) * sizeof(float) + 256;
}

static int round32(int v) { return (v + 31) & ~31; }

/* Past the default 48 KB of dynamic shared memory (large shapes only) a
 * kernel must be allowed more. */
static int smem_attr(const void *kernel, size_t bytes, tern_error *err) {
    if (bytes <= 48 * 1024) return 0;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return tern_fail(err, "moe: %zu bytes of shared memory: %s", bytes, cudaGetErrorString(e));
    }
    return 0;
}

/* Whether the one-launch MoE applies (1, with its kernel and shared
 * memory; 0 not): one token, q4 routed experts on the integer dots, a q4
 * shared expert of the same width or none, and the grid in one wave. */
static int seg_plan(moe_args *a, dim3 gd, void (**kp)(moe_args), size_t *smem_p) {
    if (!a->one_launch || gd.y != (unsigned)a->S || a->r_kind != KIND_Q4 || a->H % XD_SPAN ||
        !(a->s_kind < 0 || (a->s_kind == KIND_Q4 && a->s_inter == a->I && a->sdown_p.gsh == log2i(a->down.group))) ||
        a->I % 32)
        return 0;
    a->dc = ceil_div(a->H, gd.x);
    /* h as digits: spans of 64, and h's floats and digits within x's region */
    a->dn_digits = a->I % XD_SPAN == 0 && a->I <= a->H;
    int gshd = log2i(a->down.group);
    seg_layout L = seg_layout_of(a->I, gshd, a->dc);
    size_t smem = xd_smem_bytes(a->H, 32) + (size_t)L.bytes;
    /* the digits during the top k: routing itself */
    const int v = (a->s_kind < 0 ? 0 : 1) + (routes_itself(*a) ? 2 : 0);
    void (*const ks[4])(moe_args) = {moe_gate_up_d_kernel<KIND_Q4, -1, true>,
                                     moe_gate_up_d_kernel<KIND_Q4, KIND_Q4, true>,
                                     moe_gate_up_d_kernel<KIND_Q4, -1, true, true>,
                                     moe_gate_up_d_kernel<KIND_Q4, KIND_Q4, true, true>};
    void (*k)(moe_args) = ks[v];
    carveout_max((const void *)k);
    /* (a failed query or shared-memory limit counts one block a SM: not one wave) */
    static occ_cache caches[4];
    const int occ = blocks_per_sm(caches[v], k, GUD_WARPS * 32, smem);
    if ((int64_t)occ * tern_cuda_sm_count() < (int64_t)gd.x * gd.y)
        return 0;   /* not one wave: the blocks of a segment could wait on blocks not yet placed */
    *kp = k;
    *smem_p = smem;
    return 1;
}

/* The one-launch MoE if it applies: 0 launched, 1 not applicable, -1 error. */
static int moe_seg(moe_args *a, dim3 gd, cudaStream_t s, tern_error *err) {
    void (*k)(moe_args) = NULL;
    size_t smem = 0;
    if (!seg_plan(a, gd, &k, &smem)) return 1;
    cudaError_t e = launch_pdl(k, gd, dim3(GUD_WARPS * 32), smem, s, *a);
    if (e != cudaSuccess) return tern_fail(err, "moe (one launch): %s", cudaGetErrorString(e));
    return launch_check("moe (one launch)", err);
}

/* The launch arguments every path shares (shapes, weights, workspace). */
static int moe_fill(moe_args &a, const tern_cuda_experts *ex, const tern_expert_w *shared, const tern_mat *shared_gate,
                    const float *x, int T, int top_k, const int32_t *ids, const float *wts, void *work, float *out,
                    tern_error *err) {
    if (check_experts(ex, err)) return -1;
    if (shared && check_shared(shared, shared_gate, ex->gate.cols, err)) return -1;
    if (T < 1 || top_k < 1) return tern_fail(err, "moe: T = %d, top_k = %d", T, top_k);
    memset(&a, 0, sizeof a);
    a.blobs = ex->blobs;
    a.base = ex->base;
    a.stride = ex->stride;
    a.gate = ex->gate;
    a.up = ex->up;
    a.down = ex->down;
    a.r_kind = ex->gate.bits == 4 ? KIND_Q4 : KIND_Q8;
    a.one_launch = ex->one_launch;
    a.H = (int)ex->gate.cols;
    a.I = (int)ex->gate.rows;
    a.K = top_k;
    a.S = top_k + (shared ? 1 : 0);
    a.s_kind = -1;
    a.sg_kind = -1;
    a.s_inter = 0;
    if (shared) {
        a.s_kind = mat_kind(&shared->gate);
        a.sg_kind = mat_kind(shared_gate);
        a.sgate_p = mat_part(&shared->gate);
        a.sup_p = mat_part(&shared->up);
        a.sdown_p = mat_part(&shared->down);
        a.sg_p = mat_part(shared_gate);
        a.s_inter = (int)shared->gate.rows;
    }
    a.Imax = a.I > a.s_inter ? a.I : a.s_inter;
    a.ids = ids;
    a.wts = wts;
    a.x = x;
    if (work) {   /* (none: tern_cuda_moe_routes_itself's plan) */
        a.seg_cnt = (unsigned *)work;
        a.chunk_cnt = a.seg_cnt + a.S;
        a.done_cnt = a.chunk_cnt + gud_blocks(a.Imax);
        a.part = (float *)((uint8_t *)work + align256(seg_counters(top_k, a.Imax) * sizeof(unsigned)));
        a.h = (float *)((uint8_t *)work + moe_seg_bytes(top_k, a.Imax, a.H));
        a.sg = a.h + (size_t)T * a.S * a.Imax;
    }
    a.out = out;
    if (ex->fx) {
        if (a.S > FX_CNT_BYTES / (int)sizeof(unsigned) || ((uintptr_t)ex->fx & 15) || ((uintptr_t)ex->fx_zero & 15) ||
            ex->fx_zero == ex->fx)
            return tern_fail(err, "moe: fixed-point sums need at most %d segments and two distinct 16-byte aligned slots",
                             FX_CNT_BYTES / (int)sizeof(unsigned));
        if (T != 1) return tern_fail(err, "moe: fixed-point sums are the one launch's, one token (T = %d)", T);
        a.seg_cnt = (unsigned *)ex->fx;
        a.fx_sum = (long long *)tern_cuda_moe_fx_sums(ex->fx);
        a.fx_zero = (uint4 *)ex->fx_zero;
        a.fx_zero_n = ex->fx_zero ? (int)(tern_cuda_moe_fx_bytes(a.H) / 16) : 0;
    }
    if ((int64_t)T * a.S > 65535) return tern_fail(err, "moe: %d tokens too many for one launch", T);
    return 0;
}

static dim3 gud_grid(const moe_args &a, int T) { return dim3(gud_blocks(a.Imax), T * a.S); }

/* Routing inside the one launch, within route_row<8>'s limits. */
static int route_in_ok(int top_k, int n_experts) { return n_experts >= top_k && n_experts <= 256 && top_k <= 32; }

int tern_cuda_moe_routes_itself(const tern_cuda_experts *ex, const tern_expert_w *shared, const tern_mat *shared_gate,
                                int top_k, int n_experts) {
    moe_args a;
    tern_error err;
    void (*k)(moe_args) = NULL;
    size_t smem = 0;
    if (!route_in_ok(top_k, n_experts) || moe_fill(a, ex, shared, shared_gate, NULL, 1, top_k, NULL, NULL, NULL, NULL, &err))
        return 0;
    return seg_plan(&a, gud_grid(a, 1), &k, &smem);
}

int tern_cuda_moe_route(const tern_cuda_experts *ex, const tern_expert_w *shared, const tern_mat *shared_gate,
                        const float *x, int top_k, const float *logits, int n_experts, int renorm, int32_t *ids,
                        float *wts, void *work, float *out, tern_stream s, tern_error *err) {
    moe_args a;
    if (moe_fill(a, ex, shared, shared_gate, x, 1, top_k, NULL, NULL, work, out, err)) return -1;
    if (!route_in_ok(top_k, n_experts))
        return tern_fail(err, "moe_route: routing inside the experts' launch does not apply here");
    a.logits = logits;
    a.n_e = n_experts;
    a.renorm = renorm;
    a.ids_out = ids;
    a.wts_out = wts;
    int rc = moe_seg(&a, gud_grid(a, 1), (cudaStream_t)s, err);
    return rc == 1 ? tern_fail(err, "moe_route: the one launch did not apply") : rc;
}

int tern_cuda_moe(const tern_cuda_experts *ex, const tern_expert_w *shared, const tern_mat *shared_gate,
                  const float *x, int T, int top_k, const int32_t *ids, const float *wts, void *work, float *out,
                  tern_stream s, tern_error *err) {
    moe_args a;
    if (moe_fill(a, ex, shared, shared_gate, x, T, top_k, ids, wts, work, out, err)) return -1;
    /* one token of q4 experts: the one launch where it applies (its grid
     * is the integer-dot gate/up's) */
    int rc = moe_seg(&a, gud_grid(a, T), s, err);
    if (rc <= 0) return rc;   /* launched (0) or failed (-1) */
    if (a.fx_sum) return tern_fail(err, "moe: fixed-point sums need the one launch, which does not apply here");
    dim3 g1(ceil_div(a.Imax, 8), T * a.S);

    /* down: R rows per block, 16 KB of routed rows (1 to 16); routed lanes
     * (k, piece), at most 128; shared lanes: its pieces, at most 128 */
    const int rbr = (int)kind_row_bytes(a.r_kind, a.I), units = top_k * (a.I / 32);
    int R = DN_ROW_BYTES / (top_k * rbr);
    R = R < 1 ? 1 : R > 16 ? 16 : R;
    a.R = R;
    a.ntr = units < 128 ? round32(units) : 128;
    a.nts = 0;
    a.dn_wr = R * rbr;
    a.dn_ws = 0;
    a.dn_sbr = (R * (a.I / 32) * 2 + 32 + 15) & ~15;   /* the most groups (of 32), the 16-byte blocks at both ends */
    a.dn_sbs = 0;
    if (shared) {
        int nps = (a.s_inter + 31) / 32;
        a.nts = nps < 128 ? round32(nps) : 128;
        a.dn_ws = R * (int)kind_row_bytes(a.s_kind, a.s_inter);
        a.dn_sbs = (R * nps * 2 + 32 + 15) & ~15;
    }
    a.nt = a.ntr + a.nts;
    size_t smem2 = (size_t)top_k * a.dn_wr + a.dn_ws + (size_t)top_k * 2 * a.dn_sbr + 2 * (size_t)a.dn_sbs +
                   (size_t)R * a.nt * sizeof(float) + (size_t)top_k * (3 * sizeof(void *) + sizeof(float));
    dim3 g2(ceil_div(a.H, R), T);
    static void (*const down[2][5])(moe_args, float *) = {
        {moe_down_kernel<KIND_Q4, -1>, moe_down_kernel<KIND_Q4, KIND_Q4>, moe_down_kernel<KIND_Q4, KIND_Q8>,
         moe_down_kernel<KIND_Q4, KIND_BF16>, moe_down_kernel<KIND_Q4, KIND_F16>},
        {moe_down_kernel<KIND_Q8, -1>, moe_down_kernel<KIND_Q8, KIND_Q4>, moe_down_kernel<KIND_Q8, KIND_Q8>,
         moe_down_kernel<KIND_Q8, KIND_BF16>, moe_down_kernel<KIND_Q8, KIND_F16>}};
    void (*k2)(moe_args, float *) = down[a.r_kind == KIND_Q8][a.s_kind + 1];
    if (smem_attr((const void *)k2, smem2, err)) return -1;

    if (a.H % XD_SPAN == 0) {
        /* integer dots; the digits of x in shared memory */
        size_t smem1 = xd_smem_bytes(a.H, a.r_kind == KIND_Q4 ? 32 : 16);
        static void (*const gud[2][5])(moe_args) = {
            {moe_gate_up_d_kernel<KIND_Q4, -1>, moe_gate_up_d_kernel<KIND_Q4, KIND_Q4>,
             moe_gate_up_d_kernel<KIND_Q4, KIND_Q8>, moe_gate_up_d_kernel<KIND_Q4, KIND_BF16>,
             moe_gate_up_d_kernel<KIND_Q4, KIND_F16>},
            {moe_gate_up_d_kernel<KIND_Q8, -1>, moe_gate_up_d_kernel<KIND_Q8, KIND_Q4>,
             moe_gate_up_d_kernel<KIND_Q8, KIND_Q8>, moe_gate_up_d_kernel<KIND_Q8, KIND_BF16>,
             moe_gate_up_d_kernel<KIND_Q8, KIND_F16>}};
        void (*k1)(moe_args) = gud[a.r_kind == KIND_Q8][a.s_kind + 1];
        dim3 gd = gud_grid(a, T);
        if (smem_attr((const void *)k1, smem1, err)) return -1;
        cudaError_t e1 = launch_pdl(k1, gd, dim3(GUD_WARPS * 32), smem1, s, a);
        if (e1 != cudaSuccess) return tern_fail(err, "moe gate/up: %s", cudaGetErrorString(e1));
    } else {
        moe_gate_up_kernel<<<g1, 128, 0, s>>>(a);
    }
    if (launch_check("moe gate/up", err)) return -1;
    void *args[] = {&a, &out};
    carveout_max((const void *)k2);
    cudaError_t e = cudaLaunchKernel((const void *)k2, g2, dim3(a.nt), args, smem2, s);
    if (e != cudaSuccess) return tern_fail(err, "moe down: %s", cudaGetErrorString(e));
    return 0;
}

/* ---- router ---------------------------------------------------------------- */

/* One warp per token (route.cuh). */
template <int V>
__global__ void __launch_bounds__(32) route_kernel(const float *logits, int E, int K, int renorm, int32_t *ids,
                                                   float *wts) {
    pdl_trigger();
    const int t = blockIdx.x;
    pdl_wait();
    route_row<V>(logits + (size_t)t * E, E, K, renorm, ids + (size_t)t * K, wts + (size_t)t * K);
}

int tern_cuda_route(const float *logits, int T, int n_experts, int top_k, int renorm, int32_t *ids, float *wts,
                    tern_stream s, tern_error *err) {
    if (n_experts < 1 || n_experts > 4096 || top_k < 1 || top_k > 32 || top_k > n_experts || T < 1)
        return tern_fail(err, "route: %d experts, top %d outside the kernel's range", n_experts, top_k);
    dim3 g(T), b(32);
    cudaError_t e;
    if (n_experts <= 256) e = launch_pdl(route_kernel<8>, g, b, 0, s, logits, n_experts, top_k, renorm, ids, wts);
    else if (n_experts <= 1024) e = launch_pdl(route_kernel<32>, g, b, 0, s, logits, n_experts, top_k, renorm, ids, wts);
    else e = launch_pdl(route_kernel<128>, g, b, 0, s, logits, n_experts, top_k, renorm, ids, wts);
    if (e != cudaSuccess) return tern_fail(err, "route: %s", cudaGetErrorString(e));
    return 0;
}

TRACE_DUMP_FN(tern_cuda_trace_dump_moe)
