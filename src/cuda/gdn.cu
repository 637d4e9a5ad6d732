/* The Gated DeltaNet step (recurrent form) in one kernel: one block per key
 * head m, which owns everything that reads or writes m's channels — the
 * conv state of q_m, k_m and of its value heads j = m r .. m r + r - 1
 * (r = nv / nk), and their states S_j — so no two blocks touch the same
 * memory and the conv state needs no second buffer.
 *
 * Threads: (value head jl, column v, key part kp), kp fastest; thread holds
 * S_j[kp * SK .. kp * SK + SK)[v] in registers for all T tokens (SK = 32
 * rows of the 128 x 128 state), so S is read and written once per call.
 * The sums over the key dimension (S^T k, S^T q) are a register loop plus
 * a shuffle across the KS = dk / SK lanes of a column.
 * Qwen3.6: 16 blocks of 2 x 128 x 4 = 1024 threads. */
#include "cuda/common.cuh"

#define SK 32

typedef struct {
    tern_cuda_gdn_w w;
    const float *qkv, *z, *b, *a;
    float *conv_state, *S, *out;
    int T, sk, ks;
} gdn_args;

/* Channel c (0 .. 2 dk + r dv) of block m, in the qkv channel order
 * q | k | v (flat over heads). */
__device__ __forceinline__ int gdn_channel(const gdn_args &g, int m, int c) {
    int dk = g.w.dk, kd = g.w.nk * dk, r = g.w.nv / g.w.nk;
    if (c < dk) return m * dk + c;
    if (c < 2 * dk) return kd + m * dk + (c - dk);
    return 2 * kd + m * r * g.w.dv + (c - 2 * dk);
}

/* conv1d over the window [state rows, current input] + SiLU for channel
 * ch, then the window slides (the state keeps the last K - 1 inputs). */
__device__ float conv_step(const gdn_args &g, int ch, float in) {
    int K = g.w.conv_kernel, C = 2 * g.w.nk * g.w.dk + g.w.nv * g.w.dv;
    const float *w = g.w.conv + (size_t)ch * K;
    float acc = 0.0f;
    for (int j = 0; j < K - 1; j++) acc += w[j] * g.conv_state[(size_t)j * C + ch];
    acc += w[K - 1] * in;
    for (int j = 0; j < K - 2; j++) g.conv_state[(size_t)j * C + ch] = g.conv_state[(size_t)(j + 1) * C + ch];
    if (K >= 2) g.conv_state[(size_t)(K - 2) * C + ch] = in;
    return silu_f(acc);
}

__global__ void __launch_bounds__(1024, 1) gdn_step_kernel(gdn_args g) {
    extern __shared__ float sm[];
    int m = blockIdx.x, dk = g.w.dk, dv = g.w.dv, nv = g.w.nv, r = nv / g.w.nk;
    int C = 2 * g.w.nk * dk + nv * dv, nch = 2 * dk + r * dv;
    float *cq = sm, *ck = cq + dk, *cv = ck + dk;       /* conv outputs of this block's channels */
    float *ob = cv + r * dv;                            /* [r][dv] outputs before the norm */
    float *gb = ob + r * dv;                            /* [r][2]: g, beta */
    float *rn = gb + 2 * r;                             /* [r]: 1 / rms */
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int kp = tid % g.ks, v = (tid / g.ks) % dv, jl = tid / (g.ks * dv);
    bool active = jl < r;
    int j = m * r + jl;
    float s[SK];
    float *Sj = g.S + (size_t)j * dk * dv;
#pragma unroll
    for (int i = 0; i < SK; i++) s[i] = active && i < g.sk ? Sj[(size_t)(kp * g.sk + i) * dv + v] : 0.0f;
    float qscale = 1.0f / sqrtf((float)dk);
    for (int t = 0; t < g.T; t++) {
        for (int c = tid; c < nch; c += blockDim.x) {
            int ch = gdn_channel(g, m, c);
            cq[c] = conv_step(g, ch, g.qkv[(size_t)t * C + ch]);   /* cq, ck, cv are contiguous */
        }
        __syncthreads();
        if (warp < 2) {                                 /* l2norm of q (warp 0) and k (warp 1) */
            float *x = warp == 0 ? cq : ck, ss = 0.0f;
            for (int i = lane; i < dk; i += 32) ss += x[i] * x[i];
            float rr = 1.0f / sqrtf(warp_sum(ss) + 1e-6f);
            __syncwarp();
            for (int i = lane; i < dk; i += 32) x[i] = warp == 0 ? x[i] * rr * qscale : x[i] * rr;
        } else if (warp == 2 && lane < r) {             /* g and beta of the value heads */
            int jj = m * r + lane;
            float av = g.a[(size_t)t * nv + jj] + g.w.dt_bias[jj];
            float sp = av > 20.0f ? av : log1pf(expf(av));
            gb[2 * lane] = -expf(g.w.A_log[jj]) * sp;
            gb[2 * lane + 1] = sigmoid_f(g.b[(size_t)t * nv + jj]);
        }
        __syncthreads();
        if (active) {
            float decay = expf(gb[2 * jl]), beta = gb[2 * jl + 1];
            const float *kk = ck + kp * g.sk, *qq = cq + kp * g.sk;
            float mem = 0.0f;
#pragma unroll
            for (int i = 0; i < SK; i++) {
                if (i < g.sk) {
                    s[i] *= decay;
                    mem += s[i] * kk[i];
                }
            }
            mem = group_sum(mem, g.ks);
            float delta = beta * (cv[jl * dv + v] - mem);
            float o = 0.0f;
#pragma unroll
            for (int i = 0; i < SK; i++) {
                if (i < g.sk) {
                    s[i] += kk[i] * delta;
                    o += s[i] * qq[i];
                }
            }
            o = group_sum(o, g.ks);
            if (kp == 0) ob[jl * dv + v] = o;
        }
        __syncthreads();
        if (warp < r) {                                 /* gated RMSNorm: 1 / rms per value head */
            float ss = 0.0f;
            for (int i = lane; i < dv; i += 32) ss += ob[warp * dv + i] * ob[warp * dv + i];
            ss = warp_sum(ss);
            if (lane == 0) rn[warp] = 1.0f / sqrtf(ss / (float)dv + g.w.eps);
        }
        __syncthreads();
        for (int i = tid; i < r * dv; i += blockDim.x) {
            int hj = i / dv, vv = i % dv;
            size_t at = (size_t)t * nv * dv + (size_t)(m * r + hj) * dv + vv;
            g.out[at] = ob[i] * rn[hj] * g.w.norm[vv] * silu_f(g.z[at]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < SK; i++)
        if (active && i < g.sk) Sj[(size_t)(kp * g.sk + i) * dv + v] = s[i];
}

/* The step kernel's block: whole warps of (head, column, part) threads, and
 * at least 3 warps (q norm, k norm, gates) and r warps (one per value
 * head's norm). 0 when the shapes do not fit one block. */
static int step_threads(const tern_cuda_gdn_w *w, int *sk_out, int *ks_out) {
    int r = w->nk > 0 ? w->nv / w->nk : 0;
    int sk = w->dk < SK ? w->dk : SK, ks = sk ? w->dk / sk : 0;
    int threads = r * w->dv * ks;
    int min_threads = r * 32 > 96 ? r * 32 : 96;
    bool ok = w->nk >= 1 && w->nv % w->nk == 0 && sk > 0 && w->dk % sk == 0 && (ks & (ks - 1)) == 0 && ks <= 32 &&
              threads % 32 == 0 && threads <= 1024 && r <= 32 && w->conv_kernel >= 1;
    if (threads < min_threads) threads = min_threads;
    *sk_out = sk;
    *ks_out = ks;
    return ok && threads <= 1024 ? threads : 0;
}

int tern_cuda_gdn_supported(const tern_cuda_gdn_w *w) {
    int sk, ks;
    return step_threads(w, &sk, &ks) > 0;
}

int tern_cuda_gdn_step(const tern_cuda_gdn_w *w, const float *qkv, const float *z, const float *b, const float *a,
                       int T, float *conv_state, float *S, float *out, tern_stream s, tern_error *err) {
    int r = w->nk > 0 ? w->nv / w->nk : 0, sk, ks;
    int threads = step_threads(w, &sk, &ks);
    if (!threads || T < 1)
        return tern_fail(err, "gdn_step: heads %d/%d x %d/%d outside the kernel's shapes", w->nk, w->nv, w->dk, w->dv);
    gdn_args g = {*w, qkv, z, b, a, conv_state, S, out, T, sk, ks};
    size_t smem = (size_t)(2 * w->dk + 2 * r * w->dv + 3 * r) * sizeof(float);
    gdn_step_kernel<<<w->nk, threads, smem, s>>>(g);
    return launch_check("gdn_step", err);
}
