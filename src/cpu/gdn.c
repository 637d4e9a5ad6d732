#include "cpu/gdn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"

void tern_gdn_conv(const float *w, float *state, const float *qkv, int T, int C, int K, float *out) {
#define IN(i, ch) ((i) >= 0 ? qkv[(size_t)(i) * C + (ch)] : state[(size_t)((K - 1) + (i)) * C + (ch)])
    for (int t = 0; t < T; t++)
        for (int ch = 0; ch < C; ch++) {
            float acc = 0.0f;
            for (int j = 0; j < K; j++) acc += w[(size_t)ch * K + j] * IN(t - (K - 1) + j, ch);
            out[(size_t)t * C + ch] = tern_silu(acc);
        }
#undef IN
    /* the last K-1 rows of [state; qkv] */
    size_t keep = (size_t)(K - 1), row = (size_t)C * sizeof(float);
    if ((size_t)T >= keep) {
        memcpy(state, qkv + ((size_t)T - keep) * C, keep * row);
    } else {
        memmove(state, state + (size_t)T * C, (keep - (size_t)T) * row);
        memcpy(state + (keep - (size_t)T) * C, qkv, (size_t)T * row);
    }
}

void tern_l2norm(float *x, int n) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss + 1e-6f);
    for (int i = 0; i < n; i++) x[i] *= r;
}

void tern_gdn_inputs(const float *c, const float *b, const float *a, const float *A_log, const float *dt_bias, int T,
                     int nk, int nv, int dk, int dv, float *q, float *k, float *v, float *g, float *beta) {
    int kd = nk * dk, vd = nv * dv, C = 2 * kd + vd;
    float qscale = 1.0f / sqrtf((float)dk);
    for (int t = 0; t < T; t++) {
        const float *row = c + (size_t)t * C;
        memcpy(q + (size_t)t * kd, row, (size_t)kd * sizeof(float));
        memcpy(k + (size_t)t * kd, row + kd, (size_t)kd * sizeof(float));
        memcpy(v + (size_t)t * vd, row + 2 * kd, (size_t)vd * sizeof(float));
        for (int h = 0; h < nk; h++) {
            float *qh = q + (size_t)t * kd + (size_t)h * dk;
            tern_l2norm(qh, dk);
            for (int i = 0; i < dk; i++) qh[i] *= qscale;
            tern_l2norm(k + (size_t)t * kd + (size_t)h * dk, dk);
        }
        for (int j = 0; j < nv; j++) {
            size_t i = (size_t)t * nv + j;
            beta[i] = tern_sigmoid(b[i]);
            g[i] = -expf(A_log[j]) * tern_softplus(a[i] + dt_bias[j]);
        }
    }
}

void tern_gdn_gated_norm(float *o, const float *z, const float *w, size_t rows, int dv, float eps) {
    for (size_t i = 0; i < rows; i++) {
        float *oh = o + i * dv;
        const float *zh = z + i * dv;
        tern_rmsnorm(oh, oh, w, dv, eps);
        for (int d = 0; d < dv; d++) oh[d] *= tern_silu(zh[d]);
    }
}

/* Head j's state after token t, kept when asked for (not after the last). */
static void keep_state(const tern_gdn_io *io, int j, int t, const float *S) {
    if (!io->keep || t + 1 >= io->T) return;
    size_t n = (size_t)io->dk * io->dv;
    memcpy(io->keep + (size_t)t * io->keep_stride + (size_t)j * n, S, n * sizeof(float));
}

void tern_gdn_recurrent(const tern_gdn_io *io, int h0, int h1) {
    int dk = io->dk, dv = io->dv, group = io->nv / io->nk;
    float *mem = malloc((size_t)dv * sizeof(float));
    if (!mem) abort();
    for (int j = h0; j < h1; j++) {
        float *S = io->S + (size_t)j * dk * dv;          /* S[kk][vv] */
        int m = j / group;
        for (int t = 0; t < io->T; t++) {
            const float *q = io->q + ((size_t)t * io->nk + m) * dk;
            const float *k = io->k + ((size_t)t * io->nk + m) * dk;
            const float *v = io->v + ((size_t)t * io->nv + j) * dv;
            float decay = expf(io->g[(size_t)t * io->nv + j]);
            float beta = io->beta[(size_t)t * io->nv + j];
            float *o = io->o + ((size_t)t * io->nv + j) * dv;
            for (int i = 0; i < dk * dv; i++) S[i] *= decay;
            /* mem = S^T k: what the state currently recalls for key k */
            memset(mem, 0, (size_t)dv * sizeof(float));
            for (int kk = 0; kk < dk; kk++)
                for (int vv = 0; vv < dv; vv++) mem[vv] += S[kk * dv + vv] * k[kk];
            for (int vv = 0; vv < dv; vv++) mem[vv] = beta * (v[vv] - mem[vv]);   /* delta */
            for (int kk = 0; kk < dk; kk++)
                for (int vv = 0; vv < dv; vv++) S[kk * dv + vv] += k[kk] * mem[vv];
            /* read after the update */
            memset(o, 0, (size_t)dv * sizeof(float));
            for (int kk = 0; kk < dk; kk++)
                for (int vv = 0; vv < dv; vv++) o[vv] += S[kk * dv + vv] * q[kk];
            keep_state(io, j, t, S);
        }
    }
    free(mem);
}

typedef struct {
    float *G;      /* [C] cumulative log-decay within the chunk */
    float *A;      /* [C, C] strictly lower: beta_i (k_i . k_j) exp(G_i - G_j) */
    float *U;      /* [C, dv] solved "new values" */
    float *W;      /* [C, dk] solved decayed keys that read the old state */
    float *Vn;     /* [C, dv] */
} chunk_scratch;

/* One chunk of rows [t0, t0 + C) of value head j with k/q head m. */
static void gdn_chunk(const tern_gdn_io *io, int j, int m, int t0, int C, float *S, chunk_scratch *s) {
    int dk = io->dk, dv = io->dv, nk = io->nk, nv = io->nv;
#define Q(i) (io->q + ((size_t)(t0 + (i)) * nk + m) * dk)
#define K(i) (io->k + ((size_t)(t0 + (i)) * nk + m) * dk)
#define V(i) (io->v + ((size_t)(t0 + (i)) * nv + j) * dv)
#define BETA(i) (io->beta[(size_t)(t0 + (i)) * nv + j])
    float acc = 0.0f;
    for (int i = 0; i < C; i++) { acc += io->g[(size_t)(t0 + i) * nv + j]; s->G[i] = acc; }
    for (int i = 0; i < C; i++)
        for (int c = 0; c < i; c++)
            s->A[i * C + c] = BETA(i) * tern_dot(K(i), K(c), dk) * expf(s->G[i] - s->G[c]);
    /* Forward substitution: (I + A) U = beta V and (I + A) W = beta exp(G) K. */
    for (int i = 0; i < C; i++) {
        float *u = s->U + (size_t)i * dv, *w = s->W + (size_t)i * dk;
        for (int vv = 0; vv < dv; vv++) u[vv] = BETA(i) * V(i)[vv];
        float eg = BETA(i) * expf(s->G[i]);
        for (int kk = 0; kk < dk; kk++) w[kk] = eg * K(i)[kk];
        for (int c = 0; c < i; c++) {
            float a = s->A[i * C + c];
            for (int vv = 0; vv < dv; vv++) u[vv] -= a * s->U[(size_t)c * dv + vv];
            for (int kk = 0; kk < dk; kk++) w[kk] -= a * s->W[(size_t)c * dk + kk];
        }
    }
    /* Vn = U - W S: the part of each value the old state does not explain. */
    for (int i = 0; i < C; i++) {
        float *vn = s->Vn + (size_t)i * dv;
        memcpy(vn, s->U + (size_t)i * dv, (size_t)dv * sizeof(float));
        for (int kk = 0; kk < dk; kk++) {
            float w = s->W[(size_t)i * dk + kk];
            for (int vv = 0; vv < dv; vv++) vn[vv] -= w * S[kk * dv + vv];
        }
    }
    /* O_i = exp(G_i) q_i^T S + sum_{c <= i} (q_i . k_c) exp(G_i - G_c) Vn_c */
    for (int i = 0; i < C; i++) {
        float *o = io->o + ((size_t)(t0 + i) * nv + j) * dv;
        float eg = expf(s->G[i]);
        memset(o, 0, (size_t)dv * sizeof(float));
        for (int kk = 0; kk < dk; kk++) {
            float qk = Q(i)[kk] * eg;
            for (int vv = 0; vv < dv; vv++) o[vv] += qk * S[kk * dv + vv];
        }
        for (int c = 0; c <= i; c++) {
            float p = tern_dot(Q(i), K(c), dk) * expf(s->G[i] - s->G[c]);
            for (int vv = 0; vv < dv; vv++) o[vv] += p * s->Vn[(size_t)c * dv + vv];
        }
    }
    /* S = S exp(G_last) + sum_i (k_i exp(G_last - G_i)) Vn_i^T */
    float glast = s->G[C - 1], el = expf(glast);
    for (int x = 0; x < dk * dv; x++) S[x] *= el;
    for (int i = 0; i < C; i++) {
        float d = expf(glast - s->G[i]);
        for (int kk = 0; kk < dk; kk++) {
            float kd = K(i)[kk] * d;
            for (int vv = 0; vv < dv; vv++) S[kk * dv + vv] += kd * s->Vn[(size_t)i * dv + vv];
        }
    }
#undef Q
#undef K
#undef V
#undef BETA
}

void tern_gdn_chunked(const tern_gdn_io *io, int h0, int h1, int chunk) {
    int dk = io->dk, dv = io->dv, group = io->nv / io->nk;
    chunk_scratch s;
    size_t C = (size_t)chunk;
    float *buf = malloc((C + C * C + C * dv + C * dk + C * dv) * sizeof(float));
    if (!buf) abort();
    s.G = buf;
    s.A = s.G + C;
    s.U = s.A + C * C;
    s.W = s.U + C * dv;
    s.Vn = s.W + C * dk;
    for (int j = h0; j < h1; j++) {
        float *S = io->S + (size_t)j * dk * dv;
        for (int t0 = 0; t0 < io->T; t0 += chunk) {
            int n = io->T - t0 < chunk ? io->T - t0 : chunk;
            gdn_chunk(io, j, j / group, t0, n, S, &s);
            keep_state(io, j, t0 + n - 1, S);
        }
    }
    free(buf);
}
