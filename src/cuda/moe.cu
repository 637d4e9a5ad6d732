/* The MoE block at decode: the router's top-k, then the routed experts and
 * the shared expert in two launches.
 *
 * Segments: for each token t the top_k routed experts and (if present) the
 * shared expert are segments t * S + k, S = top_k + 1 (or top_k). Expert
 * weights are read through the ids on the device, so the host never waits
 * for the router.
 *   gate_up: grid (intermediate rows / 8, T * S); a warp computes rows i
 *            and i + 1 of gate and up together (4 rows in flight per lane)
 *            and writes h = silu(gate) * up; the shared segment's first
 *            warp also computes sigmoid(x . w_sg).
 *   down:    grid (hidden rows / 16, T); a warp computes four output rows,
 *            its lanes spread over the segments (a q4 expert row of 512
 *            is 16 chunks: two experts per warp pass), each lane's share
 *            scaled by its segment's routing weight, one warp sum at the
 *            end: no atomics, so the result does not depend on timing. */
#include <float.h>

#include "cuda/common.cuh"

typedef struct {
    const uint8_t *q;
    const uint16_t *s, *b;
    int gsh;
} part_ptr;

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
} moe_args;

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

/* acc[r] += sum over the routed segments of token t of wts * down_row(d_r) . h. */
#define DR 4   /* output rows per warp in the down kernel: 4 loads per lane in flight */

template <int KIND>
__device__ void down_routed(const moe_args &a, int t, const int64_t (&d)[DR], float (&acc)[DR]) {
    constexpr int E = kind_traits<KIND>::E;
    int lane = threadIdx.x & 31;
    int nl = lanes_per_row(a.I / E), spp = 32 / nl;
    for (int k0 = 0; k0 < a.K; k0 += spp) {
        int k = k0 + lane / nl;
        if (k >= a.K) continue;
        const uint8_t *blob = expert_blob(a, a.ids[t * a.K + k]);
        part_ptr p = blob_part(blob, a.down);
        const uint8_t *q[DR];
        const uint16_t *sc[DR], *bi[DR];
        int gs[DR];
        float part[DR][1];
#pragma unroll
        for (int r = 0; r < DR; r++) {
            part_row(p, KIND, d[r], a.I, q[r], sc[r], bi[r]);
            gs[r] = p.gsh;
            part[r][0] = 0.0f;
        }
        rows_dot<KIND, 1, DR>(q, sc, bi, gs, a.I, a.h + ((size_t)t * a.S + k) * a.Imax, 0, lane % nl, nl, part);
        float w = a.wts[t * a.K + k];
#pragma unroll
        for (int r = 0; r < DR; r++) acc[r] += w * part[r][0];
    }
}

template <int KIND>
__device__ void down_shared(const moe_args &a, int t, const int64_t (&d)[DR], float (&acc)[DR]) {
    const uint8_t *q[DR];
    const uint16_t *sc[DR], *bi[DR];
    int gs[DR];
    float part[DR][1];
#pragma unroll
    for (int r = 0; r < DR; r++) {
        part_row(a.sdown_p, KIND, d[r], a.s_inter, q[r], sc[r], bi[r]);
        gs[r] = a.sdown_p.gsh;
        part[r][0] = 0.0f;
    }
    rows_dot<KIND, 1, DR>(q, sc, bi, gs, a.s_inter, a.h + ((size_t)t * a.S + a.K) * a.Imax, 0, threadIdx.x & 31, 32,
                          part);
    float w = a.sg[t];
#pragma unroll
    for (int r = 0; r < DR; r++) acc[r] += w * part[r][0];
}

__global__ void __launch_bounds__(128) moe_down_kernel(moe_args a, float *out) {
    int t = blockIdx.y, warp = threadIdx.x >> 5;
    int64_t d0 = ((int64_t)blockIdx.x * 4 + warp) * DR;
    if (d0 >= a.H) return;
    int64_t d[DR];
    float acc[DR];
#pragma unroll
    for (int r = 0; r < DR; r++) {
        d[r] = d0 + r < a.H ? d0 + r : a.H - 1;   /* past the end: a valid row, not stored */
        acc[r] = 0.0f;
    }
    switch (a.r_kind) {
    case KIND_Q4: down_routed<KIND_Q4>(a, t, d, acc); break;
    default: down_routed<KIND_Q8>(a, t, d, acc); break;
    }
    if (a.s_kind >= 0) {
        switch (a.s_kind) {
        case KIND_Q4: down_shared<KIND_Q4>(a, t, d, acc); break;
        case KIND_Q8: down_shared<KIND_Q8>(a, t, d, acc); break;
        case KIND_BF16: down_shared<KIND_BF16>(a, t, d, acc); break;
        default: down_shared<KIND_F16>(a, t, d, acc); break;
        }
    }
#pragma unroll
    for (int r = 0; r < DR; r++) {
        float v = warp_sum(acc[r]);
        if ((threadIdx.x & 31) == 0 && d0 + r < a.H) out[(size_t)t * a.H + d0 + r] = v;
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

size_t tern_cuda_moe_workspace(int T, int top_k, int64_t inter) {
    return ((size_t)T * (size_t)(top_k + 1) * (size_t)inter + (size_t)T) * sizeof(float) + 256;
}

int tern_cuda_moe(const tern_cuda_experts *ex, const tern_expert_w *shared, const tern_mat *shared_gate,
                  const float *x, int T, int top_k, const int32_t *ids, const float *wts, void *work, float *out,
                  tern_stream s, tern_error *err) {
    if (check_experts(ex, err)) return -1;
    if (shared && check_shared(shared, shared_gate, ex->gate.cols, err)) return -1;
    if (T < 1 || top_k < 1) return tern_fail(err, "moe: T = %d, top_k = %d", T, top_k);
    moe_args a;
    memset(&a, 0, sizeof a);
    a.blobs = ex->blobs;
    a.base = ex->base;
    a.stride = ex->stride;
    a.gate = ex->gate;
    a.up = ex->up;
    a.down = ex->down;
    a.r_kind = ex->gate.bits == 4 ? KIND_Q4 : KIND_Q8;
    a.H = (int)ex->gate.cols;
    a.I = (int)ex->gate.rows;
    a.K = top_k;
    a.S = top_k + (shared ? 1 : 0);
    a.s_kind = -1;
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
    a.h = (float *)work;
    a.sg = a.h + (size_t)T * a.S * a.Imax;
    dim3 g1(ceil_div(a.Imax, 8), T * a.S), g2(ceil_div(a.H, 4 * DR), T);
    moe_gate_up_kernel<<<g1, 128, 0, s>>>(a);
    if (launch_check("moe gate/up", err)) return -1;
    moe_down_kernel<<<g2, 128, 0, s>>>(a, out);
    return launch_check("moe down", err);
}

/* ---- router ---------------------------------------------------------------- */

/* One warp per token: softmax of the logits in shared memory, then top_k
 * rounds of a warp argmax (larger first, lower index on ties), each taken
 * entry marked -1. */
__global__ void route_kernel(const float *logits, int E, int K, int renorm, int32_t *ids, float *wts) {
    extern __shared__ float p[];
    int t = blockIdx.x, lane = threadIdx.x;
    const float *l = logits + (size_t)t * E;
    float m = -FLT_MAX;
    for (int e = lane; e < E; e += 32) {
        p[e] = l[e];
        m = fmaxf(m, p[e]);
    }
    m = warp_max(m);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) {
        p[e] = expf(p[e] - m);
        sum += p[e];
    }
    sum = warp_sum(sum);
    for (int e = lane; e < E; e += 32) p[e] /= sum;
    __syncwarp();
    float mine = 0.0f, total = 0.0f;
    for (int r = 0; r < K; r++) {
        float bv = -2.0f;
        int bi = 0x7fffffff;
        for (int e = lane; e < E; e += 32)
            if (p[e] > bv) { bv = p[e]; bi = e; }
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        if (lane == r) mine = bv;
        if (lane == 0) ids[(size_t)t * K + r] = bi;
        total += bv;
        __syncwarp();
        if (lane == (bi & 31)) p[bi] = -1.0f;
        __syncwarp();
    }
    if (lane < K) wts[(size_t)t * K + lane] = renorm ? mine / total : mine;
}

int tern_cuda_route(const float *logits, int T, int n_experts, int top_k, int renorm, int32_t *ids, float *wts,
                    tern_stream s, tern_error *err) {
    if (n_experts < 1 || n_experts > 4096 || top_k < 1 || top_k > 32 || top_k > n_experts || T < 1)
        return tern_fail(err, "route: %d experts, top %d outside the kernel's range", n_experts, top_k);
    route_kernel<<<T, 32, (size_t)n_experts * sizeof(float), s>>>(logits, n_experts, top_k, renorm, ids, wts);
    return launch_check("route", err);
}
