/* Launch 2 of the MoE block (moe.cuh): a block computes R output rows of
 * one token from every segment's h, its weights staged in shared memory
 * first. */
#include "cuda/moe.cuh"

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

moe_down_fn moe_down_of(int r_kind, int s_kind) {
    static void (*const down[2][5])(moe_args, float *) = {
        {moe_down_kernel<KIND_Q4, -1>, moe_down_kernel<KIND_Q4, KIND_Q4>, moe_down_kernel<KIND_Q4, KIND_Q8>,
         moe_down_kernel<KIND_Q4, KIND_BF16>, moe_down_kernel<KIND_Q4, KIND_F16>},
        {moe_down_kernel<KIND_Q8, -1>, moe_down_kernel<KIND_Q8, KIND_Q4>, moe_down_kernel<KIND_Q8, KIND_Q8>,
         moe_down_kernel<KIND_Q8, KIND_BF16>, moe_down_kernel<KIND_Q8, KIND_F16>}};
    return down[r_kind == KIND_Q8][s_kind + 1];
}

TRACE_DUMP_FN(tern_cuda_trace_dump_moe_down)
