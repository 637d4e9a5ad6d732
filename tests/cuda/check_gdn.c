/* tern_cuda_gdn_step against forward.c's gdn_layer between the projections
 * and out_proj: the causal conv + SiLU (a copy of forward.c's static
 * gdn_conv), l2norm, g and beta, tern_gdn_recurrent (cpu/gdn.h), then
 * tern_rmsnorm times silu(z). Checked: the output, the state S and the conv
 * state after the call.
 * Tolerance 1e-5 of max |ref|: fp32 everywhere; the 128-term sums S^T k
 * and S^T q run in another order, and expf / log1pf / sqrtf differ from
 * glibc's by an ulp or two, compounded over at most a few tokens. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu/gdn.h"
#include "cpu/ops.h"

typedef struct {
    int nk, nv, dk, dv, K, T;
} gdn_dims;

/* forward.c's gdn_conv: state rows are the previous K - 1 inputs. */
static void conv_ref(const float *w, float *state, const float *qkv, int T, int C, int K, float *out) {
#define IN(i, ch) ((i) >= 0 ? qkv[(size_t)(i) * C + (ch)] : state[(size_t)((K - 1) + (i)) * C + (ch)])
    for (int t = 0; t < T; t++)
        for (int ch = 0; ch < C; ch++) {
            float acc = 0.0f;
            for (int j = 0; j < K; j++) acc += w[(size_t)ch * K + j] * IN(t - (K - 1) + j, ch);
            out[(size_t)t * C + ch] = tern_silu(acc);
        }
    float *next = xmalloc((size_t)(K - 1) * C * sizeof(float) + 1);
    for (int r = 0; r < K - 1; r++)
        for (int ch = 0; ch < C; ch++) next[(size_t)r * C + ch] = IN(T - (K - 1) + r, ch);
#undef IN
    memcpy(state, next, (size_t)(K - 1) * C * sizeof(float));
    free(next);
}

static void l2n(float *x, int n) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss + 1e-6f);
    for (int i = 0; i < n; i++) x[i] *= r;
}

typedef struct {
    float *qkv, *z, *a, *b, *conv, *A_log, *dt_bias, *norm, *state, *S;
} gdn_host;

static void gdn_ref(const gdn_dims *g, gdn_host *h, float *out) {
    int T = g->T, kd = g->nk * g->dk, vd = g->nv * g->dv, C = 2 * kd + vd;
    float *c = xmalloc((size_t)T * C * 4), *q = xmalloc((size_t)T * kd * 4), *k = xmalloc((size_t)T * kd * 4);
    float *v = xmalloc((size_t)T * vd * 4), *gg = xmalloc((size_t)T * g->nv * 4), *beta = xmalloc((size_t)T * g->nv * 4);
    conv_ref(h->conv, h->state, h->qkv, T, C, g->K, c);
    float qscale = 1.0f / sqrtf((float)g->dk);
    for (int t = 0; t < T; t++) {
        memcpy(q + (size_t)t * kd, c + (size_t)t * C, (size_t)kd * 4);
        memcpy(k + (size_t)t * kd, c + (size_t)t * C + kd, (size_t)kd * 4);
        memcpy(v + (size_t)t * vd, c + (size_t)t * C + 2 * kd, (size_t)vd * 4);
        for (int m = 0; m < g->nk; m++) {
            float *qh = q + (size_t)t * kd + (size_t)m * g->dk;
            l2n(qh, g->dk);
            for (int i = 0; i < g->dk; i++) qh[i] *= qscale;
            l2n(k + (size_t)t * kd + (size_t)m * g->dk, g->dk);
        }
        for (int j = 0; j < g->nv; j++) {
            size_t i = (size_t)t * g->nv + j;
            beta[i] = tern_sigmoid(h->b[i]);
            gg[i] = -expf(h->A_log[j]) * tern_softplus(h->a[i] + h->dt_bias[j]);
        }
    }
    tern_gdn_io io = {T, g->nk, g->nv, g->dk, g->dv, q, k, v, gg, beta, h->S, out};
    tern_gdn_recurrent(&io, 0, g->nv);
    for (size_t i = 0; i < (size_t)T * g->nv; i++) {
        float *o = out + i * g->dv;
        tern_rmsnorm(o, o, h->norm, g->dv, 1e-6f);
        for (int d = 0; d < g->dv; d++) o[d] *= tern_silu(h->z[i * g->dv + d]);
    }
    free(c); free(q); free(k); free(v); free(gg); free(beta);
}

typedef struct {
    const tern_cuda_gdn_w *w;
    const float *qkv, *z, *b, *a;
    int T;
    float *conv_state;
    float **S;
    int n;
    float *out;
    tern_stream s;
} gdn_run;

static void run_gdn(void *arg, int rep) {
    gdn_run *r = arg;
    tern_error err;
    if (tern_cuda_gdn_step(r->w, r->qkv, r->z, r->b, r->a, r->T, r->conv_state, r->S[rep % r->n], r->out, r->s, &err))
        die_err("gdn_step", &err);
}

static float *up(const float *h, size_t n) { return dev_upload(h, n * sizeof(float)); }

static void gdn_case(checker *ck, gdn_dims g, int timed) {
    int T = g.T, kd = g.nk * g.dk, vd = g.nv * g.dv, C = 2 * kd + vd;
    size_t nS = (size_t)g.nv * g.dk * g.dv, nst = (size_t)(g.K - 1) * C;
    gdn_host h;
    h.qkv = xmalloc((size_t)T * C * 4);
    h.z = xmalloc((size_t)T * vd * 4);
    h.a = xmalloc((size_t)T * g.nv * 4);
    h.b = xmalloc((size_t)T * g.nv * 4);
    h.conv = xmalloc((size_t)C * g.K * 4);
    h.A_log = xmalloc((size_t)g.nv * 4);
    h.dt_bias = xmalloc((size_t)g.nv * 4);
    h.norm = xmalloc((size_t)g.dv * 4);
    h.state = xmalloc(nst * 4 + 4);
    h.S = xmalloc(nS * 4);
    rnd_floats(ck, h.qkv, (size_t)T * C, 1.0f);
    rnd_floats(ck, h.z, (size_t)T * vd, 1.0f);
    rnd_floats(ck, h.a, (size_t)T * g.nv, 1.0f);
    rnd_floats(ck, h.b, (size_t)T * g.nv, 1.0f);
    for (size_t i = 0; i < (size_t)C * g.K; i++) h.conv[i] = rnd_uniform(ck, -0.5f, 0.5f);
    for (int j = 0; j < g.nv; j++) {
        h.A_log[j] = logf(rnd_uniform(ck, 1.0f, 16.0f));
        h.dt_bias[j] = rnd_uniform(ck, 0.5f, 1.5f);
    }
    for (int i = 0; i < g.dv; i++) h.norm[i] = 1.0f + 0.1f * rnd_normal(ck);
    rnd_floats(ck, h.state, nst, 1.0f);
    rnd_floats(ck, h.S, nS, 0.1f);
    float *dqkv = up(h.qkv, (size_t)T * C), *dz = up(h.z, (size_t)T * vd), *da = up(h.a, (size_t)T * g.nv);
    float *db = up(h.b, (size_t)T * g.nv), *dconv = up(h.conv, (size_t)C * g.K), *dA = up(h.A_log, (size_t)g.nv);
    float *ddt = up(h.dt_bias, (size_t)g.nv), *dn = up(h.norm, (size_t)g.dv), *dst = up(h.state, nst + 1);
    float *dS = up(h.S, nS), *dout = dev_poison((size_t)T * vd);
    float *ref = xmalloc((size_t)T * vd * 4), *got = xmalloc((size_t)T * vd * 4);
    float *gS = xmalloc(nS * 4), *gst = xmalloc(nst * 4 + 4);
    gdn_ref(&g, &h, ref);
    tern_cuda_gdn_w w = {g.nk, g.nv, g.dk, g.dv, g.K, dconv, dA, ddt, dn, 1e-6f};
    tern_error err;
    if (tern_cuda_gdn_step(&w, dqkv, dz, db, da, T, dst, dS, dout, ck->stream, &err)) die_err("gdn_step", &err);
    dev_sync(ck, "gdn_step");
    dev_download(got, dout, (size_t)T * vd * 4);
    dev_download(gS, dS, nS * 4);
    dev_download(gst, dst, nst * 4);
    char shape[96];
    snprintf(shape, sizeof shape, "%d/%d heads x %d/%d conv %d T=%d", g.nk, g.nv, g.dk, g.dv, g.K, T);
    report(ck, "gdn out", shape, got, ref, (size_t)T * vd, 1e-5);
    report(ck, "gdn S", shape, gS, h.S, nS, 1e-5);
    report(ck, "gdn conv state", shape, gst, h.state, nst, 1e-6);
    if (timed && ck->time) {
        int n = n_copies(nS * 4);
        float **Ss = xmalloc((size_t)n * sizeof(float *));
        Ss[0] = dS;
        for (int i = 1; i < n; i++) Ss[i] = up(h.S, nS);
        gdn_run r = {&w, dqkv, dz, db, da, T, dst, Ss, n, dout, ck->stream};
        double bytes = 2.0 * nS * 4 + 2.0 * nst * 4 + (double)T * (C + 2 * vd + 2 * g.nv) * 4 + (double)C * g.K * 4;
        report_time(ck, "gdn_step", shape, time_op(ck, run_gdn, &r), bytes);
        for (int i = 1; i < n; i++) tern_cuda_free(Ss[i]);
        free(Ss);
    }
    float *bufs[] = {dqkv, dz, da, db, dconv, dA, ddt, dn, dst, dS, dout};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) tern_cuda_free(bufs[i]);
    free(h.qkv); free(h.z); free(h.a); free(h.b); free(h.conv); free(h.A_log); free(h.dt_bias); free(h.norm);
    free(h.state); free(h.S); free(ref); free(got); free(gS); free(gst);
}

void check_gdn(checker *ck) {
    gdn_case(ck, (gdn_dims){16, 32, 128, 128, 4, 1}, 1);
    gdn_case(ck, (gdn_dims){16, 32, 128, 128, 4, 4}, 0);
    gdn_case(ck, (gdn_dims){2, 4, 16, 16, 4, 3}, 0);     /* the tiny test models */
    gdn_case(ck, (gdn_dims){4, 4, 64, 32, 2, 2}, 0);     /* one value head per key head, kernel 2 */
}
