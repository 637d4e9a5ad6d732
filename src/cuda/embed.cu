/* Embedding rows on the device: the token ids come from device memory, so
 * a captured decode step reads its token where the previous step's sampler
 * (or the host's few-byte upload) left it, and no row of 2,048 floats
 * crosses the bus per token. One block per token, each thread a run of
 * elements; the rows are tiny next to a step, so the kernel stays plain. */
#include "cuda/common.cuh"

/* w = q * scale + bias with both roundings explicit: nvcc would fuse them
 * into one FMA, and the CPU's tern_dequantize_row (C11, no contraction)
 * rounds twice. */
__device__ __forceinline__ float deq(int q, float s, float b) { return __fadd_rn(__fmul_rn((float)q, s), b); }

template <int KIND>
__global__ void embed_kernel(const uint8_t *__restrict__ data, const uint16_t *__restrict__ sc,
                             const uint16_t *__restrict__ bi, int64_t rows, int cols, int group,
                             const int32_t *__restrict__ ids, const int32_t *__restrict__ prev, float *__restrict__ x) {
    /* the successor (the first input projections, a PDL launch that waits
     * before it reads x) may launch at once: its blocks become resident and
     * request their weights while this one reads its row
     * (docs/experiments/cuda-step-timeline.md) */
    pdl_trigger();
    int64_t r = ids[blockIdx.x];
    if (r == -1 && prev) r = *prev;   /* the step before's draw, on the device (tern_cuda_embed_prev) */
    float *out = x + (size_t)blockIdx.x * cols;
    if (r < 0 || r >= rows) {   /* the host checks ids; a bad one yields zeros, never a stray read */
        for (int i = threadIdx.x; i < cols; i += blockDim.x) out[i] = 0.0f;
        return;
    }
    int ng = cols / group;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float v;
        if (KIND == KIND_Q4 || KIND == KIND_Q8) {
            const uint8_t *row = data + (size_t)r * kind_row_bytes(KIND, cols);
            int q = KIND == KIND_Q8 ? row[i] : (row[i >> 1] >> (4 * (i & 1))) & 15;
            int g = i / group;
            v = deq(q, bf16f(sc[r * ng + g]), bf16f(bi[r * ng + g]));
        } else if (KIND == KIND_BF16) {
            v = bf16f(((const uint16_t *)data)[r * cols + i]);
        } else if (KIND == KIND_F16) {
            v = __half2float(__ushort_as_half(((const uint16_t *)data)[r * cols + i]));
        } else {
            v = ((const float *)data)[r * cols + i];
        }
        out[i] = v;
    }
}

enum { KIND_F32 = 4 };

int tern_cuda_embed_prev(const tern_mat *W, const int32_t *ids, const int32_t *prev, int T, float *x, tern_stream s,
                         tern_error *err) {
    int kind = W->bits == 0 && W->dtype == TERN_DTYPE_F32 ? KIND_F32 : mat_kind(W);
    if (kind < 0 || T < 1 || W->cols < 1 || W->cols > (1 << 30) ||
        ((kind == KIND_Q4 || kind == KIND_Q8) && (W->group < 1 || W->cols % W->group)))
        return tern_fail(err, "embed: %lld x %lld matrix with %d bits, dtype %d, group %d is not supported",
                         (long long)W->rows, (long long)W->cols, W->bits, W->dtype, W->group);
    const uint8_t *d = (const uint8_t *)W->data;
    int cols = (int)W->cols, group = W->group > 0 ? W->group : 1;
    dim3 grid(T), block(256);
    switch (kind) {
    case KIND_Q4: embed_kernel<KIND_Q4><<<grid, block, 0, s>>>(d, W->scales, W->biases, W->rows, cols, group, ids, prev, x); break;
    case KIND_Q8: embed_kernel<KIND_Q8><<<grid, block, 0, s>>>(d, W->scales, W->biases, W->rows, cols, group, ids, prev, x); break;
    case KIND_BF16: embed_kernel<KIND_BF16><<<grid, block, 0, s>>>(d, NULL, NULL, W->rows, cols, group, ids, prev, x); break;
    case KIND_F16: embed_kernel<KIND_F16><<<grid, block, 0, s>>>(d, NULL, NULL, W->rows, cols, group, ids, prev, x); break;
    default: embed_kernel<KIND_F32><<<grid, block, 0, s>>>(d, NULL, NULL, W->rows, cols, group, ids, prev, x); break;
    }
    return launch_check("embed", err);
}

int tern_cuda_embed(const tern_mat *W, const int32_t *ids, int T, float *x, tern_stream s, tern_error *err) {
    return tern_cuda_embed_prev(W, ids, NULL, T, x, s, err);
}
