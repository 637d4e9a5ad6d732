/* tern_cuda_attention against the same attention in float64 on the same
 * quantized rows, and against tern_kv_attend (cpu/kvquant.h, portable
 * variant), times sigmoid(gate) as forward.c's attn_layer applies it, for
 * every query head and token (causal).
 * Tolerance against float64: 1e-5 of max |o| (fp32 scores over head_dim
 * 256, softmax and a weighted sum; the split-K merge only regroups the same
 * sums). Against the CPU twin: the twin sums its n probabilities and n
 * weighted rows one after another in fp32, whose own error grows like
 * sqrt(n) 2^-24 (1.1e-5 at n = 32768, measured 1.07e-5 between the two), so
 * max(1e-5, 4 sqrt(n) 2^-24) there; the float64 check holds the kernels
 * to 1e-5 at every length. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu/kvquant.h"
#include "cpu/ops.h"

typedef struct {
    const tern_cuda_attn_dims *d;
    const tern_kvq *L;
    const float *qg;
    uint8_t **kc, **vc;
    int n;
    int T, pos0;
    const int *pos_dev;   /* the device-position form, splits planned for n_plan */
    int n_plan;
    float scale;
    void *work;
    size_t work_bytes;
    float *o;
    tern_stream s;
} att_run;

static void run_att(void *arg, int rep) {
    att_run *r = arg;
    tern_error err;
    int i = rep % r->n;
    int rc = r->pos_dev ? tern_cuda_attention_at(r->d, r->L, r->qg, r->kc[i], r->vc[i], r->T, r->pos_dev, r->n_plan,
                                                 r->scale, r->work, r->work_bytes, r->o, r->s, &err)
                        : tern_cuda_attention(r->d, r->L, r->qg, r->kc[i], r->vc[i], r->T, r->pos0, r->scale, r->work,
                                              r->work_bytes, r->o, r->s, &err);
    if (rc) die_err("attention", &err);
}

static void time_attention(checker *ck, att_run *r, size_t cache, const char *shape) {
    int n = n_copies(2 * cache);
    uint8_t **kc = xmalloc((size_t)n * sizeof(*kc)), **vc = xmalloc((size_t)n * sizeof(*vc));
    tern_error err;
    kc[0] = r->kc[0];
    vc[0] = r->vc[0];
    for (int i = 1; i < n; i++) {
        kc[i] = dev_alloc(cache);
        vc[i] = dev_alloc(cache);
        if (tern_cuda_copy(kc[i], kc[0], cache, ck->stream, &err) || tern_cuda_copy(vc[i], vc[0], cache, ck->stream, &err))
            die_err("copy", &err);
    }
    att_run t = *r;
    t.kc = kc;
    t.vc = vc;
    t.n = n;
    report_time(ck, "attention", shape, time_op(ck, run_att, &t), 2.0 * (double)cache);
    for (int i = 1; i < n; i++) {
        tern_cuda_free(kc[i]);
        tern_cuda_free(vc[i]);
    }
    free(kc);
    free(vc);
}

/* The attention of T tokens at pos0 in float64 from the dequantized rows
 * (the values both implementations read), times sigmoid(gate). */
static void att_ref64(const tern_kvq *L, int nh, int hd, int T, int pos0, const float *qg, const uint8_t *K,
                      const uint8_t *V, float scale, float *out) {
    int n = pos0 + T, G = nh / L->n_heads;
    float *Kf = xmalloc((size_t)n * L->row_len * 4), *Vf = xmalloc((size_t)n * L->row_len * 4);
    for (int j = 0; j < n; j++) {
        tern_kv_dequantize_row(L, K + (size_t)j * L->row_bytes, Kf + (size_t)j * L->row_len);
        tern_kv_dequantize_row(L, V + (size_t)j * L->row_bytes, Vf + (size_t)j * L->row_len);
    }
    double *p = xmalloc((size_t)n * sizeof(double)), *o = xmalloc((size_t)hd * sizeof(double));
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            const float *q = qg + ((size_t)t * nh + h) * 2 * hd, *gate = q + hd;
            int m = pos0 + t + 1, off = (h / G) * hd;
            double mx = -INFINITY, z = 0.0;
            for (int j = 0; j < m; j++) {
                double d = 0.0;
                for (int i = 0; i < hd; i++) d += (double)q[i] * Kf[(size_t)j * L->row_len + off + i];
                p[j] = d * scale;
                mx = p[j] > mx ? p[j] : mx;
            }
            for (int i = 0; i < hd; i++) o[i] = 0.0;
            for (int j = 0; j < m; j++) {
                p[j] = exp(p[j] - mx);
                z += p[j];
                for (int i = 0; i < hd; i++) o[i] += p[j] * Vf[(size_t)j * L->row_len + off + i];
            }
            for (int i = 0; i < hd; i++)
                out[((size_t)t * nh + h) * hd + i] = (float)(o[i] / z / (1.0 + exp(-(double)gate[i])));
        }
    free(Kf); free(Vf); free(p); free(o);
}

/* timed: 1 times tern_cuda_attention, 2 also the device-position form
 * planned for about twice the context (a captured decode step just past a
 * power of two) */
/* plan: the device-position form's planned context (0: 2 n + 100) */
static void att_case_plan(checker *ck, int nh, int nkv, int hd, int bits, int T, int pos0, int timed, int plan) {
    tern_cuda_attn_dims d = {nh, nkv, hd, 0, 1e-6f, 1.0f};
    tern_kvq L;
    if (tern_kvq_init(&L, nkv, hd, bits)) { fprintf(stderr, "bad kv layout\n"); exit(2); }
    int n = pos0 + T, G = nh / nkv;
    size_t cache = (size_t)n * L.row_bytes, nq = (size_t)T * nh * 2 * hd, no = (size_t)T * nh * hd;
    uint8_t *K = xmalloc(cache), *V = xmalloc(cache);
    float *qg = xmalloc(nq * 4);
    rnd_kv_rows(ck, &L, K, V, n);
    rnd_floats(ck, qg, nq, 1.0f);
    float scale = 1.0f / sqrtf((float)hd);
    float *ref = xmalloc(no * 4), *got = xmalloc(no * 4), *scores = xmalloc((size_t)G * n * 4);
    for (int t = 0; t < T; t++)
        for (int g = 0; g < nkv; g++) {
            int h0 = g * G;
            tern_kv_attend(TERN_ISA_C, &L, g, qg + ((size_t)t * nh + h0) * 2 * hd, G, (size_t)2 * hd, K, V, L.row_bytes,
                           pos0 + t + 1, scale, scores, ref + ((size_t)t * nh + h0) * hd, (size_t)hd);
            for (int h = h0; h < h0 + G; h++)
                for (int i = 0; i < hd; i++)
                    ref[((size_t)t * nh + h) * hd + i] *= tern_sigmoid(qg[((size_t)t * nh + h) * 2 * hd + hd + i]);
        }
    float *ref64 = xmalloc(no * 4);
    att_ref64(&L, nh, hd, T, pos0, qg, K, V, scale, ref64);
    double tol_cpu = 4.0 * sqrt((double)n) / 16777216.0;
    if (tol_cpu < 1e-5) tol_cpu = 1e-5;
    uint8_t *dK = dev_upload(K, cache), *dV = dev_upload(V, cache);
    float *dq = dev_upload(qg, nq * 4), *dout = dev_poison(no);
    size_t wb = tern_cuda_attention_workspace(&d, T, n);
    void *work = dev_alloc(wb);
    tern_error err;
    if (tern_cuda_attention(&d, &L, dq, dK, dV, T, pos0, scale, work, wb, dout, ck->stream, &err))
        die_err("attention", &err);
    dev_sync(ck, "attention");
    dev_download(got, dout, no * 4);
    char shape[96];
    snprintf(shape, sizeof shape, "%dq/%dkv x %d kv%d ctx %d T=%d", nh, nkv, hd, bits, n, T);
    report(ck, "attention", shape, got, ref64, no, 1e-5);
    report(ck, "attention~cpu", shape, got, ref, no, tol_cpu);
    /* the position read on the device, splits planned for a longer context
     * (the captured decode step's form): empty splits must not count */
    {
        int n_plan = plan ? plan : 2 * n + 100;
        size_t wb2 = tern_cuda_attention_workspace(&d, T, n_plan);
        void *work2 = dev_alloc(wb2);
        int *dpos = dev_upload(&pos0, sizeof pos0);
        float *dout2 = dev_poison(no);
        if (tern_cuda_attention_at(&d, &L, dq, dK, dV, T, dpos, n_plan, scale, work2, wb2, dout2, ck->stream, &err))
            die_err("attention_at", &err);
        dev_sync(ck, "attention_at");
        dev_download(got, dout2, no * 4);
        report(ck, "attention (device pos)", shape, got, ref64, no, 1e-5);
        if (timed > 1 && ck->time) {
            att_run r = {&d, &L, dq, &dK, &dV, 1, T, pos0, dpos, n_plan, scale, work2, wb2, dout2, ck->stream};
            char sh2[128];
            snprintf(sh2, sizeof sh2, "%s at, plan %d", shape, n_plan);
            time_attention(ck, &r, cache, sh2);
        }
        tern_cuda_free(work2); tern_cuda_free(dpos); tern_cuda_free(dout2);
    }
    if (timed && ck->time) {
        att_run r = {&d, &L, dq, &dK, &dV, 1, T, pos0, NULL, 0, scale, work, wb, dout, ck->stream};
        time_attention(ck, &r, cache, shape);
    }
    tern_cuda_free(dK); tern_cuda_free(dV); tern_cuda_free(dq); tern_cuda_free(dout); tern_cuda_free(work);
    free(K); free(V); free(qg); free(ref); free(ref64); free(got); free(scores);
}

static void att_case(checker *ck, int nh, int nkv, int hd, int bits, int T, int pos0, int timed) {
    att_case_plan(ck, nh, nkv, hd, bits, T, pos0, timed, 0);
}

void check_attention(checker *ck) {
    for (int bits = 16; bits >= 4; bits /= 2) {
        att_case(ck, 16, 2, 256, bits, 1, 0, 0);
        att_case(ck, 16, 2, 256, bits, 1, 511, bits == 16);
        att_case(ck, 16, 2, 256, bits, 1, 999, 1);
        att_case(ck, 16, 2, 256, bits, 1, 32767, bits == 16 ? 2 : 1);
    }
    att_case(ck, 16, 2, 256, 16, 8, 2000, 0);      /* the largest decode step */
    att_case(ck, 8, 2, 512, 16, 2, 700, 0);        /* head_dim 512: two 8-value pieces a lane, 4 queries a block */
    att_case(ck, 8, 2, 512, 8, 1, 300, 0);
    att_case(ck, 4, 2, 16, 4, 2, 50, 0);           /* head_dim 16: groups of 16, two lanes a row */
    att_case(ck, 16, 2, 256, 8, 5, 300, 0);        /* a prefill chunk against the cache */
    att_case(ck, 16, 2, 256, 16, 3, 9000, 0);      /* splits past some tokens' ends */
    att_case(ck, 8, 1, 32, 8, 3, 40, 0);           /* tiny rows (36 bytes): the unaligned loads */
    att_case(ck, 8, 1, 32, 4, 2, 70, 0);
    att_case(ck, 20, 1, 64, 16, 1, 500, 0);        /* 20 heads per KV head: three query groups */
    att_case(ck, 8, 1, 32, 16, 3, 40, 0);          /* 16-bit rows of 64 bytes: the tensor-core kernel's smallest */
    att_case(ck, 4, 1, 128, 16, 2, 77, 0);         /* 4 queries a block (the rest padding), rows in part chunks */
    /* one token, 16-bit, contexts up to 1024: the splits merged in a
     * cluster (longer contexts and T > 1: the combine kernel); the decode step's
     * plan (the next power of two), most splits past the context, other
     * head sizes and query groups */
    att_case_plan(ck, 16, 2, 256, 16, 1, 639, 0, 1024);
    att_case_plan(ck, 16, 2, 256, 16, 1, 99, 0, 1024);
    att_case_plan(ck, 16, 2, 256, 16, 1, 1023, 0, 1024);
    att_case_plan(ck, 8, 1, 128, 16, 1, 300, 0, 512);
    att_case_plan(ck, 20, 1, 64, 16, 1, 200, 0, 256);
    att_case_plan(ck, 4, 1, 32, 16, 1, 40, 0, 64);
}

/* ---- prefill (flash-style) -----------------------------------------------------
 * tern_cuda_attention_prefill against tern_kv_attend on the same quantized
 * rows for T new tokens at pos0 (causal), times sigmoid(gate); at T = 4096
 * on every 16th token (the CPU twin would take minutes on all).
 * The error of each output is measured against its own scale sigmoid(gate)
 * sum_j p_j |v_j| (for random V the output averages towards zero like
 * 1/sqrt(n) while its rounding does not), tolerance 4e-3: q (scaled), K,
 * V and P are rounded to f16 (2^-11 relative each); P and V contribute at
 * most 2 x 2^-11 = 1e-3 of that scale, and a score's error, ~2^-11 of
 * sum_i |q_i k_i| scale ~ 1e-3 absolute for unit-variance q and k at
 * head_dim 256, moves each weight by as much relatively; an indexing, mask
 * or softmax error is O(1). */

typedef struct {
    const tern_kvq *L;
    const float *qg, *vabs;
    const uint8_t *K, *V;
    int nh, nkv, hd, pos0, every, n_chk;
    float scale;
    float *ref, *sc;      /* [n_chk, nh, hd] */
} attp_ref;

static void attp_ref_range(void *ctx, int64_t b, int64_t e) {
    const attp_ref *r = ctx;
    int G = r->nh / r->nkv, hd = r->hd, nmax = r->pos0 + (int)((r->n_chk - 1) * (int64_t)r->every) + 1;
    float *scores = xmalloc((size_t)G * nmax * sizeof(float));
    double *acc = xmalloc((size_t)G * hd * sizeof(double));
    for (int64_t i = b; i < e; i++) {
        int t = (int)(i * r->every), n = r->pos0 + t + 1;
        for (int g = 0; g < r->nkv; g++) {
            int h0 = g * G;
            float *o = r->ref + ((size_t)i * r->nh + h0) * hd, *sc = r->sc + ((size_t)i * r->nh + h0) * hd;
            tern_kv_attend(TERN_ISA_C, r->L, g, r->qg + ((size_t)t * r->nh + h0) * 2 * hd, G, (size_t)2 * hd, r->K,
                           r->V, r->L->row_bytes, n, r->scale, scores, o, (size_t)hd);
            /* scores now hold the probabilities; positions outer so |V| rows stream */
            memset(acc, 0, (size_t)G * hd * sizeof(double));
            for (int j = 0; j < n; j++) {
                const float *va = r->vabs + (size_t)j * r->L->row_len + g * hd;
                for (int q = 0; q < G; q++) {
                    double p = scores[(size_t)q * n + j], *aq = acc + (size_t)q * hd;
                    for (int dd = 0; dd < hd; dd++) aq[dd] += p * va[dd];
                }
            }
            for (int q = 0; q < G; q++) {
                const float *gate = r->qg + ((size_t)t * r->nh + h0 + q) * 2 * hd + hd;
                for (int dd = 0; dd < hd; dd++) {
                    float sg = tern_sigmoid(gate[dd]);
                    o[(size_t)q * hd + dd] *= sg;
                    sc[(size_t)q * hd + dd] = (float)acc[(size_t)q * hd + dd] * sg;
                }
            }
        }
    }
    free(acc);
    free(scores);
}

typedef struct {
    const tern_cuda_attn_dims *d;
    const tern_kvq *L;
    const float *qg;
    const uint8_t *K, *V;
    int T, pos0;
    float scale;
    void *work;
    size_t work_bytes;
    float *o;
    int split;            /* time tern_cuda_attention instead */
    tern_stream s;
} attp_run;

static void run_attp(void *arg, int rep) {
    attp_run *r = arg;
    tern_error err;
    (void)rep;
    int rc = r->split ? tern_cuda_attention(r->d, r->L, r->qg, r->K, r->V, r->T, r->pos0, r->scale, r->work,
                                            r->work_bytes, r->o, r->s, &err)
                      : tern_cuda_attention_prefill(r->d, r->L, r->qg, r->K, r->V, r->T, r->pos0, r->scale, r->work,
                                                    r->work_bytes, r->o, r->s, &err);
    if (rc) die_err(r->split ? "attention" : "attention_prefill", &err);
}

static void attp_case(checker *ck, int nh, int nkv, int hd, int bits, int T, int pos0, int every, int timed) {
    tern_cuda_attn_dims d = {nh, nkv, hd, 0, 1e-6f, 1.0f};
    tern_kvq L;
    if (tern_kvq_init(&L, nkv, hd, bits)) { fprintf(stderr, "bad kv layout\n"); exit(2); }
    int n = pos0 + T;
    size_t cache = (size_t)n * L.row_bytes, nq = (size_t)T * nh * 2 * hd, no = (size_t)T * nh * hd;
    uint8_t *K = xmalloc(cache), *V = xmalloc(cache);
    float *qg = xmalloc(nq * 4);
    float *vabs = xmalloc((size_t)n * L.row_len * 4);
    rnd_kv_rows(ck, &L, K, V, n);
    for (int j = 0; j < n; j++) {
        float *va = vabs + (size_t)j * L.row_len;
        tern_kv_dequantize_row(&L, V + (size_t)j * L.row_bytes, va);
        for (int i = 0; i < L.row_len; i++) va[i] = fabsf(va[i]);
    }
    rnd_floats(ck, qg, nq, 1.0f);
    float scale = 1.0f / sqrtf((float)hd);
    int n_chk = (T + every - 1) / every;
    size_t nc = (size_t)n_chk * nh * hd;
    float *ref = xmalloc(nc * 4), *sc = xmalloc(nc * 4), *got = xmalloc(no * 4), *sub = xmalloc(nc * 4);
    attp_ref rr = {&L, qg, vabs, K, V, nh, nkv, hd, pos0, every, n_chk, scale, ref, sc};
    tern_pool_for(ck->pool, n_chk, attp_ref_range, &rr);
    uint8_t *dK = dev_upload(K, cache), *dV = dev_upload(V, cache);
    float *dq = dev_upload(qg, nq * 4), *dout = dev_poison(no);
    size_t pw = tern_cuda_attention_prefill_workspace(&d, n);
    attp_run r = {&d, &L, dq, dK, dV, T, pos0, scale, pw ? dev_alloc(pw) : NULL, pw, dout, 0, ck->stream};
    run_attp(&r, 0);
    dev_sync(ck, "attention_prefill");
    dev_download(got, dout, no * 4);
    for (int i = 0; i < n_chk; i++)
        memcpy(sub + (size_t)i * nh * hd, got + (size_t)i * every * nh * hd, (size_t)nh * hd * 4);
    char shape[112];
    snprintf(shape, sizeof shape, "%dq/%dkv x %d kv%d T=%d at %d%s", nh, nkv, hd, bits, T, pos0,
             every > 1 ? " (every 16th)" : "");
    report_scaled(ck, "attn_prefill", shape, sub, ref, sc, nc, 4e-3);
    if (timed && ck->time) {
        double flops = 0;
        for (int t = 0; t < T; t++) flops += 4.0 * (pos0 + t + 1) * (double)nh * hd;
        snprintf(shape, sizeof shape, "%dq/%dkv x %d kv%d T=%d at %d", nh, nkv, hd, bits, T, pos0);
        report_rate(ck, "attn_prefill", shape, time_eager(ck, run_attp, &r, 10), flops, 2.0 * cache + no * 12.0);
        size_t wb = tern_cuda_attention_workspace(&d, T, n);
        attp_run sp = r;
        sp.split = 1;
        sp.work = dev_alloc(wb);
        sp.work_bytes = wb;
        report_rate(ck, "attention", shape, time_eager(ck, run_attp, &sp, 3), flops, 2.0 * cache + no * 12.0);
        tern_cuda_free(sp.work);
    }
    tern_cuda_free(r.work);
    tern_cuda_free(dK); tern_cuda_free(dV); tern_cuda_free(dq); tern_cuda_free(dout);
    free(K); free(V); free(qg); free(vabs); free(ref); free(sc); free(got); free(sub);
}

void check_attention_prefill(checker *ck) {
    for (int bits = 16; bits >= 4; bits /= 2) attp_case(ck, 16, 2, 256, bits, 4096, 0, 16, 1);
    attp_case(ck, 16, 2, 256, 8, 300, 1000, 1, 0);   /* a prefill chunk after cached positions */
    /* a turn after a long conversation: few blocks, the context in splits */
    attp_case(ck, 16, 2, 256, 16, 448, 31616, 16, 1);
    attp_case(ck, 16, 2, 256, 4, 40, 9000, 1, 0);
    attp_case(ck, 16, 2, 256, 16, 65, 0, 1, 0);
    attp_case(ck, 16, 2, 256, 4, 1, 500, 1, 0);
    attp_case(ck, 8, 1, 32, 8, 70, 40, 1, 0);         /* 36-byte rows: the unaligned loads */
    attp_case(ck, 20, 1, 64, 4, 50, 100, 1, 0);       /* 20 heads per KV head: 3 tokens per block */
    attp_case(ck, 4, 2, 128, 16, 33, 7, 1, 0);        /* 2 heads per KV head: 32 tokens per block */
}
