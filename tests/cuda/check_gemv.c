/* tern_cuda_gemv against tern_matmul (cpu/ops.h), the fp32 reference
 * product over the same encoded weights.
 * Tolerance 1e-5 of max |y|: both sides dequantize exactly (q * scale +
 * bias in fp32) and accumulate in fp32, in different orders; with K <= 4096
 * terms of random sign the rounding differences stay near 1e-7 of the
 * largest output, so 1e-5 leaves room for the order and fails on any
 * indexing, nibble-order or scale error (which are O(1)). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu/ops.h"

typedef struct {
    tern_mat *copies;
    int n;
    const float *x;
    int T;
    float *y;
    tern_stream s;
} gemv_run;

static void run_gemv(void *arg, int rep) {
    gemv_run *r = arg;
    tern_error err;
    if (tern_cuda_gemv(&r->copies[rep % r->n], r->x, r->T, r->y, r->s, &err)) die_err("gemv", &err);
}

static const char *enc_name(int bits, int dtype) {
    if (bits == 4) return "q4";
    if (bits == 8) return "q8";
    return dtype == TERN_DTYPE_BF16 ? "bf16" : "f16";
}

/* Device copies of m for timing (the first is m itself), enough to
 * exceed the L2; *n gets their count. */
static tern_mat *rotation(test_mat *m, int *n) {
    *n = n_copies(mat_bytes(&m->h));
    tern_mat *c = xmalloc((size_t)*n * sizeof(tern_mat));
    c[0] = m->d;
    for (int i = 1; i < *n; i++) c[i] = copy_dev_mat(m);
    return c;
}

static void rotation_free(tern_mat *c, int n) {
    for (int i = 1; i < n; i++) free_dev_mat(&c[i]);
    free(c);
}

static void time_gemv(checker *ck, test_mat *m, const float *dx, int T, float *dy, const char *shape) {
    size_t bytes = mat_bytes(&m->h);
    gemv_run r = {NULL, 0, dx, T, dy, ck->stream};
    r.copies = rotation(m, &r.n);
    double ms = time_op(ck, run_gemv, &r);
    report_time(ck, "gemv", shape, ms, (double)bytes + (double)T * 4.0 * (double)(m->h.rows + m->h.cols));
    rotation_free(r.copies, r.n);
}

static void gemv_case(checker *ck, int64_t rows, int64_t cols, int bits, int dtype, int group, int T, int timed) {
    test_mat m;
    make_mat(ck, &m, rows, cols, bits, dtype, group);
    size_t nx = (size_t)T * cols, ny = (size_t)T * rows;
    float *x = xmalloc(nx * sizeof(float)), *ref = xmalloc(ny * sizeof(float)), *got = xmalloc(ny * sizeof(float));
    rnd_floats(ck, x, nx, 1.0f);
    tern_matmul(ck->pool, ref, x, T, &m.h);
    float *dx = dev_upload(x, nx * sizeof(float)), *dy = dev_poison(ny);
    tern_error err;
    if (tern_cuda_gemv(&m.d, dx, T, dy, ck->stream, &err)) die_err("gemv", &err);
    dev_sync(ck, "gemv");
    dev_download(got, dy, ny * sizeof(float));
    char shape[96];
    snprintf(shape, sizeof shape, "%s %lldx%lld g%d T=%d", enc_name(bits, dtype), (long long)rows, (long long)cols,
             bits ? group : 0, T);
    report(ck, "gemv", shape, got, ref, ny, 1e-5);
    if (timed && ck->time) time_gemv(ck, &m, dx, T, dy, shape);
    tern_cuda_free(dx);
    tern_cuda_free(dy);
    free(x);
    free(ref);
    free(got);
    free_mat(&m);
}

/* ---- tern_cuda_gemv1: the one-token GEMV with its input made in the
 * prologue, against tern_rmsnorm_1p / tern_rmsnorm + tern_matmul. The sum
 * x + delta is one fp32 addition on both sides (1e-6); the normalised
 * vector and the product take the GEMV's 1e-5. */

typedef struct {
    tern_mat *copies;
    int n;
    tern_cuda_vec_in in;
    float *y;
    tern_stream s;
} gemv1_run;

static void run_gemv1(void *arg, int rep) {
    gemv1_run *r = arg;
    tern_error err;
    if (tern_cuda_gemv1(&r->copies[rep % r->n], &r->in, r->y, r->s, &err)) die_err("gemv1", &err);
}

/* The residual as the experts' fixed-point sums (delta_fx): y, the normed
 * vector and the sum bit for bit those of the same call with delta as the
 * floats the sums stand for (each the float nearest d * 2^SHIFT / 2^SHIFT,
 * made here as the kernel makes it: one rounding, then a power of 2). */
static void gemv1_fx_case(checker *ck, const test_mat *m, const float *d, const tern_cuda_vec_in *in,
                          const char *shape) {
    size_t n = (size_t)m->d.cols, rows = (size_t)m->d.rows;
    long long *fx = xmalloc(n * sizeof(long long));
    size_t per = rows + 2 * n;   /* y, x_out, xn_out */
    float *dq = xmalloc(n * sizeof(float)), *a = xmalloc(2 * per * sizeof(float)), *b = a + per;
    for (size_t i = 0; i < n; i++) {
        fx[i] = llrint((double)d[i] * (double)(1ull << TERN_CUDA_DFX_SHIFT));
        dq[i] = (float)fx[i] * (1.0f / (float)(1ull << TERN_CUDA_DFX_SHIFT));
    }
    long long *dfx = dev_upload(fx, n * sizeof(long long));
    float *ddq = dev_upload(dq, n * sizeof(float));
    float *outs[2][3] = {{dev_poison(rows), dev_poison(n), dev_poison(n)}, {dev_poison(rows), dev_poison(n), dev_poison(n)}};
    tern_error err;
    for (int v = 0; v < 2; v++) {
        tern_cuda_vec_in i2 = *in;
        i2.delta = v ? NULL : ddq;
        i2.delta_fx = v ? dfx : NULL;
        i2.x_out = outs[v][1];
        i2.xn_out = outs[v][2];
        if (tern_cuda_gemv1(&m->d, &i2, outs[v][0], ck->stream, &err)) die_err("gemv1 (fixed-point residual)", &err);
    }
    /* both residuals given: refused */
    tern_cuda_vec_in both = *in;
    both.delta = ddq;
    both.delta_fx = dfx;
    long bad = tern_cuda_gemv1(&m->d, &both, outs[0][0], ck->stream, &err) == 0;
    dev_sync(ck, "gemv1 (fixed-point residual)");
    for (int v = 0; v < 2; v++) {
        float *h = v ? b : a;
        dev_download(h, outs[v][0], rows * sizeof(float));
        dev_download(h + rows, outs[v][1], n * sizeof(float));
        dev_download(h + rows + n, outs[v][2], n * sizeof(float));
    }
    bad += memcmp(a, b, per * sizeof(float)) != 0;
    char what[256];
    snprintf(what, sizeof what, "%s, residual as fixed point = as its floats (bitwise); both refused", shape);
    report_exact(ck, "gemv1 delta_fx", what, bad, 2);
    for (int v = 0; v < 2; v++)
        for (int j = 0; j < 3; j++) tern_cuda_free(outs[v][j]);
    tern_cuda_free(dfx);
    tern_cuda_free(ddq);
    free(fx);
    free(dq);
    free(a);
}

/* mode: 0 plain x, 1 RMSNorm (1 + w), 2 residual + RMSNorm (1 + w), 3 residual + RMSNorm w */
static void gemv1_case(checker *ck, int64_t rows, int64_t cols, int bits, int dtype, int group, int mode, int timed) {
    test_mat m;
    make_mat(ck, &m, rows, cols, bits, dtype, group);
    size_t n = (size_t)cols;
    float *x = xmalloc(n * sizeof(float)), *d = xmalloc(n * sizeof(float)), *w = xmalloc(n * sizeof(float));
    float *xs = xmalloc(n * sizeof(float)), *xn = xmalloc(n * sizeof(float)), *got_x = xmalloc(n * sizeof(float));
    float *got_n = xmalloc(n * sizeof(float)), *ref = xmalloc((size_t)rows * sizeof(float)),
          *got = xmalloc((size_t)rows * sizeof(float));
    rnd_floats(ck, x, n, 3.0f);
    rnd_floats(ck, d, n, 1.0f);
    rnd_floats(ck, w, n, 0.2f);
    for (size_t i = 0; i < n; i++) xs[i] = mode >= 2 ? x[i] + d[i] : x[i];
    if (mode == 0) memcpy(xn, xs, n * sizeof(float));
    else if (mode == 3) tern_rmsnorm(xn, xs, w, (int)cols, 1e-6f);
    else tern_rmsnorm_1p(xn, xs, w, (int)cols, 1e-6f);
    tern_matmul(ck->pool, ref, xn, 1, &m.h);
    float *dx = dev_upload(x, n * sizeof(float)), *dd = dev_upload(d, n * sizeof(float));
    float *dw = dev_upload(w, n * sizeof(float)), *dxo = dev_poison(n), *dxn = dev_poison(n), *dy = dev_poison(rows);
    tern_cuda_vec_in in = {dx, mode >= 2 ? dd : NULL, mode >= 2 ? dxo : NULL, mode ? dw : NULL, mode != 3, 1e-6f, dxn, NULL};
    tern_error err;
    if (tern_cuda_gemv1(&m.d, &in, dy, ck->stream, &err)) die_err("gemv1", &err);
    dev_sync(ck, "gemv1");
    dev_download(got, dy, (size_t)rows * sizeof(float));
    dev_download(got_n, dxn, n * sizeof(float));
    static const char *const modes[] = {"x", "norm", "x+d, norm", "x+d, norm w"};
    char shape[128];
    snprintf(shape, sizeof shape, "%s %lldx%lld g%d (%s)", enc_name(bits, dtype), (long long)rows, (long long)cols,
             bits ? group : 0, modes[mode]);
    report(ck, "gemv1", shape, got, ref, (size_t)rows, 1e-5);
    report(ck, "gemv1 xn_out", shape, got_n, xn, n, 1e-5);
    if (mode >= 2) {
        dev_download(got_x, dxo, n * sizeof(float));
        report(ck, "gemv1 x_out", shape, got_x, xs, n, 1e-6);
        gemv1_fx_case(ck, &m, d, &in, shape);
    }
    if (timed && ck->time) {
        gemv1_run r = {NULL, 0, in, dy, ck->stream};
        r.in.xn_out = NULL;
        r.copies = rotation(&m, &r.n);
        double ms = time_op(ck, run_gemv1, &r);
        report_time(ck, "gemv1", shape, ms, (double)mat_bytes(&m.h) + 4.0 * (double)(rows + cols));
        rotation_free(r.copies, r.n);
    }
    tern_cuda_free(dx); tern_cuda_free(dd); tern_cuda_free(dw);
    tern_cuda_free(dxo); tern_cuda_free(dxn); tern_cuda_free(dy);
    free(x); free(d); free(w); free(xs); free(xn); free(got_x); free(got_n); free(ref); free(got);
    free_mat(&m);
}

/* tern_cuda_gemv1_route: its logits against tern_cuda_gemv1's (checked
 * against the CPU above; within the GEMV's 1e-5, since the reference may
 * take another kernel than the router's register tiles), its ids and weights against
 * tern_cuda_route over those same logits (checked against the CPU in
 * check_moe.c), bit for bit: the same code. Three calls in a row with the
 * outputs poisoned between them, so the counter's reset is exercised. */
static void gemv1_route_case(checker *ck, int E, int64_t cols, int bits, int K, int renorm) {
    test_mat m;
    make_mat(ck, &m, E, cols, bits, 0, 64);
    size_t n = (size_t)cols;
    float *x = xmalloc(n * sizeof(float)), *w = xmalloc(n * sizeof(float));
    rnd_floats(ck, x, n, 3.0f);
    rnd_floats(ck, w, n, 0.2f);
    float *dx = dev_upload(x, n * sizeof(float)), *dw = dev_upload(w, n * sizeof(float));
    float *l1 = dev_poison((size_t)E), *l2 = dev_poison((size_t)E), *w1 = dev_poison((size_t)K), *w2 = dev_poison((size_t)K);
    int32_t *i1 = dev_alloc((size_t)K * 4), *i2 = dev_alloc((size_t)K * 4);
    unsigned zero = 0, *counter = dev_upload(&zero, sizeof zero);
    tern_cuda_vec_in in = {dx, NULL, NULL, dw, 1, 1e-6f, NULL, NULL};
    tern_cuda_route_out ro = {E, K, renorm, i2, w2, counter};
    tern_error err;
    if (tern_cuda_gemv1(&m.d, &in, l1, ck->stream, &err)) die_err("gemv1", &err);
    float *ref = xmalloc((size_t)E * 4), *got = xmalloc((size_t)E * 4);
    dev_sync(ck, "gemv1");
    dev_download(ref, l1, (size_t)E * 4);
    long bad = 0;
    char shape[96];
    snprintf(shape, sizeof shape, "%s %dx%lld top%d%s", enc_name(bits, 0), E, (long long)cols, K,
             renorm ? " renorm" : "");
    for (int rep = 0; rep < 3; rep++) {
        if (tern_cuda_gemv1_route(&m.d, &in, l2, &ro, ck->stream, &err) ||
            tern_cuda_route(l2, 1, E, K, renorm, i1, w1, ck->stream, &err))
            die_err("gemv1_route", &err);
        dev_sync(ck, "gemv1_route");
        float wa[32], wb[32];
        int32_t ia[32], ib[32];
        dev_download(got, l2, (size_t)E * 4);
        dev_download(wa, w1, (size_t)K * 4);
        dev_download(wb, w2, (size_t)K * 4);
        dev_download(ia, i1, (size_t)K * 4);
        dev_download(ib, i2, (size_t)K * 4);
        if (rep == 0) report(ck, "gemv1_route logits", shape, got, ref, (size_t)E, 1e-5);
        bad += memcmp(wa, wb, (size_t)K * 4) != 0;
        bad += memcmp(ia, ib, (size_t)K * 4) != 0;
        /* poison the outputs between calls: each call must write them again */
        if (tern_cuda_fill(i2, 0xff, (size_t)K * 4, ck->stream, &err) || tern_cuda_fill(w2, 0xff, (size_t)K * 4, ck->stream, &err))
            die_err("fill", &err);
    }
    unsigned left;
    dev_download(&left, counter, sizeof left);
    strncat(shape, ", 3 calls (ids, weights, counter)", sizeof shape - strlen(shape) - 1);
    report_exact(ck, "gemv1_route", shape, bad + (left != 0), 7);
    tern_cuda_free(dx); tern_cuda_free(dw); tern_cuda_free(l1); tern_cuda_free(l2); tern_cuda_free(w1);
    tern_cuda_free(w2); tern_cuda_free(i1); tern_cuda_free(i2); tern_cuda_free(counter);
    free(x); free(w); free(ref); free(got);
    free_mat(&m);
}

void check_gemv(checker *ck) {
    /* the decode matrices: GDN in_proj_qkv / attention q_proj, out_proj /
     * o_proj, an expert's gate and down, k/v_proj, the lm_head */
    gemv_case(ck, 8192, 2048, 8, 0, 64, 1, 1);
    gemv_case(ck, 8192, 2048, 8, 0, 64, 3, 0);
    gemv_case(ck, 8192, 2048, 8, 0, 64, 8, 1);
    gemv_case(ck, 2048, 4096, 8, 0, 64, 1, 1);
    gemv_case(ck, 512, 2048, 8, 0, 64, 1, 1);
    gemv_case(ck, 512, 2048, 4, 0, 64, 1, 1);
    gemv_case(ck, 2048, 512, 4, 0, 32, 1, 1);
    gemv_case(ck, 4096, 2048, 4, 0, 128, 2, 0);
    gemv_case(ck, 8192, 2048, 4, 0, 64, 1, 1);
    gemv_case(ck, 8192, 2048, 4, 0, 64, 4, 1);
    gemv_case(ck, 248320, 2048, 8, 0, 64, 1, 1);
    gemv_case(ck, 248320, 2048, 4, 0, 64, 1, 1);
    gemv_case(ck, 2048, 4096, 0, TERN_DTYPE_BF16, 0, 1, 1);
    gemv_case(ck, 2048, 4096, 0, TERN_DTYPE_BF16, 0, 5, 0);
    /* odd shapes: a row count no warp layout divides, short rows */
    gemv_case(ck, 37, 2048, 4, 0, 64, 1, 0);
    gemv_case(ck, 33, 96, 8, 0, 32, 7, 0);
    gemv_case(ck, 37, 264, 0, TERN_DTYPE_F16, 0, 2, 0);
    gemv_case(ck, 32, 2048, 8, 0, 64, 6, 0);
    /* the one-token GEMV with its input made in the prologue: the stacked
     * DeltaNet input projections (qkv|z|b|a), out_proj / o_proj, the
     * router, the lm_head; every chunk-per-lane layout (1, 2, 4, 8) */
    gemv1_case(ck, 12352, 2048, 4, 0, 64, 2, 1);
    gemv1_case(ck, 12352, 2048, 8, 0, 64, 2, 1);
    gemv1_case(ck, 2048, 4096, 4, 0, 64, 0, 1);
    gemv1_case(ck, 8192, 4096, 4, 0, 32, 1, 0);
    /* the register tiles (below 8 MB) with more row groups than any
     * device's resident warps, so a warp walks several (its next tile a
     * tile ahead) */
    gemv1_case(ck, 60000, 256, 4, 0, 32, 1, 0);
    gemv1_case(ck, 2048, 4096, 8, 0, 64, 0, 1);
    gemv1_case(ck, 256, 2048, 4, 0, 64, 2, 1);
    gemv1_case(ck, 256, 2048, 8, 0, 64, 3, 0);    /* the router at 8 bits: four chunks a lane */
    gemv1_case(ck, 200, 2048, 4, 0, 32, 1, 0);    /* fewer rows than the warps' groups */
    gemv1_case(ck, 248320, 2048, 4, 0, 64, 3, 1);
    gemv1_case(ck, 248320, 2048, 8, 0, 64, 3, 1);
    gemv1_case(ck, 9216, 2048, 4, 0, 128, 1, 0);
    gemv1_case(ck, 37, 1024, 4, 0, 32, 2, 0);
    gemv1_case(ck, 1000, 3072, 4, 0, 64, 1, 0);
    gemv1_case(ck, 513, 8192, 8, 0, 64, 2, 0);
    gemv1_case(ck, 2048, 4096, 0, TERN_DTYPE_BF16, 0, 2, 1);
    gemv1_case(ck, 77, 256, 0, TERN_DTYPE_F16, 0, 3, 0);
    gemv1_case(ck, 8064, 256, 4, 0, 64, 2, 0);   /* tern-tiny: 8 chunks a row */
    gemv1_case(ck, 256, 512, 8, 0, 32, 0, 0);
    gemv1_case(ck, 19, 96, 8, 0, 32, 2, 0);
    gemv1_route_case(ck, 256, 2048, 4, 8, 1);
    gemv1_route_case(ck, 256, 2048, 8, 8, 0);
    gemv1_route_case(ck, 16, 256, 4, 4, 1);
}
