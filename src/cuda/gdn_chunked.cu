/* The Gated DeltaNet block for a prefill of T tokens in chunks of 64 (the
 * GPU twin of cpu/gdn.c's tern_gdn_chunked and the steps around it in
 * forward.c's gdn_layer). Five launches:
 *
 *   1 prep     block per token: conv1d + SiLU of all conv_dim channels (the
 *              conv state supplies the inputs before token 0), l2norm of q
 *              (times dk^-0.5) and k per key head, g and beta per value
 *              head; written to the workspace.
 *   2 state    the conv state becomes the last K - 1 inputs (after launch 1
 *              has read the old one: the stream orders them).
 *   3 chunk    block per (chunk, value head), all chunks at once since
 *              nothing here depends on S: cumulative log-decay G, the
 *              strictly lower A = beta_i (k_i . k_c) e^(G_i - G_c), the
 *              causal P = (q_i . k_c) e^(G_i - G_c), and the forward
 *              substitutions (I + A) U = beta V, (I + A) W = beta e^G K
 *              (thread per column, rows in order: cpu/gdn.c's order).
 *   4 scan     block per (value head, 32 value columns): the only
 *              sequential part, over the chunks, with that column slice of
 *              S (dk x 32) in shared memory: Vn = U - W S,
 *              O = e^G Q S + P Vn, S = e^G_last S + (k e^(G_last - G))^T Vn.
 *              Columns of S never mix in the delta rule, so slices of one
 *              head run in parallel (Qwen3.6: 32 heads x 4 = 128 blocks).
 *   5 norm     warp per (token, value head): the gated RMSNorm in place.
 *
 * Workspace: the normalised conv output [T, conv_dim], g and beta [T, nv],
 * then per (chunk, value head) G [64], P [64, 64], W [64, dk], U [64, dv].
 * fp32 throughout, as the CPU twin. */
#include "cuda/common.cuh"

#define CH 64          /* chunk length (the reference's) */
#define BV 32          /* value columns per scan block: a warp's lanes */
#define SCAN_WARPS 8
#define MAX_DK 128     /* the scan keeps 3 x 64 x dk floats of the chunk in shared memory */

typedef struct {
    tern_cuda_gdn_w w;
    const float *qkv, *z, *b, *a;
    float *conv_state, *S, *out;
    float *xc, *g, *beta, *chunks;   /* workspace parts */
    int T, C, n_chunks;
    size_t per_chunk;                 /* floats per (chunk, head) record */
} gdnc_args;

static size_t chunk_record(const tern_cuda_gdn_w *w) {
    return (size_t)CH + CH * CH + (size_t)CH * w->dk + (size_t)CH * w->dv;
}

/* ---- 1: conv + SiLU, l2norm, g and beta ---------------------------------- */

__global__ void __launch_bounds__(256) gdnc_prep_kernel(gdnc_args g) {
    extern __shared__ float xs[];   /* [C] this token's conv outputs */
    int t = blockIdx.x, C = g.C, K = g.w.conv_kernel, dk = g.w.dk, nk = g.w.nk, nv = g.w.nv;
    for (int ch = threadIdx.x; ch < C; ch += blockDim.x) {
        const float *w = g.w.conv + (size_t)ch * K;
        float acc = 0.0f;
        for (int j = 0; j < K; j++) {      /* j ascending: the step kernel's and forward.c's order */
            int i = t - (K - 1) + j;
            float in = i >= 0 ? g.qkv[(size_t)i * C + ch] : g.conv_state[(size_t)(K - 1 + i) * C + ch];
            acc += w[j] * in;
        }
        xs[ch] = silu_f(acc);
    }
    __syncthreads();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    float qscale = 1.0f / sqrtf((float)dk);
    for (int h = warp; h < 2 * nk; h += nw) {   /* q heads, then k heads */
        float *x = xs + (size_t)h * dk, ss = 0.0f;
        for (int i = lane; i < dk; i += 32) ss += x[i] * x[i];
        float r = 1.0f / sqrtf(warp_sum(ss) + 1e-6f);
        __syncwarp();
        for (int i = lane; i < dk; i += 32) x[i] = h < nk ? x[i] * r * qscale : x[i] * r;
    }
    for (int j = threadIdx.x; j < nv; j += blockDim.x) {
        size_t i = (size_t)t * nv + j;
        float av = g.a[i] + g.w.dt_bias[j];
        float sp = av > 20.0f ? av : log1pf(expf(av));
        g.g[i] = -expf(g.w.A_log[j]) * sp;
        g.beta[i] = sigmoid_f(g.b[i]);
    }
    __syncthreads();
    for (int ch = threadIdx.x; ch < C; ch += blockDim.x) g.xc[(size_t)t * C + ch] = xs[ch];
}

/* ---- 2: the conv state slides T inputs -------------------------------------- */

/* Row r of the new state is input T - (K - 1) + r: a row of qkv, or (T <
 * K - 1) row r + T of the old state, which this thread reads before it
 * overwrites it (r + T > r; one thread per channel). */
__global__ void gdnc_state_kernel(gdnc_args g) {
    int ch = blockIdx.x * blockDim.x + threadIdx.x, K = g.w.conv_kernel, C = g.C;
    if (ch >= C) return;
    for (int r = 0; r < K - 1; r++) {
        int i = g.T - (K - 1) + r;
        float v = i >= 0 ? g.qkv[(size_t)i * C + ch] : g.conv_state[(size_t)(r + g.T) * C + ch];
        g.conv_state[(size_t)r * C + ch] = v;
    }
}

/* ---- 3: the chunk-local quantities ------------------------------------------- */

/* Pointers into one (chunk, head) record. */
typedef struct {
    float *G, *P, *W, *U;
} chunk_rec;

__device__ __forceinline__ chunk_rec rec_of(const gdnc_args &g, int c, int j) {
    chunk_rec r;
    r.G = g.chunks + ((size_t)c * g.w.nv + j) * g.per_chunk;
    r.P = r.G + CH;
    r.W = r.P + CH * CH;
    r.U = r.W + (size_t)CH * g.w.dk;
    return r;
}

#define KP 1   /* row padding of the k and q tiles: rows dk + 1 apart spread a warp's rows over the banks */

__global__ void __launch_bounds__(256) gdnc_chunk_kernel(gdnc_args g) {
    extern __shared__ float sm[];
    int c = blockIdx.x, j = blockIdx.y, dk = g.w.dk, dv = g.w.dv, nv = g.w.nv, C = g.C;
    int m = j / (nv / g.w.nk), kd = g.w.nk * dk, t0 = c * CH, n = min(CH, g.T - t0), ks = dk + KP;
    float *kt = sm, *qt = kt + CH * ks;                 /* [CH][dk + 1] */
    float *A = qt + CH * ks;                             /* [CH][CH] */
    float *G = A + CH * CH, *bt = G + CH;                /* [CH] each */
    float *X = bt + CH;                                  /* [CH][dk + dv]: W | U being solved */
    int tid = threadIdx.x, nt = blockDim.x;
    for (int e = tid; e < n * dk; e += nt) {
        int i = e / dk, d = e % dk;
        const float *row = g.xc + (size_t)(t0 + i) * C;
        qt[i * ks + d] = row[m * dk + d];
        kt[i * ks + d] = row[kd + m * dk + d];
    }
    if (tid == 0) {   /* the cumulative sum in the CPU's order */
        float acc = 0.0f;
        for (int i = 0; i < n; i++) {
            acc += g.g[(size_t)(t0 + i) * nv + j];
            G[i] = acc;
        }
    }
    for (int i = tid; i < n; i += nt) bt[i] = g.beta[(size_t)(t0 + i) * nv + j];
    __syncthreads();
    chunk_rec rec = rec_of(g, c, j);
    /* A (strictly lower) and P (lower with the diagonal), one (i, c) pair
     * per thread and step; zeros above so the scan needs no bounds */
    for (int e = tid; e < CH * CH; e += nt) {
        int i = e / CH, cc = e % CH;
        float a = 0.0f, p = 0.0f;
        if (i < n && cc <= i) {
            float sk = 0.0f, sq = 0.0f;
            const float *ki = kt + i * ks, *qi = qt + i * ks, *kc = kt + cc * ks;
            for (int d = 0; d < dk; d++) {
                sk = fmaf(ki[d], kc[d], sk);
                sq = fmaf(qi[d], kc[d], sq);
            }
            float dec = expf(G[i] - G[cc]);
            p = sq * dec;
            if (cc < i) a = bt[i] * sk * dec;
        }
        A[e] = a;
        rec.P[e] = p;
    }
    __syncthreads();
    /* forward substitution, a thread per column of W (dk) and U (dv); row i
     * needs rows < i, which the same thread wrote */
    int ncol = dk + dv;
    for (int col = tid; col < ncol; col += nt) {
        for (int i = 0; i < n; i++) {
            float x;
            if (col < dk) x = bt[i] * expf(G[i]) * kt[i * ks + col];
            else x = bt[i] * g.xc[(size_t)(t0 + i) * C + 2 * kd + (size_t)j * dv + (col - dk)];
            for (int cc = 0; cc < i; cc++) x -= A[i * CH + cc] * X[cc * ncol + col];
            X[i * ncol + col] = x;
            if (col < dk) rec.W[i * dk + col] = x;
            else rec.U[i * dv + col - dk] = x;
        }
    }
    if (tid < CH) rec.G[tid] = tid < n ? G[tid] : 0.0f;
}

/* ---- 4: the scan over chunks -------------------------------------------------- */

#define RW (CH / SCAN_WARPS)       /* chunk rows per warp: 8 */
#define RK (MAX_DK / SCAN_WARPS)   /* state rows per warp: up to 16 */

__global__ void __launch_bounds__(SCAN_WARPS * 32, 1) gdnc_scan_kernel(gdnc_args g) {
    extern __shared__ float sm[];
    int j = blockIdx.x, v0 = blockIdx.y * BV, dk = g.w.dk, dv = g.w.dv, nv = g.w.nv, C = g.C;
    int m = j / (nv / g.w.nk), kd = g.w.nk * dk;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nt = blockDim.x;
    int bv = min(BV, dv - v0), rk = dk / SCAN_WARPS;
    bool live = lane < bv;
    float *Ws = sm, *Qe = Ws + CH * dk, *Kd = Qe + CH * dk;   /* [CH][dk] */
    float *Ps = Kd + CH * dk;                                   /* [CH][CH] */
    float *Vn = Ps + CH * CH;                                   /* [CH][BV] */
    float *Ss = Vn + CH * BV;                                   /* [dk][BV] */
    float *Gs = Ss + dk * BV;                                   /* [CH] */
    float *Sg = g.S + (size_t)j * dk * dv;
    for (int e = threadIdx.x; e < dk * BV; e += nt) {
        int kk = e / BV, v = e % BV;
        Ss[e] = v < bv ? Sg[(size_t)kk * dv + v0 + v] : 0.0f;
    }
    for (int c = 0; c < g.n_chunks; c++) {
        int t0 = c * CH, n = min(CH, g.T - t0);
        chunk_rec rec = rec_of(g, c, j);
        __syncthreads();   /* the previous chunk's readers of Vn, Qe, Kd are done */
        for (int e = threadIdx.x; e < CH; e += nt) Gs[e] = rec.G[e];
        for (int e = threadIdx.x; e < CH * CH; e += nt) Ps[e] = rec.P[e];
        __syncthreads();
        float glast = Gs[n - 1];
        for (int e = threadIdx.x; e < CH * dk; e += nt) {
            int i = e / dk, d = e % dk;
            bool in = i < n;
            const float *row = g.xc + (size_t)(t0 + (in ? i : 0)) * C;
            Ws[e] = in ? rec.W[e] : 0.0f;
            Qe[e] = in ? row[m * dk + d] * expf(Gs[i]) : 0.0f;
            Kd[e] = in ? row[kd + m * dk + d] * expf(glast - Gs[i]) : 0.0f;
        }
        for (int e = threadIdx.x; e < CH * BV; e += nt) {
            int i = e / BV, v = e % BV;
            Vn[e] = i < n && v < bv ? rec.U[(size_t)i * dv + v0 + v] : 0.0f;
        }
        __syncthreads();
        /* Vn = U - W S and o = Qe S (both with the old S), in the CPU's
         * order (Vn starts at U, kk ascending): lane = column, the warp's
         * rows i = warp + 8 r; W and Qe rows are read as 16-byte broadcasts */
        float ws[RW], os[RW];
#pragma unroll
        for (int r = 0; r < RW; r++) {
            ws[r] = Vn[(warp + SCAN_WARPS * r) * BV + lane];
            os[r] = 0.0f;
        }
        for (int kk = 0; kk < dk; kk += 4) {
            float s0 = Ss[kk * BV + lane], s1 = Ss[(kk + 1) * BV + lane];
            float s2 = Ss[(kk + 2) * BV + lane], s3 = Ss[(kk + 3) * BV + lane];
#pragma unroll
            for (int r = 0; r < RW; r++) {
                int i = warp + SCAN_WARPS * r;
                float4 wv = *(const float4 *)(Ws + i * dk + kk), qv = *(const float4 *)(Qe + i * dk + kk);
                ws[r] = fmaf(-wv.x, s0, ws[r]); ws[r] = fmaf(-wv.y, s1, ws[r]);
                ws[r] = fmaf(-wv.z, s2, ws[r]); ws[r] = fmaf(-wv.w, s3, ws[r]);
                os[r] = fmaf(qv.x, s0, os[r]); os[r] = fmaf(qv.y, s1, os[r]);
                os[r] = fmaf(qv.z, s2, os[r]); os[r] = fmaf(qv.w, s3, os[r]);
            }
        }
        /* a thread rewrites only the Vn entries it read */
#pragma unroll
        for (int r = 0; r < RW; r++) Vn[(warp + SCAN_WARPS * r) * BV + lane] = ws[r];   /* rows past n: 0 */
        __syncthreads();
        /* o += sum_{c <= i} P[i][c] Vn[c] (P is zero above the diagonal) */
        for (int cc = 0; cc < n; cc++) {
            float vn = Vn[cc * BV + lane];
#pragma unroll
            for (int r = 0; r < RW; r++) os[r] = fmaf(Ps[(warp + SCAN_WARPS * r) * CH + cc], vn, os[r]);
        }
#pragma unroll
        for (int r = 0; r < RW; r++) {
            int i = warp + SCAN_WARPS * r;
            if (i < n && live) g.out[((size_t)(t0 + i) * nv + j) * dv + v0 + lane] = os[r];
        }
        /* S = e^G_last S + sum_i Kd_i Vn_i^T: the warp's state rows
         * warp * rk .. + rk; each thread reads and writes only its own
         * entries, whose readers above are past the barrier */
        float el = expf(glast), s[RK];
#pragma unroll
        for (int r = 0; r < RK; r++) s[r] = r < rk ? Ss[(warp * rk + r) * BV + lane] * el : 0.0f;
        for (int i = 0; i < n; i++) {
            float vn = Vn[i * BV + lane];
            const float *kr = Kd + i * dk + warp * rk;
            if (rk % 4 == 0) {   /* 16-byte broadcasts (dk a multiple of 32) */
#pragma unroll
                for (int r = 0; r < RK; r += 4) {
                    if (r < rk) {
                        float4 k4 = *(const float4 *)(kr + r);
                        s[r] = fmaf(k4.x, vn, s[r]); s[r + 1] = fmaf(k4.y, vn, s[r + 1]);
                        s[r + 2] = fmaf(k4.z, vn, s[r + 2]); s[r + 3] = fmaf(k4.w, vn, s[r + 3]);
                    }
                }
            } else {
#pragma unroll
                for (int r = 0; r < RK; r++)
                    if (r < rk) s[r] = fmaf(kr[r], vn, s[r]);
            }
        }
#pragma unroll
        for (int r = 0; r < RK; r++)
            if (r < rk) Ss[(warp * rk + r) * BV + lane] = s[r];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < dk * BV; e += nt) {
        int kk = e / BV, v = e % BV;
        if (v < bv) Sg[(size_t)kk * dv + v0 + v] = Ss[e];
    }
}

/* ---- 5: gated RMSNorm ----------------------------------------------------------- */

__global__ void gdnc_norm_kernel(gdnc_args g) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31, dv = g.w.dv;
    if (row >= g.T * g.w.nv) return;
    float *o = g.out + (size_t)row * dv;
    const float *z = g.z + (size_t)row * dv;
    float ss = 0.0f;
    for (int i = lane; i < dv; i += 32) ss += o[i] * o[i];
    float rn = 1.0f / sqrtf(warp_sum(ss) / (float)dv + g.w.eps);
    for (int i = lane; i < dv; i += 32) o[i] = o[i] * rn * g.w.norm[i] * silu_f(z[i]);
}

/* ---- host side ------------------------------------------------------------------ */

size_t tern_cuda_gdn_chunked_workspace(const tern_cuda_gdn_w *w, int T) {
    size_t C = (size_t)2 * w->nk * w->dk + (size_t)w->nv * w->dv, nc = (size_t)(T + CH - 1) / CH;
    return ((size_t)T * C + 2 * (size_t)T * w->nv + nc * w->nv * chunk_record(w)) * sizeof(float) + 256;
}

static size_t chunk_smem(const tern_cuda_gdn_w *w) {
    int ncol = w->dk + w->dv;
    return ((size_t)2 * CH * (w->dk + KP) + CH * CH + 2 * CH + (size_t)CH * ncol) * sizeof(float);
}

static size_t scan_smem(const tern_cuda_gdn_w *w) {
    return ((size_t)3 * CH * w->dk + CH * CH + CH * BV + (size_t)w->dk * BV + CH) * sizeof(float);
}

int tern_cuda_gdn_chunked(const tern_cuda_gdn_w *w, const float *qkv, const float *z, const float *b, const float *a,
                          int T, float *conv_state, float *S, void *work, size_t work_bytes, float *out, tern_stream s,
                          tern_error *err) {
    bool ok = w->nk >= 1 && w->nv % w->nk == 0 && w->dk >= SCAN_WARPS && w->dk <= MAX_DK &&
              w->dk % SCAN_WARPS == 0 && w->dv >= 1 && (w->dv % BV == 0 || w->dv < BV) && w->conv_kernel >= 1 && T >= 1;
    if (!ok)
        return tern_fail(err, "gdn_chunked: heads %d/%d x %d/%d outside the kernel's shapes (dk a multiple of 8, <= %d)",
                         w->nk, w->nv, w->dk, w->dv, MAX_DK);
    if (work_bytes < tern_cuda_gdn_chunked_workspace(w, T))
        return tern_fail(err, "gdn_chunked: workspace %zu bytes, %zu needed", work_bytes,
                         tern_cuda_gdn_chunked_workspace(w, T));
    gdnc_args g;
    g.w = *w;
    g.qkv = qkv; g.z = z; g.b = b; g.a = a;
    g.conv_state = conv_state; g.S = S; g.out = out;
    g.T = T;
    g.C = 2 * w->nk * w->dk + w->nv * w->dv;
    g.n_chunks = (T + CH - 1) / CH;
    g.per_chunk = chunk_record(w);
    g.xc = (float *)work;
    g.g = g.xc + (size_t)T * g.C;
    g.beta = g.g + (size_t)T * w->nv;
    g.chunks = g.beta + (size_t)T * w->nv;
    size_t prep_smem = (size_t)g.C * sizeof(float), csm = chunk_smem(w), ssm = scan_smem(w);
    cudaFuncSetAttribute(gdnc_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)prep_smem);
    cudaFuncSetAttribute(gdnc_chunk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)csm);
    cudaFuncSetAttribute(gdnc_scan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ssm);
    gdnc_prep_kernel<<<T, 256, prep_smem, s>>>(g);
    if (launch_check("gdn_chunked prep", err)) return -1;
    if (w->conv_kernel > 1) {
        gdnc_state_kernel<<<ceil_div(g.C, 256), 256, 0, s>>>(g);
        if (launch_check("gdn_chunked conv state", err)) return -1;
    }
    gdnc_chunk_kernel<<<dim3(g.n_chunks, w->nv), 256, csm, s>>>(g);
    if (launch_check("gdn_chunked chunks", err)) return -1;
    gdnc_scan_kernel<<<dim3(w->nv, ceil_div(w->dv, BV)), SCAN_WARPS * 32, ssm, s>>>(g);
    if (launch_check("gdn_chunked scan", err)) return -1;
    int rows = T * w->nv;
    gdnc_norm_kernel<<<ceil_div(rows, 8), 256, 0, s>>>(g);
    return launch_check("gdn_chunked norm", err);
}
