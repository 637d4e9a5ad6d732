/* tern_cuda_argmax and tern_cuda_sample against engine/sampler.c: the
 * argmax rule of its greedy path (lowest id on ties, NaN as -inf), and the
 * distribution tern_sampler_probs keeps after temperature, top-k, top-p and
 * min-p, drawn at the same u in the sampler's order (most likely first):
 * every id must match exactly. Both also under a grammar's mask (the
 * sampler's tern_sampler_set_mask): half the ids, fewer than top-k, one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/sampler.h"

#define VOCAB 248320
#define VALID 248077

#define MASK_WORDS ((VOCAB + 31) / 32)

static int in_mask(const uint32_t *mask, int i) { return !mask || (mask[i >> 5] >> (i & 31) & 1u); }

static int32_t argmax_ref(const float *l, const uint32_t *mask, int n) {
    int32_t best = 0;
    float bv = -INFINITY;
    for (int i = 0; i < n; i++) {
        float v = isnan(l[i]) || !in_mask(mask, i) ? -INFINITY : l[i];
        if (v > bv) { bv = v; best = i; }
    }
    return best;
}

enum { MASK_NONE, MASK_HALF, MASK_FEW, MASK_ONE };

/* A grammar's mask of the kind: random half the ids, 3 ids (fewer than
 * most top-k), or one; NULL for none. */
static const uint32_t *mask_fill(checker *ck, uint32_t *mask, int kind) {
    if (kind == MASK_NONE) return NULL;
    for (int w = 0; w < MASK_WORDS; w++) mask[w] = kind == MASK_HALF ? (uint32_t)rnd_u64(ck) : 0u;
    for (int j = 0; kind != MASK_HALF && j < (kind == MASK_FEW ? 3 : 1); j++) {
        int i = (int)(rnd_u64(ck) % VALID);
        mask[i >> 5] |= 1u << (i & 31);
    }
    return mask;
}

static const char *mask_name(int kind) {
    return kind == MASK_HALF ? ", masked: half the ids" : kind == MASK_FEW ? ", masked: 3 ids"
                                                         : kind == MASK_ONE ? ", masked: one id" : "";
}

typedef struct {
    float p;
    int32_t id;
} kept;

static int by_prob(const void *a, const void *b) {
    const kept *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* The draw of engine/sampler.c's draw() over tern_sampler_probs' output. */
static int32_t draw_ref(const float *probs, int n, double u, kept *buf) {
    int m = 0;
    for (int i = 0; i < n; i++)
        if (probs[i] > 0) buf[m++] = (kept){probs[i], i};
    qsort(buf, (size_t)m, sizeof *buf, by_prob);
    double total = 0, cum = 0;
    for (int i = 0; i < m; i++) total += buf[i].p;
    double target = u * total;
    for (int i = 0; i < m; i++) {
        cum += buf[i].p;
        if (target < cum) return buf[i].id;
    }
    return m ? buf[m - 1].id : -1;
}

typedef struct {
    const float *l;
    const uint32_t *mask;
    const double *u;
    void *work;
    int32_t *id;
    tern_stream s;
    int sample;
} sample_run;

static void run_sample(void *arg, int rep) {
    sample_run *r = arg;
    tern_error err;
    (void)rep;
    int rc = r->sample ? tern_cuda_sample(r->l, r->mask, VALID, 0.7f, 20, 0.95f, 0.0f, r->u, r->work, r->id, NULL, r->s,
                                          &err)
                       : tern_cuda_argmax(r->l, r->mask, VALID, r->work, r->id, NULL, r->s, &err);
    if (rc) die_err("sample", &err);
}

static void logits_fill(checker *ck, float *l) { rnd_floats(ck, l, VOCAB, 3.0f); }

/* Logits on a few integer levels: thousands tie at the top-k threshold,
 * where the lower ids must be the ones kept. */
static void logits_ties(checker *ck, float *l) {
    logits_fill(ck, l);
    for (int i = 0; i < VOCAB; i++) l[i] = floorf(l[i] * 0.5f);
}

/* The best logits in neighbouring ids: 300 from id 70000 on (one slice,
 * neighbouring threads) above all others, so more than the fast selection's
 * cap pass its bound there and the radix selection takes over. */
static void logits_cluster(checker *ck, float *l) {
    logits_fill(ck, l);
    for (int i = 70000; i < 70300; i++) l[i] = 10.0f + 0.01f * (float)(i % 97);
}

enum { LOGITS_RANDOM, LOGITS_TIES, LOGITS_CLUSTER };

/* The draw's two outputs (did[0], and did[1] on odd trials): before each
 * call both hold -7; after it did[0] is the id, did[1] the id again when it
 * was given and still -7 when not. */
static void ids_reset(int32_t *did) {
    const int32_t m7[2] = {-7, -7};
    tern_error err;
    if (tern_cuda_upload(did, m7, sizeof m7, &err)) die_err("upload", &err);
}

static int ids_bad(checker *ck, const int32_t *did, int two, int32_t want, const char *what) {
    int32_t got[2];
    dev_sync(ck, what);
    dev_download(got, did, sizeof got);
    return got[0] != want || got[1] != (two ? want : -7);
}

static void check_argmax(checker *ck, float *l, float *dl, void *work, int32_t *did, uint32_t *mask, uint32_t *dmask) {
    long bad = 0, total = 0;
    tern_error err;
    for (int trial = 0; trial < 9; trial++) {
        /* trial 4: fewer valid ids on the same workspace (its layout moves; the count does not) */
        const int n = trial == 4 ? 100000 : VALID;
        logits_fill(ck, l);
        if (trial == 1) { l[100] = 50.0f; l[5000] = 50.0f; }           /* a tie: the lower id */
        if (trial == 2) { l[7] = NAN; l[VALID + 3] = 1e9f; }           /* NaN, and the padding rows */
        if (trial == 3) for (int i = 0; i < VOCAB; i++) l[i] = -INFINITY;
        /* trials 6-8: under a mask (its best id is rarely the best of all) */
        const uint32_t *m = mask_fill(ck, mask, trial < 6 ? MASK_NONE : trial - 5);
        if (m) tern_cuda_upload(dmask, m, MASK_WORDS * sizeof(uint32_t), &err);
        tern_cuda_upload(dl, l, VOCAB * sizeof(float), &err);
        ids_reset(did);
        if (tern_cuda_argmax(dl, m ? dmask : NULL, n, work, did, trial & 1 ? did + 1 : NULL, ck->stream, &err))
            die_err("argmax", &err);
        bad += ids_bad(ck, did, trial & 1, argmax_ref(l, m, n), "argmax");
        total++;
    }
    report_exact(ck, "argmax", "vocab 248320 (248077 valid; 100000 once), 9 cases (3 masked)", bad, total);
}

static void sample_setting(checker *ck, float *l, float *dl, void *work, int32_t *did, double *du, float temp, int k,
                           float p, float minp, int kind, uint32_t *mask, uint32_t *dmask, int mask_kind) {
    tern_sampler_params sp;
    tern_sampler_params_default(&sp);
    sp.do_sample = 1;
    sp.temperature = temp;
    sp.top_k = k;
    sp.top_p = p;
    sp.min_p = minp;
    tern_error err;
    tern_sampler *s = tern_sampler_create(&sp, VOCAB, VALID, &err);
    if (!s) die_err("sampler", &err);
    float *probs = xmalloc(VOCAB * sizeof(float));
    kept *buf = xmalloc(VOCAB * sizeof(kept));
    long bad = 0, total = 0;
    for (int trial = 0; trial < 40; trial++) {
        if (trial % 8 == 0) {
            if (kind == LOGITS_TIES) logits_ties(ck, l);
            else if (kind == LOGITS_CLUSTER) logits_cluster(ck, l);
            else logits_fill(ck, l);
            tern_cuda_upload(dl, l, VOCAB * sizeof(float), &err);
            const uint32_t *m = mask_fill(ck, mask, mask_kind);
            if (m) tern_cuda_upload(dmask, m, MASK_WORDS * sizeof(uint32_t), &err);
            tern_sampler_set_mask(s, m);
            if (tern_sampler_probs(s, l, NULL, 0, probs, &err)) die_err("sampler", &err);
        }
        double u = (double)(rnd_u64(ck) >> 11) * 0x1.0p-53;
        tern_cuda_upload(du, &u, sizeof u, &err);
        ids_reset(did);
        if (tern_cuda_sample(dl, mask_kind ? dmask : NULL, VALID, temp, k, p, minp, du, work, did,
                             trial & 1 ? did + 1 : NULL, ck->stream, &err))
            die_err("sample", &err);
        bad += ids_bad(ck, did, trial & 1, draw_ref(probs, VOCAB, u, buf), "sample");
        total++;
    }
    char shape[128];
    snprintf(shape, sizeof shape, "temp %.1f top-k %d top-p %.2f min-p %.2f%s%s", temp, k, p, minp,
             kind == LOGITS_TIES ? ", tied levels" : kind == LOGITS_CLUSTER ? ", best ids together" : "",
             mask_name(mask_kind));
    report_exact(ck, "sample", shape, bad, total);
    free(probs);
    free(buf);
    tern_sampler_destroy(s);
}

/* The merge's size: 248,320 ids fit at top-k 64, 262,145 do not, and a
 * call past it is refused with a message, not launched. */
static void check_merge_size(checker *ck, const float *dl, void *work, int32_t *did, const double *du) {
    tern_error err;
    long bad = !tern_cuda_sample_fits(VOCAB, 64) || !tern_cuda_sample_fits(262144, 64) ||
               tern_cuda_sample_fits(262145, 64) || !tern_cuda_sample_fits(262145, 63) ||
               tern_cuda_sample(dl, NULL, 262145, 1.0f, 64, 1.0f, 0.0f, du, work, did, NULL, ck->stream, &err) == 0;
    report_exact(ck, "sample", "the merge's size: fits and refusals", bad, 1);
}

void check_sample(checker *ck) {
    float *l = xmalloc(VOCAB * sizeof(float));
    float *dl = dev_alloc(VOCAB * sizeof(float));
    void *work = dev_alloc(tern_cuda_sample_workspace(VALID));
    dev_zero(work, tern_cuda_sample_workspace(VALID));   /* (the one launch's count: zero, then left zero) */
    int32_t *did = dev_alloc(2 * sizeof(int32_t));   /* the id and its second copy */
    double *du = dev_alloc(sizeof(double));
    uint32_t *mask = xmalloc(MASK_WORDS * sizeof(uint32_t)), *dmask = dev_alloc(MASK_WORDS * sizeof(uint32_t));
    check_argmax(ck, l, dl, work, did, mask, dmask);
    static const struct { float temp; int k; float p, minp; int logits, mask; } settings[] = {
        {0.7f, 20, 0.95f, 0.0f, LOGITS_RANDOM, MASK_NONE},  {1.0f, 64, 1.0f, 0.05f, LOGITS_RANDOM, MASK_NONE},
        {1.3f, 5, 0.5f, 0.0f, LOGITS_RANDOM, MASK_NONE},    {1.0f, 1, 1.0f, 0.0f, LOGITS_RANDOM, MASK_NONE},
        {1.0f, 20, 1.0f, 0.0f, LOGITS_TIES, MASK_NONE},     {0.7f, 64, 0.9f, 0.0f, LOGITS_TIES, MASK_NONE},
        {1.0f, 20, 1.0f, 0.0f, LOGITS_CLUSTER, MASK_NONE},  {2.0f, 64, 1.0f, 0.0f, LOGITS_CLUSTER, MASK_NONE},
        {0.7f, 20, 0.95f, 0.0f, LOGITS_RANDOM, MASK_HALF},  {1.0f, 20, 1.0f, 0.0f, LOGITS_RANDOM, MASK_FEW},
        {1.0f, 64, 1.0f, 0.05f, LOGITS_TIES, MASK_FEW},     {0.7f, 20, 0.95f, 0.0f, LOGITS_RANDOM, MASK_ONE},
    };
    for (size_t i = 0; i < sizeof settings / sizeof *settings; i++)
        sample_setting(ck, l, dl, work, did, du, settings[i].temp, settings[i].k, settings[i].p, settings[i].minp,
                       settings[i].logits, mask, dmask, settings[i].mask);
    check_merge_size(ck, dl, work, did, du);
    if (ck->time) {
        logits_fill(ck, l);
        tern_error err;
        tern_cuda_upload(dl, l, VOCAB * sizeof(float), &err);
        double half = 0.5;
        tern_cuda_upload(du, &half, sizeof half, &err);
        sample_run r = {dl, NULL, du, work, did, ck->stream, 0};
        report_time(ck, "argmax", "vocab 248077", time_op(ck, run_sample, &r), VALID * 4.0);
        r.sample = 1;
        report_time(ck, "sample", "vocab 248077 top-k 20 top-p 0.95", time_op(ck, run_sample, &r), VALID * 4.0);
        tern_cuda_upload(dmask, mask_fill(ck, mask, MASK_HALF), MASK_WORDS * sizeof(uint32_t), &err);
        r.mask = dmask;
        report_time(ck, "sample", "the same, masked", time_op(ck, run_sample, &r), VALID * 4.125);
    }
    tern_cuda_free(dl);
    tern_cuda_free(work);
    tern_cuda_free(did);
    tern_cuda_free(du);
    tern_cuda_free(dmask);
    free(mask);
    free(l);
}
