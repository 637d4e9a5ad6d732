/* The router's top k over the logits of T tokens (tern_cuda_route): one
 * warp per token, the selection of route.cuh (which the experts' one launch
 * also uses when it routes the token itself). */
#include "cuda/common.cuh"
#include "cuda/route.cuh"

/* One warp per token (route.cuh). */
template <int V>
__global__ void __launch_bounds__(32) route_kernel(const float *logits, int E, int K, int renorm, int32_t *ids,
                                                   float *wts) {
    pdl_trigger();
    const int t = blockIdx.x;
    pdl_wait();
    route_row<V>(logits + (size_t)t * E, E, K, renorm, ids + (size_t)t * K, wts + (size_t)t * K);
}

int tern_cuda_route(const float *logits, int T, int n_experts, int top_k, int renorm, int32_t *ids, float *wts,
                    tern_stream s, tern_error *err) {
    if (n_experts < 1 || n_experts > 4096 || top_k < 1 || top_k > 32 || top_k > n_experts || T < 1)
        return tern_fail(err, "route: %d experts, top %d outside the kernel's range", n_experts, top_k);
    dim3 g(T), b(32);
    cudaError_t e;
    if (n_experts <= 256) e = launch_pdl(route_kernel<8>, g, b, 0, s, logits, n_experts, top_k, renorm, ids, wts);
    else if (n_experts <= 1024) e = launch_pdl(route_kernel<32>, g, b, 0, s, logits, n_experts, top_k, renorm, ids, wts);
    else e = launch_pdl(route_kernel<128>, g, b, 0, s, logits, n_experts, top_k, renorm, ids, wts);
    if (e != cudaSuccess) return tern_fail(err, "route: %s", cudaGetErrorString(e));
    return 0;
}

/* ---- the experts a step chose, counted (a GPU expert budget's slot cache) ---- */

__global__ void count_experts_kernel(const int32_t *ids, int n, int n_experts, unsigned *counts) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && ids[i] >= 0 && ids[i] < n_experts) atomicAdd(counts + ids[i], 1u);
}

int tern_cuda_count_experts(const int32_t *ids, int n, int n_experts, unsigned *counts, tern_stream s,
                            tern_error *err) {
    if (n < 1) return 0;
    count_experts_kernel<<<ceil_div(n, 256), 256, 0, s>>>(ids, n, n_experts, counts);
    return launch_check("count_experts", err);
}
