#include "cpu/attention.h"

#include <math.h>
#include <string.h>

#include "cpu/ops.h"

void tern_rope(float *x, int rope_dim, const float *inv_freq, float scale, int pos) {
    int half = rope_dim / 2;
    for (int d = 0; d < half; d++) {
        /* the angle is formed in fp32, as the reference forms it, and cos
         * and sin are scaled before use, as transformers scales them */
        float ang = (float)pos * inv_freq[d];
        float c = cosf(ang) * scale, s = sinf(ang) * scale;
        float a = x[d], b = x[d + half];
        x[d] = a * c - b * s;
        x[d + half] = b * c + a * s;
    }
}

void tern_attend(float *o, const float *q, const float *K, const float *V, int n, int stride, int hd,
                 float scale, float *scores) {
    for (int j = 0; j < n; j++) scores[j] = tern_dot(q, K + (size_t)j * stride, hd) * scale;
    tern_softmax(scores, n);
    memset(o, 0, (size_t)hd * sizeof(float));
    for (int j = 0; j < n; j++) {
        const float *v = V + (size_t)j * stride;
        float p = scores[j];
        for (int d = 0; d < hd; d++) o[d] += p * v[d];
    }
}
