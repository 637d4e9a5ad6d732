/* Launch 1 of the MoE block on integer dots, and the one launch of gate/up
 * and down at one token (moe.cuh): one kernel template,
 * moe_gate_up_d_kernel, holds both forms (FUSED picks), so the two share
 * this file with the one launch's down (seg_*), which the template calls.
 * Its body is long because every phase of the one launch (routing, x as
 * digits, the gate/up rows, the down rows, the sums over the segments)
 * is one block's work with no launch between them. */
#include "cuda/moe.cuh"

/* ---- launch 1 at 4 and 8 bits: gate and up through integer dots ---------
 * The same rows per warp, with x turned into digits once per block
 * (idot.cuh): a q4 chunk costs 24 dp4a per row instead of 32 float
 * dequantize-and-multiply steps (q8: 12 for 16). A block of GUD_WARPS
 * warps takes 2 x GUD_WARPS rows of gate and of up of one segment; a warp's
 * 4 rows x 2 chunks per lane are loaded before any is used (at q4 and H =
 * 2048 the whole rows). 9 warps, two blocks an SM (the kernel's launch
 * bounds): Qwen3.6's 9 segments x 29 blocks fit the H200's 264 places in
 * one wave, where 8-warp blocks made 288 blocks and a second wave
 * (GUD_WARPS, moe.cuh). */

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

moe_kernel moe_gate_up_d_of(int r_kind, int s_kind) {
    static void (*const gud[2][5])(moe_args) = {
        {moe_gate_up_d_kernel<KIND_Q4, -1>, moe_gate_up_d_kernel<KIND_Q4, KIND_Q4>,
         moe_gate_up_d_kernel<KIND_Q4, KIND_Q8>, moe_gate_up_d_kernel<KIND_Q4, KIND_BF16>,
         moe_gate_up_d_kernel<KIND_Q4, KIND_F16>},
        {moe_gate_up_d_kernel<KIND_Q8, -1>, moe_gate_up_d_kernel<KIND_Q8, KIND_Q4>,
         moe_gate_up_d_kernel<KIND_Q8, KIND_Q8>, moe_gate_up_d_kernel<KIND_Q8, KIND_BF16>,
         moe_gate_up_d_kernel<KIND_Q8, KIND_F16>}};
    return gud[r_kind == KIND_Q8][s_kind + 1];
}

moe_kernel moe_seg_of(int v) {
    static void (*const ks[4])(moe_args) = {moe_gate_up_d_kernel<KIND_Q4, -1, true>,
                                            moe_gate_up_d_kernel<KIND_Q4, KIND_Q4, true>,
                                            moe_gate_up_d_kernel<KIND_Q4, -1, true, true>,
                                            moe_gate_up_d_kernel<KIND_Q4, KIND_Q4, true, true>};
    return ks[v];
}

TRACE_DUMP_FN(tern_cuda_trace_dump_moe)
