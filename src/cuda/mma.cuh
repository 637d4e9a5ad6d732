/* Warp-level tensor-core products (mma.sync m16n8k16, fp32 accumulation)
 * shared by the prefill kernels, and the fragment layout they rely on:
 * lane = 4 g + t; A (16 x 16, row-major) regs {A[g][2t..], A[g+8][2t..],
 * A[g][2t+8..], A[g+8][2t+8..]}; B (16 x 8, stored as 8 rows of 16 k, i.e.
 * a weight row per n) regs {B[g][2t..], B[g][2t+8..]}; C/D {C[g][2t],
 * C[g][2t+1], C[g+8][2t], C[g+8][2t+1]}. Each register holds two
 * consecutive k, the lower k in the low half. */
#ifndef TERN_CUDA_MMA_CUH
#define TERN_CUDA_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* Two floats as a register of two bf16 / f16 (round to nearest even), lo
 * in the low half. */
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;
}
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
    return (uint32_t)__half_as_ushort(__float2half_rn(lo)) | (uint32_t)__half_as_ushort(__float2half_rn(hi)) << 16;
}

/* A fragment of the 16 x 16 block at (r, k) of a row-major tile of 16-bit
 * values, ld elements per row; B fragment of the 8 x 16 block at (n, k) of
 * a tile stored n-major (a row of k per n). */
__device__ __forceinline__ void frag_a(uint32_t (&a)[4], const uint16_t *tile, int ld, int r, int k, int lane) {
    int g = lane >> 2, t = lane & 3;
    const uint16_t *p = tile + (r + g) * ld + k + 2 * t;
    a[0] = *(const uint32_t *)p;
    a[1] = *(const uint32_t *)(p + 8 * ld);
    a[2] = *(const uint32_t *)(p + 8);
    a[3] = *(const uint32_t *)(p + 8 * ld + 8);
}
__device__ __forceinline__ void frag_b(uint32_t (&b)[2], const uint16_t *tile, int ld, int n, int k, int lane) {
    int g = lane >> 2, t = lane & 3;
    const uint16_t *p = tile + (n + g) * ld + k + 2 * t;
    b[0] = *(const uint32_t *)p;
    b[1] = *(const uint32_t *)(p + 8);
}

#endif
