/* What the endpoints share: the server's context, errors in each API's own
 * envelope, the request fields common to several APIs (sampling, stop
 * strings, tools, messages), prompt building, and the encoder interface
 * that turns a job's events into one API's JSON or SSE frames.
 *
 * Each endpoint (api_chat.c: chat completions and completions,
 * api_responses.c, api_messages.c) parses its request into a job and an
 * encoder; http.c submits the job and feeds the encoder. */
#ifndef TERN_SERVER_API_H
#define TERN_SERVER_API_H

#include <jansson.h>
#include <pthread.h>

#include "server/job.h"
#include "server/sbuf.h"
#include "server/sched.h"
#include "tern.h"

typedef struct srv_store srv_store;

/* What every request sees: the tokenizer, the scheduler (which owns the
 * model, loaded or not) and the settings. */
typedef struct srv_ctx {
    tern_tokenizer *tok;
    pthread_mutex_t tok_mu;          /* the tokenizer's encode is not thread-safe */
    srv_sched *sched;
    srv_store *responses;            /* stored responses for previous_response_id */
    const char *model_id;            /* the name responses carry */
    int strict_model;                /* refuse requests naming another model */
    int n_ctx;                       /* context length of every session */
    int think;                       /* thinking on when a request does not say */
    int preserve_thinking;           /* earlier turns' reasoning kept, when a request does not say */
    int concise;                     /* the concise system prompt added to every conversation (prompt_view.c) */
    tern_sampler_params sampling;    /* generation_config.json with the command line's overrides */
    int fixed_seed;                  /* sampling.seed seeds every request that gives none (else a random one) */
    int max_tokens;                  /* default limit (< 0: the context's end) */
    int ignore_eos;                  /* default for the ignore_eos request field */
    int mtp;                         /* default for the mtp request field (tern serve --mtp) */
    const char *mtp_why;             /* why the model cannot draft (no MTP head, the GPU), or NULL */
    tern_grammar_vocab *gvocab;      /* the tokenizer's vocabulary for structured output */
} srv_ctx;

/* ---- errors ------------------------------------------------------------ */

typedef enum srv_api_kind { SRV_API_OPENAI, SRV_API_ANTHROPIC } srv_api_kind;

typedef struct srv_err {
    int status;                      /* HTTP status */
    const char *type;                /* NULL: from the status */
    const char *code;                /* OpenAI's code, or NULL */
    char param[96];                  /* the field at fault, or "" */
    char msg[512];
} srv_err;

/* Fills e (param may be NULL) and returns -1. */
int srv_fail(srv_err *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The error as the API writes it: OpenAI's {"error": {message, type, param,
 * code}} or Anthropic's {"type": "error", "error": {type, message}}. */
json_t *srv_error_json(srv_api_kind api, const srv_err *e);

/* ---- request fields ---------------------------------------------------- */

/* A field that is absent or null. */
int srv_absent(json_t *req, const char *key);
/* The model field: a string when present; with strict_model it must be the
 * served id. */
int srv_check_model(const srv_ctx *c, json_t *req, int required, srv_err *e);
int srv_get_bool(json_t *req, const char *key, int dflt, int *out, srv_err *e);
int srv_get_int(json_t *req, const char *key, long long lo, long long hi, long long dflt, long long *out, srv_err *e);
int srv_get_number(json_t *req, const char *key, double lo, double hi, double dflt, double *out, srv_err *e);

/* temperature, top_p, top_k, min_p, presence/frequency/repetition penalties
 * and seed onto the server's defaults (j->sampling), and mtp, the drafts a
 * step of speculative decoding (j->mtp). max_temp: the API's range. */
int srv_parse_sampling(const srv_ctx *c, json_t *req, double max_temp, srv_job *j, srv_err *e);
/* A stop string or a list of them (key names the field) into the job. */
int srv_parse_stop(json_t *req, const char *key, srv_job *j, srv_err *e);
/* ignore_eos (a vLLM extension, for benchmarks) onto the server's default. */
int srv_parse_ignore_eos(const srv_ctx *c, json_t *req, srv_job *j, srv_err *e);
/* The job's token limit from the request's field (absent: dflt; < 0: the
 * context's end), clamped to what the context leaves after the prompt. */
int srv_parse_max_tokens(const srv_ctx *c, json_t *req, const char *key, int required, int dflt, srv_job *j,
                         srv_err *e);

/* Checks an OpenAI-style tools array ([{type: "function", function: {name,
 * description?, parameters?}}]) and returns a new reference (NULL: none). */
int srv_check_tools(json_t *tools, const char *param, json_t **out, srv_err *e);

/* ---- conversations ----------------------------------------------------- */

/* Turns leading system messages into one and checks the conversation the
 * chat template will render: roles, content types, tool calls answered
 * exactly once by tool messages (ids unique). Takes messages (OpenAI chat
 * form, normalized by the caller) and returns the checked array (new
 * reference). param: how the API names its messages field. */
json_t *srv_check_conversation(json_t *messages, const char *param, srv_err *e);

/* The chat template takes a system message only before the conversation,
 * so the APIs that allow one later (Responses, Messages) make system and
 * developer messages after the first other one user turns (in msgs, as
 * copies), before srv_check_conversation. */
void srv_late_system_as_user(json_t *msgs);

/* A message's content (a string, null, or text parts) as one string (new
 * reference), the parts joined by sep (the chat template joins OpenAI's
 * with nothing); other part types are refused naming their type. */
json_t *srv_text_content(json_t *content, const char *param, const char *sep, srv_err *e);

typedef struct srv_prompt_opts {
    int thinking;                    /* enable_thinking */
    int preserve_thinking;
} srv_prompt_opts;

/* ---- views of a conversation (prompt_view.c) ---------------------------- */

struct srv_constraint;

/* Whether model (or the request's "model") names the fast view: "<id>-fast"
 * (without strict_model, any name but the id that ends in "-fast"). */
int srv_model_is_fast(const srv_ctx *c, const char *model);
int srv_model_fast(const srv_ctx *c, json_t *req);
/* The fast view in place of a conversation as an API assembled it in chat
 * form, before srv_late_system_as_user and srv_check_conversation (*msgs,
 * *tools: new references, replaced): no system, developer or tool messages
 * wherever they stand, no tools (nor k's forced calls; k may be NULL), no
 * tool calls, no <system-reminder> blocks, no user turn those cuts empty
 * while another keeps text. A conversation that would keep no user turn
 * stays as it was (the checker judges it); so does any message of a role
 * the view does not know. */
void srv_fast_view(json_t **msgs, json_t **tools, struct srv_constraint *k);
/* msgs with the concise prompt after the system message's text, or as the
 * system message when there is none (new reference). */
json_t *srv_concise_view(json_t *msgs);

/* Renders the conversation with the chat template and tokenizes it into
 * the job: the prompt, its boundary (the tokens before the generation
 * prompt), whether it opens the reasoning; refuses a prompt the context
 * cannot hold. tools may be NULL. */
/* A prompt the sessions can hold: within the context, and within what the
 * KV budget gives one request (where the model is loaded); a 400 naming
 * param (code context_length_exceeded) otherwise. */
int srv_check_prompt_len(const srv_ctx *c, const srv_job *j, const char *param, srv_err *e);
int srv_build_chat_prompt(srv_ctx *c, json_t *messages, json_t *tools, const srv_prompt_opts *o, srv_job *j,
                          srv_err *e);
/* Tokenizes text (locks the tokenizer). */
int srv_tokenize(srv_ctx *c, const char *text, size_t len, int32_t **ids, size_t *n, srv_err *e);

/* ---- structured output ------------------------------------------------- */

/* What a request asks to enforce: the answer's form and forced tool calls. */
typedef struct srv_constraint {
    json_t *schema;                  /* a JSON Schema (borrowed), or NULL */
    int json_object;                 /* any JSON object */
    const char *gbnf;                /* a GBNF grammar (borrowed), or NULL */
    const char *form_param;          /* the field that asked for the form, for errors */
    int tools_required;              /* tool_choice: required / a named function / any / tool */
    const char *tool_name;           /* a named function, or NULL */
    const char *tool_param;          /* the field that asked for the calls, for errors */
} srv_constraint;

/* Compiles the constraint into j->grammar (nothing when there is none):
 * tools (chat form, may be NULL) are the calls that may or must come,
 * parallel 0 allows one; with thinking on (j->start_in_reasoning) the
 * grammar starts after the reasoning. Call after the prompt is built.
 * 400 naming the field and what cannot be enforced. */
int srv_build_grammar(srv_ctx *c, const srv_constraint *k, json_t *tools, int parallel, srv_job *j, srv_err *e);
/* response_format / text.format / output_config.format: {"type": "text" |
 * "json_object" | "json_schema", ...} into k (param names the field;
 * schema_in_member: the schema sits in json_schema.schema (Chat) rather
 * than beside the type (Responses, Anthropic)). */
int srv_parse_format(json_t *fmt, const char *param, int schema_in_member, srv_constraint *k, srv_err *e);

/* "prefix" + 32 random hex digits. */
void srv_new_id(char *out, size_t cap, const char *prefix);

/* A JSON string of bytes that may not be valid UTF-8 (a token's bytes):
 * invalid sequences become U+FFFD. */
json_t *srv_json_bytes(const char *s, size_t n);
/* [b0, b1, ...] of the bytes. */
json_t *srv_json_byte_list(const char *s, size_t n);

/* ---- encoders ---------------------------------------------------------- */

typedef struct srv_enc srv_enc;
struct srv_enc {
    int stream;
    srv_api_kind api;
    /* stream: the frames sent before any event (e.g. message_start) */
    void (*start)(srv_enc *e, sbuf *out);
    /* stream: the frames for one event (an ERROR ends the stream in the
     * API's own way); otherwise collects it (never an ERROR: http.c answers
     * a failed whole response with the API's error envelope) */
    void (*event)(srv_enc *e, const srv_event *ev, sbuf *out);
    /* not stream, after DONE: the response body (status 200) */
    void (*body)(srv_enc *e, sbuf *out);
    /* stream: a keep-alive while nothing else is sent; NULL: the SSE
     * comment ": ping" */
    void (*heartbeat)(srv_enc *e, sbuf *out);
    void (*destroy)(srv_enc *e);
    char id[64];                 /* the response's id as the client sees it (the request log names it) */
};

/* The endpoints: each parses the request, fills the job (prompt, limits,
 * parsing) and returns its encoder, or fails with e set. */
srv_enc *srv_chat_prepare(srv_ctx *c, json_t *req, srv_job *j, srv_err *e);
srv_enc *srv_completions_prepare(srv_ctx *c, json_t *req, srv_job *j, srv_err *e);
srv_enc *srv_responses_prepare(srv_ctx *c, json_t *req, srv_job *j, srv_err *e);
srv_enc *srv_messages_prepare(srv_ctx *c, json_t *req, srv_job *j, srv_err *e);
/* An Anthropic request's system, messages and tools as a checked chat
 * conversation and chat tools (NULL: none), in the fast view when fast;
 * single: one tool call ends the turn; k (may be NULL) gets a forced tool
 * choice. */
int srv_messages_conversation(json_t *req, int fast, json_t **msgs, json_t **tools, int *single, srv_constraint *k,
                              srv_err *e);
/* Responses input (a string or items) appended to msgs as chat messages,
 * roles as sent (srv_late_system_as_user makes them renderable). */
int srv_responses_input(json_t *input, json_t *msgs, srv_err *e);
/* POST /v1/messages/count_tokens: the body {"input_tokens": N}. */
json_t *srv_count_tokens(srv_ctx *c, json_t *req, srv_err *e);

/* The responses store (api_responses.c). */
srv_store *srv_store_create(int capacity);
void srv_store_destroy(srv_store *s);

#endif
