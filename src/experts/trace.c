/* Routing traces: which experts each token chose, per layer, recorded by a
 * session's routing observer; their statistics, and the hit rate a slot
 * cache would have on them, replayed exactly as src/experts/cache.c plans
 * (experts of a token in ascending order, lifetime request counts for LFU
 * with ties to the least recently used, the token's own experts pinned). */
#include <stdlib.h>
#include <string.h>

#include "tern.h"
#include "util/err.h"

struct tern_route_trace {
    int n_layers, n_experts, k;
    int **ids;                   /* [layer][token * k], router order */
    int *n_tok, *cap;            /* per layer */
};

tern_route_trace *tern_route_trace_create(int n_layers, int n_experts, int k, tern_error *err) {
    if (n_layers < 1 || n_experts < 1 || k < 1 || k > n_experts) {
        tern_fail(err, "route trace: bad dimensions (%d layers, %d experts, top %d)", n_layers, n_experts, k);
        return NULL;
    }
    tern_route_trace *t = calloc(1, sizeof *t);
    if (t) {
        t->ids = calloc((size_t)n_layers, sizeof *t->ids);
        t->n_tok = calloc((size_t)n_layers, sizeof *t->n_tok);
        t->cap = calloc((size_t)n_layers, sizeof *t->cap);
    }
    if (!t || !t->ids || !t->n_tok || !t->cap) {
        tern_route_trace_destroy(t);
        tern_fail(err, "out of memory");
        return NULL;
    }
    t->n_layers = n_layers;
    t->n_experts = n_experts;
    t->k = k;
    return t;
}

void tern_route_trace_destroy(tern_route_trace *t) {
    if (!t) return;
    for (int l = 0; t->ids && l < t->n_layers; l++) free(t->ids[l]);
    free(t->ids);
    free(t->n_tok);
    free(t->cap);
    free(t);
}

void tern_route_trace_clear(tern_route_trace *t) {
    memset(t->n_tok, 0, (size_t)t->n_layers * sizeof *t->n_tok);
}

void tern_route_trace_record(void *ud, int layer, int pos, const int *experts, int k) {
    tern_route_trace *t = ud;
    (void)pos;
    if (layer < 0 || layer >= t->n_layers || k != t->k) return;   /* the MTP layer is not traced */
    if (t->n_tok[layer] == t->cap[layer]) {
        int cap = t->cap[layer] ? 2 * t->cap[layer] : 1024;
        int *p = realloc(t->ids[layer], (size_t)cap * (size_t)k * sizeof *p);
        if (!p) return;   /* a trace is statistics: a short one is still one */
        t->ids[layer] = p;
        t->cap[layer] = cap;
    }
    memcpy(t->ids[layer] + (size_t)t->n_tok[layer] * k, experts, (size_t)k * sizeof *experts);
    t->n_tok[layer]++;
}

int tern_route_trace_tokens(const tern_route_trace *t) {
    int n = t->n_tok[0];
    for (int l = 1; l < t->n_layers; l++) if (t->n_tok[l] < n) n = t->n_tok[l];
    return n;
}

/* Distinct experts of layer l over tokens [a, b). */
static int distinct(const tern_route_trace *t, int l, int a, int b, unsigned char *seen) {
    memset(seen, 0, (size_t)t->n_experts);
    int n = 0;
    for (int i = a * t->k; i < b * t->k; i++) {
        int e = t->ids[l][i];
        if (!seen[e]) { seen[e] = 1; n++; }
    }
    return n;
}

/* Mean distinct experts per window of w tokens (windows at steps of w/2). */
static double window_mean(const tern_route_trace *t, int l, int T, int w, unsigned char *seen) {
    if (T < w) return 0.0;
    double sum = 0.0;
    int n = 0;
    for (int a = 0; a + w <= T; a += w / 2 > 0 ? w / 2 : 1, n++) sum += distinct(t, l, a, a + w, seen);
    return sum / n;
}

void tern_route_trace_summary(const tern_route_trace *t, tern_route_summary *out) {
    memset(out, 0, sizeof *out);
    int T = tern_route_trace_tokens(t), K = t->k;
    out->tokens = T;
    unsigned char *seen = malloc((size_t)t->n_experts), *prev = malloc((size_t)t->n_experts);
    if (!seen || !prev || T < 1) { free(seen); free(prev); return; }
    double reuse = 0.0, life = 0.0;
    for (int l = 0; l < t->n_layers; l++) {
        int same = 0;
        for (int i = 1; i < T; i++) {
            memset(prev, 0, (size_t)t->n_experts);
            for (int j = 0; j < K; j++) prev[t->ids[l][(i - 1) * K + j]] = 1;
            for (int j = 0; j < K; j++) same += prev[t->ids[l][i * K + j]];
        }
        if (T > 1) reuse += (double)same / ((double)(T - 1) * K);
        out->distinct8 += window_mean(t, l, T, 8, seen);
        out->distinct32 += window_mean(t, l, T, 32, seen);
        out->distinct128 += window_mean(t, l, T, 128, seen);
        life += distinct(t, l, 0, T, seen);
    }
    int L = t->n_layers;
    out->reuse = reuse / L;
    out->distinct8 /= L;
    out->distinct32 /= L;
    out->distinct128 /= L;
    out->lifetime = life / L;
    out->first_touch_ceiling = 1.0 - life / ((double)L * T * K);
    free(seen);
    free(prev);
}

/* One layer through a cache of `slots`, as cache.c plans a decode step. */
static void replay_layer(const tern_route_trace *t, int l, int T, int slots, int policy, uint64_t *hits,
                         int *slot_of, int *expert_in, uint64_t *requests, uint64_t *last_use, int *sorted) {
    int E = t->n_experts, K = t->k;
    for (int e = 0; e < E; e++) { slot_of[e] = -1; requests[e] = 0; }
    for (int s = 0; s < slots; s++) { expert_in[s] = -1; last_use[s] = 0; }
    for (int i = 0; i < T; i++) {
        /* the engine asks for a token's experts in ascending order */
        memcpy(sorted, t->ids[l] + (size_t)i * K, (size_t)K * sizeof *sorted);
        for (int a = 1; a < K; a++)
            for (int b = a; b > 0 && sorted[b - 1] > sorted[b]; b--) { int x = sorted[b]; sorted[b] = sorted[b - 1]; sorted[b - 1] = x; }
        uint64_t tick = (uint64_t)i + 1;
        for (int j = 0; j < K; j++) {
            int e = sorted[j];
            requests[e]++;
            int s = slot_of[e];
            if (s >= 0) {
                (*hits)++;
            } else {
                int best = -1;
                for (int x = 0; x < slots; x++) {
                    if (expert_in[x] < 0) { best = x; break; }
                    if (last_use[x] == tick) continue;   /* pinned: this token's */
                    if (best < 0) { best = x; continue; }
                    int ex = expert_in[x], eb = expert_in[best];
                    int better = policy == TERN_POLICY_LFU && requests[ex] != requests[eb]
                                     ? requests[ex] < requests[eb] : last_use[x] < last_use[best];
                    if (better) best = x;
                }
                s = best;
                if (expert_in[s] >= 0) slot_of[expert_in[s]] = -1;
                expert_in[s] = e;
                slot_of[e] = s;
            }
            last_use[s] = tick;
        }
    }
}

double tern_route_trace_simulate(const tern_route_trace *t, int slots, int policy) {
    int T = tern_route_trace_tokens(t), E = t->n_experts;
    if (T < 1 || slots < t->k) return 0.0;
    if (slots > E) slots = E;
    int *slot_of = malloc((size_t)E * sizeof(int)), *expert_in = malloc((size_t)slots * sizeof(int));
    uint64_t *requests = malloc((size_t)E * sizeof(uint64_t)), *last_use = malloc((size_t)slots * sizeof(uint64_t));
    int *sorted = malloc((size_t)t->k * sizeof(int));
    uint64_t hits = 0;
    if (slot_of && expert_in && requests && last_use && sorted)
        for (int l = 0; l < t->n_layers; l++)
            replay_layer(t, l, T, slots, policy, &hits, slot_of, expert_in, requests, last_use, sorted);
    free(slot_of); free(expert_in); free(requests); free(last_use); free(sorted);
    return (double)hits / ((double)t->n_layers * T * t->k);
}
