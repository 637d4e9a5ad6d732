/* tern_cuda_gdn_step against forward.c's gdn_block between the projections
 * and out_proj, through the same cpu/gdn.h calls: tern_gdn_conv,
 * tern_gdn_inputs, tern_gdn_recurrent, tern_gdn_gated_norm. Checked: the
 * output, the state S and the conv state after the call.
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

typedef struct {
    float *qkv, *z, *a, *b, *conv, *A_log, *dt_bias, *norm, *state, *S;
} gdn_host;

typedef struct {
    const tern_gdn_io *io;
    int chunked;
} heads_job;

static void ref_heads(void *ctx, int64_t b, int64_t e) {
    const heads_job *j = ctx;
    if (j->chunked) tern_gdn_chunked(j->io, (int)b, (int)e, 64);
    else tern_gdn_recurrent(j->io, (int)b, (int)e);
}

/* forward.c's gdn_block between the projections and out_proj, on T tokens
 * from the state in h (updated): the recurrence or the chunked form, value
 * heads spread over the pool. */
static void gdn_ref_mode(checker *ck, const gdn_dims *g, gdn_host *h, float *out, int chunked) {
    int T = g->T, kd = g->nk * g->dk, vd = g->nv * g->dv, C = 2 * kd + vd;
    float *c = xmalloc((size_t)T * C * 4), *q = xmalloc((size_t)T * kd * 4), *k = xmalloc((size_t)T * kd * 4);
    float *v = xmalloc((size_t)T * vd * 4), *gg = xmalloc((size_t)T * g->nv * 4), *beta = xmalloc((size_t)T * g->nv * 4);
    tern_gdn_conv(h->conv, h->state, h->qkv, T, C, g->K, c);
    tern_gdn_inputs(c, h->b, h->a, h->A_log, h->dt_bias, T, g->nk, g->nv, g->dk, g->dv, q, k, v, gg, beta);
    tern_gdn_io io = {T, g->nk, g->nv, g->dk, g->dv, q, k, v, gg, beta, h->S, out, NULL, 0};
    heads_job job = {&io, chunked};
    tern_pool_for(ck->pool, g->nv, ref_heads, &job);
    tern_gdn_gated_norm(out, h->z, h->norm, (size_t)T * g->nv, g->dv, 1e-6f);
    free(c); free(q); free(k); free(v); free(gg); free(beta);
}

static void gdn_ref(checker *ck, const gdn_dims *g, gdn_host *h, float *out) { gdn_ref_mode(ck, g, h, out, 0); }

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
    gdn_ref(ck, &g, &h, ref);
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
    gdn_case(ck, (gdn_dims){16, 32, 128, 128, 4, 8}, 1); /* the most tokens a decode step takes */
    gdn_case(ck, (gdn_dims){4, 8, 64, 96, 4, 5}, 0);     /* clusters of 2 heads x 3 slices */
    gdn_case(ck, (gdn_dims){2, 4, 16, 16, 4, 3}, 0);     /* the tiny test models */
    gdn_case(ck, (gdn_dims){4, 4, 64, 32, 2, 2}, 0);     /* one value head per key head, kernel 2 */
}

/* ---- the chunked form (prefill) ---------------------------------------------
 * tern_cuda_gdn_chunked against tern_gdn_chunked (the same algorithm, with
 * forward.c's steps around it) on T tokens, then two tern_cuda_gdn_step
 * tokens from the state it left against tern_gdn_recurrent from the CPU's
 * state, and against tern_cuda_gdn_step over the same T tokens (the other
 * algorithm). Decays are drawn mild (most heads keep e^-1 .. e^-16 of their
 * state over a chunk) so the state carried between chunks matters.
 * Tolerance 1e-5 of max |ref|, as for the step: fp32 throughout; the longest
 * chains are 128-term dots and 64-row substitutions with terms no larger
 * than the outputs (decay factors are e^(G_i - G_c) <= 1, never their
 * inverse), a random walk of ~16 roundings of 6e-8 relative to a typical
 * output, which is itself several times below the largest of the T x 4096. */

typedef struct {
    float *qkv, *z, *a, *b, *conv, *A_log, *dt_bias, *norm, *state, *S;   /* device */
} gdn_dev;

static void fill_host(checker *ck, const gdn_dims *g, int Tt, gdn_host *h) {
    int kd = g->nk * g->dk, vd = g->nv * g->dv, C = 2 * kd + vd;
    size_t nS = (size_t)g->nv * g->dk * g->dv, nst = (size_t)(g->K - 1) * C;
    h->qkv = xmalloc((size_t)Tt * C * 4);
    h->z = xmalloc((size_t)Tt * vd * 4);
    h->a = xmalloc((size_t)Tt * g->nv * 4);
    h->b = xmalloc((size_t)Tt * g->nv * 4);
    h->conv = xmalloc((size_t)C * g->K * 4);
    h->A_log = xmalloc((size_t)g->nv * 4);
    h->dt_bias = xmalloc((size_t)g->nv * 4);
    h->norm = xmalloc((size_t)g->dv * 4);
    h->state = xmalloc(nst * 4 + 4);
    h->S = xmalloc(nS * 4);
    rnd_floats(ck, h->qkv, (size_t)Tt * C, 1.0f);
    rnd_floats(ck, h->z, (size_t)Tt * vd, 1.0f);
    rnd_floats(ck, h->a, (size_t)Tt * g->nv, 1.0f);
    rnd_floats(ck, h->b, (size_t)Tt * g->nv, 1.0f);
    for (size_t i = 0; i < (size_t)C * g->K; i++) h->conv[i] = rnd_uniform(ck, -0.5f, 0.5f);
    for (int j = 0; j < g->nv; j++) {
        h->A_log[j] = logf(rnd_uniform(ck, 1.0f, 16.0f));
        h->dt_bias[j] = rnd_uniform(ck, -6.0f, -2.0f);   /* softplus(a + dt_bias) ~ 0.002 .. 0.3 */
    }
    for (int i = 0; i < g->dv; i++) h->norm[i] = 1.0f + 0.1f * rnd_normal(ck);
    rnd_floats(ck, h->state, nst, 1.0f);
    rnd_floats(ck, h->S, nS, 0.1f);
}

static void free_host(gdn_host *h) {
    free(h->qkv); free(h->z); free(h->a); free(h->b); free(h->conv); free(h->A_log); free(h->dt_bias);
    free(h->norm); free(h->state); free(h->S);
}

/* The host inputs from token t on (state and weights shared). */
static gdn_host host_from(const gdn_dims *g, const gdn_host *h, int t) {
    int vd = g->nv * g->dv, C = 2 * g->nk * g->dk + vd;
    gdn_host v = *h;
    v.qkv = h->qkv + (size_t)t * C;
    v.z = h->z + (size_t)t * vd;
    v.a = h->a + (size_t)t * g->nv;
    v.b = h->b + (size_t)t * g->nv;
    return v;
}

typedef struct {
    const tern_cuda_gdn_w *w;
    const float *qkv, *z, *b, *a;
    int T;
    float *conv_state, *S, *out;
    void *work;
    size_t work_bytes;
    int chunked;
    tern_stream s;
} gdnc_run;

static void run_gdnc(void *arg, int rep) {
    gdnc_run *r = arg;
    tern_error err;
    (void)rep;
    int rc = r->chunked ? tern_cuda_gdn_chunked(r->w, r->qkv, r->z, r->b, r->a, r->T, r->conv_state, r->S, r->work,
                                                r->work_bytes, r->out, r->s, &err)
                        : tern_cuda_gdn_step(r->w, r->qkv, r->z, r->b, r->a, r->T, r->conv_state, r->S, r->out, r->s,
                                             &err);
    if (rc) die_err(r->chunked ? "gdn_chunked" : "gdn_step", &err);
}

/* The chunked algorithm's multiply-adds x 2 (A and P, the substitutions,
 * W S and Q S, P Vn, the state update), per chunk and value head. */
static double chunked_flops(const gdn_dims *g) {
    double c = 64, dk = g->dk, dv = g->dv, n = (g->T + 63) / 64;
    double per = c * c * dk + c * c / 2 * (dk + dv) + 2 * c * dk * dv + c * c / 2 * dv + c * dk * dv;
    return 2 * per * n * g->nv;
}

static void gdnc_case(checker *ck, gdn_dims g, int timed) {
    const int extra = 2;   /* decode steps after the prefill */
    int T = g.T, Tt = T + extra, kd = g.nk * g.dk, vd = g.nv * g.dv, C = 2 * kd + vd;
    size_t nS = (size_t)g.nv * g.dk * g.dv, nst = (size_t)(g.K - 1) * C;
    gdn_host h;
    fill_host(ck, &g, Tt, &h);
    float *dqkv = up(h.qkv, (size_t)Tt * C), *dz = up(h.z, (size_t)Tt * vd), *da = up(h.a, (size_t)Tt * g.nv);
    float *db = up(h.b, (size_t)Tt * g.nv), *dconv = up(h.conv, (size_t)C * g.K), *dA = up(h.A_log, (size_t)g.nv);
    float *ddt = up(h.dt_bias, (size_t)g.nv), *dn = up(h.norm, (size_t)g.dv);
    float *dst = up(h.state, nst + 1), *dS = up(h.S, nS), *dst2 = up(h.state, nst + 1), *dS2 = up(h.S, nS);
    float *dout = dev_poison((size_t)Tt * vd), *dout2 = dev_poison((size_t)T * vd);
    tern_cuda_gdn_w w = {g.nk, g.nv, g.dk, g.dv, g.K, dconv, dA, ddt, dn, 1e-6f};
    size_t wb = tern_cuda_gdn_chunked_workspace(&w, T);
    void *work = dev_alloc(wb);
    tern_error err;
    /* GPU: chunked over T, then the steps; the step kernel over T from copies of the start state */
    gdnc_run run = {&w, dqkv, dz, db, da, T, dst, dS, dout, work, wb, 1, ck->stream};
    run_gdnc(&run, 0);
    dev_sync(ck, "gdn_chunked");
    float *gS = xmalloc(nS * 4), *gst = xmalloc(nst * 4 + 4), *got = xmalloc((size_t)Tt * vd * 4);
    dev_download(gS, dS, nS * 4);
    dev_download(gst, dst, nst * 4);
    if (tern_cuda_gdn_step(&w, dqkv + (size_t)T * C, dz + (size_t)T * vd, db + (size_t)T * g.nv, da + (size_t)T * g.nv,
                           extra, dst, dS, dout + (size_t)T * vd, ck->stream, &err))
        die_err("gdn_step", &err);
    gdnc_run step = {&w, dqkv, dz, db, da, T, dst2, dS2, dout2, NULL, 0, 0, ck->stream};
    run_gdnc(&step, 0);
    dev_sync(ck, "gdn_step after chunked");
    dev_download(got, dout, (size_t)Tt * vd * 4);
    float *gS_after = xmalloc(nS * 4), *sout = xmalloc((size_t)T * vd * 4), *sS = xmalloc(nS * 4);
    dev_download(gS_after, dS, nS * 4);
    dev_download(sout, dout2, (size_t)T * vd * 4);
    dev_download(sS, dS2, nS * 4);
    /* CPU: chunked over T, then the recurrence over the extra tokens */
    float *ref = xmalloc((size_t)Tt * vd * 4);
    gdn_ref_mode(ck, &g, &h, ref, 1);
    float *rS = xmalloc(nS * 4), *rst = xmalloc(nst * 4 + 4);
    memcpy(rS, h.S, nS * 4);
    memcpy(rst, h.state, nst * 4);
    gdn_dims ge = g;
    ge.T = extra;
    gdn_host he = host_from(&g, &h, T);
    gdn_ref_mode(ck, &ge, &he, ref + (size_t)T * vd, 0);
    char shape[96], sh2[112];
    snprintf(shape, sizeof shape, "%d/%d heads x %d/%d conv %d T=%d", g.nk, g.nv, g.dk, g.dv, g.K, T);
    report(ck, "gdnc out", shape, got, ref, (size_t)T * vd, 1e-5);
    report(ck, "gdnc S", shape, gS, rS, nS, 1e-5);
    report(ck, "gdnc conv state", shape, gst, rst, nst, 1e-6);
    snprintf(sh2, sizeof sh2, "%s +%d steps", shape, extra);
    report(ck, "gdnc>step out", sh2, got + (size_t)T * vd, ref + (size_t)T * vd, (size_t)extra * vd, 1e-5);
    report(ck, "gdnc>step S", sh2, gS_after, h.S, nS, 1e-5);
    snprintf(sh2, sizeof sh2, "%s vs gdn_step", shape);
    report(ck, "gdnc~step out", sh2, got, sout, (size_t)T * vd, 1e-5);
    report(ck, "gdnc~step S", sh2, gS, sS, nS, 1e-5);
    if (timed && ck->time) {
        double bytes = (double)T * (C + 2 * vd + 2 * g.nv) * 4 + 2.0 * nS * 4;
        report_rate(ck, "gdn_chunked", shape, time_eager(ck, run_gdnc, &run, 10), chunked_flops(&g), bytes);
        double step_flops = 2.0 * 4 * T * (double)nS;   /* S^T k, S += k d^T, S^T q, decay */
        report_rate(ck, "gdn_step", shape, time_eager(ck, run_gdnc, &step, 3), step_flops, bytes);
    }
    float *bufs[] = {dqkv, dz, da, db, dconv, dA, ddt, dn, dst, dS, dst2, dS2, dout, dout2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) tern_cuda_free(bufs[i]);
    tern_cuda_free(work);
    free_host(&h);
    free(gS); free(gst); free(got); free(gS_after); free(sout); free(sS); free(ref); free(rS); free(rst);
}

void check_gdn_chunked(checker *ck) {
    int Ts[] = {1, 63, 64, 65, 200, 4096};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
        gdnc_case(ck, (gdn_dims){16, 32, 128, 128, 4, Ts[i]}, Ts[i] == 4096);
    gdnc_case(ck, (gdn_dims){2, 4, 16, 16, 4, 130}, 0);   /* the tiny test models: 16-wide S, 16 idle lanes */
    gdnc_case(ck, (gdn_dims){4, 4, 64, 32, 2, 97}, 0);    /* one value head per key head, kernel 2 */
    gdnc_case(ck, (gdn_dims){2, 4, 32, 64, 4, 2}, 0);     /* T below the conv window: the state shifts */
}
