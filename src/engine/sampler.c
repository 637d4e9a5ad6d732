/* Token sampler; the order of operations is documented in sampler.h.
 * Truncation never sorts the 248k logits: top-k keeps a k-sized heap in
 * one pass (0.6 ms per token at 248k ids, k = 20, on the dev box), and
 * top-p/min-p without top-k pop a heap of all ids only as far as the kept
 * mass needs (fast for the peaked distributions of a trained model; a flat
 * one costs ~13 ms). Weights are exp(logit - max) in float, summed in
 * double. */
#include "engine/sampler.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/err.h"
#include "util/file.h"

/* ---- parameters ------------------------------------------------------------ */

void tern_sampler_params_default(tern_sampler_params *p) {
    *p = (tern_sampler_params){
        .do_sample = 0, .temperature = 1.0f, .top_k = 50, .top_p = 1.0f,
        .min_p = 0.0f, .repetition_penalty = 1.0f,
    };
}

/* The ranges are those the tern command line accepts for the same settings
 * (--temp, --top-p, --min-p, --repeat-penalty, --top-k): a file may not
 * ask for what a flag may not. */
static int read_float(json_t *cfg, const char *key, double lo, double hi, float *out, const char *path,
                      tern_error *err) {
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return tern_fail(err, "%s: \"%s\" must be a number", path, key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return tern_fail(err, "%s: \"%s\" must be in [%g, %g], got %g", path, key, lo, hi, x);
    *out = (float)x;
    return 0;
}

static int read_int(json_t *cfg, const char *key, int *out, const char *path, tern_error *err) {
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return tern_fail(err, "%s: \"%s\" must be an integer in [0, %d]", path, key, INT32_MAX);
    *out = (int)json_integer_value(v);
    return 0;
}

static int eos_id(json_t *v, int32_t *out, const char *path, size_t i, tern_error *err) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return tern_fail(err, "%s: eos_token_id[%zu] must be a token id (an integer >= 0)", path, i);
    *out = (int32_t)json_integer_value(v);
    return 0;
}

static int read_eos(json_t *cfg, tern_sampler_params *p, const char *path, tern_error *err) {
    json_t *v = json_object_get(cfg, "eos_token_id");
    if (!v || json_is_null(v)) return 0;
    if (json_is_number(v)) {
        if (eos_id(v, &p->eos_ids[0], path, 0, err) != 0) return -1;
        p->n_eos = 1;
        return 0;
    }
    if (!json_is_array(v) || json_array_size(v) > TERN_SAMPLER_MAX_EOS)
        return tern_fail(err, "%s: \"eos_token_id\" must be an integer or a list of at most %d",
                         path, TERN_SAMPLER_MAX_EOS);
    size_t i;
    json_t *id;
    json_array_foreach(v, i, id) {
        if (eos_id(id, &p->eos_ids[i], path, i, err) != 0) return -1;
    }
    p->n_eos = (int)json_array_size(v);
    return 0;
}

static int read_fields(json_t *cfg, tern_sampler_params *p, const char *path, tern_error *err) {
    json_t *ds = json_object_get(cfg, "do_sample");
    if (ds && !json_is_null(ds)) {
        if (!json_is_boolean(ds)) return tern_fail(err, "%s: \"do_sample\" must be true/false", path);
        p->do_sample = json_is_true(ds);
    }
    if (read_float(cfg, "temperature", 0, 100, &p->temperature, path, err) ||
        read_int(cfg, "top_k", &p->top_k, path, err) ||
        read_float(cfg, "top_p", 0, 1, &p->top_p, path, err) ||
        read_float(cfg, "min_p", 0, 1, &p->min_p, path, err) ||
        read_float(cfg, "repetition_penalty", 0.01, 100, &p->repetition_penalty, path, err))
        return -1;
    return read_eos(cfg, p, path, err);
}

int tern_sampler_params_load(tern_sampler_params *p, const char *model_dir, tern_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", model_dir);
    tern_sampler_params_default(p);
    /* No file: transformers' defaults, as GenerationConfig has without one. */
    if (access(path, F_OK) != 0) return 0;
    json_t *cfg = tern_json_load(path, 0, TERN_JSON_SMALL_MAX, err);
    if (!cfg) return -1;
    int rc = json_is_object(cfg) ? read_fields(cfg, p, path, err)
                                 : tern_fail(err, "%s: not a JSON object", path);
    json_decref(cfg);
    return rc;
}

int tern_sampler_is_eos(const tern_sampler_params *p, int32_t id) {
    for (int i = 0; i < p->n_eos; i++)
        if (p->eos_ids[i] == id) return 1;
    return 0;
}

/* ---- random numbers: xoshiro256** seeded through splitmix64 ---------------- */

struct tern_sampler {
    tern_sampler_params p;
    int n_vocab, n_valid;
    uint64_t rng[4];
    float *work;      /* n_valid logits being processed */
    int32_t *counts;  /* n_valid occurrence counts; all zero between calls */
    int32_t *heap;    /* n_valid ids */
    int32_t *cand;    /* kept ids, most likely first */
    double *weight;   /* exp(logit - max) of each kept id */
    int n_cand;
    const uint32_t *mask;   /* a grammar's allowed ids, or NULL */
};

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4]) {
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double uniform(tern_sampler *s) { return (double)(xoshiro_next(s->rng) >> 11) * 0x1.0p-53; }

void tern_sampler_seed(tern_sampler *s, uint64_t seed) {
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&seed);
}

/* ---- lifetime ------------------------------------------------------------------ */

tern_sampler *tern_sampler_create(const tern_sampler_params *p, int n_vocab, int n_valid,
                                  tern_error *err) {
    if (n_valid <= 0 || n_valid > n_vocab) {
        tern_fail(err, "sampler: n_valid %d must be in 1..n_vocab (%d)", n_valid, n_vocab);
        return NULL;
    }
    tern_sampler *s = calloc(1, sizeof *s);
    if (!s) goto oom;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->n_valid = n_valid;
    s->work = malloc((size_t)n_valid * sizeof *s->work);
    s->counts = calloc((size_t)n_valid, sizeof *s->counts);
    s->heap = malloc((size_t)n_valid * sizeof *s->heap);
    s->cand = malloc((size_t)n_valid * sizeof *s->cand);
    s->weight = malloc((size_t)n_valid * sizeof *s->weight);
    if (!s->work || !s->counts || !s->heap || !s->cand || !s->weight) goto oom;
    tern_sampler_seed(s, p->seed);
    return s;
oom:
    tern_sampler_destroy(s);
    tern_fail(err, "out of memory (sampler for %d tokens)", n_valid);
    return NULL;
}

void tern_sampler_destroy(tern_sampler *s) {
    if (!s) return;
    free(s->work);
    free(s->counts);
    free(s->heap);
    free(s->cand);
    free(s->weight);
    free(s);
}

/* ---- steps 1-4: mask, penalties, temperature -------------------------------- */

static int is_greedy(const tern_sampler *s) {
    return !s->p.do_sample || !(s->p.temperature > 0);
}

static void penalise(tern_sampler *s, const int32_t *history, int n_history) {
    const tern_sampler_params *p = &s->p;
    if (p->repetition_penalty == 1 && p->presence_penalty == 0 && p->frequency_penalty == 0)
        return;
    for (int i = 0; i < n_history; i++)
        if (history[i] >= 0 && history[i] < s->n_valid) s->counts[history[i]]++;
    /* Each distinct id once; clearing its count on the way keeps the
     * counts array zero for the next call. */
    for (int i = 0; i < n_history; i++) {
        int32_t id = history[i];
        if (id < 0 || id >= s->n_valid || s->counts[id] == 0) continue;
        float l = s->work[id];
        if (p->repetition_penalty != 1)
            l = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
        l -= (float)s->counts[id] * p->frequency_penalty + p->presence_penalty;
        s->work[id] = l;
        s->counts[id] = 0;
    }
}

void tern_sampler_set_mask(tern_sampler *s, const uint32_t *mask) { s->mask = mask; }

static void prepare(tern_sampler *s, const float *logits, const int32_t *history,
                    int n_history) {
    for (int i = 0; i < s->n_valid; i++)
        s->work[i] = isnan(logits[i]) ? -INFINITY : logits[i];
    for (int w = 0; s->mask && w * 32 < s->n_valid; w++) {
        uint32_t bits = s->mask[w];
        if (bits == 0xFFFFFFFFu) continue;
        int end = w * 32 + 32 < s->n_valid ? w * 32 + 32 : s->n_valid;
        for (int i = w * 32; i < end; i++)
            if (!((bits >> (i & 31)) & 1)) s->work[i] = -INFINITY;
    }
    penalise(s, history, n_history);
    if (is_greedy(s)) return;
    float inv_t = 1.0f / s->p.temperature;
    for (int i = 0; i < s->n_valid; i++) s->work[i] *= inv_t;
}

/* ---- steps 5-7: candidates --------------------------------------------------- */

/* Heap order: larger logit first, lower id first among equals. */
static int before(const float *w, int32_t a, int32_t b) {
    return w[a] > w[b] || (w[a] == w[b] && a < b);
}

static void sift_down(const float *w, int32_t *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, top = i;
        if (l < n && before(w, h[l], h[top])) top = l;
        if (r < n && before(w, h[r], h[top])) top = r;
        if (top == i) return;
        int32_t t = h[i];
        h[i] = h[top];
        h[top] = t;
        i = top;
    }
}

/* The same heap with the order reversed: the least likely id on top. */
static void sift_down_worst(const float *w, int32_t *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, top = i;
        if (l < n && before(w, h[top], h[l])) top = l;
        if (r < n && before(w, h[top], h[r])) top = r;
        if (top == i) return;
        int32_t t = h[i];
        h[i] = h[top];
        h[top] = t;
        i = top;
    }
}

static int32_t heap_pop(const float *w, int32_t *h, int *n) {
    int32_t top = h[0];
    h[0] = h[--*n];
    sift_down(w, h, *n, 0);
    return top;
}

/* Every valid id in id order: nothing is truncated, no ordering needed. */
static void all_candidates(tern_sampler *s, float max) {
    for (int i = 0; i < s->n_valid; i++) {
        s->cand[i] = i;
        s->weight[i] = expf(s->work[i] - max);
    }
    s->n_cand = s->n_valid;
}

/* Top-k: one pass keeps the k best ids in a min-heap (root = the worst
 * kept), so most ids cost one comparison; then the heap is emptied
 * worst-first into cand from the back. */
static void select_top_k(tern_sampler *s, float max, int k) {
    int32_t *h = s->heap;
    int n = 0;
    for (int32_t id = 0; id < s->n_valid; id++) {
        if (n < k) {
            h[n++] = id;
            for (int i = n - 1; i > 0 && before(s->work, h[(i - 1) / 2], h[i]); i = (i - 1) / 2) {
                int32_t t = h[i];
                h[i] = h[(i - 1) / 2];
                h[(i - 1) / 2] = t;
            }
        } else if (before(s->work, id, h[0])) {
            h[0] = id;
            sift_down_worst(s->work, h, n, 0);
        }
    }
    s->n_cand = n;
    while (n > 0) {
        int32_t id = h[0];
        h[0] = h[--n];
        sift_down_worst(s->work, h, n, 0);
        s->cand[n] = id;
        s->weight[n] = expf(s->work[id] - max);
    }
}

/* Without top-k: pops the most likely ids until the kept mass reaches
 * top_p or the next id falls below min_p (a peaked distribution stops
 * after a few pops; heapify is O(n)). */
static void pop_candidates(tern_sampler *s, float max) {
    int n = s->n_valid;
    double total = 0, cum = 0;
    for (int i = 0; i < n; i++) total += expf(s->work[i] - max);
    for (int i = 0; i < n; i++) s->heap[i] = i;
    for (int i = n / 2 - 1; i >= 0; i--) sift_down(s->work, s->heap, n, i);
    s->n_cand = 0;
    while (n > 0) {
        int32_t id = heap_pop(s->work, s->heap, &n);
        double w = expf(s->work[id] - max);
        if (s->n_cand > 0 && w < s->p.min_p) break;
        s->cand[s->n_cand] = id;
        s->weight[s->n_cand++] = w;
        cum += w;
        if (s->p.top_p < 1 && cum >= s->p.top_p * total) break;
    }
}

/* Top-p over what top-k kept (without top-k, popping already stopped at
 * top-p of the whole distribution), then min-p; both cut the sorted list. */
static void cut_candidates(tern_sampler *s, int after_top_k) {
    double total = 0, cum = 0;
    for (int i = 0; i < s->n_cand; i++) total += s->weight[i];
    if (after_top_k && s->p.top_p < 1) {
        for (int i = 0; i < s->n_cand; i++) {
            cum += s->weight[i];
            if (cum >= s->p.top_p * total) {
                s->n_cand = i + 1;
                break;
            }
        }
    }
    /* weight[0] is the largest probability's weight, exp(0) = 1 */
    if (s->p.min_p > 0)
        for (int i = 1; i < s->n_cand; i++)
            if (s->weight[i] < s->p.min_p * s->weight[0]) {
                s->n_cand = i;
                break;
            }
}

static int32_t argmax(const tern_sampler *s) {
    int32_t best = 0;
    for (int i = 1; i < s->n_valid; i++)
        if (s->work[i] > s->work[best]) best = i;
    return best;
}

static int select_candidates(tern_sampler *s, tern_error *err) {
    int32_t best = argmax(s);
    float max = s->work[best];
    if (!isfinite(max)) return tern_fail(err, "sampler: no token has a finite logit");
    if (is_greedy(s)) {
        s->cand[0] = best;
        s->weight[0] = 1;
        s->n_cand = 1;
        return 0;
    }
    int k = s->p.top_k > 0 && s->p.top_k < s->n_valid ? s->p.top_k : s->n_valid;
    if (k == s->n_valid && !(s->p.top_p < 1) && !(s->p.min_p > 0)) {
        all_candidates(s, max);
        return 0;
    }
    if (k < s->n_valid) select_top_k(s, max, k);
    else pop_candidates(s, max);
    cut_candidates(s, k < s->n_valid);
    return 0;
}

/* ---- step 8 and the public calls ---------------------------------------------- */

static int32_t draw(tern_sampler *s) {
    double total = 0;
    for (int i = 0; i < s->n_cand; i++) total += s->weight[i];
    double u = uniform(s) * total, cum = 0;
    int32_t last = s->cand[0];
    for (int i = 0; i < s->n_cand; i++) {
        if (s->weight[i] <= 0) continue;
        cum += s->weight[i];
        last = s->cand[i];
        if (u < cum) return last;
    }
    return last;  /* u landed past the sum by rounding */
}

int32_t tern_sampler_sample(tern_sampler *s, const float *logits, const int32_t *history,
                            int n_history, tern_error *err) {
    prepare(s, logits, history, n_history);
    if (select_candidates(s, err)) return -1;
    return s->n_cand == 1 ? s->cand[0] : draw(s);
}

int tern_sampler_probs(tern_sampler *s, const float *logits, const int32_t *history,
                       int n_history, float *probs, tern_error *err) {
    prepare(s, logits, history, n_history);
    if (select_candidates(s, err)) return -1;
    double total = 0;
    for (int i = 0; i < s->n_cand; i++) total += s->weight[i];
    memset(probs, 0, (size_t)s->n_vocab * sizeof *probs);
    for (int i = 0; i < s->n_cand; i++) probs[s->cand[i]] = (float)(s->weight[i] / total);
    return 0;
}

int tern_sampler_logits(tern_sampler *s, const float *logits, const int32_t *history,
                        int n_history, float *out, tern_error *err) {
    prepare(s, logits, history, n_history);
    memcpy(out, s->work, (size_t)s->n_valid * sizeof *out);
    for (int i = s->n_valid; i < s->n_vocab; i++) out[i] = -INFINITY;
    return 0;
}

int tern_sampler_gpu_rule(const tern_sampler *s, int max_k, int *greedy, float *temperature, int *top_k,
                          float *top_p, float *min_p) {
    const tern_sampler_params *p = &s->p;
    if (p->repetition_penalty != 1 || p->presence_penalty != 0 || p->frequency_penalty != 0) return 0;
    *greedy = is_greedy(s);
    *temperature = p->temperature;
    *top_k = p->top_k;
    *top_p = p->top_p;
    *min_p = p->min_p;
    return *greedy || (p->top_k >= 1 && p->top_k <= max_k);
}

double tern_sampler_next_uniform(tern_sampler *s) { return uniform(s); }

int tern_sampler_greedy(const tern_sampler *s) { return is_greedy(s); }

int32_t tern_sampler_draw_probs(tern_sampler *s, const float *probs, int n) {
    double total = 0, cum = 0;
    for (int i = 0; i < n; i++) total += probs[i] > 0 ? probs[i] : 0;
    if (!(total > 0)) return -1;
    double u = uniform(s) * total;
    int32_t last = -1;
    for (int i = 0; i < n; i++) {
        if (!(probs[i] > 0)) continue;
        cum += probs[i];
        last = i;
        if (u < cum) return i;
    }
    return last;  /* u landed past the sum by rounding */
}

int tern_sampler_n_valid(const tern_sampler *s) { return s->n_valid; }
