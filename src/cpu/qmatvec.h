/* Fast matrix-vector kernels for the decode path: y = W x for a tern_mat in
 * any stored encoding (affine q4/q8, bf16, f16, f32), fp32 x and y, without
 * ever writing a dequantized row to memory.
 *
 * Quantized rows are dotted group by group (cpu/quant.h):
 *
 *   y[n] = sum_g ( scale[n,g] * sum_{c in g} q[n,c] x[c]  +  bias[n,g] * sum_{c in g} x[c] )
 *
 * sum_{c in g} x[c] depends only on x, so it is computed once per input
 * vector ("prepared input", below) and reused for every row of every matrix
 * with the same (bits, group, cols).
 *
 * Each kernel exists as portable C, AVX2+FMA and AVX-512 (F/BW/VL), chosen
 * by a tern_isa value the caller passes: the engine resolves it once at load
 * (tern_isa_best) and keeps it with the model; tests name each variant. The
 * variants differ only in summation order, so results agree to rounding, not
 * bit for bit. Within one variant, tern_gemv_batch with T tokens gives
 * exactly the bits of T tern_gemv calls (same operations per token). */
#ifndef TERN_CPU_QMATVEC_H
#define TERN_CPU_QMATVEC_H

#include <stddef.h>
#include <stdint.h>

#include "model/weights.h"
#include "util/pool.h"

typedef enum tern_isa {
    TERN_ISA_C = 0,        /* portable C, any CPU */
    TERN_ISA_AVX2 = 1,     /* AVX2 + FMA + F16C */
    TERN_ISA_AVX512 = 2,   /* AVX-512 F/BW/VL/DQ (+ the above) */
    TERN_ISA_COUNT
} tern_isa;

/* The best variant this CPU (and OS) runs. Cheap, but call once at load and
 * store the result: it is the only place that asks the CPU. */
tern_isa tern_isa_best(void);
/* 1 if this CPU runs variant isa (TERN_ISA_C always). */
int tern_isa_supported(tern_isa isa);
const char *tern_isa_name(tern_isa isa);   /* "c", "avx2", "avx512" */

/* Most tokens one tern_gemv_batch call takes (registers hold one
 * accumulator per token). */
#define TERN_GEMV_MAX_T 8

/* 1 if the kernels here handle W: bits 0 with dtype F32/F16/BF16, or bits 4
 * or 8 with group a multiple of 32 dividing cols. Otherwise use tern_matmul. */
int tern_gemv_supported(const tern_mat *W);

/* The prepared input: floats per token, and how to fill them.
 *   quantized W: [x in kernel order (cols)][sum of x per group (cols/group)]
 *                kernel order for 4-bit permutes each block of 32 elements
 *                to [x0 x2 .. x30 | x1 x3 .. x31] so the low and high
 *                nibbles of 16 packed bytes meet contiguous x; for 8-bit it
 *                is x unchanged;
 *   float W:     x unchanged (cols).
 * The layout depends only on W's bits, group and cols, never on the ISA, so
 * one prepared vector serves every matrix of that shape and every variant. */
size_t tern_gemv_prep_len(const tern_mat *W);
void tern_gemv_prep(const tern_mat *W, const float *x, float *prep);

/* y[n] = sum_c W[n,c] x[c] for n in [r0, r1) (y indexed by absolute row, so
 * threads working on disjoint row ranges share y). prep from tern_gemv_prep.
 * W must pass tern_gemv_supported; isa must be supported by the CPU. */
void tern_gemv(tern_isa isa, const tern_mat *W, int64_t r0, int64_t r1, const float *prep, float *y);

/* The same for T tokens (1 <= T <= TERN_GEMV_MAX_T) with each weight row
 * read and widened once: prep holds T prepared vectors back to back
 * (tern_gemv_prep_len(W) floats apart), y[t * W->rows + n] as tern_matmul. */
void tern_gemv_batch(tern_isa isa, const tern_mat *W, int64_t r0, int64_t r1, const float *prep, int T,
                     float *y);

/* Drop-in for tern_matmul (y[T, rows] = x[T, cols] W^T) on the fast
 * kernels, parallel over rows with tern_pool_for, for any T: tokens run in
 * groups of TERN_GEMV_MAX_T, and a prefill's tokens in blocks of 64 whose
 * prepared inputs stay in cache while the rows stream past once per block.
 * Every token's result equals its own tern_gemv call bit for bit. W must
 * pass tern_gemv_supported. Returns -1 only if an allocation fails. */
int tern_qmatmul(tern_pool *pool, tern_isa isa, float *y, const float *x, int64_t T, const tern_mat *W);

/* sum_i a[i] b[i] in fp32 (several partial sums; the order differs from
 * tern_dot's, so results differ by rounding). */
float tern_dot_fast(tern_isa isa, const float *a, const float *b, int64_t n);

#endif
