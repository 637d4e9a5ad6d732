/* The KV cache in 16, 8 or 4 bits per value (`--kv-bits`), and the two
 * attention loops run directly on the stored rows.
 *
 * A row is one token's K (or V) for all KV heads: row_len = n_kv_heads *
 * head_dim values, laid out as in the system tern re-creates
 * (../shared/docs/seed-system.md §2c):
 *
 *   bits 16:   [f16 value x row_len]
 *   bits 8, 4: [packed q, padded to an even byte count][f16 scale x groups][f16 bias x groups]
 *
 * 4-bit q pack two per byte, element 2i in the low nibble. Groups are
 * `group` consecutive values, never straddling a head, so one head's slice
 * of a row is whole groups: group = 64 when head_dim is a multiple of 64
 * (Qwen3.6: head_dim 256, 2 KV heads -> 8 groups, rows of 1024 / 544 / 288
 * bytes), else 32 when head_dim is a multiple of 32, else head_dim itself
 * (tiny test models with head_dim 16).
 *
 * Quantization is asymmetric per group, value = q * scale + bias, chosen so
 * every value of the group lies in [bias, bias + levels * scale]: bias is
 * the group minimum rounded down to f16 and scale = (max - bias) / levels
 * rounded up to f16 (levels 15 or 255), so |value - x| <= scale / 2 for
 * every element (plus fp32 rounding of the dequantization). Rounding the
 * bias to nearest instead could put it above the minimum by half an f16
 * ulp of the minimum, several steps for a narrow group far from zero (the
 * test has one); rounding the scale up keeps the maximum inside the range. A constant group whose value is an f16 gets scale 0
 * and dequantizes to exactly bias. Values beyond the f16 range (|x| >
 * 65504) saturate to +-65504 in every mode, so an outlier cannot turn the
 * attention into inf/NaN.
 *
 * The fp32 reference engine keeps fp32 rows; bits 16 here is f16. */
#ifndef TERN_CPU_KVQUANT_H
#define TERN_CPU_KVQUANT_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/qmatvec.h"   /* tern_isa */

/* head_dim bound: the attention loops keep one head-sized row (portable)
 * or 8 queries (SIMD) on the stack. */
#define TERN_KV_MAX_HEAD_DIM 512

typedef struct tern_kvq {
    int bits;            /* 16, 8 or 4 */
    int n_heads;         /* KV heads per row */
    int head_dim;
    int row_len;         /* n_heads * head_dim */
    int group;           /* values per scale/bias (bits 8, 4); head_dim for 16 */
    int n_groups;        /* row_len / group (0 for bits 16) */
    size_t q_bytes;      /* the value part: packed q (even), or 2 * row_len */
    size_t row_bytes;    /* q_bytes + 4 * n_groups */
} tern_kvq;

/* Group size for a head_dim (rule above). */
int tern_kv_group(int head_dim);
/* Bytes of one row of row_len values with this group size (any group for
 * bits 16). */
size_t tern_kv_row_bytes(int row_len, int group, int bits);
/* Fills the layout; -1 for bits other than 16/8/4 or head_dim outside
 * [1, TERN_KV_MAX_HEAD_DIM] or n_heads < 1. */
int tern_kvq_init(tern_kvq *L, int n_heads, int head_dim, int bits);

/* x: row_len floats -> row: row_bytes bytes (padding bytes written as 0). */
void tern_kv_quantize_row(const tern_kvq *L, const float *x, uint8_t *row);
/* row -> out: row_len floats. */
void tern_kv_dequantize_row(const tern_kvq *L, const uint8_t *row, float *out);

/* scores[i * n + j] = scale * dot(q_i, K_j[head]) for nq queries against n
 * rows. q_i = q + i * q_stride (floats; head_dim values), K_j = K + j *
 * k_stride (bytes), K_j[head] its values head*head_dim .. +head_dim.
 * Taking the several query heads that share a KV head (GQA) in one call
 * reads each K row once for all of them. */
void tern_kv_scores(tern_isa isa, const tern_kvq *L, int head, const float *q, int nq, size_t q_stride,
                    const uint8_t *K, size_t k_stride, int n, float scale, float *scores);

/* o_i[d] += sum_j p[i * n + j] * V_j[head][d] for nq queries over n rows;
 * o_i = o + i * o_stride (floats), V_j = V + j * v_stride (bytes).
 * Accumulates: zero o first for a plain weighted sum. */
void tern_kv_accum(tern_isa isa, const tern_kvq *L, int head, const float *p, int nq, const uint8_t *V,
                   size_t v_stride, int n, float *o, size_t o_stride);

/* Attention of nq query heads sharing KV head `head` over n cached
 * positions, the quantized twin of tern_attend (cpu/attention.h):
 *   o_i = sum_j softmax_j(scale * q_i . K_j[head]) V_j[head]
 * o_i = o + i * o_stride is overwritten; K and V rows are `stride` bytes
 * apart; scores is scratch of nq * n floats (left holding the
 * probabilities). */
void tern_kv_attend(tern_isa isa, const tern_kvq *L, int head, const float *q, int nq, size_t q_stride,
                    const uint8_t *K, const uint8_t *V, size_t stride, int n, float scale, float *scores, float *o,
                    size_t o_stride);

#endif
