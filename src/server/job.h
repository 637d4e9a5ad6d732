/* A generation job: what one API request asks the engine for (the prompt as
 * token ids, sampling, limits, how to parse the output), and the channel its
 * results come back on.
 *
 * The HTTP thread that received the request builds the job and submits it
 * to the scheduler (sched.h), then pops events until DONE or ERROR. The
 * scheduler's thread runs the generation and pushes the events. Both hold a
 * reference; the last release frees the job. Events are the API-neutral
 * output of one generation; each endpoint's encoder turns them into its own
 * JSON or SSE frames. */
#ifndef TERN_SERVER_JOB_H
#define TERN_SERVER_JOB_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "tern.h"

typedef enum srv_ev_kind {
    SRV_EV_CONTENT,      /* answer text */
    SRV_EV_REASONING,    /* reasoning text */
    SRV_EV_TOOL_CALL,    /* one complete call: name, arguments (JSON object text), index */
    SRV_EV_LOGPROBS,     /* one generated token's log-probabilities (lp), with its bytes in text */
    SRV_EV_DONE,         /* the end: finish reason and usage */
    SRV_EV_ERROR,        /* the end, failed: text is the message */
} srv_ev_kind;

typedef enum srv_finish {
    SRV_FINISH_EOS,      /* the model ended its turn */
    SRV_FINISH_LENGTH,   /* max tokens, or the context is full */
    SRV_FINISH_STOP,     /* a stop string (stop_index says which) */
    SRV_FINISH_TOOL,     /* a tool call ended the turn where only one was allowed */
    SRV_FINISH_CANCEL,   /* the client went away or the server is stopping */
} srv_finish;

typedef struct srv_usage {
    int prompt_tokens;       /* the whole prompt */
    int cached_tokens;       /* of which restored or continued, not prefilled */
    int completion_tokens;   /* generated, the final EOS included */
    int reasoning_tokens;    /* of which inside the reasoning block */
    double queue_s;          /* submitted until the engine took it */
    double prefill_s;        /* the engine took it until the first token was drawn, of which: */
    double restore_s;        /*   a kept session reset or a checkpoint restored */
    double eval_s;           /*   the prompt evaluated, all but its last token */
    double snapshot_s;       /*   the checkpoints taken during the prefill */
    double decode_s;         /* the first token until the last */
    int mtp_drafted, mtp_accepted;   /* speculative decoding: drafts proposed, drafts kept */
} srv_usage;

typedef struct srv_bytes {
    const char *p;
    size_t n;
} srv_bytes;

typedef struct srv_event {
    struct srv_event *next;
    srv_ev_kind kind;
    char *text;              /* CONTENT, REASONING, ERROR */
    size_t len;
    char *name, *arguments;  /* TOOL_CALL */
    int index;               /* TOOL_CALL */
    tern_logprobs lp;        /* LOGPROBS, with the bytes of its token and of each top id (the
                              * tokenizer's own, valid while it lives; not NUL-terminated) */
    srv_bytes token, top[TERN_MAX_TOP_LOGPROBS];
    srv_finish finish;       /* DONE */
    int stop_index;          /* DONE with SRV_FINISH_STOP */
    srv_usage usage;         /* DONE */
    int status;              /* ERROR: the HTTP status it calls for while nothing was answered (0: a generation
                              * that failed) */
} srv_event;

void srv_event_free(srv_event *ev);
/* The event for a piece of text (CONTENT, REASONING, ERROR). */
srv_event *srv_event_text(srv_ev_kind kind, const char *text, size_t len);
/* The event for one of the output parser's (NULL for MALFORMED, which the
 * parser passes on as text itself, or when memory runs out). */
srv_event *srv_event_from_output(const tern_out_event *ev);

#define SRV_MAX_STOP 16
/* Events closer together than this reach a stream's reader together: one
 * wake-up and one write for several tokens when tokens come fast (a wake-up
 * on a machine whose cores all compute costs more than the token). */
#define SRV_WAKE_S 0.002

typedef struct srv_job {
    /* ---- the request (fixed once submitted) ---- */
    int32_t *prompt;         /* rendered and tokenized */
    int n_prompt;
    int boundary;            /* prompt tokens before the generation prompt (the chat's last message
                              * boundary): a checkpoint is taken there; 0 = none */
    int first_boundary;      /* prompt tokens of the first message (the system prompt, which
                              * conversations share): a checkpoint too; 0 = none */
    tern_sampler_params sampling;
    int max_tokens;          /* < 0: until EOS or the context's end */
    int ignore_eos;          /* generate past end-of-sequence ids (benchmarks) */
    int mtp;                 /* drafts a step of speculative decoding (0: off) */
    char *stop[SRV_MAX_STOP];
    int n_stop;
    int logprobs, top_logprobs;
    int raw_text;            /* the text as generated: no reasoning or tool-call parsing */
    int start_in_reasoning;  /* the prompt ends in an open <think> */
    int parse_tool_calls;
    int single_tool_call;    /* parallel_tool_calls false: the turn ends after one call */
    char *tools_json;        /* OpenAI-style tools for the output parser, or NULL */
    tern_grammar *grammar;   /* structured output: the grammar the generation follows (owned), or NULL */
    /* ---- the channel ---- */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_event *head, *tail;
    int ended;               /* DONE or ERROR pushed */
    int wake_at_end;         /* the reader waits for the end only (a whole response): no wake-up per event */
    double last_wake;        /* a stream's reader is woken at most once per SRV_WAKE_S, and at the end */
    atomic_int cancel;       /* set by the HTTP side: stop at the next step */
    int refs;
    double t_submit;
    /* ---- owned by the scheduler ---- */
    struct srv_job *qnext;
    int queued;
} srv_job;

srv_job *srv_job_create(void);
void srv_job_retain(srv_job *j);
void srv_job_release(srv_job *j);
/* Copies a stop string (up to SRV_MAX_STOP). */
int srv_job_add_stop(srv_job *j, const char *s);

/* Scheduler side: appends an event (the job takes it) and wakes the reader. */
void srv_job_push(srv_job *j, srv_event *ev);
/* HTTP side: the next event, waiting at most timeout_s; NULL on timeout.
 * The caller frees it. */
srv_event *srv_job_pop(srv_job *j, double timeout_s);
/* Whether DONE or ERROR was pushed (any thread). */
int srv_job_ended(srv_job *j);
/* HTTP side: waits at most timeout_s for an event and returns the first's
 * kind without taking it; -1 when none came. */
int srv_job_peek(srv_job *j, double timeout_s);

#endif
