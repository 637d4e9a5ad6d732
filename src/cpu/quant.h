/* Affine group quantization of weight matrices (the MLX scheme, so MLX
 * checkpoints copy bit for bit):
 *
 *   w[r, c] = q[r, c] * scale[r, c / group] + bias[r, c / group]
 *
 * q is unsigned (4-bit 0..15, 8-bit 0..255); groups run along the input
 * (last) dimension; scales and biases are bf16, row-major [rows, cols/group].
 * Packing: each row is a little-endian bit stream, element i at bits
 * [i*bits, (i+1)*bits): for 4-bit, byte j holds element 2j in its low nibble
 * and 2j+1 in its high nibble. A row takes cols*bits/8 bytes. */
#ifndef TERN_CPU_QUANT_H
#define TERN_CPU_QUANT_H

#include <stddef.h>
#include <stdint.h>

/* Bytes of the packed q of one row. */
static inline size_t tern_q_row_bytes(int64_t cols, int bits) { return (size_t)cols * (size_t)bits / 8; }

/* Quantizes rows x cols fp32 weights: per group, bias = bf16(min) and
 * scale = bf16((max - bias) / levels), q = round-to-nearest((w - bias) /
 * scale) clamped to [0, levels] (a constant group gets scale 0, q 0).
 * cols must be a multiple of group; bits 4 or 8. */
void tern_quantize(const float *w, int64_t rows, int64_t cols, int bits, int group, uint8_t *q,
                   uint16_t *scales, uint16_t *biases);

/* Row r dequantized to fp32 (cols values). */
void tern_dequantize_row(const uint8_t *q, const uint16_t *scales, const uint16_t *biases, int64_t r,
                         int64_t cols, int bits, int group, float *out);

#endif
