/* The model's residency: the scheduler's thread loads it when a job finds
 * it missing and frees it when asked or after the idle time (sched.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "server/metrics.h"
#include "server/sched_int.h"
#include "util/clock.h"
#include "util/err.h"

const char *srv_model_state_name(srv_model_state st) {
    return st == SRV_MODEL_LOADED ? "loaded" : st == SRV_MODEL_LOADING ? "loading" : "unloaded";
}

static double mib(long long bytes) { return (double)bytes / (1 << 20); }

/* The prefix cache at the first load, with its disk tier when one is asked
 * for. */
static int cache_create(srv_sched *s, const srv_loaded *ld, tern_error *err) {
    pcache *c = pcache_create(ld->cache_vram_bytes, ld->cache_ram_bytes);
    if (!c) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return -1;
    }
    if (s->p.cache_disk) {
        pcdisk *d = pcdisk_open(s->p.cache_disk, ld->m, err);
        if (!d) {
            tern_err_prefix(err, "--cache-disk");
            pcache_destroy(c);
            return -1;
        }
        pcache_attach_disk(c, d, s->p.cache_disk_bytes);
        int n = pcache_adopt_disk(c, err);
        if (n < 0) fprintf(stderr, "tern serve: the prefix cache's disk tier starts empty: %s\n", err->msg);
        else if (n > 0) fprintf(stderr, "tern serve: prefix cache: %d checkpoints kept in %s\n", n, s->p.cache_disk);
    }
    pthread_mutex_lock(&s->mu);
    s->cache = c;
    s->cs.enabled = 1;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* The most positions one job's rows may reach within the KV budget (the
 * rows grow in steps, so this is where a step would pass it). */
static int kv_limit(srv_sched *s, const tern_model *m, tern_error *err) {
    const tern_session *ss = s->slots[0].s;
    uint64_t budget = s->p.kv_budget;
    int ctx = s->p.session.max_context > 0 ? s->p.session.max_context : tern_model_max_context(m);
    if (tern_session_kv_bytes_at(ss, 1, 1) > budget)
        return tern_fail(err, "kv_budget: %llu bytes is less than one request's first KV rows (%llu bytes)",
                         (unsigned long long)budget, (unsigned long long)tern_session_kv_bytes_at(ss, 1, 1));
    int lo = 1, hi = ctx;   /* lo fits; the answer is in [lo, hi] */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (tern_session_kv_bytes_at(ss, mid, 1) <= budget) lo = mid;
        else hi = mid - 1;
    }
    pthread_mutex_lock(&s->mu);
    s->kv.budget = budget;
    s->kv.max_tokens = lo;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* The sessions, the step's logits and the cache for a loaded model. */
static int bind_model(srv_sched *s, const srv_loaded *ld, tern_error *err) {
    int seqs = tern_model_batches(ld->m) ? s->cap_seqs : 1;
    pthread_mutex_lock(&s->mu);
    s->max_seqs = seqs;
    pthread_mutex_unlock(&s->mu);
    s->logits = malloc((size_t)seqs * (size_t)tern_model_vocab_size(ld->m) * sizeof *s->logits);
    if (!s->logits) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return -1;
    }
    if (s->cache && pcache_rebind(s->cache, ld->m, err)) return -1;
    if (!s->cache && (ld->cache_ram_bytes || ld->cache_vram_bytes) && cache_create(s, ld, err)) return -1;
    /* every slot's session now, so no request waits for one (a GPU session
     * allocates its buffers), and a budget too small fails at the load */
    for (int i = 0; i < s->p.n_slots; i++) {
        if ((s->slots[i].s = tern_session_create(ld->m, &s->p.session, err)) &&
            (!s->p.mtp_track || tern_session_set_mtp(s->slots[i].s, 1, err) == 0))
            continue;
        if (s->slots[i].s) tern_err_prefix(err, "--mtp");   /* the model cannot draft */
        else tern_err_prefix(err, "session %d of %d (n_slots)", i + 1, s->p.n_slots);
        return -1;
    }
    return s->p.kv_budget ? kv_limit(s, ld->m, err) : 0;
}

/* Frees the sessions (their slots forget what they held), the logits and
 * the model. */
static void release_model(srv_sched *s, tern_model *m) {
    for (int i = 0; s->slots && i < s->p.n_slots; i++) {
        slot *sl = &s->slots[i];
        tern_session_destroy(sl->s);
        free(sl->toks);
        *sl = (slot){.used = sl->used};
    }
    free(s->logits);
    s->logits = NULL;
    if (s->cache) pcache_rebind(s->cache, NULL, NULL);
    tern_model_free(m);
}

int sched_load(srv_sched *s, tern_error *err) {
    double t0 = tern_now_s();
    pthread_mutex_lock(&s->mu);
    s->rs.state = SRV_MODEL_LOADING;
    pthread_mutex_unlock(&s->mu);
    srv_loaded ld = {0};
    int rc = s->p.load(s->p.load_ud, &ld, err);
    if (rc == 0 && bind_model(s, &ld, err)) {
        release_model(s, ld.m);
        rc = -1;
    }
    pthread_mutex_lock(&s->mu);
    s->rs.state = rc == 0 ? SRV_MODEL_LOADED : SRV_MODEL_UNLOADED;
    if (rc == 0) {
        s->m = ld.m;
        s->rs.loads++;
        s->rs.last_load_s = tern_now_s() - t0;
    } else {
        s->rs.load_failures++;
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    s->idle_since = tern_now_s();
    return rc;
}

void sched_load_for_queue(srv_sched *s) {
    tern_error err = {{0}};
    long long before = srv_rss_bytes();
    if (sched_load(s, &err) == 0) {
        fprintf(stderr, "tern serve: model loaded on %s in %.2f s (resident memory %.0f MiB -> %.0f MiB)\n",
                tern_model_device(s->m), s->rs.last_load_s, mib(before), mib(srv_rss_bytes()));
        return;
    }
    fprintf(stderr, "tern serve: the model could not be loaded: %s\n", err.msg);
    char msg[sizeof err.msg + 96];
    snprintf(msg, sizeof msg, "the model could not be loaded: %s (the next request tries again)", err.msg);
    pthread_mutex_lock(&s->mu);
    srv_job *list = sched_take_queue(s);
    pthread_mutex_unlock(&s->mu);
    for (srv_job *j = list, *next; j; j = next) {
        next = j->qnext;
        srv_event *ev = srv_event_text(SRV_EV_ERROR, msg, strlen(msg));
        if (ev) {
            ev->status = 500;
            srv_job_push(j, ev);
        }
        srv_job_release(j);   /* (no event: the reader's wait ends with the release) */
    }
}

/* Frees the model (the lock held, released meanwhile): the prefix cache's
 * checkpoints in memory go to its disk tier (or are dropped), the
 * sessions and the model are freed, and the allocator gives the pages
 * back. */
static void unload(srv_sched *s, const char *why) {
    tern_model *m = s->m;
    s->m = NULL;
    s->rs.state = SRV_MODEL_UNLOADED;
    pthread_mutex_unlock(&s->mu);
    long long before = srv_rss_bytes();
    if (s->cache) pcache_evict_memory(s->cache);
    release_model(s, m);
#ifdef __GLIBC__
    malloc_trim(0);
#endif
    fprintf(stderr, "tern serve: model unloaded (%s): resident memory %.0f MiB -> %.0f MiB\n", why, mib(before),
            mib(srv_rss_bytes()));
    pthread_mutex_lock(&s->mu);
    s->rs.unloads++;
    s->kv.held = 0;   /* (the sessions and their rows are gone) */
}

/* Waits on the condition until the monotonic time `until` (the lock held). */
static void wait_until(srv_sched *s, double until) {
    double whole = (double)(time_t)until;
    struct timespec ts = {.tv_sec = (time_t)until, .tv_nsec = (long)((until - whole) * 1e9)};
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
}

int sched_wait_work(srv_sched *s) {
    for (;;) {
        int loaded = s->rs.state == SRV_MODEL_LOADED;
        if (s->unload_asked && !s->n_act) {
            /* (asked while idle: a job queued since loads the model again) */
            if (loaded) unload(s, "on request");
            s->unload_asked = 0;
            pthread_cond_broadcast(&s->cv);
            continue;
        }
        if (s->qhead || s->n_act) return 0;
        if (s->quit) return 1;
        if (!loaded || s->p.idle_unload_s <= 0) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        double due = s->idle_since + s->p.idle_unload_s;
        if (tern_now_s() < due) {
            wait_until(s, due);
            continue;
        }
        char why[64];
        snprintf(why, sizeof why, "idle for %g s", s->p.idle_unload_s);
        unload(s, why);
    }
}

void sched_free_resident(srv_sched *s) {
    /* the checkpoints first: one in device memory needs the model's device */
    tern_error err;
    int n = s->cache ? pcache_persist(s->cache, &err) : 0;
    if (n < 0) fprintf(stderr, "tern serve: the prefix cache's disk tier was not kept: %s\n", err.msg);
    else if (n > 0) fprintf(stderr, "tern serve: prefix cache: %d checkpoints kept in %s\n", n, s->p.cache_disk);
    pcache_destroy(s->cache);
    s->cache = NULL;
    release_model(s, s->m);
    s->m = NULL;
}

int srv_sched_unload(srv_sched *s) {
    pthread_mutex_lock(&s->mu);
    int rc = SRV_UNLOAD_OK;
    if (sched_in_use(s)) {
        rc = SRV_UNLOAD_BUSY;
    } else if (s->rs.state == SRV_MODEL_LOADED && !s->quit) {
        s->unload_asked = 1;
        pthread_cond_broadcast(&s->cv);
        while (s->unload_asked) pthread_cond_wait(&s->cv, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void srv_sched_residency(srv_sched *s, srv_residency *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->rs;
    pthread_mutex_unlock(&s->mu);
}

int srv_sched_stream_stats(srv_sched *s, tern_stream_stats *out) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&s->mu);
    /* (the model is freed only after s->m is cleared under the lock) */
    if (s->m) tern_model_stream_stats(s->m, out);
    int rc = s->m ? 0 : -1;
    pthread_mutex_unlock(&s->mu);
    return rc;
}
