/* tern_cuda_attention against tern_kv_attend (cpu/kvquant.h, portable
 * variant) on the same quantized rows, times sigmoid(gate) as forward.c's
 * attn_layer applies it, for every query head and token (causal).
 * Tolerance 1e-5 of max |o|: fp32 scores over head_dim 256, softmax and a
 * weighted sum; the split-K merge only regroups the same sums. */
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
    if (tern_cuda_attention(r->d, r->L, r->qg, r->kc[i], r->vc[i], r->T, r->pos0, r->scale, r->work, r->work_bytes,
                            r->o, r->s, &err))
        die_err("attention", &err);
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

static void att_case(checker *ck, int nh, int nkv, int hd, int bits, int T, int pos0, int timed) {
    tern_cuda_attn_dims d = {nh, nkv, hd, 0, 1e-6f};
    tern_kvq L;
    if (tern_kvq_init(&L, nkv, hd, bits)) { fprintf(stderr, "bad kv layout\n"); exit(2); }
    int n = pos0 + T, G = nh / nkv;
    size_t cache = (size_t)n * L.row_bytes, nq = (size_t)T * nh * 2 * hd, no = (size_t)T * nh * hd;
    uint8_t *K = xmalloc(cache), *V = xmalloc(cache);
    float *row = xmalloc((size_t)L.row_len * 4), *qg = xmalloc(nq * 4);
    for (int j = 0; j < n; j++) {
        rnd_floats(ck, row, (size_t)L.row_len, 1.0f);
        tern_kv_quantize_row(&L, row, K + (size_t)j * L.row_bytes);
        rnd_floats(ck, row, (size_t)L.row_len, 1.0f);
        tern_kv_quantize_row(&L, row, V + (size_t)j * L.row_bytes);
    }
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
    report(ck, "attention", shape, got, ref, no, 1e-5);
    if (timed && ck->time) {
        att_run r = {&d, &L, dq, &dK, &dV, 1, T, pos0, scale, work, wb, dout, ck->stream};
        time_attention(ck, &r, cache, shape);
    }
    tern_cuda_free(dK); tern_cuda_free(dV); tern_cuda_free(dq); tern_cuda_free(dout); tern_cuda_free(work);
    free(K); free(V); free(row); free(qg); free(ref); free(got); free(scores);
}

void check_attention(checker *ck) {
    for (int bits = 16; bits >= 4; bits /= 2) {
        att_case(ck, 16, 2, 256, bits, 1, 0, 0);
        att_case(ck, 16, 2, 256, bits, 1, 999, 1);
        att_case(ck, 16, 2, 256, bits, 1, 32767, 1);
    }
    att_case(ck, 16, 2, 256, 8, 5, 300, 0);        /* a prefill chunk against the cache */
    att_case(ck, 16, 2, 256, 16, 3, 9000, 0);      /* splits past some tokens' ends */
    att_case(ck, 8, 1, 32, 8, 3, 40, 0);           /* tiny rows (36 bytes): the unaligned loads */
    att_case(ck, 8, 1, 32, 4, 2, 70, 0);
    att_case(ck, 20, 1, 64, 16, 1, 500, 0);        /* 20 heads per KV head: three query groups */
}
