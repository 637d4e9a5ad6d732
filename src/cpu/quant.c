#include "cpu/quant.h"

#include <math.h>
#include <string.h>

#include "util/half.h"

static void quantize_group(const float *w, int n, int bits, uint8_t *q, int64_t first, uint16_t *scale,
                           uint16_t *bias) {
    int levels = (1 << bits) - 1;
    float mn = w[0], mx = w[0];
    for (int i = 1; i < n; i++) { mn = w[i] < mn ? w[i] : mn; mx = w[i] > mx ? w[i] : mx; }
    /* bias is rounded first so the scale is chosen for the bias the
     * dequantizer will actually add */
    *bias = tern_f32_to_bf16(mn);
    float b = tern_bf16_to_f32(*bias);
    *scale = tern_f32_to_bf16((mx - b) / (float)levels);
    float s = tern_bf16_to_f32(*scale);
    for (int i = 0; i < n; i++) {
        int v = 0;
        if (s > 0) {
            v = (int)lrintf((w[i] - b) / s);
            v = v < 0 ? 0 : v > levels ? levels : v;
        }
        int64_t e = first + i;
        if (bits == 8) q[e] = (uint8_t)v;
        else q[e / 2] |= (uint8_t)(v << (4 * (e & 1)));
    }
}

void tern_quantize(const float *w, int64_t rows, int64_t cols, int bits, int group, uint8_t *q,
                   uint16_t *scales, uint16_t *biases) {
    int64_t ng = cols / group;
    size_t rb = tern_q_row_bytes(cols, bits);
    memset(q, 0, rb * (size_t)rows);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < ng; g++)
            quantize_group(w + r * cols + g * group, group, bits, q + r * rb, g * group,
                           &scales[r * ng + g], &biases[r * ng + g]);
}

void tern_dequantize_row(const uint8_t *q, const uint16_t *scales, const uint16_t *biases, int64_t r,
                         int64_t cols, int bits, int group, float *out) {
    int64_t ng = cols / group;
    const uint8_t *row = q + (size_t)r * tern_q_row_bytes(cols, bits);
    for (int64_t g = 0; g < ng; g++) {
        float s = tern_bf16_to_f32(scales[r * ng + g]), b = tern_bf16_to_f32(biases[r * ng + g]);
        for (int64_t i = g * group; i < (g + 1) * group; i++) {
            int v = bits == 8 ? row[i] : (row[i / 2] >> (4 * (i & 1))) & 15;
            out[i] = (float)v * s + b;
        }
    }
}
