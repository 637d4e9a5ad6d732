/* tern serve: an OpenAI- and Anthropic-compatible HTTP server over the
 * public API (tern.h). The CLI fills the parameters; srv_run loads the
 * model (GET /health answers 503 meanwhile; with lazy_load the first
 * request loads it), serves until SIGINT or SIGTERM, drains the requests
 * in flight and returns the exit status. */
#ifndef TERN_SERVER_SERVER_H
#define TERN_SERVER_SERVER_H

#include <stddef.h>

#include "tern.h"

typedef struct srv_params {
    /* HTTP */
    const char *host;            /* address to bind; "127.0.0.1" unless asked */
    int port;                    /* 0: any free port (printed) */
    const char *api_key;         /* NULL: no authentication */
    size_t max_body;             /* bytes (413 beyond) */
    int max_connections;
    double read_timeout_s;       /* a request's headers and body must arrive within this */
    double idle_timeout_s;       /* a keep-alive connection with nothing to do is closed after this */
    double heartbeat_s;          /* SSE keep-alive comment while a stream waits */
    int webui;                   /* the chat page at / (src/server/web/) */
    /* the model */
    const char *model_dir;       /* a model directory, or NULL with synth */
    const tern_synth_params *synth;   /* an in-memory synthetic model (tokenizer_dir then required) */
    const char *tokenizer_dir;   /* NULL: the model directory */
    tern_load_params load;
    tern_session_params session;
    const char *model_id;        /* served name; NULL: the model directory's name */
    int lazy_load;               /* listen at once; the first request loads the model (a model directory) */
    double idle_unload_s;        /* > 0: the model is freed after this long without a request */
    int strict_model;
    /* generation */
    tern_sampler_params sampling;   /* defaults for requests that do not say */
    int fixed_seed;                 /* sampling.seed for requests without a seed (else random) */
    int max_tokens;              /* default limit; < 0: the context's end */
    int think;                   /* thinking when a request does not say */
    int preserve_thinking;       /* the chat template keeps every turn's reasoning, when a request does not say */
    int concise;                 /* a system prompt asking for short answers in every conversation */
    int ignore_eos;              /* default of the ignore_eos request field */
    int mtp;                     /* default of the mtp request field; > 0: slots keep the MTP head in step */
    /* scheduling */
    int slots, max_seqs, queue_limit, responses_store;
    int prefill_chunk;           /* a prompt's tokens a step while other requests generate; 0: the default */
    uint64_t kv_budget;          /* bytes of KV rows all sessions hold together; 0: no bound */
    int mlock;                   /* each load locks the weights in RAM (tern_model_lock) */
    long long cache_ram;         /* prefix cache's host RAM budget in bytes; < 0: default_cache_bytes */
    long long cache_vram;        /* its device memory budget (a GPU model only); < 0: 4 GiB there */
    int checkpoint_interval;     /* prompt tokens between checkpoints of a long prefill; 0: none */
    const char *cache_disk;      /* the cache's disk tier (a directory); NULL: none */
    long long cache_disk_size;   /* its budget in bytes; < 0: 16 GiB */
    FILE *log;                   /* request log; NULL: stderr */
} srv_params;

int srv_run(const srv_params *p);

#endif
