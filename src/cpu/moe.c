#include "cpu/moe.h"

#include "cpu/ops.h"

void tern_moe_topk(float *probs, int E, int K, int renorm, int *idx, float *wt) {
    tern_softmax(probs, E);
    float sum = 0.0f;
    for (int r = 0; r < K; r++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int q = 0; q < r; q++) taken |= idx[q] == e;
            if (!taken && (best < 0 || probs[e] > probs[best])) best = e;
        }
        idx[r] = best;
        wt[r] = probs[best];
        sum += wt[r];
    }
    if (renorm)
        for (int r = 0; r < K; r++) wt[r] /= sum;
}

void tern_swiglu(float *h, const float *gate, const float *up, size_t n) {
    for (size_t i = 0; i < n; i++) h[i] = tern_silu(gate[i]) * up[i];
}
