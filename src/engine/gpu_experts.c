/* The routed experts of a GPU model under an expert budget
 * (tern_model.gpu_expert_budget).
 *
 * Every expert's blob has a home in page-locked host memory mapped into the
 * device's address space; each layer also has `slots` blobs in device
 * memory. A device table per layer holds each expert's current address
 * (its slot, or its home), and the MoE kernels read through it
 * (tern_cuda_experts.blobs): a resident expert comes from VRAM, any other
 * straight over the host link, so no step waits for a copy and decode stays
 * one captured graph.
 *
 * The slot cache: every step counts the experts it chose on the device
 * (tern_cuda_count_experts); every COUNT_STEPS steps the counts come back to
 * the host, which keeps a score per expert (LFU: its decayed use; LRU: the
 * last reading that saw it used) and promotes the best-scored experts
 * without a slot into the slots of the worst-scored, at most PROMOTE_ROUND
 * at a time. A promotion repoints the evicted expert
 * at its home (a table word copied up on the session's stream, so every
 * step enqueued before still reads the slot), then the copy engine fills the
 * slot from the new expert's home on a stream of its own, and only once
 * that copy is done is the new expert repointed at the slot: no step ever
 * reads a slot being written. Promotions run only where one stream orders
 * every step (one session, or serial sessions).
 *
 * A prefill piece uses nearly every expert of every layer, so it does not
 * read the others over the bus: each layer's experts without a slot are
 * copied into one of two staging buffers while the layer before it
 * computes, and the layer's MoE reads a table of the slots and the staged
 * copies (tern_gpu_experts_ready).
 *
 * With the experts' home on disk (TERN_HOME_DISK) nothing reads over the
 * bus: a step's chosen ids come back to the host after each router
 * (decode runs uncaptured), the missing experts are read from the model's
 * files with O_DIRECT (a tern_expert_cache of a few host slots per layer
 * and its I/O threads) and copied into the slots of the worst-scored
 * experts, or, when a piece chooses more experts than a layer has slots,
 * into a staging buffer beside those found in slots. */
#ifdef TERN_CUDA

#include "engine/gpu_internal.h"

#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "experts/cache.h"
#include "util/err.h"

#define COUNT_STEPS 8         /* steps between reading the counts back */
#define PROMOTE_ROUND 64      /* promotions started per reading, over all layers */
#define DECAY 0.5f            /* a score's weight after each reading */
#define MAX_PENDING 256       /* promotions in flight */
#define WORDS 8192            /* page-locked table words for the updates in flight */
#define HOST_SLOTS 8          /* disk: host slots per layer for the reads (at least top_k) */
#define IO_THREADS 8          /* disk: parallel O_DIRECT reads */

typedef struct pending {
    int f, slot, e;
    tern_event done;
} pending;

typedef struct gpu_slot_cache gpu_slot_cache;

struct gpu_slot_cache {
    int n_files, E, S;
    int lru;                      /* the policy: LRU, else LFU */
    int disk;                     /* the homes are the model's files, read through io */
    tern_expert_cache *io;
    unsigned char *want;          /* disk: [E] the ids of the step at hand */
    int *ids;                     /* disk: [E] them, distinct */
    size_t stride;
    const uint8_t **dev_home;     /* [n_files]: each file's home, as the device addresses it */
    unsigned *counts;             /* device [n_files x E] */
    unsigned *counts_host;        /* page-locked copy */
    tern_event counts_ev;
    int counts_pending;
    long steps, readings;
    float *score;                 /* [n_files x E] */
    int *slot_of;                 /* [n_files x E]: its slot, -1 none, -2 being copied in */
    int *held;                    /* [n_files x S]: the expert in the slot, -1 none */
    int *busy;                    /* [n_files x S]: a copy into it in flight */
    tern_stream copy;
    tern_event repointed;         /* the session's stream passed the evictions' table words */
    pending pend[MAX_PENDING];
    tern_event free_ev[MAX_PENDING];
    int n_pend, n_free_ev;
    const uint8_t **words;        /* page-locked ring of table words */
    int next_word;
    uint64_t hits, misses, promoted;   /* counted experts found in a slot or not; copies started */
    /* prefill staging: two buffers of a whole file each, their tables,
     * the file each holds (or is being filled with; -1 none) */
    uint8_t *stage[2];
    const uint8_t **stage_table[2];
    int stage_file[2];
    const uint8_t **stage_words;  /* page-locked [n_files x E]: each file's staged table */
    tern_event staged[2], freed[2];
    uint64_t staged_bytes;
};

/* ---- setup ---------------------------------------------------------------- */

/* One expert file: its blobs into mapped host memory, the first sc->S of
 * them into device memory (the cache starts there), the table. */
static int stream_file(tern_model *m, gpu_model *g, int f, const uint8_t **tab, tern_error *err) {
    gpu_slot_cache *sc = g->sc;
    int E = sc->E;
    if (sc->disk) {   /* the slots start empty; an expert not in one has no address */
        if (!(g->slot_mem[f] = tern_cuda_alloc((size_t)sc->S * sc->stride, err))) return -1;
        for (int e = 0; e < E; e++) tab[e] = NULL, sc->slot_of[(size_t)f * E + e] = -1;
        if (!(g->table[f] = tern_cuda_alloc((size_t)E * sizeof *tab, err))) return -1;
        return tern_cuda_upload((void *)g->table[f], tab, (size_t)E * sizeof *tab, err);
    }
    size_t stride = sc->stride, bytes = (size_t)E * stride, sbytes = (size_t)sc->S * stride;
    void *dev_home = NULL;
    if (!(g->home[f] = tern_cuda_host_alloc_mapped(bytes, &dev_home, err))) return -1;
    sc->dev_home[f] = dev_home;
    memcpy(g->home[f], m->expert_maps[f], bytes);
    if (!(g->slot_mem[f] = tern_cuda_alloc(sbytes, err)) || tern_cuda_upload(g->slot_mem[f], g->home[f], sbytes, err))
        return -1;
    for (int e = 0; e < E; e++) {
        int in = e < sc->S;
        tab[e] = in ? g->slot_mem[f] + (size_t)e * stride : (const uint8_t *)dev_home + (size_t)e * stride;
        sc->slot_of[(size_t)f * E + e] = in ? e : -1;
        if (in) sc->held[(size_t)f * sc->S + e] = e;
    }
    if (!(g->table[f] = tern_cuda_alloc((size_t)E * sizeof *tab, err))) return -1;
    return tern_cuda_upload((void *)g->table[f], tab, (size_t)E * sizeof *tab, err);
}

static int cache_alloc(gpu_slot_cache *sc, tern_error *err) {
    size_t fe = (size_t)sc->n_files * sc->E, fs = (size_t)sc->n_files * sc->S;
    sc->dev_home = calloc((size_t)sc->n_files, sizeof *sc->dev_home);
    sc->score = calloc(fe, sizeof *sc->score);
    sc->slot_of = malloc(fe * sizeof *sc->slot_of);
    sc->held = malloc(fs * sizeof *sc->held);
    sc->busy = calloc(fs, sizeof *sc->busy);
    if (!sc->dev_home || !sc->score || !sc->slot_of || !sc->held || !sc->busy) return tern_fail(err, "out of memory");
    for (size_t i = 0; i < fs; i++) sc->held[i] = -1;
    if (!(sc->counts = tern_cuda_alloc(fe * sizeof *sc->counts, err)) ||
        tern_cuda_fill(sc->counts, 0, fe * sizeof *sc->counts, NULL, err) ||
        !(sc->counts_host = tern_cuda_host_alloc(fe * sizeof *sc->counts_host, err)) ||
        !(sc->words = tern_cuda_host_alloc(WORDS * sizeof *sc->words, err)) ||
        !(sc->copy = tern_cuda_stream_create(err)) || !(sc->counts_ev = tern_cuda_event_create(err)) ||
        !(sc->repointed = tern_cuda_event_create(err)))
        return -1;
    for (int i = 0; i < MAX_PENDING; i++)
        if (!(sc->free_ev[sc->n_free_ev++] = tern_cuda_event_create(err))) return -1;
    return tern_cuda_sync(NULL, err);
}

static int stage_alloc(gpu_slot_cache *sc, tern_error *err) {
    size_t bytes = (size_t)sc->E * sc->stride;
    const uint8_t **tab = malloc((size_t)sc->E * sizeof *tab);
    if (!tab) return tern_fail(err, "out of memory");
    if (!(sc->stage_words = tern_cuda_host_alloc((size_t)sc->n_files * sc->E * sizeof *tab, err))) {
        free(tab);
        return -1;
    }
    int rc = 0;
    for (int b = 0; rc == 0 && b < 2; b++) {
        sc->stage_file[b] = -1;
        if (!(sc->stage[b] = tern_cuda_alloc(bytes, err)) ||
            !(sc->stage_table[b] = tern_cuda_alloc((size_t)sc->E * sizeof *tab, err)) ||
            !(sc->staged[b] = tern_cuda_event_create(err)) || !(sc->freed[b] = tern_cuda_event_create(err))) {
            rc = -1;
            break;
        }
        for (int e = 0; e < sc->E; e++) tab[e] = sc->stage[b] + (size_t)e * sc->stride;
        rc = tern_cuda_upload((void *)sc->stage_table[b], tab, (size_t)sc->E * sizeof *tab, err);
    }
    free(tab);
    if (rc) tern_err_prefix(err, "GPU: the prefill staging buffers (2 x %zu bytes)", bytes);
    return rc;
}

/* disk: the reader of the model's expert files (decoder layers only). */
static int disk_open(const tern_model *m, gpu_slot_cache *sc, tern_error *err) {
    sc->want = calloc((size_t)sc->E, 1);
    sc->ids = malloc((size_t)sc->E * sizeof *sc->ids);
    if (!sc->want || !sc->ids) return tern_fail(err, "out of memory");
    int hs = m->cfg.top_k > HOST_SLOTS ? m->cfg.top_k : HOST_SLOTS;
    sc->io = tern_model_expert_reader(m, sc->n_files, hs < sc->E ? hs : sc->E, TERN_EXPERT_LRU, IO_THREADS, err);
    return sc->io ? 0 : -1;
}

int tern_gpu_experts_stream(tern_model *m, gpu_model *g, tern_error *err) {
    int nf = g->n_expert_files, E = m->man.n_experts;
    uint64_t per_slot = (uint64_t)m->man.stride * (uint64_t)nf, slots = m->gpu_expert_budget / per_slot;
    if (slots < (uint64_t)m->cfg.top_k)
        return tern_fail(err, "GPU: an expert budget of %llu bytes gives %llu slots per layer; at least top_k = %d "
                              "are needed (a budget of %llu bytes)",
                         (unsigned long long)m->gpu_expert_budget, (unsigned long long)slots, m->cfg.top_k,
                         (unsigned long long)(per_slot * (uint64_t)m->cfg.top_k));
    if (slots > (uint64_t)E) slots = (uint64_t)E;
    g->home = calloc((size_t)nf, sizeof *g->home);
    g->slot_mem = calloc((size_t)nf, sizeof *g->slot_mem);
    g->table = calloc((size_t)nf, sizeof *g->table);
    g->sc = calloc(1, sizeof *g->sc);
    const uint8_t **tab = malloc((size_t)E * sizeof *tab);
    if (!g->home || !g->slot_mem || !g->table || !g->sc || !tab) {
        free(tab);
        return tern_fail(err, "out of memory");
    }
    *g->sc = (gpu_slot_cache){.n_files = nf, .E = E, .S = (int)slots, .lru = m->gpu_expert_policy == TERN_POLICY_LRU,
                              .disk = m->gpu_expert_home == TERN_HOME_DISK, .stride = m->man.stride};
    int rc = cache_alloc(g->sc, err) || stage_alloc(g->sc, err) ? -1 : 0;
    if (rc == 0 && g->sc->disk) rc = disk_open(m, g->sc, err);
    for (int f = 0; rc == 0 && f < nf; f++)
        if ((rc = stream_file(m, g, f, tab, err)) != 0)
            tern_err_prefix(err, "GPU: the experts of layer %d under the budget", f);
    free(tab);
    return rc;
}

void tern_gpu_experts_free(gpu_model *g) {
    gpu_slot_cache *sc = g->sc;
    for (int f = 0; g->home && f < g->n_expert_files; f++) {
        tern_cuda_host_free(g->home[f]);
        tern_cuda_free(g->slot_mem[f]);
        tern_cuda_free((void *)g->table[f]);
    }
    free(g->home);
    free(g->slot_mem);
    free(g->table);
    if (!sc) return;
    if (sc->copy) tern_cuda_sync(sc->copy, NULL);
    for (int i = 0; i < sc->n_pend; i++) tern_cuda_event_destroy(sc->pend[i].done);
    for (int i = 0; i < sc->n_free_ev; i++) tern_cuda_event_destroy(sc->free_ev[i]);
    for (int b = 0; b < 2; b++) {
        tern_cuda_free(sc->stage[b]);
        tern_cuda_free((void *)sc->stage_table[b]);
        tern_cuda_event_destroy(sc->staged[b]);
        tern_cuda_event_destroy(sc->freed[b]);
    }
    tern_cuda_event_destroy(sc->counts_ev);
    tern_cuda_event_destroy(sc->repointed);
    if (sc->copy) tern_cuda_stream_destroy(sc->copy);
    tern_cuda_free(sc->counts);
    tern_cuda_host_free(sc->counts_host);
    tern_cuda_host_free((void *)sc->words);
    tern_cuda_host_free((void *)sc->stage_words);
    if (sc->io) tern_expert_cache_destroy(sc->io);
    free(sc->want);
    free(sc->ids);
    free(sc->dev_home);
    free(sc->score);
    free(sc->slot_of);
    free(sc->held);
    free(sc->busy);
    free(sc);
}

/* ---- counting --------------------------------------------------------------- */

int tern_gpu_experts_count(const tern_session *s, int l, const int32_t *ids, int n, tern_error *err) {
    const gpu_model *gm = s->m->gpu;
    const gpu_slot_cache *sc = gm->sc;
    if (!sc || sc->disk || l >= sc->n_files) return 0;
    const gpu_session *g = s->state;
    return tern_cuda_count_experts(ids, n, sc->E, sc->counts + (size_t)l * sc->E, g->stream, err);
}

/* ---- promotions ------------------------------------------------------------- */

/* Enqueues on s the table word of expert e of file f: addr. */
static int set_word(const gpu_model *g, gpu_slot_cache *sc, tern_stream s, int f, int e, const uint8_t *addr,
                    tern_error *err) {
    const uint8_t **w = sc->words + sc->next_word;
    sc->next_word = (sc->next_word + 1) % WORDS;
    *w = addr;
    return tern_cuda_copy_host((void *)(g->table[f] + e), w, sizeof *w, 0, s, err);
}

/* Repoints the experts whose copies into their slots are done. */
static int finish_copies(const gpu_model *g, gpu_slot_cache *sc, tern_stream s, tern_error *err) {
    for (int i = 0; i < sc->n_pend;) {
        pending *p = &sc->pend[i];
        if (!tern_cuda_event_done(p->done)) {
            i++;
            continue;
        }
        if (set_word(g, sc, s, p->f, p->e, g->slot_mem[p->f] + (size_t)p->slot * sc->stride, err)) return -1;
        sc->slot_of[(size_t)p->f * sc->E + p->e] = p->slot;
        sc->busy[(size_t)p->f * sc->S + p->slot] = 0;
        sc->free_ev[sc->n_free_ev++] = p->done;
        *p = sc->pend[--sc->n_pend];
    }
    return 0;
}

/* The best-scored expert of file f without a slot, and the slot (not being
 * filled) whose expert scores least; 0 when none would gain. */
static int pick(const gpu_slot_cache *sc, int f, int *e_in, int *slot) {
    const float *sc_f = sc->score + (size_t)f * sc->E;
    const int *slot_of = sc->slot_of + (size_t)f * sc->E, *held = sc->held + (size_t)f * sc->S;
    int best = -1, worst = -1;
    for (int e = 0; e < sc->E; e++)
        if (slot_of[e] == -1 && (best < 0 || sc_f[e] > sc_f[best])) best = e;
    float worst_score = 0;
    for (int v = 0; v < sc->S; v++) {
        if (sc->busy[(size_t)f * sc->S + v]) continue;
        float w = held[v] < 0 ? -1.0f : sc_f[held[v]];
        if (worst < 0 || w < worst_score) worst = v, worst_score = w;
    }
    /* LFU: a margin, so two experts of equal use do not trade places */
    float bar = sc->lru ? worst_score : 1.25f * worst_score + 0.5f;
    if (best < 0 || worst < 0 || !(sc_f[best] > bar)) return 0;
    *e_in = best;
    *slot = worst;
    return 1;
}

/* Starts the copies of up to PROMOTE_ROUND experts into slots, layers in
 * turn; their evicted experts are repointed at their homes first. */
static int promote(const gpu_model *g, gpu_slot_cache *sc, tern_stream s, tern_error *err) {
    int f_of[PROMOTE_ROUND], slot_of[PROMOTE_ROUND], e_of[PROMOTE_ROUND], n = 0;
    for (int more = 1; more && n < PROMOTE_ROUND;) {
        more = 0;
        for (int f = 0; f < sc->n_files && n < PROMOTE_ROUND && sc->n_free_ev > n; f++) {
            int e, v;
            if (!pick(sc, f, &e, &v)) continue;
            int old = sc->held[(size_t)f * sc->S + v];
            if (old >= 0) {
                if (set_word(g, sc, s, f, old, sc->dev_home[f] + (size_t)old * sc->stride, err)) return -1;
                sc->slot_of[(size_t)f * sc->E + old] = -1;
            }
            sc->held[(size_t)f * sc->S + v] = e;
            sc->slot_of[(size_t)f * sc->E + e] = -2;
            sc->busy[(size_t)f * sc->S + v] = 1;
            f_of[n] = f, slot_of[n] = v, e_of[n] = e, n++;
            more = 1;
        }
    }
    if (!n) return 0;
    /* the copies wait until the stream has passed the evictions' words */
    if (tern_cuda_event_record(sc->repointed, s, err) || tern_cuda_stream_wait(sc->copy, sc->repointed, err)) return -1;
    for (int i = 0; i < n; i++) {
        pending *p = &sc->pend[sc->n_pend++];
        *p = (pending){f_of[i], slot_of[i], e_of[i], sc->free_ev[--sc->n_free_ev]};
        sc->promoted++;
        const uint8_t *src = g->home[p->f] + (size_t)p->e * sc->stride;
        if (tern_cuda_copy(g->slot_mem[p->f] + (size_t)p->slot * sc->stride, src, sc->stride, sc->copy, err) ||
            tern_cuda_event_record(p->done, sc->copy, err))
            return -1;
    }
    return 0;
}

/* The counts read back: hits and misses (as the slots stand now, which
 * is near enough for statistics), scores updated, then promotions. */
static int take_counts(const gpu_model *g, gpu_slot_cache *sc, tern_stream s, tern_error *err) {
    size_t fe = (size_t)sc->n_files * sc->E;
    float now = (float)++sc->readings;
    for (size_t i = 0; i < fe; i++) {
        unsigned n = sc->counts_host[i];
        if (sc->slot_of[i] >= 0) sc->hits += n;
        else sc->misses += n;
        if (sc->lru) sc->score[i] = n ? now : sc->score[i];
        else sc->score[i] = DECAY * sc->score[i] + (float)n;
    }
    return promote(g, sc, s, err);
}

/* ---- prefill staging ---------------------------------------------------------- */

/* Whether a piece of T tokens stages its layers: when its T x top_k
 * choices are at least the experts per layer, nearly all of them are
 * used, and one copy of those without a slot beats reading them over the
 * link from the kernels; and only where one stream orders the pieces (as for
 * promotions), since the buffers are the model's. */
static gpu_slot_cache *staging(const tern_session *s, int T) {
    const gpu_model *gm = s->m->gpu;
    gpu_slot_cache *sc = gm->sc;
    if (!sc || T <= SUB || (int64_t)T * s->m->cfg.top_k < sc->E) return NULL;
    return gm->serial || atomic_load(&((gpu_model *)gm)->sessions) <= 1 ? sc : NULL;
}

/* File f into buffer b on the copy stream, once the MoE that last read
 * the buffer is done: the buffer's table sends each expert held in a slot
 * there (no promotion starts within a piece, and one in flight has not
 * repointed its expert yet), every other to its place in the buffer, and
 * the runs of those others are copied from their homes. The table comes
 * from the file's own page-locked words, free again once the piece ends
 * synchronised. */
static int stage_copy(const gpu_model *g, gpu_slot_cache *sc, int f, int b, tern_error *err) {
    const int *slot_of = sc->slot_of + (size_t)f * sc->E;
    const uint8_t **tab = sc->stage_words + (size_t)f * sc->E;
    for (int e = 0; e < sc->E; e++)
        tab[e] = slot_of[e] >= 0 ? g->slot_mem[f] + (size_t)slot_of[e] * sc->stride : sc->stage[b] + (size_t)e * sc->stride;
    sc->stage_file[b] = f;
    if (tern_cuda_stream_wait(sc->copy, sc->freed[b], err) ||
        tern_cuda_copy_host((void *)sc->stage_table[b], tab, (size_t)sc->E * sizeof *tab, 0, sc->copy, err))
        return -1;
    for (int e0 = 0; e0 < sc->E;) {
        if (slot_of[e0] >= 0) {
            e0++;
            continue;
        }
        int e1 = e0 + 1;
        while (e1 < sc->E && slot_of[e1] < 0) e1++;
        size_t off = (size_t)e0 * sc->stride, bytes = (size_t)(e1 - e0) * sc->stride;
        if (tern_cuda_copy(sc->stage[b] + off, g->home[f] + off, bytes, sc->copy, err)) return -1;
        sc->staged_bytes += bytes;
        e0 = e1;
    }
    return tern_cuda_event_record(sc->staged[b], sc->copy, err);
}

/* RAM home: the staged copy of layer l for a large piece. */
static int ram_ready(const tern_session *s, int l, int T, tern_cuda_experts *ex, tern_error *err) {
    gpu_slot_cache *sc = staging(s, T);
    if (!sc) return 0;
    const gpu_model *g = s->m->gpu;
    int b = l & 1;
    if (sc->stage_file[b] != l && stage_copy(g, sc, l, b, err)) return -1;
    if (l + 1 < sc->n_files && sc->stage_file[b ^ 1] != l + 1 && stage_copy(g, sc, l + 1, b ^ 1, err)) return -1;
    if (tern_cuda_stream_wait(((gpu_session *)s->state)->stream, sc->staged[b], err)) return -1;
    ex->blobs = sc->stage_table[b];
    return 0;
}

/* ---- disk home ------------------------------------------------------------------ */

/* The slot of file f to take for a new expert: an empty one, else the
 * worst-scored whose expert the step does not use. */
static int victim(const gpu_slot_cache *sc, int f) {
    const int *held = sc->held + (size_t)f * sc->S;
    const float *score = sc->score + (size_t)f * sc->E;
    int best = -1;
    for (int v = 0; v < sc->S; v++) {
        if (held[v] < 0) return v;
        if (sc->want[held[v]]) continue;
        if (best < 0 || score[held[v]] < score[held[best]]) best = v;
    }
    return best;
}

/* Reads experts e[0..n) of file f from disk, HOST_SLOTS at a time, and
 * hands each blob to put (which uploads it). */
typedef int (*put_fn)(const gpu_model *g, gpu_slot_cache *sc, tern_stream st, int f, int e, const uint8_t *blob,
                      tern_error *err);

static int disk_read(const gpu_model *g, gpu_slot_cache *sc, tern_stream st, int f, const int *e, int n, put_fn put,
                     tern_error *err) {
    int wave = tern_expert_cache_slots(sc->io);
    for (int i0 = 0; i0 < n; i0 += wave) {
        int k = n - i0 < wave ? n - i0 : wave, rc = 0;
        tern_expert_batch b;
        if (tern_expert_cache_begin(sc->io, f, e + i0, k, &b, err)) return -1;
        for (int i = 0; rc == 0 && i < k; i++) {
            const uint8_t *blob = tern_expert_batch_wait(&b, i, err);
            rc = blob ? put(g, sc, st, f, e[i0 + i], blob, err) : -1;
        }
        tern_expert_batch_end(&b);
        if (rc) return -1;
    }
    return 0;
}

/* An expert into a slot (synchronously: the step's earlier work is done),
 * the table words of the expert it evicts (no address) and its own. */
static int put_slot(const gpu_model *g, gpu_slot_cache *sc, tern_stream st, int f, int e, const uint8_t *blob,
                    tern_error *err) {
    int v = victim(sc, f);
    if (v < 0) return tern_fail(err, "layer %d: no slot free for expert %d", f, e);
    int *held = sc->held + (size_t)f * sc->S, *slot_of = sc->slot_of + (size_t)f * sc->E;
    uint8_t *dst = g->slot_mem[f] + (size_t)v * sc->stride;
    if (tern_cuda_upload(dst, blob, sc->stride, err)) return -1;
    if (held[v] >= 0) {
        slot_of[held[v]] = -1;
        if (set_word(g, sc, st, f, held[v], NULL, err)) return -1;
    }
    held[v] = e;
    slot_of[e] = v;
    sc->promoted++;
    return set_word(g, sc, st, f, e, dst, err);
}

/* An expert into its place in the staging buffer of file f. */
static int put_stage(const gpu_model *g, gpu_slot_cache *sc, tern_stream st, int f, int e, const uint8_t *blob,
                     tern_error *err) {
    return tern_cuda_upload(sc->stage[f & 1] + (size_t)e * sc->stride, blob, sc->stride, err);
}

/* Disk home: the piece's ids of layer f back on the host (after a sync,
 * so the step's earlier work is done), scored; then the missing ones into
 * slots, or where they are more than the slots, every chosen expert into
 * the staging buffer (those in slots copied over on the device). */
static int disk_ready(const tern_session *s, int f, int T, tern_cuda_experts *ex, tern_error *err) {
    const gpu_model *g = s->m->gpu;
    gpu_slot_cache *sc = g->sc;
    gpu_session *gs = s->state;
    int nk = T * s->m->cfg.top_k, n = 0, miss = 0;
    /* the slots and their record are the model's, changed by the host here */
    if (!g->serial && atomic_load(&((gpu_model *)g)->sessions) > 1)
        return tern_fail(err, "expert_home disk: a model with several sessions must use them one call at a time "
                              "(tern_load_params.serial_sessions)");
    if (tern_cuda_sync(gs->stream, err) || tern_cuda_download(gs->host_ids, gs->ids, (size_t)nk * sizeof(int32_t), err))
        return -1;
    for (int i = 0; i < nk; i++)
        if (gs->host_ids[i] < 0 || gs->host_ids[i] >= sc->E)
            return tern_fail(err, "layer %d: the router chose expert %d of %d", f, gs->host_ids[i], sc->E);
    float *score = sc->score + (size_t)f * sc->E;
    const int *slot_of = sc->slot_of + (size_t)f * sc->E;
    if (f == 0 && ++sc->readings % COUNT_STEPS == 0 && !sc->lru)
        for (size_t i = 0; i < (size_t)sc->n_files * sc->E; i++) sc->score[i] *= DECAY;
    for (int i = 0; i < nk; i++) {
        int e = gs->host_ids[i];
        if (slot_of[e] >= 0) sc->hits++;
        else sc->misses++;
        score[e] = sc->lru ? (float)sc->readings : score[e] + 1.0f;
        if (!sc->want[e]) sc->want[e] = 1, sc->ids[n++] = e;
    }
    /* the misses first in ids[0..miss) */
    for (int i = 0; i < n; i++)
        if (slot_of[sc->ids[i]] < 0) {
            int t = sc->ids[miss];
            sc->ids[miss++] = sc->ids[i];
            sc->ids[i] = t;
        }
    int rc;
    if (n <= sc->S) {
        rc = disk_read(g, sc, gs->stream, f, sc->ids, miss, put_slot, err);
    } else {
        int b = f & 1;
        rc = disk_read(g, sc, gs->stream, f, sc->ids, miss, put_stage, err);
        for (int i = miss; rc == 0 && i < n; i++) {
            int e = sc->ids[i];
            rc = tern_cuda_copy(sc->stage[b] + (size_t)e * sc->stride, g->slot_mem[f] + (size_t)slot_of[e] * sc->stride,
                                sc->stride, gs->stream, err);
        }
        ex->blobs = sc->stage_table[b];
    }
    for (int i = 0; i < n; i++) sc->want[sc->ids[i]] = 0;
    return rc;
}

int tern_gpu_experts_ready(const tern_session *s, int l, int T, tern_cuda_experts *ex, tern_error *err) {
    const gpu_slot_cache *sc = ((const gpu_model *)s->m->gpu)->sc;
    if (!sc || l >= sc->n_files) return 0;
    return sc->disk ? disk_ready(s, l, T, ex, err) : ram_ready(s, l, T, ex, err);
}

int tern_gpu_experts_done(const tern_session *s, int l, int T, tern_error *err) {
    gpu_slot_cache *sc = staging(s, T);
    if (!sc || sc->disk || l >= sc->n_files) return 0;
    int b = l & 1;
    if (tern_cuda_event_record(sc->freed[b], ((gpu_session *)s->state)->stream, err)) return -1;
    /* the next piece stages again: promotions may have moved experts */
    if (l == sc->n_files - 1) sc->stage_file[0] = sc->stage_file[1] = -1;
    return l + 2 < sc->n_files ? stage_copy(s->m->gpu, sc, l + 2, b, err) : 0;
}

int tern_gpu_experts_on_disk(const gpu_model *g) { return g->sc && g->sc->disk; }

int tern_gpu_experts_verify(const tern_model *m, tern_error *err) {
    const gpu_model *g = m->gpu;
    const gpu_slot_cache *sc = g ? g->sc : NULL;
    if (!sc) return tern_fail(err, "the model streams no experts on a GPU");
    if (tern_cuda_sync(sc->copy, err) || tern_cuda_sync(NULL, err)) return -1;
    const uint8_t **tab = malloc((size_t)sc->E * sizeof *tab);
    if (!tab) return tern_fail(err, "out of memory");
    int rc = 0;
    for (int f = 0; rc == 0 && f < sc->n_files; f++) {
        if ((rc = tern_cuda_download(tab, g->table[f], (size_t)sc->E * sizeof *tab, err))) break;
        for (int e = 0; e < sc->E; e++) {
            int v = sc->slot_of[(size_t)f * sc->E + e];
            /* an expert being copied in still reads its home */
            const uint8_t *want = v >= 0     ? g->slot_mem[f] + (size_t)v * sc->stride
                                  : sc->disk ? NULL
                                             : sc->dev_home[f] + (size_t)e * sc->stride;
            if (v >= 0 && sc->held[(size_t)f * sc->S + v] != e) {
                rc = tern_fail(err, "layer %d: expert %d has slot %d, which holds expert %d", f, e, v,
                               sc->held[(size_t)f * sc->S + v]);
                break;
            }
            if (tab[e] != want) {
                rc = tern_fail(err, "layer %d: the device table sends expert %d to %p, the host's model to %p (%s)", f,
                               e, (const void *)tab[e], (const void *)want, v >= 0 ? "its slot" : "its home");
                break;
            }
        }
    }
    free(tab);
    return rc;
}

void tern_gpu_stream_stats(const tern_model *m, tern_stream_stats *out) {
    const gpu_model *g = m->gpu;
    const gpu_slot_cache *sc = g ? g->sc : NULL;
    if (!sc) return;
    out->streaming = 1;
    out->slots_per_layer = sc->S;
    out->hits = sc->hits;
    out->misses = sc->misses;
    out->bytes_read = (sc->misses + sc->promoted) * (uint64_t)sc->stride + sc->staged_bytes;
    if (sc->disk) {   /* what came from the files */
        tern_expert_stats io;
        tern_expert_cache_stats(sc->io, &io);
        out->bytes_read = io.bytes_read;
        out->read_s = io.read_s;
        out->wait_s = io.wait_s;
        out->direct_io = io.direct_io;
    }
}

int tern_gpu_experts_tick(tern_session *s, tern_error *err) {
    const gpu_model *gm = s->m->gpu;
    gpu_slot_cache *sc = gm->sc;
    if (!sc || sc->disk || !(gm->serial || atomic_load(&((gpu_model *)gm)->sessions) <= 1)) return 0;
    /* a serial session taking over from another: that one's last steps may
     * still read the slots; this step's launch waits for them, the next
     * tick goes on */
    if (gm->serial && gm->last && gm->last != s) return 0;
    tern_stream st = ((gpu_session *)s->state)->stream;
    if (finish_copies(gm, sc, st, err)) return -1;
    if (sc->counts_pending && tern_cuda_event_done(sc->counts_ev)) {
        sc->counts_pending = 0;
        if (take_counts(gm, sc, st, err)) return -1;
    }
    if (sc->counts_pending || ++sc->steps % COUNT_STEPS) return 0;
    size_t bytes = (size_t)sc->n_files * sc->E * sizeof *sc->counts;
    if (tern_cuda_copy_host(sc->counts_host, sc->counts, bytes, 1, st, err) ||
        tern_cuda_fill(sc->counts, 0, bytes, st, err) || tern_cuda_event_record(sc->counts_ev, st, err))
        return -1;
    sc->counts_pending = 1;
    return 0;
}

#endif
