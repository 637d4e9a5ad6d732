/* The Gated DeltaNet step (recurrent form) in one kernel, spread over one
 * block per (value head j, slice of cw value columns): Qwen3.6 runs 32 x 4
 * blocks of 128 threads. The blocks of one key head m (its r = nv / nk
 * value heads times their nsl slices) form a thread-block cluster, which
 * settles the two things the slices share:
 *   - the gated RMSNorm's sum of squares over the dv values of a head:
 *     each warp stores its share into the shared memory of every block of
 *     the cluster (st.async, counted on the receiver's mbarrier, one per
 *     token parity), so no cluster barrier per token;
 *   - the conv state of q_m and k_m: every block of the cluster computes
 *     the conv of all of q_m and k_m from the old state (cheap: 2 dk
 *     channels); once a block has every block's message for the last
 *     token, all reads of the old state are done, and it writes the new
 *     state of its share of those channels. The state of the value
 *     channels belongs to one block.
 *
 * Threads: (column vl, key part kp), kp fastest; the thread holds rows
 * kp, kp + ks, .. of column vl of S_j (sk = dk / ks <= SK of them) in
 * registers for all T tokens, so S is read and written once per call.
 * The sums over the key dimension (S^T k, S^T q) are a register loop plus
 * a shuffle across the ks lanes of a column.
 *
 * Programmatic dependent launch: S (written only by this layer's step of
 * an earlier token) and the weights are loaded before pdl_wait(); the
 * activations and the conv state after it, and every write. */
#include "cuda/common.cuh"
#include "cuda/trace.cuh"

#define SK 32          /* most rows of S a thread holds */
#define CPT 3          /* most conv channels a thread computes per token */
#define MAX_CLUSTER 8  /* portable cluster size */
#define MAX_THREADS 256

typedef struct {
    tern_cuda_gdn_w w;
    const float *qkv, *z, *b, *a;
    float *conv_state, *S, *out;
    int T, cw, nsl, ks, sk;
} gdn_args;

/* Store v at `local`'s place in the shared memory of cluster block `rank`
 * and count its 4 bytes on that block's `bar`. */
__device__ __forceinline__ void st_async(float *local, uint64_t *bar, unsigned rank, float v) {
    const unsigned ra = cluster_map(local, rank), rb = cluster_map(bar, rank);
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(ra),
                 "r"(__float_as_uint(v)), "r"(rb)
                 : "memory");
}

/* Channel c (0 .. 2 dk + cw) of block (j, sl) in the qkv channel order
 * q | k | v (flat over heads): q_m, k_m, then the slice's value columns. */
__device__ __forceinline__ int gdn_channel(const gdn_args &g, int m, int j, int sl, int c) {
    int dk = g.w.dk, kd = g.w.nk * dk;
    if (c < dk) return m * dk + c;
    if (c < 2 * dk) return kd + m * dk + (c - dk);
    return 2 * kd + j * g.w.dv + sl * g.cw + (c - 2 * dk);
}

/* KC, KS, SKT: conv_kernel, ks and sk known at compile time (Qwen3.6: 4,
 * 4, 32), or 0 (any, slower). */
template <int KC, int KS, int SKT>
__global__ void __launch_bounds__(MAX_THREADS, 1) gdn_step_kernel(gdn_args g) {
    constexpr int KR = KC > 0 ? KC : 1;
    extern __shared__ __align__(16) float sm[];
    const int dk = g.w.dk, dv = g.w.dv, nv = g.w.nv, K = KC > 0 ? KC : g.w.conv_kernel;
    const int r = nv / g.w.nk, cw = g.cw, nsl = g.nsl, csize = r * nsl;
    const int ks = KS > 0 ? KS : g.ks, sk = SKT > 0 ? SKT : g.sk;
    const int C = 2 * g.w.nk * dk + nv * dv, nch = 2 * dk + cw;
    const int nwarps = blockDim.x >> 5, np = nsl * nwarps, nrs = csize * nwarps;
    const int j = blockIdx.x / nsl, sl = blockIdx.x % nsl, m = j / r;
    const int cr = blockIdx.x % csize;   /* rank in the cluster: (j % r) * nsl + sl */
    const int head0 = (j % r) * nsl;     /* rank of slice 0 of head j */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kp = tid % ks, vl = tid / ks;
    const bool active = vl < cw, writer = active && kp == 0;
    const int v = sl * cw + (active ? vl : 0);
    uint64_t *bars = (uint64_t *)sm;                /* [2]: token parity */
    float *cq = sm + 8, *ck = cq + dk, *cv = ck + dk;   /* conv outputs: q_m, k_m, the slice's v */
    float *nrm = cv + cw;                           /* [nwarps][2]: sums of squares of q, k */
    float *rs = nrm + 2 * nwarps;                   /* [2][csize][nwarps]: sums of squares of o by block, warp */
    const float *kr = ck + kp, *qr = cq + kp;       /* the thread's rows: kr[ks * i] */

    TRACE_DECL;
    TRACE_MARK(0);
    float s[SK];
    float *Sj = g.S + (size_t)j * dk * dv + v;
#pragma unroll
    for (int i = 0; i < SK; i++) s[i] = active && (SKT > 0 ? i < SKT : i < sk) ? Sj[(size_t)(kp + ks * i) * dv] : 0.0f;
    /* the thread's conv channels c = tid + u * blockDim.x (< nch) and,
     * KC > 0, their weights */
    int chn[CPT];
    float cwt[CPT][KR], cin[CPT][KR];
#pragma unroll
    for (int u = 0; u < CPT; u++) {
        int c = tid + u * blockDim.x;
        chn[u] = gdn_channel(g, m, j, sl, c < nch ? c : 0);
#pragma unroll
        for (int i = 0; i < KR; i++) cwt[u][i] = KC > 0 ? g.w.conv[(size_t)chn[u] * KR + i] : 0.0f;
    }
    if (tid == 0) {
        mbar_init(bars);
        mbar_init(bars + 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    cluster_arrive_relaxed();   /* "started": waited on before the first store into a peer */
    pdl_trigger();
    const float nw = g.w.norm[v], A = g.w.A_log[j], dtb = g.w.dt_bias[j];
    TRACE_MARK(1);
    pdl_wait();
    TRACE_MARK(2);

    /* token t's inputs, loaded a token ahead: the conv window (inputs t - K
     * + 1 .. t, those before the first token from the conv state, which
     * holds the last K - 1 inputs before this call and is left untouched
     * until the end) when KC > 0, z, a + dt_bias, b */
    float zt, at, bt;
    auto load_inputs = [&](int t) {
#pragma unroll
        for (int u = 0; u < CPT; u++) {
#pragma unroll
            for (int i = 0; i < KR; i++) {
                int ti = t - (KR - 1) + i;
                const float *row = ti >= 0 ? g.qkv + (size_t)ti * C : g.conv_state + (size_t)(ti + KR - 1) * C;
                cin[u][i] = KC > 0 ? row[chn[u]] : 0.0f;
            }
        }
        zt = writer ? g.z[(size_t)t * nv * dv + (size_t)j * dv + v] : 0.0f;
        at = g.a[(size_t)t * nv + j] + dtb;
        bt = g.b[(size_t)t * nv + j];
    };
    load_inputs(0);
    const float qscale = 1.0f / sqrtf((float)dk);
    for (int t = 0; t < g.T; t++) {
        /* conv1d + SiLU */
        float x[CPT];
#pragma unroll
        for (int u = 0; u < CPT; u++) {
            int c = tid + u * blockDim.x;
            float acc = 0.0f;
            if (KC > 0) {
#pragma unroll
                for (int i = 0; i < KR; i++) acc += cwt[u][i] * cin[u][i];
            } else if (c < nch) {
                for (int i = 0; i < K; i++) {
                    int ti = t - (K - 1) + i;
                    const float *row = ti >= 0 ? g.qkv + (size_t)ti * C : g.conv_state + (size_t)(ti + K - 1) * C;
                    acc += g.w.conv[(size_t)chn[u] * K + i] * row[chn[u]];
                }
            }
            x[u] = c < nch ? silu_f(acc) : 0.0f;
        }
        if (t == 0) TRACE_MARK(3);   /* token 0's inputs in (thread 0's) */
        /* g and beta */
        const float sp = at > 20.0f ? at : log1pf(expf(at));
        const float decay = expf(-expf(A) * sp), beta = sigmoid_f(bt), zc = zt;
        if (t + 1 < g.T) load_inputs(t + 1);
        uint64_t *bar = bars + (t & 1);
        float *slot = rs + (t & 1) * nrs;
        if (tid == 0) mbar_expect(bar, (unsigned)nrs * 4);
        float ssq = 0.0f, ssk = 0.0f;
#pragma unroll
        for (int u = 0; u < CPT; u++) {
            int c = tid + u * blockDim.x;
            if (c < nch) cq[c] = x[u];
            if (c < dk) ssq += x[u] * x[u];
            else if (c < 2 * dk) ssk += x[u] * x[u];
        }
        ssq = warp_sum(ssq);
        ssk = warp_sum(ssk);
        if (lane == 0) {
            nrm[2 * warp] = ssq;
            nrm[2 * warp + 1] = ssk;
        }
        __syncthreads();
        ssq = ssk = 0.0f;
        for (int w = 0; w < nwarps; w++) {
            ssq += nrm[2 * w];
            ssk += nrm[2 * w + 1];
        }
        if (t == 0) TRACE_MARK(4);   /* the block's conv outputs in shared memory */
        /* l2norm of q (times dk^-0.5) and k, applied as they are read */
        const float rq = 1.0f / sqrtf(ssq + 1e-6f), rk = 1.0f / sqrtf(ssk + 1e-6f);

        /* the delta rule on the thread's rows of column v (sums in 4
         * interleaved parts: shorter chains) */
        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < SK; i++)
            if (SKT > 0 ? i < SKT : i < sk) {
                s[i] *= decay;
                part[i & 3] += s[i] * (kr[ks * i] * rk);
            }
        const float mem = group_sum((part[0] + part[1]) + (part[2] + part[3]), ks);
        const float delta = beta * (cv[active ? vl : 0] - mem);
        part[0] = part[1] = part[2] = part[3] = 0.0f;
#pragma unroll
        for (int i = 0; i < SK; i++)
            if (SKT > 0 ? i < SKT : i < sk) {
                s[i] += (kr[ks * i] * rk) * delta;
                part[i & 3] += s[i] * (qr[ks * i] * rq * qscale);
            }
        const float o = group_sum((part[0] + part[1]) + (part[2] + part[3]), ks);

        /* gated RMSNorm: every warp sends its sum of squares to every
         * block of the cluster (all of them then know that this block is
         * past the token's conv); a block sums those of its head's nsl
         * slices. Parity t & 1 double-buffers: a block sends token t + 2
         * only after every block of its head has sent token t + 1, which
         * each does after reading token t. */
        const float p = warp_sum(writer ? o * o : 0.0f);
        if (t == 0) cluster_wait();
        if (lane < csize) st_async(slot + cr * nwarps + warp, bar, (unsigned)lane, p);
        if (t == g.T - 1) mbar_wait<true>(bar, (unsigned)(t >> 1) & 1);   /* then the conv state is written */
        else mbar_wait<false>(bar, (unsigned)(t >> 1) & 1);
        if (t == 0) TRACE_MARK(5);   /* the head's sums of squares in from the cluster */
        float ss = 0.0f;
        for (int i = 0; i < np; i++) ss += slot[head0 * nwarps + i];
        const float rn = 1.0f / sqrtf(ss / (float)dv + g.w.eps);
        if (writer) {
            const float y = o * rn * nw * silu_f(zc);
            g.out[(size_t)t * nv * dv + (size_t)j * dv + v] = y;
        }
    }
#pragma unroll
    for (int i = 0; i < SK; i++)
        if (active && (SKT > 0 ? i < SKT : i < sk)) Sj[(size_t)(kp + ks * i) * dv] = s[i];
    /* the new conv state, the last K - 1 inputs (KC > 0: the last token's
     * window held in cin): every block of the cluster has sent its last
     * token, so all reads of the old rows are done; q_m and k_m's channels
     * are split over the cluster */
    if (KC > 0) {
#pragma unroll
        for (int u = 0; u < CPT; u++) {
            int c = tid + u * blockDim.x;
            if (c < nch && (c >= 2 * dk || c % csize == cr))
#pragma unroll
                for (int i = 1; i < KR; i++) g.conv_state[(size_t)(i - 1) * C + chn[u]] = cin[u][i];
        }
    } else {
        for (int c = tid; c < nch; c += blockDim.x) {
            if (c < 2 * dk && c % csize != cr) continue;
            int ch = gdn_channel(g, m, j, sl, c);
            for (int i = 0; i < K - 1; i++) {   /* row i read before the rows below it are written */
                int ti = g.T - (K - 1) + i;
                g.conv_state[(size_t)i * C + ch] =
                    ti >= 0 ? g.qkv[(size_t)ti * C + ch] : g.conv_state[(size_t)(ti + K - 1) * C + ch];
            }
        }
    }
    TRACE_END(TRACE_GDN_STEP, (unsigned)g.T);
}

/* The launch shape: slices per value head (the most that keep a cluster
 * within MAX_CLUSTER blocks and slices at least 32 columns wide), lanes per
 * column (the fewest that keep sk <= SK rows a thread), and whole warps
 * enough for the columns and the conv channels. 0 when the shapes do not
 * fit. */
typedef struct {
    int cw, nsl, ks, sk, csize, threads;
} step_plan;

static int plan_step(const tern_cuda_gdn_w *w, step_plan *p) {
    if (w->nk < 1 || w->nv < w->nk || w->nv % w->nk || w->dk < 1 || w->dv < 1 || w->conv_kernel < 1) return 0;
    int r = w->nv / w->nk;
    if (r > MAX_CLUSTER) return 0;
    int ks = 1;
    while (ks <= 32 && (w->dk % ks || w->dk / ks > SK)) ks *= 2;
    if (ks > 32) return 0;
    int nsl = 1;
    for (int n = 2; n * r <= MAX_CLUSTER; n++)
        if (w->dv % n == 0 && w->dv / n >= 32) nsl = n;
    int cw = w->dv / nsl, nch = 2 * w->dk + cw;
    int threads = (cw * ks + 31) / 32 * 32, need = ((nch + CPT - 1) / CPT + 31) / 32 * 32;
    if (threads < need) threads = need;
    if (threads > MAX_THREADS) return 0;
    *p = step_plan{cw, nsl, ks, w->dk / ks, r * nsl, threads};
    return 1;
}

int tern_cuda_gdn_supported(const tern_cuda_gdn_w *w) {
    step_plan p;
    return plan_step(w, &p);
}

template <int KC, int KS, int SKT>
static cudaError_t launch_step(const step_plan &p, int blocks, size_t smem, cudaStream_t s, gdn_args g) {
    return launch_pdl_cluster(gdn_step_kernel<KC, KS, SKT>, dim3(blocks), dim3(p.threads), smem,
                              (unsigned)p.csize, s, g);
}

static size_t step_smem(const tern_cuda_gdn_w *w, const step_plan &p) {
    const int nwarps = p.threads / 32;
    return (size_t)(8 + 2 * w->dk + p.cw + 2 * nwarps + 2 * p.csize * nwarps) * sizeof(float);
}

/* The step's launch. */
static int launch_any(const tern_cuda_gdn_w *w, const step_plan &p, size_t smem, cudaStream_t s, const gdn_args &g,
                      tern_error *err) {
    const int blocks = w->nv * p.nsl, fixed = w->conv_kernel == 4 && p.ks == 4 && p.sk == 32;
    cudaError_t e = fixed ? launch_step<4, 4, 32>(p, blocks, smem, s, g) : launch_step<0, 0, 0>(p, blocks, smem, s, g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return tern_fail(err, "gdn_step: %s", cudaGetErrorString(e));
    }
    return launch_check("gdn_step", err);
}

int tern_cuda_gdn_step(const tern_cuda_gdn_w *w, const float *qkv, const float *z, const float *b, const float *a,
                       int T, float *conv_state, float *S, float *out, tern_stream s, tern_error *err) {
    step_plan p;
    if (!plan_step(w, &p) || T < 1)
        return tern_fail(err, "gdn_step: heads %d/%d x %d/%d outside the kernel's shapes", w->nk, w->nv, w->dk, w->dv);
    gdn_args g = {*w, qkv, z, b, a, conv_state, S, out, T, p.cw, p.nsl, p.ks, p.sk};
    return launch_any(w, p, step_smem(w, p), s, g, err);
}

TRACE_DUMP_FN(tern_cuda_trace_dump_gdn)
