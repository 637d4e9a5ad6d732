/* The scheduler's state, shared by sched.c (the queue, the jobs, the
 * steps), sched_slots.c (the kept sessions and their checkpoints),
 * sched_kv.c (the KV budget) and resident.c (loading and freeing the
 * model). Private to the four. */
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

/* Where a prompt starts from: a slot, the prompt tokens it will hold
 * without prefilling them, and the checkpoint to restore for that (NULL:
 * the slot's live session as it stands). */
typedef struct plan {
    slot *sl;
    int reuse;
    const pc_node *ckpt;
} plan;

typedef struct run {
    srv_sched *s;
    srv_job *j;
    slot *sl;
    tern_output_parser *parser;
    int answer_began;            /* an answer or a call came after the reasoning */
    int stop_after_call;         /* single_tool_call: the call came, end the turn */
    int n_reasoning;
    double t_first;              /* when the first token was drawn (0: none yet) */
    int failed;
} run;

/* A running job: its slot and output parser (r), the generation's
 * parameters, and in a batched scheduler its steps (gen). */
typedef struct active {
    run r;
    srv_job *j;
    srv_usage u;
    double t0;
    tern_gen_params gp;
    tern_gen *gen;
    /* the tokens its slot is brought to before it generates: the prompt,
     * or once preempted mid-generation all it held (redo, its own) */
    const int32_t *src;
    int n_src;
    int32_t *redo;
    int parked;                  /* preempted: its rows given back, it waits for room */
    int parked_at;               /* the tokens its state held then */
    uint64_t order;              /* when it was admitted */
} active;

/* sched_slots.c: a slot's ids grown by n (-1 when out of memory); where
 * a prompt starts from; the deepest cached checkpoint that starts it and
 * reuses more than beat (read back from disk if need be); the slot
 * brought to the plan's reused tokens; a checkpoint of the slot's first n
 * ids (or all it holds), evicting now when trim. */
int sched_toks_append(slot *sl, const int32_t *ids, int n);
plan sched_pick(srv_sched *s, const int32_t *prompt, int n);
pc_node *sched_cached_checkpoint(srv_sched *s, const int32_t *prompt, int n, int beat);
int sched_slot_prepare(srv_sched *s, const plan *p, const int32_t *prompt, tern_error *err);
void sched_checkpoint_at(srv_sched *s, slot *sl, int n, srv_usage *u, int trim);
void sched_checkpoint(srv_sched *s, slot *sl, srv_usage *u, int trim);

/* sched.c: a running job that ends before its generation does (rc 1:
 * cancelled, else failed with err); its place given up (the lock not
 * held); its index in act; its generation begun, or resumed, once its
 * tokens are in. */
void sched_end_early(srv_sched *s, active *a, int rc, const tern_error *err);
void sched_retire(srv_sched *s, int i);
int sched_index_of(const srv_sched *s, const active *a);
int sched_begin_gen(srv_sched *s, active *a, tern_error *err);

/* sched_kv.c: whether the queue's next job's prompt fits (idle rows given
 * back as it needs; the lock held); before a step, preempted jobs back
 * and the newest preempted until the step fits; the rows held, for the
 * metrics. */
int sched_kv_admits(srv_sched *s, const srv_job *j);
void sched_kv_balance(srv_sched *s);
void sched_kv_note(srv_sched *s);

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
