#include "experts/cache.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"
#include "util/file.h"
#include "util/clock.h"

enum { SLOT_EMPTY, SLOT_LOADING, SLOT_READY };

typedef struct {
    int expert;             /* -1 when empty */
    int state;
    int pins;               /* batches using it; pinned slots are never evicted */
    uint64_t last_use;      /* tick of the last request (LRU, and LFU ties) */
    int io_err;             /* why its last read failed: an errno, or -1 for end of file */
    uint64_t io_at;         /* bytes of the blob read when it failed */
} slot_t;

typedef struct {
    int fd;
    char *path;             /* a copy: the caller's paths need not outlive create */
    uint8_t *mem;           /* slots x stride, 4 KiB aligned for O_DIRECT */
    slot_t *slots;
    int *where;             /* [n_experts] slot holding the expert, or -1 */
    uint64_t *requests;     /* [n_experts] lifetime requests (LFU) */
} layer_t;

typedef struct {
    int layer, slot, expert;
} read_job;

struct tern_expert_cache {
    tern_expert_cache_params p;
    layer_t *layers;
    pthread_mutex_t mu;
    pthread_cond_t done;    /* a read finished */
    pthread_cond_t work;    /* a read was queued */
    read_job *queue;        /* ring buffer */
    int q_head, q_len, q_cap;
    pthread_t *io;
    int n_io, quit;
    uint64_t tick;
    tern_expert_stats st;
};

/* ---- I/O workers -------------------------------------------------------- */

/* 0, or why the read failed: an errno, or -1 when the file ended before
 * the blob did (truncated since it was opened); *at gets the bytes read. */
static int read_blob(tern_expert_cache *c, const read_job *j, uint64_t *at) {
    const layer_t *L = &c->layers[j->layer];
    uint8_t *dst = L->mem + (size_t)j->slot * c->p.stride;
    off_t off = (off_t)((uint64_t)j->expert * c->p.stride);
    size_t done = 0;
    while (done < c->p.stride) {
        ssize_t n = pread(L->fd, dst + done, c->p.stride - done, off + (off_t)done);
        if (n < 0 && errno == EINTR) continue;
        *at = done;
        if (n < 0) return errno ? errno : EIO;
        if (n == 0) return -1;
        done += (size_t)n;
    }
    /* Without O_DIRECT, drop what the read left in the page cache so the
     * budget stays the footprint. */
    if (!c->st.direct_io) posix_fadvise(L->fd, off, (off_t)c->p.stride, POSIX_FADV_DONTNEED);
    return 0;
}

static void *io_main(void *arg) {
    tern_expert_cache *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->quit && c->q_len == 0) pthread_cond_wait(&c->work, &c->mu);
        if (c->quit) break;
        read_job j = c->queue[c->q_head];
        c->q_head = (c->q_head + 1) % c->q_cap;
        c->q_len--;
        pthread_mutex_unlock(&c->mu);

        double t0 = tern_now_s();
        uint64_t at = 0;
        int rc = read_blob(c, &j, &at);
        double dt = tern_now_s() - t0;

        pthread_mutex_lock(&c->mu);
        layer_t *L = &c->layers[j.layer];
        c->st.read_s += dt;
        if (rc == 0) {
            L->slots[j.slot].state = SLOT_READY;
            c->st.bytes_read += c->p.stride;
        } else {
            /* a failed read leaves the slot empty; the waiter reports it */
            L->slots[j.slot].state = SLOT_EMPTY;
            L->slots[j.slot].expert = -1;
            L->slots[j.slot].io_err = rc;
            L->slots[j.slot].io_at = at;
            L->where[j.expert] = -1;
        }
        pthread_cond_broadcast(&c->done);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ---- create / destroy --------------------------------------------------- */

static int open_layer(tern_expert_cache *c, int l, const char *path, tern_error *err) {
    layer_t *L = &c->layers[l];
    L->path = strdup(path);
    if (!L->path) return tern_fail(err, "out of memory");
    L->fd = tern_file_open(path, O_DIRECT, err);
    if (L->fd < 0 && errno == EINVAL) {        /* e.g. tmpfs: no direct I/O */
        L->fd = tern_file_open(path, 0, err);
        c->st.direct_io = 0;
    }
    if (L->fd < 0) return -1;
    struct stat st;
    uint64_t want = (uint64_t)c->p.n_experts * c->p.stride;
    if (fstat(L->fd, &st) != 0 || (uint64_t)st.st_size != want)
        return tern_fail(err, "%s: expert file is %lld bytes, expected %llu (%d experts x %llu)", path,
                         (long long)st.st_size, (unsigned long long)want, c->p.n_experts,
                         (unsigned long long)c->p.stride);
    size_t bytes = (size_t)c->p.slots * c->p.stride;
    if (posix_memalign((void **)&L->mem, 4096, bytes) != 0) {
        L->mem = NULL;
        return tern_fail(err, "out of memory for %d expert slots (%zu bytes)", c->p.slots, bytes);
    }
    L->slots = calloc((size_t)c->p.slots, sizeof *L->slots);
    L->where = malloc((size_t)c->p.n_experts * sizeof *L->where);
    L->requests = calloc((size_t)c->p.n_experts, sizeof *L->requests);
    if (!L->slots || !L->where || !L->requests) return tern_fail(err, "out of memory");
    for (int s = 0; s < c->p.slots; s++) L->slots[s].expert = -1;
    for (int e = 0; e < c->p.n_experts; e++) L->where[e] = -1;
    return 0;
}

tern_expert_cache *tern_expert_cache_create(const tern_expert_cache_params *p, tern_error *err) {
    if (p->stride == 0 || p->stride % 4096 != 0) {
        tern_fail(err, "expert stride %llu is not a multiple of 4096", (unsigned long long)p->stride);
        return NULL;
    }
    if (p->slots < 1 || p->slots > p->n_experts || p->slots > TERN_EXPERT_BATCH_MAX) {
        tern_fail(err, "expert slots per layer %d out of range [1, %d]", p->slots, p->n_experts);
        return NULL;
    }
    tern_expert_cache *c = calloc(1, sizeof *c);
    if (!c) { tern_fail(err, "out of memory"); return NULL; }
    c->p = *p;
    c->p.paths = NULL;   /* each layer keeps its own copy */
    c->st.direct_io = 1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->done, NULL);
    pthread_cond_init(&c->work, NULL);
    c->q_cap = p->slots * 2 + 16;
    c->queue = malloc((size_t)c->q_cap * sizeof *c->queue);
    c->layers = calloc((size_t)p->n_layers, sizeof *c->layers);
    int ok = c->queue && c->layers;
    if (!ok) tern_fail(err, "out of memory");
    for (int l = 0; ok && l < p->n_layers; l++) c->layers[l].fd = -1;
    for (int l = 0; ok && l < p->n_layers; l++)
        if (open_layer(c, l, p->paths[l], err) != 0) ok = 0;
    int n_io = p->io_threads > 0 ? p->io_threads : 4;
    c->io = ok ? calloc((size_t)n_io, sizeof *c->io) : NULL;
    for (int i = 0; ok && c->io && i < n_io; i++) {
        if (pthread_create(&c->io[i], NULL, io_main, c) != 0) break;
        c->n_io++;
    }
    if (!ok || c->n_io == 0) {
        if (ok) tern_fail(err, "cannot start expert I/O threads");
        tern_expert_cache_destroy(c);
        return NULL;
    }
    return c;
}

void tern_expert_cache_destroy(tern_expert_cache *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->quit = 1;
    pthread_cond_broadcast(&c->work);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < c->n_io; i++) pthread_join(c->io[i], NULL);
    for (int l = 0; c->layers && l < c->p.n_layers; l++) {
        layer_t *L = &c->layers[l];
        if (L->fd >= 0) close(L->fd);
        free(L->path);
        free(L->mem);
        free(L->slots);
        free(L->where);
        free(L->requests);
    }
    free(c->layers);
    free(c->queue);
    free(c->io);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->done);
    pthread_cond_destroy(&c->work);
    free(c);
}

/* ---- planning ----------------------------------------------------------- */

/* The slot to refill: an empty one if any, else the unpinned resident one
 * the policy ranks lowest (LFU: fewest lifetime requests, ties to the least
 * recently used; LRU: least recently used). */
static int pick_victim(tern_expert_cache *c, layer_t *L) {
    int best = -1;
    for (int s = 0; s < c->p.slots; s++) {
        slot_t *x = &L->slots[s];
        if (x->pins > 0 || x->state == SLOT_LOADING) continue;
        if (x->expert < 0) return s;
        if (best < 0) { best = s; continue; }
        slot_t *b = &L->slots[best];
        int better;
        if (c->p.policy == TERN_EXPERT_LFU && L->requests[x->expert] != L->requests[b->expert])
            better = L->requests[x->expert] < L->requests[b->expert];
        else
            better = x->last_use < b->last_use;
        if (better) best = s;
    }
    return best;
}

static void enqueue(tern_expert_cache *c, read_job j) {
    c->queue[(c->q_head + c->q_len) % c->q_cap] = j;
    c->q_len++;
}

int tern_expert_cache_begin(tern_expert_cache *c, int layer, const int *ids, int n, tern_expert_batch *b,
                            tern_error *err) {
    if (layer < 0 || layer >= c->p.n_layers) return tern_fail(err, "expert layer %d out of range", layer);
    if (n > c->p.slots)
        return tern_fail(err, "%d experts requested at once but only %d slots per layer", n, c->p.slots);
    b->c = c;
    b->layer = layer;
    b->n = 0;
    layer_t *L = &c->layers[layer];
    pthread_mutex_lock(&c->mu);
    c->tick++;
    int rc = 0, queued = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        int e = ids[i];
        if (e < 0 || e >= c->p.n_experts) { rc = tern_fail(err, "expert id %d out of range", e); break; }
        L->requests[e]++;
        int s = L->where[e];
        if (s >= 0) {
            c->st.hits++;
        } else {
            s = pick_victim(c, L);
            if (s < 0) { rc = tern_fail(err, "no evictable expert slot in layer %d", layer); break; }
            slot_t *x = &L->slots[s];
            if (x->expert >= 0) L->where[x->expert] = -1;
            x->expert = e;
            x->state = SLOT_LOADING;
            L->where[e] = s;
            enqueue(c, (read_job){layer, s, e});
            queued++;
            c->st.misses++;
        }
        L->slots[s].pins++;
        L->slots[s].last_use = c->tick;
        b->slot[i] = s;
        b->expert[i] = e;
        b->pending[i] = L->slots[s].state == SLOT_LOADING;
        b->n = i + 1;
    }
    if (queued) pthread_cond_broadcast(&c->work);
    pthread_mutex_unlock(&c->mu);
    if (rc != 0) tern_expert_batch_end(b);
    return rc;
}

int tern_expert_batch_is_hit(const tern_expert_batch *b, int i) { return !b->pending[i]; }

const uint8_t *tern_expert_batch_wait(tern_expert_batch *b, int i, tern_error *err) {
    tern_expert_cache *c = b->c;
    layer_t *L = &c->layers[b->layer];
    slot_t *x = &L->slots[b->slot[i]];
    if (b->pending[i]) {
        double t0 = tern_now_s();
        pthread_mutex_lock(&c->mu);
        while (x->state == SLOT_LOADING) pthread_cond_wait(&c->done, &c->mu);
        int failed = x->state != SLOT_READY, why = x->io_err;
        uint64_t at = x->io_at;
        c->st.wait_s += tern_now_s() - t0;
        pthread_mutex_unlock(&c->mu);
        if (failed) {
            uint64_t off = (uint64_t)b->expert[i] * c->p.stride + at;
            if (why < 0)
                tern_fail(err, "%s: expert %d: the file ends at byte %llu, inside the expert (truncated since "
                               "the model was loaded?)", L->path, b->expert[i], (unsigned long long)off);
            else
                tern_fail(err, "%s: expert %d: read failed at byte %llu: %s", L->path, b->expert[i],
                          (unsigned long long)off, strerror(why));
            return NULL;
        }
        b->pending[i] = 0;
    }
    return L->mem + (size_t)b->slot[i] * c->p.stride;
}

void tern_expert_batch_end(tern_expert_batch *b) {
    tern_expert_cache *c = b->c;
    layer_t *L = &c->layers[b->layer];
    pthread_mutex_lock(&c->mu);
    /* A batch ended before its reads finished must not unpin a slot that
     * is still being written. */
    for (int i = 0; i < b->n; i++)
        while (L->slots[b->slot[i]].state == SLOT_LOADING) pthread_cond_wait(&c->done, &c->mu);
    for (int i = 0; i < b->n; i++) L->slots[b->slot[i]].pins--;
    pthread_mutex_unlock(&c->mu);
    b->n = 0;
}

void tern_expert_cache_stats(const tern_expert_cache *c, tern_expert_stats *out) {
    pthread_mutex_lock((pthread_mutex_t *)&c->mu);
    *out = c->st;
    pthread_mutex_unlock((pthread_mutex_t *)&c->mu);
}

int tern_expert_cache_slots(const tern_expert_cache *c) { return c->p.slots; }
