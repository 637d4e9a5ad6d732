/* Pieces of the gated full-attention layer. */
#ifndef TERN_CPU_ATTENTION_H
#define TERN_CPU_ATTENTION_H

/* Partial rotate-half RoPE on the first rope_dim dims of one head vector:
 * dims d and d + rope_dim/2 form a pair rotated by pos * inv_freq[d], with
 * cos and sin times scale (YaRN's attention factor; 1 leaves a plain
 * rotation); dims past rope_dim pass through. */
void tern_rope(float *x, int rope_dim, const float *inv_freq, float scale, int pos);

/* One query against n cached positions: o = softmax(q . K_j * scale) V.
 * K and V rows are `stride` floats apart; scores needs n floats. */
void tern_attend(float *o, const float *q, const float *K, const float *V, int n, int stride, int hd,
                 float scale, float *scores);

#endif
