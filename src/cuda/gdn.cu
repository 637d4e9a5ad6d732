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
 * activations and the conv state after it, and every write.
 *
 * With the output projection (OUTP, one token): the cluster of key head m
 * holds the gated outputs of its r value heads, columns m r dv .. of the
 * projection's input; every writer thread stores its output into the
 * shared memory of every block of the cluster (st.async on a third
 * mbarrier), and block cr takes output rows cr hb .. cr hb + hb - 1 over
 * those r dv columns: its share of W (q4: hb x r dv / 2 bytes, with the
 * scales and biases) is copied into shared memory before the wait, so the
 * projection's DRAM latency hides under the step. A thread keeps one
 * 32-column chunk of the outputs in registers and walks rows; the chunk
 * sums of a row meet by shuffles, and the row's sum over the cluster goes
 * into y as a fixed-point atomic (common.cuh's dfx_*): the clusters add in
 * any order and the sums are the same. The kernel boundary and the
 * projection's prologue of the two-launch form are gone, but the row loop
 * on 4 warps an SM costs more than they did (docs/PERFORMANCE.md step 74:
 * the engine takes this form only with TERN_GDN_PROJ=1). */
#include "cuda/common.cuh"
#include "cuda/trace.cuh"

#define SK 32          /* most rows of S a thread holds */
#define CPT 3          /* most conv channels a thread computes per token */
#define MAX_CLUSTER 8  /* portable cluster size */
#define MAX_THREADS 256

/* The output projection beside the step (OUTP). */
typedef struct {
    const uint8_t *q;             /* W's packed rows, row_bytes apart */
    const uint16_t *sc, *bi;      /* bf16 per (row, group), ng a row */
    size_t row_bytes;
    int rows, ng, gsh, hb;        /* H, groups a row, log2 group, rows a block */
    long long *fx;                /* [rows] fixed-point sums, zero on entry */
    uint4 *zero;                  /* zero_n 16-byte units zeroed after the wait */
    int zero_n;
} gdn_outp;

typedef struct {
    tern_cuda_gdn_w w;
    const float *qkv, *z, *b, *a;
    float *conv_state, *S, *out;
    int T, cw, nsl, ks, sk;
    gdn_outp o;
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

/* OUTP: the block's share of W into shared memory (before the wait: W is
 * constant): rows orow0 .. orow0 + hb - 1 (those past W's last row read
 * nothing and hold zeros), columns ocol0 .. as ocp 16-byte chunks a row,
 * and their scales and biases, ongc (even) a row, copied in pairs. */
__device__ __forceinline__ void outp_request(const gdn_outp &o, uint8_t *wq, uint16_t *ws, uint16_t *wb, int hb,
                                             int ocp, int ongc, int orow0, int ocol0) {
    for (int i = threadIdx.x; i < hb * ocp; i += blockDim.x) {
        const int r = i / ocp, c = i - r * ocp, gr = orow0 + r;
        const bool ok = gr < o.rows;
        cp_async_zfill<16>(wq + (size_t)i * 16, o.q + (size_t)(ok ? gr : 0) * o.row_bytes + ocol0 / 2 + c * 16, ok);
    }
    const int np = ongc / 2;
    for (int i = threadIdx.x; i < hb * np; i += blockDim.x) {
        const int r = i / np, c = i - r * np, gr = orow0 + r;
        const bool ok = gr < o.rows;
        const size_t at = (size_t)(ok ? gr : 0) * o.ng + (ocol0 >> o.gsh) + 2 * c;
        cp_async_zfill<4>(ws + 2 * i, o.sc + at, ok);
        cp_async_zfill<4>(wb + 2 * i, o.bi + at, ok);
    }
    cp_async_commit();
}

/* OUTP: y[orow0 + r] += W[orow0 + r, cluster's columns] . ob for the
 * block's rows. Thread: chunk p = tid % ocp of ob in registers (32
 * outputs and their sum), rows tid / ocp, + blockDim / ocp, ...; per row
 * scale * sum(q ob) + bias * sum(ob) over its chunk (a chunk lies in one
 * group), the ocp chunks summed by shuffles (ocp a power of two <= 32), one
 * fixed-point atomic a row. The row loop stays rolled: this code runs once
 * a launch on every SM, so its instruction fetch is on the path (an
 * unrolled form spent 28 % of its stall samples waiting for instructions
 * and ran slower). Every thread runs every round (the shuffles). */
__device__ __forceinline__ void outp_rows(const gdn_outp &o, const float *ob, const uint8_t *wq, const uint16_t *ws,
                                          const uint16_t *wb, int hb, int ocp, int ongc, int orow0) {
    const int p = threadIdx.x % ocp, rp = blockDim.x / ocp, gi = (p * 32) >> o.gsh;
    float x[32], xsum = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float4 v = ((const float4 *)(ob + p * 32))[i];
        x[4 * i] = v.x; x[4 * i + 1] = v.y; x[4 * i + 2] = v.z; x[4 * i + 3] = v.w;
        xsum += (v.x + v.y) + (v.z + v.w);
    }
#pragma unroll 1
    for (int r = (int)threadIdx.x / ocp; r - (int)threadIdx.x / ocp < hb; r += rp) {
        const bool ok = r < hb && orow0 + r < o.rows;
        const uint4 raw = ok ? ((const uint4 *)wq)[r * ocp + p] : make_uint4(0u, 0u, 0u, 0u);
        const uint32_t wv[4] = {raw.x, raw.y, raw.z, raw.w};
        float part[4];   /* one chain per word */
#pragma unroll
        for (int wi = 0; wi < 4; wi++) {
            const uint32_t lo = wv[wi] & 0x0f0f0f0fu, hi = (wv[wi] >> 4) & 0x0f0f0f0fu;
            const float *xw = x + 8 * wi;
            float a = byte_f<0>(lo) * xw[0];
            a = fmaf(byte_f<0>(hi), xw[1], a); a = fmaf(byte_f<1>(lo), xw[2], a); a = fmaf(byte_f<1>(hi), xw[3], a);
            a = fmaf(byte_f<2>(lo), xw[4], a); a = fmaf(byte_f<2>(hi), xw[5], a); a = fmaf(byte_f<3>(lo), xw[6], a);
            part[wi] = fmaf(byte_f<3>(hi), xw[7], a);
        }
        const float s = ok ? bf16f(ws[r * ongc + gi]) : 0.0f, b = ok ? bf16f(wb[r * ongc + gi]) : 0.0f;
        const float y = group_sum(fmaf(s, (part[0] + part[1]) + (part[2] + part[3]), b * xsum), ocp);
        if (ok && p == 0) dfx_add(o.fx + orow0 + r, dfx_of(y));
    }
}

/* KC, KS, SKT: conv_kernel, ks and sk known at compile time (Qwen3.6: 4,
 * 4, 32), or 0 (any, slower). */
template <int KC, int KS, int SKT, bool OUTP>
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
    /* OUTP: the cluster's columns (ocw, 32-column chunks ocp of them), the
     * block's first output row and the cluster's first column */
    const int ocw = csize * cw, ocp = ocw / 32, ongc = OUTP ? ocw >> g.o.gsh : 0, hb = OUTP ? g.o.hb : 0;
    const int orow0 = cr * hb, ocol0 = (blockIdx.x / csize) * ocw;
    uint64_t *bars = (uint64_t *)sm;                /* [3]: token parity; OUTP: the outputs exchanged */
    float *ob = sm + 8;                             /* OUTP: [ocw] the cluster's gated outputs (16-byte aligned) */
    uint8_t *wq = (uint8_t *)(ob + (OUTP ? ocw : 0));   /* OUTP: [hb][ocp] 16-byte chunks of W */
    uint16_t *ws = (uint16_t *)(wq + (size_t)hb * ocp * 16), *wb = ws + hb * ongc;   /* [hb][ongc] */
    float *cq = (float *)(wb + hb * ongc), *ck = cq + dk, *cv = ck + dk;   /* conv outputs: q_m, k_m, the slice's v */
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
    if (OUTP) outp_request(g.o, wq, ws, wb, hb, ocp, ongc, orow0, ocol0);
    if (tid == 0) {
        mbar_init(bars);
        mbar_init(bars + 1);
        if (OUTP) mbar_init(bars + 2);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    cluster_arrive_relaxed();   /* "started": waited on before the first store into a peer */
    pdl_trigger();
    const float nw = g.w.norm[v], A = g.w.A_log[j], dtb = g.w.dt_bias[j];
    TRACE_MARK(1);
    pdl_wait();
    TRACE_MARK(2);
    if (OUTP)   /* the slot of a layer before, read by now */
        for (int i = blockIdx.x * blockDim.x + tid; i < g.o.zero_n; i += gridDim.x * blockDim.x)
            g.o.zero[i] = make_uint4(0u, 0u, 0u, 0u);

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
            if (OUTP)   /* column cr cw + vl of the cluster's outputs, into every block of it */
                for (int q = 0; q < csize; q++) st_async(ob + cr * cw + vl, bars + 2, (unsigned)q, y);
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
    if (OUTP) {
        if (tid == 0) mbar_expect(bars + 2, (unsigned)ocw * 4);
        cp_async_wait_all();
        __syncthreads();                            /* every thread's copies of W have landed */
        TRACE_MARK(7);
        mbar_wait<true>(bars + 2, 0);               /* the cluster's outputs have */
        TRACE_MARK(6);
        outp_rows(g.o, ob, wq, ws, wb, hb, ocp, ongc, orow0);
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

/* OUTP: the projection's plan for W, or 0 where it does not apply: q4
 * with W [H, nv dv], its rows 16-byte aligned and its scales and biases
 * 4-byte aligned (the copies' sizes); a cluster's r dv columns whole
 * 32-column chunks (a power of two of them, at most 32, dividing the
 * block's threads) and whole groups, an even number of them and of a
 * row's (the scales are copied in pairs); rows spread evenly over the
 * cluster's blocks; the block's shared memory within the default 48 KB. */
static int plan_outp(const tern_cuda_gdn_w *w, const step_plan &p, const tern_mat *W, gdn_outp *o, size_t *smem) {
    const int ocw = p.csize * p.cw, ocp = ocw / 32;
    if (!W || W->bits != 4 || W->cols != (int64_t)w->nv * w->dv || W->rows < 1 || W->rows > (1 << 20)) return 0;
    if (W->group != 32 && W->group != 64 && W->group != 128) return 0;
    if (((uintptr_t)W->data & 15) || ((uintptr_t)W->scales & 3) || ((uintptr_t)W->biases & 3)) return 0;
    if (ocw % 32 || ocw % W->group || (ocw / W->group) % 2 || (W->cols / W->group) % 2) return 0;
    if (ocp & (ocp - 1) || ocp > 32 || p.threads % ocp) return 0;
    const int hb = ceil_div(W->rows, p.csize), ongc = ocw / W->group;
    const size_t extra = (size_t)ocw * 4 + (size_t)hb * ocp * 16 + (size_t)hb * ongc * 4;
    if (*smem + extra > 48 * 1024) return 0;
    *o = gdn_outp{(const uint8_t *)W->data, W->scales, W->biases, (size_t)W->cols / 2, (int)W->rows,
                  (int)(W->cols / W->group), log2i(W->group), hb, NULL, NULL, 0};
    *smem += extra;
    return 1;
}

template <int KC, int KS, int SKT, bool OUTP>
static cudaError_t launch_step(const step_plan &p, int blocks, size_t smem, cudaStream_t s, gdn_args g) {
    return launch_pdl_cluster(gdn_step_kernel<KC, KS, SKT, OUTP>, dim3(blocks), dim3(p.threads), smem,
                              (unsigned)p.csize, s, g);
}

static size_t step_smem(const tern_cuda_gdn_w *w, const step_plan &p) {
    const int nwarps = p.threads / 32;
    return (size_t)(8 + 2 * w->dk + p.cw + 2 * nwarps + 2 * p.csize * nwarps) * sizeof(float);
}

/* The step's launch, with the projection when g.o.fx is set. */
static int launch_any(const tern_cuda_gdn_w *w, const step_plan &p, size_t smem, cudaStream_t s, const gdn_args &g,
                      tern_error *err) {
    const int blocks = w->nv * p.nsl, fixed = w->conv_kernel == 4 && p.ks == 4 && p.sk == 32;
    cudaError_t e = g.o.fx ? (fixed ? launch_step<4, 4, 32, true>(p, blocks, smem, s, g)
                                    : launch_step<0, 0, 0, true>(p, blocks, smem, s, g))
                           : (fixed ? launch_step<4, 4, 32, false>(p, blocks, smem, s, g)
                                    : launch_step<0, 0, 0, false>(p, blocks, smem, s, g));
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
    gdn_args g = {*w, qkv, z, b, a, conv_state, S, out, T, p.cw, p.nsl, p.ks, p.sk, gdn_outp{}};
    return launch_any(w, p, step_smem(w, p), s, g, err);
}

size_t tern_cuda_gdn_proj_slot_bytes(int64_t H) { return ((size_t)H * sizeof(long long) + 255) & ~(size_t)255; }

int tern_cuda_gdn_proj_supported(const tern_cuda_gdn_w *w, const tern_mat *W) {
    step_plan p;
    gdn_outp o;
    if (!plan_step(w, &p)) return 0;
    size_t smem = step_smem(w, p);
    return plan_outp(w, p, W, &o, &smem);
}

int tern_cuda_gdn_step_proj(const tern_cuda_gdn_w *w, const float *qkv, const float *z, const float *b,
                            const float *a, float *conv_state, float *S, float *out, const tern_cuda_gdn_proj *pj,
                            tern_stream s, tern_error *err) {
    step_plan p;
    gdn_outp o;
    if (!plan_step(w, &p))
        return tern_fail(err, "gdn_step: heads %d/%d x %d/%d outside the kernel's shapes", w->nk, w->nv, w->dk, w->dv);
    size_t smem = step_smem(w, p);
    if (!pj || !plan_outp(w, p, pj->W, &o, &smem))
        return tern_fail(err, "gdn_step_proj: the output projection is not q4 [H, %d] in whole groups of a cluster's "
                              "columns", w->nv * w->dv);
    const uintptr_t z0 = (uintptr_t)pj->zero, y0 = (uintptr_t)pj->y_fx;
    const bool overlap = pj->zero && z0 < y0 + (size_t)o.rows * sizeof(long long) && y0 < z0 + pj->zero_bytes;
    if (!pj->y_fx || (z0 & 15) || pj->zero_bytes % 16 || (!pj->zero && pj->zero_bytes) || overlap)
        return tern_fail(err, "gdn_step_proj: no sums, or a slot to zero that is not 16-byte units apart from them");
    o.fx = pj->y_fx;
    o.zero = (uint4 *)pj->zero;
    o.zero_n = (int)(pj->zero_bytes / 16);
    gdn_args g = {*w, qkv, z, b, a, conv_state, S, out, 1, p.cw, p.nsl, p.ks, p.sk, o};
    return launch_any(w, p, smem, s, g, err);
}

TRACE_DUMP_FN(tern_cuda_trace_dump_gdn)
