/* Decode GEMV: y[T, rows] = x[T, cols] W^T for q4/q8/bf16/f16 W and T <= 8.
 *
 * Memory-bound at T = 1 (a q4 weight byte feeds two multiply-adds), so the
 * kernel is shaped around the loads: every lane reads 16-byte chunks of a
 * row (coalesced across the warp, streaming past L1), a warp takes R rows
 * at once so that R loads per lane are in flight before the first use and
 * each x value loaded from L1 serves R rows. Rows of fewer than 32 chunks
 * share a warp (lanes_per_row). Scales and biases are read once per chunk
 * and applied once per group share (scale * sum(q x) + bias * sum(x)); the
 * nibbles and bytes become floats through the 2^23 mantissa trick
 * (common.cuh) rather than int-to-float conversions.
 *
 * Versions: v1 (this) is one kernel per (kind, T, R); R = 4 for matrices
 * with enough rows to fill the GPU four rows per warp, R = 1 otherwise
 * (more warps, more loads in flight per SM), R = 2 for T > 4. Measured: docs/CUDA.md. */
#include "cuda/common.cuh"

template <int KIND, int T, int R>
__global__ void __launch_bounds__(128) gemv_kernel(const uint8_t *__restrict__ q, const uint16_t *__restrict__ sc,
                                                   const uint16_t *__restrict__ bi, int64_t rows, int cols, int gsh,
                                                   size_t row_bytes, const float *__restrict__ x,
                                                   float *__restrict__ y, int nl) {
    int lane = threadIdx.x & 31;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int rps = 32 / nl;                                   /* rows per warp step */
    int64_t row0 = warp * R * rps + lane / nl;
    int64_t ng = cols >> gsh;
    const uint8_t *qp[R];
    const uint16_t *sp[R], *bp[R];
    int gs[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        int64_t row = row0 + (int64_t)r * rps;
        row = row < rows ? row : rows - 1;               /* out-of-range rows read a valid row, store nothing */
        qp[r] = q + row * row_bytes;
        sp[r] = sc ? sc + row * ng : sc;
        bp[r] = bi ? bi + row * ng : bi;
        gs[r] = gsh;
    }
    float acc[R][T];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[r][t] = 0.0f;
    rows_dot<KIND, T, R>(qp, sp, bp, gs, cols, x, cols, lane % nl, nl, acc);
#pragma unroll
    for (int r = 0; r < R; r++) {
        int64_t row = row0 + (int64_t)r * rps;
#pragma unroll
        for (int t = 0; t < T; t++) {
            float v = group_sum(acc[r][t], nl);
            if (lane % nl == 0 && row < rows) y[t * rows + row] = v;
        }
    }
}

int tern_cuda_gemv_supported(const tern_mat *W) {
    int kind = mat_kind(W);
    if (kind < 0 || W->rows < 1 || W->cols < 1) return 0;
    if (kind == KIND_Q4 || kind == KIND_Q8) {
        int g = W->group;
        if ((g != 32 && g != 64 && g != 128) || W->cols % g) return 0;
        return (W->cols * W->bits / 8) % 16 == 0;
    }
    return W->cols % 8 == 0;
}

template <int KIND, int T, int R>
static void launch_gemv(const tern_mat *W, const float *x, float *y, cudaStream_t s) {
    constexpr int E = kind_traits<KIND>::E;
    int nl = lanes_per_row(W->cols / E);
    int64_t rows_per_warp = (int64_t)R * (32 / nl);
    int64_t warps = (W->rows + rows_per_warp - 1) / rows_per_warp;
    int blocks = ceil_div(warps, 4);
    size_t row_bytes = KIND == KIND_Q4 ? (size_t)W->cols / 2 : KIND == KIND_Q8 ? (size_t)W->cols : (size_t)W->cols * 2;
    int gsh = kind_traits<KIND>::QUANT ? log2i(W->group) : 0;
    gemv_kernel<KIND, T, R><<<blocks, 128, 0, s>>>((const uint8_t *)W->data, W->scales, W->biases, W->rows,
                                                    (int)W->cols, gsh, row_bytes, x, y, nl);
}

/* R = 4 once four rows per warp still give every SM several warps; R = 2
 * past T = 4, where 4 x T accumulators and the widened words no longer fit
 * the registers (ptxas spills at T = 8, R = 4). */
template <int KIND, int T>
static void pick_r(const tern_mat *W, const float *x, float *y, cudaStream_t s) {
    int nl = lanes_per_row(W->cols / kind_traits<KIND>::E);
    if (W->rows / (4 * (32 / nl)) < 132 * 8) launch_gemv<KIND, T, 1>(W, x, y, s);
    else launch_gemv<KIND, T, (T <= 4 ? 4 : 2)>(W, x, y, s);
}

template <int KIND>
static void pick_t(const tern_mat *W, const float *x, int T, float *y, cudaStream_t s) {
    switch (T) {
    case 1: pick_r<KIND, 1>(W, x, y, s); break;
    case 2: pick_r<KIND, 2>(W, x, y, s); break;
    case 3: pick_r<KIND, 3>(W, x, y, s); break;
    case 4: pick_r<KIND, 4>(W, x, y, s); break;
    case 5: pick_r<KIND, 5>(W, x, y, s); break;
    case 6: pick_r<KIND, 6>(W, x, y, s); break;
    case 7: pick_r<KIND, 7>(W, x, y, s); break;
    default: pick_r<KIND, 8>(W, x, y, s); break;
    }
}

int tern_cuda_gemv(const tern_mat *W, const float *x, int T, float *y, tern_stream s, tern_error *err) {
    if (!tern_cuda_gemv_supported(W))
        return tern_fail(err, "gemv: unsupported matrix (bits %d, dtype %d, %lldx%lld, group %d)", W->bits, W->dtype,
                         (long long)W->rows, (long long)W->cols, W->group);
    if (T < 1 || T > TERN_CUDA_GEMV_MAX_T) return tern_fail(err, "gemv: T = %d outside 1..%d", T, TERN_CUDA_GEMV_MAX_T);
    switch (mat_kind(W)) {
    case KIND_Q4: pick_t<KIND_Q4>(W, x, T, y, s); break;
    case KIND_Q8: pick_t<KIND_Q8>(W, x, T, y, s); break;
    case KIND_BF16: pick_t<KIND_BF16>(W, x, T, y, s); break;
    default: pick_t<KIND_F16>(W, x, T, y, s); break;
    }
    return launch_check("gemv", err);
}
