/* The scheduler: one thread that owns the engine. Jobs wait in a FIFO queue
 * (bounded); the thread takes each in turn, picks a free slot (a session
 * with the token ids it holds), reuses the longest prefix it can, and
 * generates, pushing each job's events.
 *
 * Reuse, since a Gated DeltaNet state cannot be rewound: either a slot
 * continues where its session stands, when every token it holds starts the
 * new prompt (a conversation resent with the reply as generated), or the
 * prefix cache (pcache.h, shared by all slots) restores its deepest
 * checkpoint that starts the prompt into the least recently used slot,
 * whichever reuses more. Only the rest of the prompt is prefilled;
 * usage.cached_tokens counts the reused tokens.
 *
 * Checkpoints are taken at the chat's last message boundary (the next turn
 * re-renders the reply, often without its reasoning, so this is the one it
 * hits), at the end of its first message (a system prompt other
 * conversations share), every checkpoint_interval prompt tokens (a prompt that diverges in
 * its middle resumes from the last one before), at the end of the prompt's
 * prefill, and after a generated turn.
 * Up to max_seqs jobs run together where the engine evaluates several
 * sessions in one pass (the CPU's): each step evaluates every running job's
 * next token at once (tern_session_eval_many, tern_gen's steps) and a chunk
 * of at most prefill_chunk tokens of the prompt of the one job being
 * prefilled, so a long prompt holds the others up a chunk at a time. A job
 * is admitted once the one before it is prefilled (so it finds the
 * checkpoints of a prefix they share) and leaves when its generation ends.
 * Otherwise (the GPU, whose draw stays on the device) one job runs whole at
 * a time.
 *
 * The KV budget (kv_budget): the KV rows of all slots' sessions together
 * stay within it. Before each step the idle slots give their rows back
 * (least recently used first; their states are in the prefix cache) as
 * far as the running jobs' next step needs, and where that is not enough
 * the job admitted last is preempted: its state goes to the prefix cache
 * as a checkpoint, its rows are given back, and it waits, ahead of the
 * queue, until the rows it holds fit again; then its checkpoint is
 * restored (the deepest one that starts its tokens, the rest prefilled
 * again when the cache let it go) and it goes on where it stopped. A job
 * alone always fits: its tokens are capped where its rows would pass the
 * budget (it ends with the length reason there), and a prompt longer than
 * that is refused.
 *
 * Residency (resident.c): the thread also owns the model. It loads it
 * through the caller's srv_load_fn when a job is queued and the model is
 * not loaded (once however many jobs wait; a failure answers the waiting
 * jobs and the next job tries again), and frees it, with the slots'
 * sessions and the prefix cache's device and RAM tiers (moved to the disk
 * tier where there is one), when it is asked to and no job is queued or
 * running, or after idle_unload_s without a job. So no other thread ever
 * holds a session or the model. */
#ifndef TERN_SERVER_SCHED_H
#define TERN_SERVER_SCHED_H

#include "server/job.h"
#include "server/pcache.h"
#include "tern.h"

typedef struct srv_sched srv_sched;

/* The most jobs running at once. */
#define SRV_MAX_SEQS 256
/* Prompt tokens a step for the job being prefilled while others generate
 * (srv_sched_params.prefill_chunk 0). */
#define SRV_PREFILL_CHUNK 512

/* What a load gives the scheduler: the model and the prefix cache's budgets
 * for it (host RAM, device memory; both 0: no cache). The budgets of the
 * first load that succeeds size the cache for good. */
typedef struct srv_loaded {
    tern_model *m;
    size_t cache_ram_bytes, cache_vram_bytes;
} srv_loaded;
/* Loads the model (on the scheduler's thread, or in srv_sched_create
 * unless lazy); 0, or -1 with err. */
typedef int (*srv_load_fn)(void *ud, srv_loaded *out, tern_error *err);

typedef struct srv_sched_params {
    int n_slots;                 /* sessions kept (>= 1) */
    int max_seqs;                /* jobs running together, each a step at a time, where the engine evaluates
                                  * sessions in one pass (tern_model_batches); at most n_slots; else 1 */
    int queue_limit;             /* jobs waiting beyond the running one (>= 0) */
    int prefill_chunk;           /* a prompt's tokens a step while other jobs generate; 0: SRV_PREFILL_CHUNK */
    tern_session_params session;
    int checkpoint_interval;     /* prompt tokens between checkpoints in a long prefill; 0: none */
    const char *cache_disk;      /* the cache's disk tier, a directory; NULL: none */
    size_t cache_disk_bytes;     /* its budget */
    int mtp_track;               /* every session keeps the MTP head in step (tern_session_set_mtp) */
    srv_load_fn load;            /* the model's loader and its argument */
    void *load_ud;
    int lazy;                    /* create does not load: the first job does */
    double idle_unload_s;        /* > 0: the model is freed after this long without a job */
    uint64_t kv_budget;          /* bytes of KV rows all sessions hold together; 0: no bound */
} srv_sched_params;

/* Observer of finished generations (metrics); may be NULL. */
typedef void (*srv_done_fn)(void *ud, const srv_usage *u, double ttft_s);

/* Loads the model first unless p->lazy (a failure is create's). */
srv_sched *srv_sched_create(tern_tokenizer *tok, const srv_sched_params *p, srv_done_fn on_done, void *ud,
                            tern_error *err);
/* Drains (every queued job still runs), then stops the thread and frees. */
void srv_sched_destroy(srv_sched *s);

enum { SRV_SUBMIT_OK = 0, SRV_SUBMIT_FULL = -1, SRV_SUBMIT_CLOSED = -2 };
/* Queues the job (the scheduler takes its own reference). FULL when
 * queue_limit jobs already wait, CLOSED once draining began. */
int srv_sched_submit(srv_sched *s, srv_job *j);
/* The client is gone: a queued job leaves the queue at once (its DONE
 * event, finish CANCEL, is pushed); a running one stops at its next step. */
void srv_sched_cancel(srv_sched *s, srv_job *j);
/* Refuses new jobs from now on and waits until none is queued or running. */
void srv_sched_drain(srv_sched *s);
/* Cancels every queued job (each leaves the queue at once) and running job
 * (a second stop signal). */
void srv_sched_cancel_all(srv_sched *s);

void srv_sched_load(srv_sched *s, int *queued, int *running);

typedef struct srv_cache_stats {
    int enabled;
    unsigned long long hits_live;     /* jobs that continued a live session */
    unsigned long long hits_restored; /* jobs that restored a checkpoint */
    unsigned long long misses;        /* jobs that reused nothing */
    unsigned long long restored_tokens;
    pcache_stats tiers;               /* the cache's own: bytes, checkpoints, evictions, the disk tier */
} srv_cache_stats;
/* Any thread. */
void srv_sched_cache_stats(srv_sched *s, srv_cache_stats *out);

typedef enum srv_model_state { SRV_MODEL_UNLOADED, SRV_MODEL_LOADING, SRV_MODEL_LOADED } srv_model_state;
typedef struct srv_residency {
    srv_model_state state;
    unsigned long long loads, load_failures, unloads;
    double last_load_s;              /* the last successful load's duration */
} srv_residency;
/* Any thread. */
void srv_sched_residency(srv_sched *s, srv_residency *out);
/* "unloaded", "loading" or "loaded". */
const char *srv_model_state_name(srv_model_state st);
/* The model's expert-streaming statistics; -1 (out zeroed) while it is not
 * loaded. Any thread. */
int srv_sched_stream_stats(srv_sched *s, tern_stream_stats *out);

typedef struct srv_kv_stats {
    uint64_t budget, held;             /* bytes: the bound (0: none) and the sessions' KV rows after the last step */
    int max_tokens;                    /* the most positions one job's rows may reach (0: not loaded) */
    unsigned long long preemptions;    /* jobs preempted for the budget */
    unsigned long long resumed_exact;  /* ... brought back from their own checkpoint */
    unsigned long long resumed_tokens; /* tokens computed again for the others */
} srv_kv_stats;
/* Any thread. */
void srv_sched_kv_stats(srv_sched *s, srv_kv_stats *out);

enum { SRV_UNLOAD_OK = 0, SRV_UNLOAD_BUSY = -1 };
/* Frees the model now, as an idle unload does, and returns once it is
 * freed (OK, also when it was not loaded); BUSY when a job is queued or
 * running (then nothing changes). Any thread. */
int srv_sched_unload(srv_sched *s);

#endif
