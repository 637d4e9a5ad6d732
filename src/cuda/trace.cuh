/* Phase trace of the decode kernels, a measurement build only
 * (make CUDA=1 TRACE=1 defines TERN_PHASE_TRACE; otherwise every macro
 * here is empty): thread 0 of each block of an instrumented kernel reads
 * %globaltimer at the kernel's marks (start, weights requested, wait
 * released, input built, ...) and at its end appends one record, the kernel
 * id, an auxiliary number (rows, a segment) and the marks, to a buffer of
 * its translation unit. TRACE_DUMP_FN defines the host function that writes
 * the unit's records as CSV (tern_cuda_trace_dump in runtime.cu calls them
 * when the session ends; tools/gpu/phase_trace.py reads the file). */
#ifndef TERN_CUDA_TRACE_CUH
#define TERN_CUDA_TRACE_CUH

#include <stdio.h>

#include "cuda/trace_marks.h"

#ifdef TERN_PHASE_TRACE
typedef struct {
    uint32_t kid, aux, block, pad;
    unsigned long long m[TRACE_MARKS];
} trace_rec;

#define TRACE_CAP (1u << 20)
static __device__ trace_rec trace_recs[TRACE_CAP];
static __device__ unsigned trace_count;

__device__ __forceinline__ unsigned long long trace_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

#define TRACE_DECL unsigned long long trace_m_[TRACE_MARKS] = {0}
#define TRACE_MARK(i)                                  \
    do {                                               \
        if (threadIdx.x == 0) trace_m_[i] = trace_now(); \
    } while (0)
/* marks set in a device function the kernel calls: it takes TRACE_PTR */
#define TRACE_PTR trace_m_
#define TRACE_MARK_AT(p, i)                        \
    do {                                           \
        if (threadIdx.x == 0) (p)[i] = trace_now(); \
    } while (0)
/* the same, once the float v has been computed (its loads have arrived) */
#define TRACE_MARK_AFTER(p, i, v)             \
    do {                                      \
        asm volatile("" ::"f"(v));            \
        TRACE_MARK_AT(p, i);                  \
    } while (0)
#define TRACE_END(kid_, aux_)                                                          \
    do {                                                                               \
        if (threadIdx.x == 0) {                                                        \
            trace_m_[TRACE_MARKS - 1] = trace_now();                                   \
            unsigned s_ = atomicAdd(&trace_count, 1u);                                 \
            if (s_ < TRACE_CAP) {                                                      \
                trace_rec *r_ = &trace_recs[s_];                                       \
                r_->kid = (kid_);                                                      \
                r_->aux = (aux_);                                                      \
                r_->block = blockIdx.x + blockIdx.y * gridDim.x;                       \
                for (int i_ = 0; i_ < TRACE_MARKS; i_++) r_->m[i_] = trace_m_[i_];     \
            }                                                                          \
        }                                                                              \
    } while (0)
#define TRACE_DUMP_FN(name)                                                                    \
    extern "C" int name(FILE *f) {                                                             \
        unsigned n = 0;                                                                        \
        if (cudaMemcpyFromSymbol(&n, trace_count, sizeof n) != cudaSuccess) return -1;         \
        if (n > TRACE_CAP) n = TRACE_CAP;                                                      \
        trace_rec *r = (trace_rec *)malloc((size_t)n * sizeof *r + 1);                        \
        if (!r || cudaMemcpyFromSymbol(r, trace_recs, (size_t)n * sizeof *r) != cudaSuccess) { \
            free(r);                                                                           \
            return -1;                                                                         \
        }                                                                                      \
        for (unsigned i = 0; i < n; i++) {                                                     \
            fprintf(f, "%u,%u,%u", r[i].kid, r[i].aux, r[i].block);                            \
            for (int j = 0; j < TRACE_MARKS; j++) fprintf(f, ",%llu", r[i].m[j]);              \
            fputc('\n', f);                                                                    \
        }                                                                                      \
        free(r);                                                                               \
        return (int)n;                                                                         \
    }
#else
#define TRACE_DECL do { } while (0)
#define TRACE_MARK(i) do { } while (0)
#define TRACE_PTR nullptr
#define TRACE_MARK_AT(p, i) do { (void)(p); } while (0)
#define TRACE_MARK_AFTER(p, i, v) do { (void)(p); } while (0)
#define TRACE_END(kid, aux) do { } while (0)
#define TRACE_DUMP_FN(name)
#endif

/* kernel ids of the records */
enum { TRACE_GEMV1 = 1, TRACE_GEMV1_ROUTE = 2, TRACE_GEMV1S = 3, TRACE_MOE_GATE_UP = 4, TRACE_MOE_DOWN = 5,
       TRACE_MOE_ONE = 6, TRACE_GDN_STEP = 7, TRACE_SAMPLE = 8 };

#endif
