/* The scheduler's state, shared by sched.c (the queue, the slots, the
 * steps) and resident.c (loading and freeing the model). Private to the
 * two. */
#ifndef TERN_SERVER_SCHED_INT_H
#define TERN_SERVER_SCHED_INT_H

#include <pthread.h>

#include "server/pcache.h"
#include "server/sched.h"

/* One kept session. toks[0..n_toks) are the ids its state holds when live. */
typedef struct slot {
    tern_session *s;             /* NULL while the model is not loaded */
    int32_t *toks;
    int n_toks, cap;
    int live;                    /* the session's state is toks[0..n_toks) */
    uint64_t used;               /* last use, for LRU */
    /* the checkpoint (pc_node_serial) whose KV rows the session holds as
     * they are: restored from it or taken from it; 0: none */
    uint64_t ckpt;
    int busy;                    /* a running job holds it */
} slot;

struct srv_sched {
    tern_tokenizer *tok;
    srv_sched_params p;
    srv_done_fn on_done;
    void *ud;
    slot *slots;
    uint64_t clock;
    pcache *cache;               /* NULL: off (set at the first load, under mu) */
    srv_cache_stats cs;          /* the counters (under mu) */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* work arrived / the thread went idle / an unload is done (monotonic) */
    srv_job *qhead, *qtail;
    int n_queued;
    /* the running jobs, at most max_seqs (the list under mu); each its own
     * allocation, since its parser and generation point at it */
    struct active **act;
    int n_act, max_seqs;
    int cap_seqs;                /* act's length: max_seqs for a model that batches */
    float *logits;               /* a step's rows, max_seqs x vocab (while loaded) */
    struct active *pre;          /* the job being prefilled in steps (one at a time, so a job admitted
                                  * after it finds its checkpoints); NULL: none */
    int chunk;                   /* its prompt tokens a step while others generate */
    int closed;                  /* no new jobs */
    int quit;                    /* the thread ends once the queue is empty */
    /* residency (resident.c) */
    tern_model *m;               /* NULL while not loaded (set under mu) */
    srv_residency rs;            /* the state and counters (under mu) */
    int unload_asked;            /* under mu: srv_sched_unload waits for the thread to clear it */
    double idle_since;           /* when the thread last had work (its own) */
    /* the KV budget */
    srv_kv_stats kv;             /* the counters (under mu) */
    int n_parked;                /* running jobs preempted, waiting for rows (the thread's own) */
    uint64_t admitted;           /* jobs admitted so far: the newest is preempted first */
};

/* Waits, the lock held, until a job is queued or running, freeing the
 * model meanwhile when that is asked for or falls due. 1: the thread
 * ends. */
int sched_wait_work(srv_sched *s);
/* Loads the model for the queued jobs (the lock not held); a failure
 * answers every queued job with an error. */
void sched_load_for_queue(srv_sched *s);
/* Loads the model (the lock not held): srv_sched_create's. */
int sched_load(srv_sched *s, tern_error *err);
/* Frees the model, the sessions and the cache (the thread has ended). */
void sched_free_resident(srv_sched *s);
/* A job queued, one running that has not answered yet, or a load (the
 * lock held). A job that answered may still be taking its checkpoints:
 * an unload asked for waits for that. */
int sched_in_use(srv_sched *s);
/* Takes every queued job out of the queue (the lock held); the list
 * follows qnext and the caller owns the queue's references. */
srv_job *sched_take_queue(srv_sched *s);

#endif
