#include "util/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

/* A decode step is hundreds of short parallel loops one after another: a
 * worker that has just finished one spins briefly for the next before it
 * sleeps on the condition variable, and the caller spins briefly for the
 * workers to finish, so back-to-back loops skip the sleep/wake round trip
 * (tens of microseconds each on a VM). The mutex/condvar handshake stays
 * the protocol; spinning only shortcuts the wait. */
#define SPIN_ROUNDS 4000

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

struct tern_pool {
    int n;                    /* threads including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    _Atomic uint64_t generation;   /* bumped for each parallel loop */
    _Atomic int pending;      /* workers still running the current loop */
    _Atomic int quit;
    /* the current loop */
    tern_range_fn fn;
    void *ctx;
    int64_t total;
};

typedef struct {
    tern_pool *p;
    int index;                /* 1..n-1; the caller is 0 */
} worker_arg;

static void range_of(int64_t total, int n, int i, int64_t *b, int64_t *e) {
    *b = total * i / n;
    *e = total * (i + 1) / n;
}

static void *worker_main(void *arg) {
    worker_arg *w = arg;
    tern_pool *p = w->p;
    uint64_t seen = 0;
    for (;;) {
        for (int i = 0; i < SPIN_ROUNDS && atomic_load(&p->generation) == seen && !atomic_load(&p->quit); i++)
            cpu_relax();
        pthread_mutex_lock(&p->mu);
        while (!p->quit && p->generation == seen) pthread_cond_wait(&p->start, &p->mu);
        if (p->quit) { pthread_mutex_unlock(&p->mu); break; }
        seen = p->generation;
        tern_range_fn fn = p->fn;
        void *ctx = p->ctx;
        int64_t b, e;
        range_of(p->total, p->n, w->index, &b, &e);
        pthread_mutex_unlock(&p->mu);

        if (b < e) fn(ctx, b, e);

        pthread_mutex_lock(&p->mu);
        if (atomic_fetch_sub(&p->pending, 1) == 1) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
    free(w);
    return NULL;
}

tern_pool *tern_pool_create(int n_threads) {
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    tern_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) { free(p); return NULL; }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *w = malloc(sizeof *w);
        if (w) { w->p = p; w->index = i; }
        if (!w || pthread_create(&p->threads[i], NULL, worker_main, w) != 0) {
            free(w);
            p->n = i;   /* run with the threads we got */
            break;
        }
    }
    return p;
}

void tern_pool_destroy(tern_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->start);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p);
}

int tern_pool_size(const tern_pool *p) { return p ? p->n : 1; }

void tern_pool_for(tern_pool *p, int64_t n, tern_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (!p || p->n == 1 || n == 1) { fn(ctx, 0, n); return; }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->total = n;
    p->pending = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);

    int64_t b, e;
    range_of(n, p->n, 0, &b, &e);
    if (b < e) fn(ctx, b, e);

    for (int i = 0; i < SPIN_ROUNDS && atomic_load(&p->pending) > 0; i++) cpu_relax();
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
