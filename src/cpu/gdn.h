/* Gated DeltaNet core: the delta-rule recurrence with per-head decay, in its
 * two equal forms. Shapes (T tokens):
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

typedef struct tern_gdn_io {
    int T, nk, nv, dk, dv;
    const float *q, *k, *v, *g, *beta;
    float *S, *o;
} tern_gdn_io;

/* Token by token:  S = S*exp(g);  delta = beta*(v - S^T k);  S += k delta^T;
 * o = S^T q. */
void tern_gdn_recurrent(const tern_gdn_io *io, int h0, int h1);

/* The same function computed in chunks of `chunk` tokens (64 in the
 * reference): within a chunk a unit-lower-triangular solve replaces the
 * sequential updates; the state passes between chunks. */
void tern_gdn_chunked(const tern_gdn_io *io, int h0, int h1, int chunk);

#endif
