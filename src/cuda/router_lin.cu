/* The router's linear part for the one-token path (gemv_fused.cu, LIN 1;
 * LIN 2, the accumulated form's slices of N, at the end):
 *   ru = [M | N],  N = W_r diag(g),  M = N W_o,  g = norm_w (+ 1)
 * built once per layer when the model goes up. W_o and W_r are dequantized
 * to fp32 rows with the embedding's kernel (the CPU's values bit for bit),
 * then every entry of M is a sum over the hidden size in double, rounded
 * once to fp32: u = M a + N x_res then differs from the CPU's
 * W_r (g * (x_res + W_o a)) by the fp32 roundings of two sums, not of the
 * weights. Plain tiles; it runs once per layer (~2 GFLOP in double). */
#include "cuda/common.cuh"

#define RL_T 32   /* an output tile of RL_T x RL_T, RL_T columns of the sum at a time */

/* N [n_e, H] in double from W_r's rows and g. */
__global__ void rl_scale_kernel(const float *wr, const float *nw, int one_plus, int n_e, int H, double *n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n_e * H) return;
    int j = (int)(i % H);
    n[i] = (double)wr[i] * (one_plus ? 1.0 + (double)nw[j] : (double)nw[j]);
}

/* ru[e][c] for c < D: sum_j n[e][j] wo[j][c]; c >= D: n[e][c - D]. A block
 * of RL_T x 8 threads makes a tile of RL_T rows e x RL_T columns c. */
__global__ void rl_product_kernel(const double *n, const float *wo, int n_e, int H, int D, float *ru) {
    __shared__ double ns[RL_T][RL_T + 1];
    __shared__ float ws[RL_T][RL_T + 1];
    const int tx = threadIdx.x, ty = threadIdx.y, c = blockIdx.x * RL_T + tx, e0 = blockIdx.y * RL_T;
    double acc[RL_T / 8] = {0.0};
    for (int j0 = 0; j0 < H; j0 += RL_T) {
        for (int r = ty; r < RL_T; r += 8) {
            const int e = e0 + r, j = j0 + tx, jr = j0 + r;
            ns[r][tx] = e < n_e && j < H ? n[(int64_t)e * H + j] : 0.0;
            ws[r][tx] = jr < H && c < D ? wo[(int64_t)jr * D + c] : 0.0f;
        }
        __syncthreads();
        for (int k = 0; k < RL_T; k++) {
            const double w = (double)ws[k][tx];
#pragma unroll
            for (int q = 0; q < RL_T / 8; q++) acc[q] = fma(ns[ty + 8 * q][k], w, acc[q]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int q = 0; q < RL_T / 8; q++) {
        const int e = e0 + ty + 8 * q;
        if (e < n_e && c < D) ru[(int64_t)e * (D + H) + c] = (float)acc[q];
    }
}

__global__ void rl_tail_kernel(const double *n, int n_e, int H, int D, float *ru) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n_e * H) return;
    const int64_t e = i / H, j = i % H;
    ru[e * (D + H) + D + j] = (float)n[i];
}

__global__ void rl_iota_kernel(int32_t *ids, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) ids[i] = i;
}

static size_t rl_align(size_t n) { return (n + 255) & ~(size_t)255; }

size_t tern_cuda_router_lin_work(const tern_mat *router, const tern_mat *out_w) {
    const size_t H = (size_t)out_w->rows, D = (size_t)out_w->cols, E = (size_t)router->rows;
    const size_t n = H > E ? H : E;
    return rl_align(H * D * sizeof(float)) + rl_align(E * H * sizeof(float)) + rl_align(E * H * sizeof(double)) +
           rl_align(n * sizeof(int32_t));
}

int tern_cuda_router_lin_build(const tern_mat *router, const float *norm_w, int one_plus, const tern_mat *out_w,
                               float *ru, void *work, tern_stream s, tern_error *err) {
    const int64_t H = out_w->rows, D = out_w->cols, E = router->rows;
    if (router->cols != H || E < 1 || H < 1 || D < 1 || E * H > (1ll << 30) || H * D > (1ll << 30))
        return tern_fail(err, "router_lin: router %lldx%lld does not match the output projection %lldx%lld",
                         (long long)E, (long long)router->cols, (long long)H, (long long)D);
    if (!norm_w || !ru || !work) return tern_fail(err, "router_lin: missing norm weights, output or workspace");
    cudaStream_t st = (cudaStream_t)s;
    uint8_t *p = (uint8_t *)work;
    float *wo = (float *)p;
    p += rl_align((size_t)(H * D) * sizeof(float));
    float *wr = (float *)p;
    p += rl_align((size_t)(E * H) * sizeof(float));
    double *n = (double *)p;
    p += rl_align((size_t)(E * H) * sizeof(double));
    int32_t *ids = (int32_t *)p;
    const int nid = (int)(H > E ? H : E);
    rl_iota_kernel<<<(nid + 255) / 256, 256, 0, st>>>(ids, nid);
    if (launch_check("router_lin", err)) return -1;
    /* a matrix's rows 0..rows-1 through the embedding (ids 0, 1, ...) */
    if (tern_cuda_embed(out_w, ids, (int)H, wo, s, err) || tern_cuda_embed(router, ids, (int)E, wr, s, err)) {
        tern_err_prefix(err, "router_lin");
        return -1;
    }
    const int64_t EH = E * H;
    rl_scale_kernel<<<(unsigned)((EH + 255) / 256), 256, 0, st>>>(wr, norm_w, one_plus, (int)E, (int)H, n);
    dim3 grid((unsigned)((D + RL_T - 1) / RL_T), (unsigned)((E + RL_T - 1) / RL_T));
    rl_product_kernel<<<grid, dim3(RL_T, 8), 0, st>>>(n, wo, (int)E, (int)H, (int)D, ru);
    rl_tail_kernel<<<(unsigned)((EH + 255) / 256), 256, 0, st>>>(n, (int)E, (int)H, (int)D, ru);
    return launch_check("router_lin", err);
}

/* ---- the accumulated form's slices (tern_cuda_gemv1_lin with rx) ----------
 * rx[b][e][i] = N[e][b rb + i], N = W_r diag(g): block b of the output
 * projection finds its rows' columns of N in one contiguous n_e x rb run. */
__global__ void rx_slice_kernel(const float *wr, const float *nw, int one_plus, int n_e, int H, int rb, float *rx) {
    const int64_t nb = (H + rb - 1) / rb, n = nb * n_e * rb;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int k = (int)(i % rb), e = (int)((i / rb) % n_e), b = (int)(i / ((int64_t)rb * n_e)), j = b * rb + k;
    rx[i] = j < H ? (float)((double)wr[(int64_t)e * H + j] * (one_plus ? 1.0 + (double)nw[j] : (double)nw[j])) : 0.0f;
}

size_t tern_cuda_router_rx_work(const tern_mat *router) {
    const size_t E = (size_t)router->rows, H = (size_t)router->cols;
    return rl_align(E * H * sizeof(float)) + rl_align(E * sizeof(int32_t));
}

int tern_cuda_router_rx_build(const tern_mat *router, const float *norm_w, int one_plus, int rb, float *rx,
                              void *work, tern_stream s, tern_error *err) {
    const int64_t E = router->rows, H = router->cols;
    if (E < 1 || H < 1 || E * H > (1ll << 30) || rb < 1 || rb > 64)
        return tern_fail(err, "router_rx: router %lldx%lld, %d rows a block", (long long)E, (long long)H, rb);
    if (!norm_w || !rx || !work) return tern_fail(err, "router_rx: missing norm weights, output or workspace");
    cudaStream_t st = (cudaStream_t)s;
    float *wr = (float *)work;
    int32_t *ids = (int32_t *)((uint8_t *)work + rl_align((size_t)(E * H) * sizeof(float)));
    rl_iota_kernel<<<(unsigned)((E + 255) / 256), 256, 0, st>>>(ids, (int)E);
    if (launch_check("router_rx", err)) return -1;
    if (tern_cuda_embed(router, ids, (int)E, wr, s, err)) {   /* W_r's rows as the CPU dequantizes them */
        tern_err_prefix(err, "router_rx");
        return -1;
    }
    const int64_t n = (H + rb - 1) / rb * E * rb;
    rx_slice_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(wr, norm_w, one_plus, (int)E, (int)H, rb, rx);
    return launch_check("router_rx", err);
}
