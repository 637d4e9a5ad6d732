/* Device helpers shared by the op files: launch checks, half/bf16 widening,
 * warp reductions, and the dequantizing dot product of weight rows that the
 * GEMV and the expert kernels share. */
#ifndef TERN_CUDA_COMMON_CUH
#define TERN_CUDA_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_ops.h"
extern "C" {
#include "util/err.h"   /* a C header without its own extern "C" */
}

/* After a launch: the launch error (bad configuration, no device) as a
 * tern_error. Faults inside the kernel surface at the next sync. */
static inline int launch_check(const char *op, tern_error *err) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return tern_fail(err, "%s: %s", op, cudaGetErrorString(e));
    return 0;
}

static inline int ceil_div(int64_t a, int64_t b) { return (int)((a + b - 1) / b); }

/* ---- programmatic dependent launch (Hopper) ------------------------------
 * A decode step is a chain of small kernels, each a few microseconds; most
 * of a kernel's time is the DRAM latency of its first weight loads and the
 * gap between launches. A kernel launched with launch_pdl may start while
 * its predecessor still runs: it issues loads of data nobody in the chain
 * writes (weights, the recurrent state of an earlier token), then
 * pdl_wait() blocks until the predecessor has finished and its writes are
 * visible. Rule for every kernel launched this way: no global write, and
 * no read of anything its predecessor writes, before pdl_wait(). What
 * kernels before the predecessor wrote may be read before it: every kernel
 * of the step waits before it triggers, so they have finished when this one
 * starts (and the step's inputs, copied in before the step, too: the
 * attention's position, the DeltaNet state of an earlier token).
 * pdl_trigger() lets the successor launch early (once every block of this
 * grid has called it or exited). Both are no-ops in a kernel
 * launched the ordinary way. */
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

int tern_cuda_pdl_enabled(void);   /* runtime.cu: the device is sm_90+ */
int tern_cuda_sm_count(void);           /* runtime.cu: the device's SMs, asked once */

/* Resident blocks per SM of a kernel at `threads` threads and `smem` bytes
 * of dynamic shared memory, cached per kernel (a static cache for each)
 * and size: the CUDA queries cost microseconds, and a step launched
 * outside a graph would pay them every call. The kernel's shared-memory
 * limit is raised to the largest size asked; 1 when a query fails. A pure
 * function of the kernel and the device, so the cache is safe to share. */
typedef struct {
    size_t smem[8], limit;
    int occ[8], n;
} occ_cache;

template <typename Kernel>
static int blocks_per_sm(occ_cache &c, Kernel kernel, int threads, size_t smem) {
    for (int i = 0; i < c.n; i++)
        if (c.smem[i] == smem) return c.occ[i];
    if (smem > c.limit && cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) ==
                              cudaSuccess)
        c.limit = smem;
    int occ = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, threads, smem) != cudaSuccess || occ < 1) {
        cudaGetLastError();
        occ = 1;
    }
    if (c.n < 8) {
        c.smem[c.n] = smem;
        c.occ[c.n++] = occ;
    }
    return occ;
}
void tern_cuda_carveout_max(const void *kernel);   /* runtime.cu: once per kernel (carveout_max below) */

/* A block of a PDL launch becomes resident beside its predecessor's blocks
 * only if the SM's split of L1 and shared memory suits both; a kernel's
 * default split follows its own shared memory, so a kernel with a smaller
 * split (the experts' down, ~28 KB a block) kept the next layer's input
 * projections (~70 KB a block) off every SM until its blocks were gone, and
 * their weight requests could not start under it. Every kernel of the
 * step therefore asks for the largest shared-memory split (the streamed
 * weights bypass L1 anyway). */
static inline void carveout_max(const void *kernel) { tern_cuda_carveout_max(kernel); }

/* cluster > 0: the grid in thread-block clusters of cluster x 1 x 1 blocks
 * (launch_pdl: none). */
template <typename... KArgs, typename... Args>
static inline cudaError_t launch_pdl_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                             unsigned cluster, cudaStream_t s, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = tern_cuda_pdl_enabled();
    at[1].id = cudaLaunchAttributeClusterDimension;
    at[1].val.clusterDim.x = cluster;
    at[1].val.clusterDim.y = 1;
    at[1].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = cluster ? 2 : 1;
    carveout_max((const void *)kernel);
    return cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...);
}

template <typename... KArgs, typename... Args>
static inline cudaError_t launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                     Args... args) {
    return launch_pdl_cluster(kernel, grid, block, smem, 0u, s, args...);
}

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float bf16f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ float f16_lo(uint32_t w) { return __half2float(__ushort_as_half((unsigned short)(w & 0xffffu))); }
__device__ __forceinline__ float f16_hi(uint32_t w) { return __half2float(__ushort_as_half((unsigned short)(w >> 16))); }

/* Byte k (0..3) of v as a float, for bytes holding 0..255: the byte goes
 * into the mantissa of 2^23 (one PRMT), and 2^23 is subtracted (one FADD),
 * cheaper than an int-to-float conversion, which runs at 1/8 the FMA rate. */
template <int k> __device__ __forceinline__ float byte_f(uint32_t v) {
    return __uint_as_float(__byte_perm(v, 0x4b000000u, 0x7440 | k)) - 8388608.0f;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* RMSNorm's output for four elements: v * r * w, w + 1 with one_plus (the
 * CPU's order of the two products) */
__device__ __forceinline__ float4 rms_apply4(float4 v, float4 w, float r, int one_plus) {
    if (one_plus) { w.x += 1.0f; w.y += 1.0f; w.z += 1.0f; w.w += 1.0f; }
    return make_float4(v.x * r * w.x, v.y * r * w.y, v.z * r * w.z, v.w * r * w.w);
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

/* ---- cp.async: global -> shared without holding registers ---------------
 * N bytes (4, 8 or 16, both addresses N-aligned); 16 bytes bypass L1 (.cg).
 * cp_async_zfill: !ok writes zeros and reads nothing. Copies complete per
 * commit group (cp_async_commit, cp_async_wait<groups still in flight>) or
 * all at once, committed or not (cp_async_wait_all). */
template <int N> __device__ __forceinline__ void cp_async(void *dst, const void *src) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if (N == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(d), "l"(src), "n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void cp_async_zfill(void *dst, const void *src, bool ok) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    int sz = ok ? N : 0;
    if (N == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(sz) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(d), "l"(src), "n"(N), "r"(sz) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

/* Loads that skip L1: weights are read once per launch. */
__device__ __forceinline__ uint4 ld_stream(const void *p) { return __ldcs((const uint4 *)p); }

/* ---- the dequantizing row dot -------------------------------------------
 * A row is cut into 16-byte chunks: 32 elements at 4 bits, 16 at 8 bits, 8
 * at 16 bits (bf16/f16). A chunk never straddles a quantization group
 * (groups are >= 32 elements and aligned), so per chunk
 *   sum_c w_c x_c = scale * sum_c q_c x_c + bias * sum_c x_c.
 * Lanes of a row group take chunks lane, lane + nl, ... */

enum { KIND_Q4 = 0, KIND_Q8 = 1, KIND_BF16 = 2, KIND_F16 = 3 };

template <int KIND> struct kind_traits;
template <> struct kind_traits<KIND_Q4> { enum { E = 32, QUANT = 1 }; };
template <> struct kind_traits<KIND_Q8> { enum { E = 16, QUANT = 1 }; };
template <> struct kind_traits<KIND_BF16> { enum { E = 8, QUANT = 0 }; };
template <> struct kind_traits<KIND_F16> { enum { E = 8, QUANT = 0 }; };

/* Bytes of a row of n elements of a kind. */
__host__ __device__ static inline size_t kind_row_bytes(int kind, int64_t n) {
    return kind == KIND_Q4 ? (size_t)n / 2 : kind == KIND_Q8 ? (size_t)n : (size_t)n * 2;
}

/* The kind of a tern_mat, or -1 if the row dot does not handle it. */
static inline int mat_kind(const tern_mat *W) {
    if (W->bits == 4) return KIND_Q4;
    if (W->bits == 8) return KIND_Q8;
    if (W->bits == 0 && W->dtype == TERN_DTYPE_BF16) return KIND_BF16;
    if (W->bits == 0 && W->dtype == TERN_DTYPE_F16) return KIND_F16;
    return -1;
}

/* p[t] += sum over word `w` (32 bits) of chunk elements dotted with x_t.
 * x points at the chunk's first element of token 0; tokens xs floats
 * apart. For quantized kinds this is sum q x; xsum[t] collects sum x. */
template <int KIND, int T>
__device__ __forceinline__ void word_dot(uint32_t w, const float *x, int64_t xs, float (&p)[T], float (&xsum)[T],
                                         bool want_xsum) {
    if (KIND == KIND_Q4) {
        /* element i is nibble i: the low nibbles of the bytes are elements
         * 0,2,4,6 and the high ones 1,3,5,7 */
        uint32_t lo = w & 0x0f0f0f0fu, hi = (w >> 4) & 0x0f0f0f0fu;
        float f[8] = {byte_f<0>(lo), byte_f<0>(hi), byte_f<1>(lo), byte_f<1>(hi),
                      byte_f<2>(lo), byte_f<2>(hi), byte_f<3>(lo), byte_f<3>(hi)};
#pragma unroll
        for (int t = 0; t < T; t++) {
            float4 a = *(const float4 *)(x + t * xs), b = *(const float4 *)(x + t * xs + 4);
            float s = p[t];
            s = fmaf(f[0], a.x, s); s = fmaf(f[1], a.y, s); s = fmaf(f[2], a.z, s); s = fmaf(f[3], a.w, s);
            s = fmaf(f[4], b.x, s); s = fmaf(f[5], b.y, s); s = fmaf(f[6], b.z, s); s = fmaf(f[7], b.w, s);
            p[t] = s;
            if (want_xsum) xsum[t] += ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w));
        }
    } else if (KIND == KIND_Q8) {
        float f[4] = {byte_f<0>(w), byte_f<1>(w), byte_f<2>(w), byte_f<3>(w)};
#pragma unroll
        for (int t = 0; t < T; t++) {
            float4 a = *(const float4 *)(x + t * xs);
            float s = p[t];
            s = fmaf(f[0], a.x, s); s = fmaf(f[1], a.y, s); s = fmaf(f[2], a.z, s); s = fmaf(f[3], a.w, s);
            p[t] = s;
            if (want_xsum) xsum[t] += (a.x + a.y) + (a.z + a.w);
        }
    } else {
        float f0 = KIND == KIND_BF16 ? bf16_lo(w) : f16_lo(w), f1 = KIND == KIND_BF16 ? bf16_hi(w) : f16_hi(w);
#pragma unroll
        for (int t = 0; t < T; t++) {
            float2 a = *(const float2 *)(x + t * xs);
            p[t] = fmaf(f1, a.y, fmaf(f0, a.x, p[t]));
        }
    }
}

/* Elements of one 32-bit word of a chunk. */
template <int KIND> __device__ __forceinline__ constexpr int word_elems() { return kind_traits<KIND>::E / 4; }

/* acc[r][t] += lane's share of row r . x_t for R rows (row r: q[r] packed
 * data, sc[r]/bi[r] bf16 scales/biases of the row, unused for float kinds,
 * groups of 1 << gsh[r] elements: parts of one expert may differ) of
 * `cols` columns, T tokens (x_t = x + t * xs). The lane
 * takes chunks lane, lane + nl, ...; the caller reduces acc over the nl
 * lanes. All R rows' loads of a chunk are issued before their use. */
template <int KIND, int T, int R>
__device__ __forceinline__ void rows_dot(const uint8_t *const (&q)[R], const uint16_t *const (&sc)[R],
                                         const uint16_t *const (&bi)[R], const int (&gsh)[R], int cols, const float *x,
                                         int64_t xs, int lane, int nl, float (&acc)[R][T]) {
    constexpr int E = kind_traits<KIND>::E;
    const int n_chunks = cols / E;
#pragma unroll 2
    for (int ci = lane; ci < n_chunks; ci += nl) {
        uint4 raw[R];
#pragma unroll
        for (int r = 0; r < R; r++) raw[r] = ld_stream(q[r] + (size_t)ci * 16);
        float s[R] = {}, b[R] = {};
        if (kind_traits<KIND>::QUANT) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                int g = (ci * E) >> gsh[r];
                s[r] = bf16f(__ldg(sc[r] + g));
                b[r] = bf16f(__ldg(bi[r] + g));
            }
        }
        const float *xc = x + (size_t)ci * E;
        float xsum[T];
#pragma unroll
        for (int t = 0; t < T; t++) xsum[t] = 0.0f;
#pragma unroll
        for (int r = 0; r < R; r++) {
            float p[T];
#pragma unroll
            for (int t = 0; t < T; t++) p[t] = 0.0f;
            const uint32_t wv[4] = {raw[r].x, raw[r].y, raw[r].z, raw[r].w};
#pragma unroll
            for (int wi = 0; wi < 4; wi++)
                word_dot<KIND, T>(wv[wi], xc + wi * word_elems<KIND>(), xs, p, xsum, r == 0);
#pragma unroll
            for (int t = 0; t < T; t++) {
                if (kind_traits<KIND>::QUANT) acc[r][t] += fmaf(s[r], p[t], b[r] * xsum[t]);
                else acc[r][t] += p[t];
            }
        }
    }
}

/* Sum over aligned groups of nl lanes (nl a power of two); every lane of
 * the group gets the total. */
__device__ __forceinline__ float group_sum(float v, int nl) {
    for (int o = nl >> 1; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Lanes per row: chunks spread over at most 32 lanes; fewer (a power of
 * two) when a row has fewer chunks, so one warp covers several rows. */
static inline int log2i(int v) {
    int s = 0;
    while ((1 << s) < v) s++;
    return s;
}

__host__ __device__ static inline int lanes_per_row(int64_t n_chunks) {
    int nl = 32;
    while (nl > 1 && nl / 2 >= n_chunks) nl /= 2;
    return nl;
}

/* A KV row layout (cpu/kvquant.h), passed to kernels by value. */
typedef struct {
    int bits, n_groups, group, row_len;
    size_t q_bytes, row_bytes;
} kv_layout;

static inline kv_layout kv_of(const tern_kvq *L) {
    kv_layout k = {L->bits, L->n_groups, L->group, L->row_len, L->q_bytes, L->row_bytes};
    return k;
}

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* KV cache rows (cpu/kvquant.h layouts), shared by the decode and prefill
 * attention: values d .. d + 7 of a row's head slice (vals: the slice's
 * first value, d a multiple of 8) as floats, undequantized for 8/4 bits;
 * `al`: the row layout keeps 16/8/4-byte loads aligned (a compile-time
 * constant at the call removes the other branch). */
template <int BITS>
__device__ __forceinline__ void kv_load8(const uint8_t *vals, int d, bool al, float (&v)[8]) {
    if (BITS == 16) {
        const uint8_t *p = vals + 2 * (size_t)d;
        uint32_t w[4];
        if (al) {
            uint4 u = *(const uint4 *)p;
            w[0] = u.x; w[1] = u.y; w[2] = u.z; w[3] = u.w;
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) w[i] = p[4 * i] | p[4 * i + 1] << 8 | p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24;
        }
#pragma unroll
        for (int i = 0; i < 4; i++) { v[2 * i] = f16_lo(w[i]); v[2 * i + 1] = f16_hi(w[i]); }
    } else if (BITS == 8) {
        const uint8_t *p = vals + d;
        uint32_t w0, w1;
        if (al) {
            uint2 u = *(const uint2 *)p;
            w0 = u.x; w1 = u.y;
        } else {
            w0 = p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24;
            w1 = p[4] | p[5] << 8 | p[6] << 16 | (uint32_t)p[7] << 24;
        }
        v[0] = byte_f<0>(w0); v[1] = byte_f<1>(w0); v[2] = byte_f<2>(w0); v[3] = byte_f<3>(w0);
        v[4] = byte_f<0>(w1); v[5] = byte_f<1>(w1); v[6] = byte_f<2>(w1); v[7] = byte_f<3>(w1);
    } else {
        const uint8_t *p = vals + d / 2;
        uint32_t w = al ? *(const uint32_t *)p : (p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24);
        uint32_t lo = w & 0x0f0f0f0fu, hi = (w >> 4) & 0x0f0f0f0fu;
        v[0] = byte_f<0>(lo); v[1] = byte_f<0>(hi); v[2] = byte_f<1>(lo); v[3] = byte_f<1>(hi);
        v[4] = byte_f<2>(lo); v[5] = byte_f<2>(hi); v[6] = byte_f<3>(lo); v[7] = byte_f<3>(hi);
    }
}

/* The experts' fixed-point sums (tern_cuda_experts.fx): a share as an
 * integer of 2^-TERN_CUDA_DFX_SHIFT units, saturating at +-2^24 (so the 64
 * shares a slot's counters allow add to less than 2^62; NaN becomes the
 * upper limit), and a sum back as the float nearest it (one rounding: the
 * scale is a power of 2). */
__device__ __forceinline__ long long dfx_of(float v) {
    const float lim = 16777216.0f;   /* 2^24 */
    return __float2ll_rn(fminf(fmaxf(v, -lim), lim) * (float)(1ull << TERN_CUDA_DFX_SHIFT));
}
__device__ __forceinline__ float dfx_val(long long s) {
    return __ll2float_rn(s) * (1.0f / (float)(1ull << TERN_CUDA_DFX_SHIFT));
}
__device__ __forceinline__ void dfx_add(long long *p, long long v) {
    asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
/* entries 4i .. 4i + 3 of a sum array as floats */
__device__ __forceinline__ float4 dfx_load4(const long long *s, int i) {
    const longlong2 a = ((const longlong2 *)s)[2 * i], b = ((const longlong2 *)s)[2 * i + 1];
    return make_float4(dfx_val(a.x), dfx_val(a.y), dfx_val(b.x), dfx_val(b.y));
}

/* Counters between the blocks of a grid (gpu scope): a release add, an
 * acquire load, and an add that is both (the count of the block that
 * finishes last acquires what every earlier one released). */
__device__ __forceinline__ void red_release(unsigned *p) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p) : "memory");
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned atom_acq_rel(unsigned *p) {
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(p) : "memory");
    return old;
}

/* (every thread of the block) whether this block is the last of the grid
 * to get here. The block's writes before the call are ordered by a barrier
 * before thread 0 counts the block with one acquire-release add, so the last
 * block sees every block's writes after the second barrier (the arrive /
 * wait pattern of CUTLASS's GenericBarrier; a fence in every thread before
 * the count cost more); the last block leaves the count zero for the next
 * launch. */
__device__ __forceinline__ bool grid_last_block(unsigned *count) {
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atom_acq_rel(count) == gridDim.x - 1;
        if (last) *count = 0;
    }
    __syncthreads();
    return last;
}

/* mbarriers in shared memory: a phase completes when its one arrival (with
 * the bytes it expects) has come and those bytes have been stored (by
 * st_async from any block of the cluster, or by bulk copies). */
__device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

/* ---- thread-block clusters --------------------------------------------------
 * The cluster barrier, split: arrive (release: the thread's earlier writes,
 * shared memory included, are visible to the cluster after the wait),
 * arrive_relaxed (it orders nothing: e.g. only the mbarrier inits before
 * it, fenced on their own), wait (acquire). Every thread of the cluster
 * takes part. cluster_map: local's address in the shared memory of the
 * cluster's block `rank`. */
__device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }
__device__ __forceinline__ unsigned cluster_map(const void *local, unsigned rank) {
    unsigned a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(smem_u32(local)), "r"(rank));
    return a;
}
__device__ __forceinline__ void mbar_init(uint64_t *bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
/* Wait for the phase of parity ph; CLUSTER: acquire at cluster scope (the
 * senders' earlier memory operations, not just their bytes, are ordered
 * before what follows). */
template <bool CLUSTER> __device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned ph) {
    unsigned done;
    do {
        if (CLUSTER)
            asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                         " selp.u32 %0, 1, 0, p;\n}"
                         : "=r"(done) : "r"(smem_u32(bar)), "r"(ph) : "memory");
        else
            asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                         " selp.u32 %0, 1, 0, p;\n}"
                         : "=r"(done) : "r"(smem_u32(bar)), "r"(ph) : "memory");
    } while (!done);
}
/* A bulk copy (the TMA unit) of n bytes global -> shared, counted on bar's
 * expected bytes; dst, src 16-byte aligned, n a multiple of 16. */
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, unsigned n, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(n), "r"(smem_u32(bar))
                 : "memory");
}

#endif
