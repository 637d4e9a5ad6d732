/* tern_cuda_rmsnorm against tern_rmsnorm_1p / tern_rmsnorm (cpu/ops.h) with
 * the residual add done first, and tern_cuda_attn_prep against the q/k
 * steps of forward.c's attn_layer (tern_rmsnorm_1p + tern_rope per head)
 * and tern_kv_quantize_row.
 * Tolerances: 1e-5 of max |y| (fp32, a sum of squares over n <= 2048 in
 * another order, cosf/sinf within an ulp or two of glibc's); the cache
 * rows exactly: the GPU quantizes its own k (and the given v) and the CPU
 * quantizer fed the same floats must write the same bytes. And attn_prep
 * then the attention as the decode step chains them, bit for bit against
 * the two with a synchronisation between (prep_chain_case). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu/attention.h"
#include "cpu/kvquant.h"
#include "cpu/ops.h"
#include "model/rope.h"

typedef struct {
    float *y, *x;
    const float *d, *w;
    int n, T;
    tern_stream s;
} norm_run;

static void run_norm(void *arg, int rep) {
    norm_run *r = arg;
    tern_error err;
    (void)rep;
    if (tern_cuda_rmsnorm(r->y, r->x, r->d, r->w, 1, r->n, r->T, 1e-6f, r->s, &err)) die_err("rmsnorm", &err);
}

static void norm_case(checker *ck, int n, int T, int with_delta, int one_plus, int timed) {
    size_t N = (size_t)n * T;
    float *x = xmalloc(N * 4), *d = xmalloc(N * 4), *w = xmalloc((size_t)n * 4);
    float *ry = xmalloc(N * 4), *rx = xmalloc(N * 4), *gy = xmalloc(N * 4), *gx = xmalloc(N * 4);
    rnd_floats(ck, x, N, 1.0f);
    rnd_floats(ck, d, N, 0.5f);
    rnd_floats(ck, w, (size_t)n, 0.1f);
    for (size_t i = 0; i < N; i++) rx[i] = with_delta ? x[i] + d[i] : x[i];
    for (int t = 0; t < T; t++) {
        if (one_plus) tern_rmsnorm_1p(ry + (size_t)t * n, rx + (size_t)t * n, w, n, 1e-6f);
        else tern_rmsnorm(ry + (size_t)t * n, rx + (size_t)t * n, w, n, 1e-6f);
    }
    float *dx = dev_upload(x, N * 4), *dd = dev_upload(d, N * 4), *dw = dev_upload(w, (size_t)n * 4);
    float *dy = dev_poison(N);
    tern_error err;
    if (tern_cuda_rmsnorm(dy, dx, with_delta ? dd : NULL, dw, one_plus, n, T, 1e-6f, ck->stream, &err))
        die_err("rmsnorm", &err);
    dev_sync(ck, "rmsnorm");
    dev_download(gy, dy, N * 4);
    dev_download(gx, dx, N * 4);
    char shape[64];
    snprintf(shape, sizeof shape, "n=%d T=%d %s%s", n, T, one_plus ? "(1+w)" : "w", with_delta ? " +residual" : "");
    report(ck, "rmsnorm", shape, gy, ry, N, 1e-5);
    if (timed && ck->time) {
        norm_run r = {dy, dx, dd, dw, n, T, ck->stream};
        report_time(ck, "rmsnorm", shape, time_op(ck, run_norm, &r), (double)N * 4 * 4);
    }
    if (with_delta) {
        snprintf(shape, sizeof shape, "n=%d T=%d residual sum", n, T);
        report(ck, "rmsnorm", shape, gx, rx, N, 1e-6);
    }
    tern_cuda_free(dx);
    tern_cuda_free(dd);
    tern_cuda_free(dw);
    tern_cuda_free(dy);
    free(x); free(d); free(w); free(ry); free(rx); free(gy); free(gx);
}

void check_rmsnorm(checker *ck) {
    norm_case(ck, 2048, 1, 1, 1, 1);
    norm_case(ck, 2048, 7, 0, 1, 0);
    norm_case(ck, 2048, 2, 1, 0, 0);
    norm_case(ck, 130, 3, 1, 1, 0);
}

/* ---- attention prep --------------------------------------------------------- */

typedef struct {
    const tern_cuda_attn_dims *d;
    const tern_kvq *L;
    float *qg, *k;
    const float *v, *qn, *kn, *inv;
    int T, pos0;
    uint8_t *kc, *vc;
    tern_stream s;
} prep_run;

static void run_prep(void *arg, int rep) {
    prep_run *r = arg;
    tern_error err;
    (void)rep;
    if (tern_cuda_attn_prep(r->d, r->L, r->qg, r->k, r->v, r->qn, r->kn, r->inv, r->T, r->pos0, r->kc, r->vc, r->s,
                            &err))
        die_err("attn_prep", &err);
}

/* The model's RoPE table at theta 1e7 (model/rope.c): plain, or with
 * yarn > 0 YaRN of that factor over a native 262,144 positions (the real
 * model's), its attention factor into *scale. */
static float *rope_freqs(int rope_dim, double yarn, float *scale) {
    tern_config c = {.rope_dim = rope_dim, .rope_theta = 1e7, .max_pos = 262144};
    c.rope = (tern_rope_cfg){.type = yarn > 0 ? TERN_ROPE_YARN : TERN_ROPE_NONE, .native = 262144, .factor = yarn,
                             .beta_fast = 32, .beta_slow = 1, .truncate = 1};
    tern_error err;
    if (tern_rope_finish(&c, "check", &err)) die_err("rope", &err);
    float *f = xmalloc((size_t)(rope_dim / 2) * sizeof(float));
    tern_rope_inv_freq(&c, f);
    *scale = (float)c.rope.attn_factor;
    return f;
}

/* Bytes of rows [pos0, pos0 + T) that differ from the CPU's quantization of
 * the given floats. */
static long row_mismatch(const tern_kvq *L, const uint8_t *rows, const float *x, int T) {
    uint8_t *buf = xmalloc(L->row_bytes);
    long bad = 0;
    for (int t = 0; t < T; t++) {
        tern_kv_quantize_row(L, x + (size_t)t * L->row_len, buf);
        for (size_t i = 0; i < L->row_bytes; i++) bad += buf[i] != rows[(size_t)t * L->row_bytes + i];
    }
    free(buf);
    return bad;
}

static void prep_case(checker *ck, int nh, int nkv, int hd, int rope, int bits, int T, int pos0, int timed, int at,
                      double yarn) {
    float scale;
    float *inv = rope_freqs(rope, yarn, &scale);
    tern_cuda_attn_dims d = {nh, nkv, hd, rope, 1e-6f, scale};
    tern_kvq L;
    if (tern_kvq_init(&L, nkv, hd, bits)) { fprintf(stderr, "bad kv layout\n"); exit(2); }
    size_t nq = (size_t)T * nh * 2 * hd, nk = (size_t)T * nkv * hd;
    float *qg = xmalloc(nq * 4), *k = xmalloc(nk * 4), *v = xmalloc(nk * 4), *qn = xmalloc((size_t)hd * 4),
          *kn = xmalloc((size_t)hd * 4);
    rnd_floats(ck, qg, nq, 1.0f);
    rnd_floats(ck, k, nk, 1.0f);
    rnd_floats(ck, v, nk, 1.0f);
    rnd_floats(ck, qn, (size_t)hd, 0.1f);
    rnd_floats(ck, kn, (size_t)hd, 0.1f);
    float *dqg = dev_upload(qg, nq * 4), *dk = dev_upload(k, nk * 4), *dv = dev_upload(v, nk * 4);
    float *dqn = dev_upload(qn, (size_t)hd * 4), *dkn = dev_upload(kn, (size_t)hd * 4);
    float *dinv = dev_upload(inv, (size_t)rope / 2 * 4);
    size_t cache = (size_t)(pos0 + T) * L.row_bytes;
    uint8_t *kc = dev_alloc(cache), *vc = dev_alloc(cache);
    tern_error err;
    if (tern_cuda_fill(kc, 0xab, cache, ck->stream, &err) || tern_cuda_fill(vc, 0xab, cache, ck->stream, &err))
        die_err("fill", &err);
    int *dpos = dev_upload(&pos0, sizeof pos0);
    if (at ? tern_cuda_attn_prep_at(&d, &L, dqg, dk, dv, dqn, dkn, dinv, T, dpos, kc, vc, ck->stream, &err)
           : tern_cuda_attn_prep(&d, &L, dqg, dk, dv, dqn, dkn, dinv, T, pos0, kc, vc, ck->stream, &err))
        die_err("attn_prep", &err);
    tern_cuda_free(dpos);
    dev_sync(ck, "attn_prep");
    float *gq = xmalloc(nq * 4), *gk = xmalloc(nk * 4);
    uint8_t *gkc = xmalloc((size_t)T * L.row_bytes), *gvc = xmalloc((size_t)T * L.row_bytes);
    dev_download(gq, dqg, nq * 4);
    dev_download(gk, dk, nk * 4);
    dev_download(gkc, kc + (size_t)pos0 * L.row_bytes, (size_t)T * L.row_bytes);
    dev_download(gvc, vc + (size_t)pos0 * L.row_bytes, (size_t)T * L.row_bytes);
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < nh; h++) {
            float *q = qg + ((size_t)t * nh + h) * 2 * hd;
            tern_rmsnorm_1p(q, q, qn, hd, 1e-6f);
            tern_rope(q, rope, inv, scale, pos0 + t);
        }
        for (int g = 0; g < nkv; g++) {
            float *kh = k + ((size_t)t * nkv + g) * hd;
            tern_rmsnorm_1p(kh, kh, kn, hd, 1e-6f);
            tern_rope(kh, rope, inv, scale, pos0 + t);
        }
    }
    char shape[96];
    char yn[32] = "";
    if (yarn > 0) snprintf(yn, sizeof yn, " yarn x%g", yarn);
    snprintf(shape, sizeof shape, "%dq/%dkv x %d rope %d%s T=%d pos %d%s kv%d", nh, nkv, hd, rope, yn, T, pos0,
             at ? " (device)" : "", bits);
    report(ck, "attn_prep q", shape, gq, qg, nq, 1e-5);
    report(ck, "attn_prep k", shape, gk, k, nk, 1e-5);
    report_exact(ck, "attn_prep K row", shape, row_mismatch(&L, gkc, gk, T), (long)T * (long)L.row_bytes);
    report_exact(ck, "attn_prep V row", shape, row_mismatch(&L, gvc, v, T), (long)T * (long)L.row_bytes);
    if (timed && ck->time) {
        prep_run r = {&d, &L, dqg, dk, dv, dqn, dkn, dinv, T, pos0, kc, vc, ck->stream};
        report_time(ck, "attn_prep", shape, time_op(ck, run_prep, &r), (double)(nq + 3 * nk) * 4);
    }
    tern_cuda_free(dqg); tern_cuda_free(dk); tern_cuda_free(dv); tern_cuda_free(dqn); tern_cuda_free(dkn);
    tern_cuda_free(dinv); tern_cuda_free(kc); tern_cuda_free(vc);
    free(qg); free(k); free(v); free(qn); free(kn); free(inv); free(gq); free(gk); free(gkc); free(gvc);
}

/* attn_prep then the attention on one stream, as the decode step runs them
 * (programmatic dependent launch: the attention's split kernel starts under
 * attn_prep and requests the rows before the token's early), against the
 * same two ops with a synchronisation between them: bit for bit. The
 * token's row is poisoned before, so a split that read it before attn_prep
 * wrote it shows. plan: the attention's planned context (1,024: the splits
 * merged in a cluster; 4,096: the combine kernel). */
static void prep_chain_case(checker *ck, int pos0, int plan) {
    const int nh = 16, nkv = 2, hd = 256, rope = 64, bits = 16;
    float scale;
    float *inv = rope_freqs(rope, 0, &scale);
    tern_cuda_attn_dims d = {nh, nkv, hd, rope, 1e-6f, scale};
    tern_kvq L;
    if (tern_kvq_init(&L, nkv, hd, bits)) { fprintf(stderr, "bad kv layout\n"); exit(2); }
    size_t nq = (size_t)nh * 2 * hd, nk = (size_t)nkv * hd, no = (size_t)nh * hd;
    size_t cache = (size_t)(pos0 + 1) * L.row_bytes;
    float *qg = xmalloc(nq * 4), *k = xmalloc(nk * 4), *v = xmalloc(nk * 4), *qn = xmalloc((size_t)hd * 4),
          *kn = xmalloc((size_t)hd * 4);
    uint8_t *K = xmalloc(cache), *V = xmalloc(cache);
    rnd_kv_rows(ck, &L, K, V, pos0);
    memset(K + (size_t)pos0 * L.row_bytes, 0x7b, L.row_bytes);   /* f16 0x7b7b: ~6.2e4 */
    memset(V + (size_t)pos0 * L.row_bytes, 0x7b, L.row_bytes);
    rnd_floats(ck, qg, nq, 1.0f);
    rnd_floats(ck, k, nk, 1.0f);
    rnd_floats(ck, v, nk, 1.0f);
    rnd_floats(ck, qn, (size_t)hd, 0.1f);
    rnd_floats(ck, kn, (size_t)hd, 0.1f);
    float *dqn = dev_upload(qn, (size_t)hd * 4), *dkn = dev_upload(kn, (size_t)hd * 4);
    float *dinv = dev_upload(inv, (size_t)rope / 2 * 4), *dv = dev_upload(v, nk * 4);
    int *dpos = dev_upload(&pos0, sizeof pos0);
    size_t wb = tern_cuda_attention_workspace(&d, 1, plan);
    void *work = dev_alloc(wb);
    float *got[2];
    tern_error err;
    for (int sep = 0; sep < 2; sep++) {   /* 0: chained, 1: synchronised between */
        float *dqg = dev_upload(qg, nq * 4), *dk = dev_upload(k, nk * 4);
        uint8_t *kc = dev_upload(K, cache), *vc = dev_upload(V, cache);
        float *dout = dev_poison(no);
        if (tern_cuda_attn_prep_at(&d, &L, dqg, dk, dv, dqn, dkn, dinv, 1, dpos, kc, vc, ck->stream, &err))
            die_err("attn_prep", &err);
        if (sep) dev_sync(ck, "attn_prep");
        if (tern_cuda_attention_at(&d, &L, dqg, kc, vc, 1, dpos, plan, 1.0f / sqrtf((float)hd), work, wb, dout,
                                   ck->stream, &err))
            die_err("attention_at", &err);
        dev_sync(ck, "attention_at");
        got[sep] = xmalloc(no * 4);
        dev_download(got[sep], dout, no * 4);
        tern_cuda_free(dqg); tern_cuda_free(dk); tern_cuda_free(kc); tern_cuda_free(vc); tern_cuda_free(dout);
    }
    long bad = 0;
    for (size_t i = 0; i < no; i++) bad += memcmp(&got[0][i], &got[1][i], 4) != 0;
    char shape[96];
    snprintf(shape, sizeof shape, "%dq/%dkv x %d kv%d pos %d plan %d", nh, nkv, hd, bits, pos0, plan);
    report_exact(ck, "attn_prep>attention", shape, bad, (long)no);
    tern_cuda_free(dqn); tern_cuda_free(dkn); tern_cuda_free(dinv); tern_cuda_free(dv); tern_cuda_free(dpos);
    tern_cuda_free(work);
    free(qg); free(k); free(v); free(qn); free(kn); free(inv); free(K); free(V); free(got[0]);
    free(got[1]);
}

void check_attn_prep(checker *ck) {
    prep_chain_case(ck, 639, 1024);
    prep_chain_case(ck, 64, 1024);
    prep_chain_case(ck, 3000, 4096);
    prep_case(ck, 16, 2, 256, 64, 16, 1, 1000, 1, 0, 0);
    prep_case(ck, 16, 2, 256, 64, 16, 1, 1000, 0, 1, 0);
    prep_case(ck, 16, 2, 256, 64, 8, 1, 200000, 0, 0, 0);
    prep_case(ck, 16, 2, 256, 64, 4, 4, 70000, 0, 1, 0);
    prep_case(ck, 8, 1, 32, 8, 8, 3, 5, 0, 0, 0);
    prep_case(ck, 8, 1, 32, 8, 4, 2, 0, 0, 0, 0);
    /* YaRN to 512 K and 1 M positions (the real model's scalings) */
    prep_case(ck, 16, 2, 256, 64, 16, 3, 524000, 0, 0, 2.0);
    prep_case(ck, 16, 2, 256, 64, 16, 1, 1048575, 0, 1, 4.0);
    prep_case(ck, 16, 2, 256, 64, 8, 2, 300000, 0, 0, 4.0);
}
