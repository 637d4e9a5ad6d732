/* Launch 1 of the MoE block on floats (moe.cuh): gate and up of every
 * segment, h = silu(gate) * up, and the shared expert's gate; for shapes
 * the integer dots (moe_seg.cu) do not take. */
#include "cuda/moe.cuh"

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

void moe_gate_up_launch(dim3 grid, cudaStream_t s, const moe_args &a) { moe_gate_up_kernel<<<grid, 128, 0, s>>>(a); }
