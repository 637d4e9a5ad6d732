/* Gated DeltaNet (../shared/docs/qwen36-model.md §2.5) between the input
 * projections and out_proj: the causal conv, the recurrence's inputs, the
 * delta-rule recurrence with per-head decay in its two equal forms, and the
 * gated output norm. The engine (engine/forward.c) and the CUDA checkers
 * call these. Shapes of the recurrence (T tokens):
 *   q, k  [T, nk, dk]   (q already L2-normalised and scaled by dk^-0.5)
 *   v     [T, nv, dv]
 *   g     [T, nv]       log-decay, <= 0
 *   beta  [T, nv]
 *   S     [nv, dk, dv]  fp32 state, updated in place
 *   o     [T, nv, dv]
 * Value head j reads q/k head j / (nv / nk): v heads share a k head in
 * consecutive groups ("repeat_interleave"). Each function handles value heads
 * [h0, h1) so callers can split heads across threads. */
#ifndef TERN_CPU_GDN_H
#define TERN_CPU_GDN_H

#include <stddef.h>

/* Causal depthwise conv (kernel K, no bias) + SiLU over the C channels of
 * qkv [T, C]: out[t, ch] = silu(sum_j w[ch, j] * in[t - (K-1) + j, ch]),
 * where rows before the first token come from state [K-1, C] (the previous
 * K-1 inputs, oldest first). state then keeps the last K-1 inputs. */
void tern_gdn_conv(const float *w, float *state, const float *qkv, int T, int C, int K, float *out);

/* x / sqrt(sum(x^2) + 1e-6) over n values (the reference's l2norm). */
void tern_l2norm(float *x, int n);

/* The recurrence's inputs from the conv output c [T, 2 nk dk + nv dv]
 * (channels q | k | v, flat over heads) and the projections b, a [T, nv]:
 * q, k [T, nk, dk] L2-normalised per head, q then scaled by dk^-0.5;
 * v [T, nv, dv] as is; beta = sigmoid(b); g = -exp(A_log) *
 * softplus(a + dt_bias) (A_log, dt_bias [nv]). */
void tern_gdn_inputs(const float *c, const float *b, const float *a, const float *A_log, const float *dt_bias, int T,
                     int nk, int nv, int dk, int dv, float *q, float *k, float *v, float *g, float *beta);

/* Gated RMSNorm of the output, per row of dv values (rows = T * nv, one per
 * token and value head): o = rmsnorm(o) * w * silu(z), z the same head's
 * gate (plain weight w [dv], shared by the heads). */
void tern_gdn_gated_norm(float *o, const float *z, const float *w, size_t rows, int dv, float eps);

typedef struct tern_gdn_io {
    int T, nk, nv, dk, dv;
    const float *q, *k, *v, *g, *beta;
    float *S, *o;
    /* NULL, or where the state after each token but the last goes (after
     * each chunk's last token in the chunked form: every token with chunk
     * 1): token t's at keep + t * keep_stride, laid out as S */
    float *keep;
    size_t keep_stride;
} tern_gdn_io;

/* Token by token:  S = S*exp(g);  delta = beta*(v - S^T k);  S += k delta^T;
 * o = S^T q. */
void tern_gdn_recurrent(const tern_gdn_io *io, int h0, int h1);

/* The same function computed in chunks of `chunk` tokens (64 in the
 * reference): within a chunk a unit-lower-triangular solve replaces the
 * sequential updates; the state passes between chunks. Chunks of 1 give,
 * token for token, what one-token calls give. */
void tern_gdn_chunked(const tern_gdn_io *io, int h0, int h1, int chunk);

#endif
