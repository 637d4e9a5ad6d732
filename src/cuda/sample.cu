/* Token choice on the GPU, so only the id crosses the bus: argmax, and
 * temperature / top-k / top-p / min-p sampling with the rules of
 * engine/sampler.h.
 *
 * Both work in two stages. Stage 1: each block takes a slice of the
 * vocabulary (SLICE ids) and keeps its best candidates (argmax: one; sample:
 * the top_k of the slice, by a bitonic sort in shared memory). Stage 2: one
 * block merges the candidates (another bitonic sort for sampling) and one
 * thread walks the at most 64 survivors: weights exp(l - max), top-p over
 * what top-k kept, min-p against the best, then the draw at u. Order: larger
 * logit first, lower id first among equals; NaN counts as -inf. */
#include <float.h>

#include "cuda/common.cuh"

#define SLICE 4096            /* ids per stage-1 block: 1024 threads x 4 */
#define MERGE 8192            /* stage-2 capacity: ceil(248320 / 4096) x 64 = 3904 fits */

typedef struct {
    float v;
    int id;
} cand;

__device__ __forceinline__ bool before(cand a, cand b) { return a.v > b.v || (a.v == b.v && a.id < b.id); }

__device__ __forceinline__ float clean(float x) { return x != x ? -INFINITY : x; }

/* Sorts n (a power of two, a multiple of 2 * blockDim) candidates best first. */
__device__ void bitonic(cand *c, int n) {
    for (int k = 2; k <= n; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                int ixj = i ^ j;
                if (ixj > i) {
                    bool up = (i & k) == 0;
                    cand a = c[i], b = c[ixj];
                    if (up ? before(b, a) : before(a, b)) { c[i] = b; c[ixj] = a; }
                }
            }
            __syncthreads();
        }
}

/* ---- argmax ------------------------------------------------------------ */

__device__ cand block_best(cand m, cand *red) {
    for (int o = 16; o; o >>= 1) {
        cand x = {__shfl_xor_sync(0xffffffffu, m.v, o), __shfl_xor_sync(0xffffffffu, m.id, o)};
        if (before(x, m)) m = x;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) red[warp] = m;
    __syncthreads();
    cand b = red[0];
    for (int i = 1; i < (int)(blockDim.x >> 5); i++)
        if (before(red[i], b)) b = red[i];
    return b;
}

__global__ void argmax_slices(const float *l, int n, cand *out) {
    __shared__ cand red[32];
    cand m = {-INFINITY, 0x7fffffff};
    int end = min(n, (blockIdx.x + 1) * SLICE);
    for (int i = blockIdx.x * SLICE + threadIdx.x; i < end; i += blockDim.x) {
        cand c = {clean(l[i]), i};
        if (before(c, m)) m = c;
    }
    cand b = block_best(m, red);
    if (threadIdx.x == 0) out[blockIdx.x] = b;
}

__global__ void argmax_merge(const cand *in, int nb, int32_t *id) {
    __shared__ cand red[32];
    cand m = {-INFINITY, 0x7fffffff};
    for (int i = threadIdx.x; i < nb; i += blockDim.x)
        if (before(in[i], m)) m = in[i];
    cand b = block_best(m, red);
    /* all -inf: id 0, as the CPU's argmax */
    if (threadIdx.x == 0) *id = b.id == 0x7fffffff ? 0 : b.id;
}

size_t tern_cuda_sample_workspace(int n_valid) {
    return (size_t)ceil_div(n_valid, SLICE) * TERN_CUDA_SAMPLE_MAX_K * sizeof(cand);
}

int tern_cuda_argmax(const float *logits, int n_valid, void *work, int32_t *id, tern_stream s, tern_error *err) {
    if (n_valid < 1) return tern_fail(err, "argmax: no logits");
    int nb = ceil_div(n_valid, SLICE);
    argmax_slices<<<nb, 256, 0, s>>>(logits, n_valid, (cand *)work);
    if (launch_check("argmax", err)) return -1;
    argmax_merge<<<1, 1024, 0, s>>>((const cand *)work, nb, id);
    return launch_check("argmax merge", err);
}

/* ---- top-k / top-p / min-p sampling ------------------------------------ */

__global__ void __launch_bounds__(1024) topk_slices(const float *l, int n, float inv_t, int k, cand *out) {
    __shared__ cand c[SLICE];
    int base = blockIdx.x * SLICE;
    for (int i = threadIdx.x; i < SLICE; i += blockDim.x) {
        int id = base + i;
        cand x = {-INFINITY, 0x7fffffff};
        if (id < n) { x.v = clean(l[id]) * inv_t; x.id = id; }
        c[i] = x;
    }
    __syncthreads();
    bitonic(c, SLICE);
    for (int i = threadIdx.x; i < k; i += blockDim.x) out[(size_t)blockIdx.x * k + i] = c[i];
}

__global__ void __launch_bounds__(1024) topk_merge(const cand *in, int m, int size, int k, float top_p, float min_p,
                                                   double u, int32_t *id) {
    extern __shared__ cand c[];   /* size: the power of two >= m */
    for (int i = threadIdx.x; i < size; i += blockDim.x) {
        cand x = {-INFINITY, 0x7fffffff};
        if (i < m) x = in[i];
        c[i] = x;
    }
    __syncthreads();
    bitonic(c, size);
    if (threadIdx.x) return;
    /* c[0 .. k) are the top-k, best first; weights relative to the best */
    double w[TERN_CUDA_SAMPLE_MAX_K], total = 0.0, cum = 0.0;
    float mx = c[0].v;
    int n = k;
    for (int i = 0; i < k; i++) {
        w[i] = c[i].id == 0x7fffffff ? 0.0 : (double)expf(c[i].v - mx);
        total += w[i];
    }
    if (top_p < 1.0f)
        for (int i = 0; i < n; i++) {
            cum += w[i];
            if (cum >= top_p * total) { n = i + 1; break; }
        }
    if (min_p > 0.0f)
        for (int i = 1; i < n; i++)
            if (w[i] < min_p * w[0]) { n = i; break; }
    double kept = 0.0;
    for (int i = 0; i < n; i++) kept += w[i];
    double target = u * kept, run = 0.0;
    int pick = c[0].id;
    for (int i = 0; i < n; i++) {
        if (w[i] <= 0) continue;
        run += w[i];
        pick = c[i].id;
        if (target < run) break;
    }
    *id = pick;
}

int tern_cuda_sample(const float *logits, int n_valid, float temperature, int top_k, float top_p, float min_p,
                     double u, void *work, int32_t *id, tern_stream s, tern_error *err) {
    if (n_valid < 1 || top_k < 1 || top_k > TERN_CUDA_SAMPLE_MAX_K || !(temperature > 0) || u < 0 || u >= 1)
        return tern_fail(err, "sample: top_k %d (1..%d), temperature %g, u %g", top_k, TERN_CUDA_SAMPLE_MAX_K,
                         temperature, u);
    int nb = ceil_div(n_valid, SLICE), k = top_k < n_valid ? top_k : n_valid;
    if ((int64_t)nb * k > MERGE) return tern_fail(err, "sample: %d ids x top_k %d exceed the merge", n_valid, top_k);
    topk_slices<<<nb, 1024, 0, s>>>(logits, n_valid, 1.0f / temperature, k, (cand *)work);
    if (launch_check("sample top-k", err)) return -1;
    /* the merge sorts only the next power of two (at least 2048: two per
     * thread) above the candidates: 61 x 20 = 1220 -> 2048 at top-k 20 */
    int size = 2048;
    while (size < nb * k) size *= 2;
    size_t smem = (size_t)size * sizeof(cand);
    cudaFuncSetAttribute(topk_merge, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(MERGE * sizeof(cand)));
    topk_merge<<<1, 1024, smem, s>>>((const cand *)work, nb * k, size, k, top_p, min_p, u, id);
    return launch_check("sample merge", err);
}
