/* tern: an inference engine for Qwen 3.6 35B-A3B (Hugging Face model_type
 * `qwen3_5_moe`) and the Qwen3.5-MoE models that share its architecture.
 *
 * The whole public API is this header. A model is loaded once; a session
 * holds one sequence's state (KV cache of the full-attention layers, conv and
 * recurrent state of the Gated DeltaNet layers) and is fed tokens:
 *
 *     tern_error err;
 *     tern_model *m = tern_model_load("models/x", NULL, &err);
 *     tern_session *s = tern_session_create(m, NULL, &err);
 *     float *logits = malloc(tern_model_vocab_size(m) * sizeof(float));
 *     tern_session_eval(s, prompt, n_prompt, logits, 0, &err);  // prefill
 *     int32_t next = argmax(logits);
 *     tern_session_eval(s, &next, 1, logits, 0, &err);           // decode
 *
 * Every call that can fail takes a tern_error and on failure writes a single
 * line into err->msg and returns -1 (or NULL).
 */
#ifndef TERN_H
#define TERN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tern_error {
    char msg[512];
} tern_error;

typedef struct tern_model tern_model;
typedef struct tern_session tern_session;
typedef struct tern_snapshot tern_snapshot;

/* ---- model -------------------------------------------------------------- */

enum tern_expert_policy_kind { TERN_POLICY_LFU = 0, TERN_POLICY_LRU = 1 };
/* Where a GPU run's routed experts live outside its budget: page-locked
 * host RAM (read by the kernels over the bus), or the packed model's
 * files, read with O_DIRECT when a step needs them. */
enum tern_expert_home_kind { TERN_HOME_RAM = 0, TERN_HOME_DISK = 1 };
/* RoPE scaling: TERN_ROPE_AS_CONFIG keeps what config.json's rope_parameters
 * say; TERN_ROPE_NONE is plain RoPE; TERN_ROPE_YARN is YaRN (transformers'
 * rope_type "yarn"), which stretches the positions a model was trained on
 * (its native context) by a factor. */
enum tern_rope_scaling { TERN_ROPE_AS_CONFIG = 0, TERN_ROPE_NONE = 1, TERN_ROPE_YARN = 2 };

typedef struct tern_load_params {
    int n_threads;           /* threads for the large matrix products; 0 = all cores */
    /* Packed models only: RAM for routed experts. 0 maps every expert file
     * (resident); otherwise experts are streamed from disk into a slot cache
     * of budget / (expert blob bytes x layers) slots per layer. */
    uint64_t expert_budget;
    int expert_policy;       /* enum tern_expert_policy_kind */
    int expert_home;         /* enum tern_expert_home_kind: a GPU budget's experts (the CPU's are read from disk) */
    int io_threads;          /* parallel expert reads; 0 = 4 */
    /* 1: only the plain fp32 reference kernels (the checked baseline);
     * 0: SIMD kernels (AVX2/AVX-512) for decode-sized products, which agree
     * with the reference to rounding. */
    int reference_kernels;
    /* NULL or "cpu": the CPU engine; "cuda" / "cuda:N": a packed model with
     * resident experts runs on that GPU (a build with make CUDA=1); "auto":
     * the first GPU when the build, the machine and the model allow it, else
     * the CPU (tern_model_device says which). */
    const char *device;
    /* 1: the caller uses the model's sessions one call at a time, from one
     * thread (a server's scheduler). A GPU model then keeps its fastest
     * decode kernels however many sessions are alive (otherwise only while
     * there is one: those kernels must not share the GPU with another
     * session's), and a session's GPU work waits for the previous one's. */
    int serial_sessions;
    /* Context beyond the native one (max_position_embeddings, or a YaRN
     * config's original_max_position_embeddings). rope_scaling: enum
     * tern_rope_scaling. With TERN_ROPE_YARN the factor is rope_factor, or
     * when that is 0, rope_context / native (when both are 0, a YaRN
     * config's own factor); over a YaRN config the other YaRN fields stay
     * as it gives them. The model's context (tern_model_max_context) is
     * then native x factor. rope_factor alone changes a YaRN config's
     * factor. */
    int rope_scaling;
    double rope_factor;
    int rope_context;
    /* Debugging aids of the engines; all zero (the default) is the
     * production path. None changes the results beyond rounding. */
    struct {
        int no_graphs;       /* 1: decode steps launched op by op, never captured as CUDA graphs */
        int cpu_sampling;    /* 1: the next token drawn by the CPU sampler from downloaded logits */
        int kernel_stats;    /* enum tern_kernel_stats: GPU time per op role, printed to stderr
                              * when a session ends */
        /* A build with make CUDA=1 TRACE=1: the decode kernels' phase
         * trace (src/cuda/trace.cuh) written as CSV to this file when a
         * session ends; NULL: none. Copied at load. */
        const char *phase_trace;
        /* Tokens per GPU forward piece, 16..65536 (0: 4096; a session's
         * context caps it): small pieces put piece boundaries in short
         * prompts. */
        int piece;
        /* 1: a speculative step (tern_gen_params.mtp_depth) that keeps
         * fewer tokens than it verified restores the DeltaNet state saved
         * before the verify and evaluates the kept tokens again, as on a
         * backend that keeps no per-token state (0: the CPU keeps the
         * state after each verified token). Same results, other costs. */
        int mtp_recompute;
        /* For benchmarks only, and the one aid that changes the output:
         * in (0, 1], a speculative step keeps each draft with this
         * probability whatever the model says (drawn from the sampler's
         * random stream; the first draft not kept ends the step as a
         * rejection does), so the loop runs at a set acceptance on a
         * model whose head accepts nothing (random weights). The session
         * holds the tokens kept, as always. 0: the model decides. */
        double mtp_force_accept;
    } debug;
} tern_load_params;

/* tern_load_params.debug.kernel_stats: events around each op role (norms,
 * projections, attention, DeltaNet, router, experts, lm_head) of
 * TERN_STATS_DECODE: every decode step (graphs off), TERN_STATS_PREFILL:
 * the prefill pieces, per prompt token; TERN_STATS_GRAPH: the GPU time of
 * each replayed one-token graph against the host's wall time. */
enum tern_kernel_stats { TERN_STATS_OFF = 0, TERN_STATS_DECODE, TERN_STATS_PREFILL, TERN_STATS_GRAPH };

/* Loads a Hugging Face model directory (config.json, generation_config.json,
 * model.safetensors or model.safetensors.index.json + shards). Tensor data is
 * memory-mapped. params may be NULL. */
tern_model *tern_model_load(const char *dir, const tern_load_params *params,
                            tern_error *err);
void tern_model_free(tern_model *m);

int tern_model_vocab_size(const tern_model *m);   /* rows of the lm_head */
/* The positions a session may hold: max_position_embeddings, or with YaRN
 * the native context times its factor (when that is more). */
int tern_model_max_context(const tern_model *m);
/* 0 if a session of ctx positions fits the model's context; otherwise -1
 * with a line that says how far it reaches and how to go further. */
int tern_model_check_context(const tern_model *m, int ctx, tern_error *err);
/* End-of-sequence ids a model or a sampler holds at most. */
#define TERN_SAMPLER_MAX_EOS 16

/* What a model directory's config.json and generation_config.json say,
 * no weights read: what the loaded model's functions would give (params'
 * RoPE scaling applied). */
typedef struct tern_model_dir_info {
    int max_context;                 /* tern_model_max_context */
    int vocab_size;                  /* tern_model_vocab_size */
    int n_eos;                       /* the ids tern_model_is_eos accepts */
    int32_t eos[TERN_SAMPLER_MAX_EOS];
} tern_model_dir_info;
/* 0, or -1 with err; when ctx > 0, also -1 with tern_model_check_context's
 * line when a session of ctx positions would not fit. */
int tern_model_dir_probe(const char *dir, const tern_load_params *params, int ctx, tern_model_dir_info *out,
                         tern_error *err);
/* The RoPE in use, one line: "default" or "yarn factor F over N positions
 * ...". */
void tern_model_rope_describe(const tern_model *m, char *buf, size_t n);
int tern_model_has_mtp(const tern_model *m);
int tern_model_n_threads(const tern_model *m);
/* Bytes one decode step reads at context ctx with a kv_bits KV cache
 * (weights a token touches, KV rows, DeltaNet state read and written): the
 * numerator of the memory-bandwidth floor. 0 for unpacked models. */
uint64_t tern_model_decode_bytes(const tern_model *m, int ctx, int kv_bits);
/* Where the model runs: "cpu" or "cuda:N (device name)". */
const char *tern_model_device(const tern_model *m);
/* Decoder layers, routed experts per layer, experts per token. */
void tern_model_moe_shape(const tern_model *m, int *n_layers, int *n_experts, int *top_k);
/* 1 if id ends generation (generation_config.json's eos_token_id list). */
int tern_model_is_eos(const tern_model *m, int32_t id);

/* Prints what `tern info` shows for a model directory: architecture, RoPE
 * and context (with params' rope settings), tensor inventory, parameter
 * counts (total and active per token) and bytes per token in the stored
 * dtype, and with params' expert_budget what it holds. Works from
 * config.json alone when no tensors exist (and says so). params may be
 * NULL. */
int tern_model_describe(const char *dir, const tern_load_params *params, FILE *out, tern_error *err);

/* Expert streaming statistics since load (all zero for resident experts). */
typedef struct tern_stream_stats {
    int streaming;           /* 1 if experts stream through a slot cache */
    int slots_per_layer;
    uint64_t hits, misses, bytes_read;
    double read_s, wait_s;   /* time in reads (summed over I/O threads); time compute waited */
    int direct_io;
} tern_stream_stats;
void tern_model_stream_stats(const tern_model *m, tern_stream_stats *out);

/* Parses a size such as "512M", "8G", "1.5GiB", "1000000" into bytes. */
int tern_parse_size(const char *s, uint64_t *bytes, tern_error *err);

/* ---- session ------------------------------------------------------------ */

enum tern_gdn_mode {
    TERN_GDN_CHUNKED = 0,    /* prefill in chunks of 64 (default) */
    TERN_GDN_RECURRENT = 1,  /* token-by-token recurrence everywhere */
};

typedef struct tern_session_params {
    int max_context;         /* 0 = tern_model_max_context; more is an error */
    int gdn_mode;            /* enum tern_gdn_mode */
    int kv_bits;             /* KV cache: 0 or 32 = fp32 (the reference); 16 = f16; 8, 4 = affine groups */
} tern_session_params;

tern_session *tern_session_create(tern_model *m, const tern_session_params *p,
                                  tern_error *err);
void tern_session_destroy(tern_session *s);

/* Appends n tokens to the sequence (n > 1: prefill; n == 1: decode).
 * logits: if all_logits, n * vocab floats (one row per token); otherwise
 * vocab floats for the last token. May be NULL. */
int tern_session_eval(tern_session *s, const int32_t *tokens, int n,
                      float *logits, int all_logits, tern_error *err);

/* One step for n_seq distinct sessions of the same model together:
 * session s[i] appends its n[i] tokens tokens[i] (prefill chunks and decode
 * steps may mix), and logits + i * vocab gets the logits of its last token
 * (logits may be NULL). Each session's result is the one tern_session_eval
 * gives alone; on the CPU the projections and the experts run over all the
 * tokens at once. Every session is checked before any moves. */
int tern_session_eval_many(tern_session *const *s, const int32_t *const *tokens, const int *n, int n_seq,
                           float *logits, tern_error *err);

/* 1 when a server should step its requests together through
 * tern_session_eval_many, drawing each row on the host (the CPU engine);
 * 0 when one request at a time generates faster (the GPU engine, whose
 * decode draws on the device; its tern_session_eval_many runs the sessions
 * in one pass all the same). */
int tern_model_batches(const tern_model *m);

/* Locks the weights the model maps from its files (its resident tensors,
 * and its routed experts when they are resident) in RAM, reading them in
 * now, so memory pressure never sends a step back to the disk for them.
 * Nothing to do for a model on a GPU (its weights are in device memory).
 * Fails, naming the process's RLIMIT_MEMLOCK, where the system refuses. */
int tern_model_lock(tern_model *m, tern_error *err);

/* Number of tokens the session holds. */
int tern_session_pos(const tern_session *s);

/* For benchmarks only: moves a new session (position 0) to position n as
 * if n tokens had been evaluated, their KV rows zero and the recurrent
 * state left as it is, without computing them; the next evaluations then
 * cost what they cost at that context, while their output means nothing.
 * For timing a step at a context too long to prefill in a benchmark's
 * time (tern bench --fill). */
int tern_session_fill(tern_session *s, int n, tern_error *err);

/* Empties the session (position 0, the state of a new session), keeping
 * its buffers. */
int tern_session_reset(tern_session *s, tern_error *err);

/* The bytes of KV rows the session holds (its attention layers' and the
 * MTP head's; they grow in steps as positions are added), and what it
 * will hold once it has n positions: never less than now, or with
 * `released`, starting from none (after tern_session_release). The
 * DeltaNet state, of fixed size, is not counted. For a memory budget over
 * many sessions (tern serve --kv-budget). */
uint64_t tern_session_kv_bytes(const tern_session *s);
uint64_t tern_session_kv_bytes_at(const tern_session *s, int n, int released);

/* Empties the session as tern_session_reset does and gives its KV rows'
 * memory back; the next evaluations allocate them again. */
int tern_session_release(tern_session *s, tern_error *err);

/* Routing observer: after each MoE layer's router, fn hears every token's
 * top-k expert ids (router order, best first) with the layer (n_layers for
 * the MTP layer) and the token's position. NULL fn stops it. For routing
 * statistics and expert-cache simulations (tern bench). */
typedef void (*tern_route_fn)(void *ud, int layer, int pos, const int *experts, int k);
void tern_session_set_route_observer(tern_session *s, tern_route_fn fn, void *ud);

/* A routing trace: the experts every token chose in every decoder layer
 * (pass tern_route_trace_record and the trace to the observer). */
typedef struct tern_route_trace tern_route_trace;
tern_route_trace *tern_route_trace_create(int n_layers, int n_experts, int k, tern_error *err);
void tern_route_trace_destroy(tern_route_trace *t);
void tern_route_trace_record(void *trace, int layer, int pos, const int *experts, int k);
void tern_route_trace_clear(tern_route_trace *t);
int tern_route_trace_tokens(const tern_route_trace *t);   /* tokens every layer has */

typedef struct tern_route_summary {
    int tokens;
    double reuse;                /* share of a token's experts its predecessor also chose */
    double distinct8, distinct32, distinct128;   /* distinct experts per window of that many tokens */
    double lifetime;             /* distinct experts over the whole trace */
    double first_touch_ceiling;  /* hit rate no cache can beat: 1 - first touches / requests */
} tern_route_summary;          /* means over the layers */
void tern_route_trace_summary(const tern_route_trace *t, tern_route_summary *out);

/* Hit rate of an expert slot cache with `slots` per layer and policy (enum
 * tern_expert_policy_kind) over the trace, planned token by token exactly
 * as the engine's cache plans a decode step. */
double tern_route_trace_simulate(const tern_route_trace *t, int slots, int policy);

/* Draft logits of the MTP head for the token after `next_token`, where
 * next_token is the token that follows the last one evaluated (the pair is
 * (hidden state of the last token, next_token)). Advances the MTP head's own
 * cache by one position. Fails if the model has no MTP weights. */
int tern_session_mtp_draft(tern_session *s, int32_t next_token, float *logits,
                           tern_error *err);

/* on 1: every evaluation of the session also runs the MTP head over the
 * positions it adds, so that the head's own KV rows follow the whole
 * sequence (the context speculative decoding drafts with; snapshots keep
 * them). Costs the head's layer per token. A generation with mtp_depth > 0
 * turns it on. Where the head's rows fell behind (tokens evaluated while
 * off), they restart at the session's position. Fails (on) for a model
 * without an MTP head or a session on the GPU (not yet). */
int tern_session_set_mtp(tern_session *s, int on, tern_error *err);

/* Exact copy of the session state (KV rows, GDN conv + recurrent state, MTP
 * cache, last hidden state); restore brings a session of the same model back
 * to it bit for bit. */
tern_snapshot *tern_session_snapshot(const tern_session *s, tern_error *err);
/* The same, sharing the KV rows of an earlier snapshot `base` of this
 * session's own sequence (its tokens a prefix of those the session holds
 * now; the caller vouches for that): it holds only the rows after base's
 * position and the rest of the state (DeltaNet state, MTP rows, hidden
 * state), and keeps base alive until it is freed itself. Restoring copies
 * the rows of the whole chain. base NULL: tern_session_snapshot. */
tern_snapshot *tern_session_snapshot_after(const tern_session *s, const tern_snapshot *base, tern_error *err);
int tern_session_restore(tern_session *s, const tern_snapshot *snap,
                         tern_error *err);
/* Releases the caller's snapshot; its memory goes once no snapshot taken
 * after it holds it either. */
void tern_snapshot_free(tern_snapshot *snap);
/* The bytes the snapshot holds itself (not its base's). */
size_t tern_snapshot_bytes(const tern_snapshot *snap);
/* The tokens a session restored from it holds. */
int tern_snapshot_pos(const tern_snapshot *snap);
/* A snapshot is taken into the memory the session runs in (a GPU's). This
 * moves the bytes it holds itself into host memory (page-locked), freeing
 * the device's; it restores and is written as before, its copies crossing
 * the host link. Nothing to do where they are in host memory already (the
 * CPU). On failure the snapshot is as it was. */
int tern_snapshot_to_host(tern_snapshot *snap, tern_error *err);
/* 1 when the bytes the snapshot holds itself are in host memory. */
int tern_snapshot_on_host(const tern_snapshot *snap);
/* Writes the bytes the snapshot holds itself (not its base's) to f, behind
 * a header with the model's identity, the positions and the KV precision,
 * and followed by a SHA-256 of it all. */
int tern_snapshot_write(const tern_snapshot *snap, FILE *f, tern_error *err);
/* Reads one back for model m. base: the snapshot whose rows it continues
 * (NULL when it starts at position 0), held as tern_session_snapshot_after
 * holds it. Refuses, with a line naming the cause, a file of another model
 * identity, sizes that do not agree, another base, a short file, or bytes
 * whose SHA-256 differs. */
tern_snapshot *tern_snapshot_read(const tern_model *m, FILE *f, const tern_snapshot *base, tern_error *err);
/* 64 hex digits naming what a saved state's validity depends on: the
 * engine (CPU kernels or GPU), the model's files (names, sizes, inodes,
 * modification times, as at the first call; worked out once per model)
 * and its packed layout. */
int tern_model_identity(const tern_model *m, char hex[65], tern_error *err);


/* ---- text --------------------------------------------------------------- */

/* A byte-level BPE tokenizer read from a model's tokenizer.json (NFC, the
 * pre-tokenizer regex from the file, merges by rank, added tokens matched
 * whole). Invalid UTF-8 input is rejected with the byte offset. */
typedef struct tern_tokenizer tern_tokenizer;

/* Loads dir/tokenizer.json and, when present, dir/tokenizer_config.json. */
tern_tokenizer *tern_tokenizer_load(const char *dir, tern_error *err);
/* Same from explicit paths; config_path may be NULL. */
tern_tokenizer *tern_tokenizer_load_files(const char *tokenizer_json_path,
                                          const char *config_path,
                                          tern_error *err);
void tern_tokenizer_free(tern_tokenizer *tok);

enum tern_encode_flags {
    /* Added tokens marked special (e.g. <|im_end|>) are not matched in the
     * text but tokenized as plain text; non-special added tokens still are.
     * This is `encode_special_tokens = True` in `tokenizers`, for text that
     * must not be able to inject control tokens (user content). */
    TERN_ENCODE_SPLIT_SPECIAL = 1 << 0,
};

/* Encodes len bytes of UTF-8 text. On success *ids is a malloc'ed array of
 * *n ids (NULL when n == 0) that the caller frees. */
int tern_tokenizer_encode(tern_tokenizer *tok, const char *text, size_t len,
                          unsigned flags, int32_t **ids, size_t *n,
                          tern_error *err);

/* Appends the ids of text to a growable array (*ids with *n used and *cap
 * allocated entries; start with NULL/0/0). For building prompts piece by
 * piece. On failure the array keeps what it had. */
int tern_tokenizer_encode_append(tern_tokenizer *tok, const char *text,
                                 size_t len, unsigned flags, int32_t **ids,
                                 size_t *n, size_t *cap, tern_error *err);

/* Decodes ids to bytes. *out is malloc'ed, NUL-terminated (the NUL not
 * counted in *out_len; the bytes may hold NULs of their own). Fails on an id
 * outside the vocabulary. skip_special: leave out added tokens marked
 * special (like skip_special_tokens=True). */
int tern_tokenizer_decode(const tern_tokenizer *tok, const int32_t *ids,
                          size_t n, int skip_special, char **out,
                          size_t *out_len, tern_error *err);

/* The bytes one id stands for (not NUL-terminated), or NULL if the id is not
 * in the vocabulary. Valid while the tokenizer lives. */
const char *tern_tokenizer_token_bytes(const tern_tokenizer *tok, int32_t id,
                                       size_t *len);

/* The token's string as tokenizer.json spells it (byte-level characters for
 * BPE tokens, e.g. "Ġthe"; the content for added tokens), NUL-terminated, or
 * NULL for an unknown id. */
const char *tern_tokenizer_token_text(const tern_tokenizer *tok, int32_t id);

/* The id of a token given as tokenizer.json spells it (an added token's
 * content such as "<|im_end|>", or a vocabulary string), or -1. */
int32_t tern_tokenizer_token_id(const tern_tokenizer *tok, const char *str);

/* 1 if id is an added token, 2 if it is an added token marked special, else 0. */
int tern_tokenizer_is_added(const tern_tokenizer *tok, int32_t id);

/* One past the largest id (BPE vocabulary plus added tokens). The model's
 * embedding may have more rows than this. */
int32_t tern_tokenizer_vocab_size(const tern_tokenizer *tok);

/* From tokenizer_config.json; -1 when not given. */
int32_t tern_tokenizer_bos_id(const tern_tokenizer *tok);
int32_t tern_tokenizer_eos_id(const tern_tokenizer *tok);
int32_t tern_tokenizer_pad_id(const tern_tokenizer *tok);

/* Qwen3.6 chat template (native C, byte-identical to the published
 * chat_template.jinja). */
typedef struct tern_chat_options {
    int add_generation_prompt;  /* end with "<|im_start|>assistant\n<think>\n" */
    int enable_thinking;        /* 0: the prompt closes an empty think block */
    int preserve_thinking;      /* keep reasoning of turns before the last query */
    int add_vision_id;          /* prefix images/videos with "Picture N: " */
} tern_chat_options;

/* The template's defaults: generation prompt off, thinking on, reasoning of
 * earlier turns dropped, no vision ids. */
void tern_chat_options_default(tern_chat_options *opt);

/* Renders an OpenAI-style `messages` JSON array (and optional `tools` JSON
 * array, may be NULL) into the prompt text. Returns malloc'd UTF-8. */
char *tern_chat_render(const char *messages_json, const char *tools_json, const tern_chat_options *opt,
                       tern_error *err);

/* ---- structured output ---------------------------------------------------- */

/* Constrained decoding: a grammar decides which tokens may come next and
 * the sampler draws only among them (tern_gen_params.grammar), so the
 * output matches a JSON Schema, any JSON object, a GBNF grammar, or the
 * chat template's tool-call form. A grammar runs as a pushdown automaton
 * over bytes; the mask of allowed tokens is computed against the
 * tokenizer's byte strings with per-position tables prepared when the
 * grammar compiles (docs/SERVER.md, "Structured output"). */

/* A tokenizer's vocabulary prepared for grammars (a trie of its byte
 * strings, and a cache of per-position token tables that every grammar of
 * this vocabulary shares: a schema seen before compiles fast). One per
 * tokenizer, which must outlive it; safe to share between threads.
 * n_vocab: entries in a logits row (the mask's bits); eos: the ids that end
 * a generation, allowed only where the grammar may end. Other added tokens
 * marked special are never allowed; every other token is its bytes. */
typedef struct tern_grammar_vocab tern_grammar_vocab;
tern_grammar_vocab *tern_grammar_vocab_create(const tern_tokenizer *tok, int n_vocab, const int32_t *eos, int n_eos,
                                              tern_error *err);
void tern_grammar_vocab_destroy(tern_grammar_vocab *v);
/* 32-bit words of a mask: token id is allowed when bit (id & 31) of word
 * id >> 5 is set. */
int tern_grammar_mask_words(const tern_grammar_vocab *v);

typedef struct tern_grammar_spec {
    const char *json_schema;   /* the answer: JSON valid under this JSON Schema (text) */
    int json_object;           /* the answer: any JSON object */
    const char *gbnf;          /* the answer: text of this GBNF grammar (llama.cpp's syntax, rule "root") */
    /* An OpenAI-style tools array (JSON text): tool calls in the chat
     * template's XML form, each argument valid under its tool's schema
     * and written as the output parser reads it back. */
    const char *tools_json;
    const char *tool_name;     /* only this function; NULL: any of the tools */
    int tools_required;        /* 1: the answer is tool calls; 0: tool calls or the answer above */
    int parallel_tool_calls;   /* 0: exactly one call */
    /* The generation starts inside the reasoning block (the prompt ends in
     * "<think>\n"): any text up to "</think>", then the grammar. */
    int after_think;
} tern_grammar_spec;

/* Compiles a grammar (v may be NULL: no masks, only tern_matcher_accept_bytes).
 * Errors are one line naming what cannot be enforced (a JSON Schema keyword
 * and where it is, a GBNF line, a tool's parameter). Immutable once made:
 * matchers in any number of threads may share it; v must outlive it. */
typedef struct tern_grammar tern_grammar;
tern_grammar *tern_grammar_create(const tern_grammar_spec *spec, tern_grammar_vocab *v, tern_error *err);
void tern_grammar_destroy(tern_grammar *g);
/* The vocabulary it was compiled against, or NULL. */
const tern_grammar_vocab *tern_grammar_vocabulary(const tern_grammar *g);

/* One generation's progress through a grammar (one thread at a time). */
typedef struct tern_matcher tern_matcher;
tern_matcher *tern_matcher_create(const tern_grammar *g, tern_error *err);
void tern_matcher_destroy(tern_matcher *m);
/* Takes a generated token: 0, or -1 (err names it, the matcher unchanged)
 * when the grammar does not allow it. An end-of-sequence id ends it. */
int tern_matcher_accept(tern_matcher *m, int32_t id, tern_error *err);
/* Takes text: 0, or -1 (the matcher unchanged) when the grammar does not allow it. */
int tern_matcher_accept_bytes(tern_matcher *m, const char *s, size_t n);
/* The tokens that may come next, as a mask of tern_grammar_mask_words
 * words. budget: the tokens that may still be generated, this one included
 * (< 0: no limit); with a budget only tokens after which the grammar can
 * still end within it (its end-of-sequence token included) are allowed, so
 * an answer that reaches max_tokens still parses. -1 when the grammar has
 * no vocabulary, or the automaton outgrew its memory. */
int tern_matcher_fill_mask(tern_matcher *m, uint32_t *mask, int budget, tern_error *err);
/* 1 when the grammar may end here (an end-of-sequence id is allowed). */
int tern_matcher_complete(const tern_matcher *m);
/* Fewest bytes of text that end the grammar from here (0: it may end). */
int tern_matcher_min_bytes(const tern_matcher *m);
/* Keeps the matcher's state (one at a time: a save replaces the last),
 * and brings it back: a speculative step's drafts advance the matcher
 * past tokens the model may not keep. restore after no save, or a second
 * restore, leaves the state as it is. */
int tern_matcher_save(tern_matcher *m, tern_error *err);
void tern_matcher_restore(tern_matcher *m);

/* ---- sampling and generation -------------------------------------------- */

typedef struct tern_sampler_params {
    int do_sample;             /* 0: greedy */
    float temperature;         /* <= 0: greedy */
    int top_k;                 /* <= 0: off */
    float top_p;               /* >= 1: off */
    float min_p;               /* <= 0: off */
    float repetition_penalty;  /* 1: off */
    float presence_penalty;    /* 0: off */
    float frequency_penalty;   /* 0: off */
    uint64_t seed;
    int n_eos;                 /* end-of-sequence ids from generation_config */
    int32_t eos_ids[TERN_SAMPLER_MAX_EOS];
} tern_sampler_params;

/* transformers' GenerationConfig defaults: greedy, temperature 1, top_k 50,
 * top_p 1, no min_p, no penalties, seed 0, no EOS ids. */
void tern_sampler_params_default(tern_sampler_params *p);

/* Defaults, then the fields of <model_dir>/generation_config.json that are
 * present: do_sample, temperature, top_k, top_p, min_p, repetition_penalty,
 * eos_token_id (an integer or a list). No file: the defaults (generation
 * then stops at config.json's EOS ids). Fails (p keeps the defaults and
 * whatever was read) on a file that is not JSON, a field of the wrong
 * type, or a value outside the range the tern command line accepts for it
 * (temperature [0, 100], top_k >= 0, top_p and min_p [0, 1],
 * repetition_penalty [0.01, 100], EOS ids >= 0). */
int tern_sampler_params_load(tern_sampler_params *p, const char *model_dir, tern_error *err);

int tern_sampler_is_eos(const tern_sampler_params *p, int32_t id);

#define TERN_MAX_TOP_LOGPROBS 20

/* One generated token's log-probability and the most likely alternatives,
 * under the distribution the sampler draws from before truncation: the
 * log-softmax of the logits after the vocabulary mask, the penalties and
 * the temperature (no temperature when greedy). */
typedef struct tern_logprobs {
    int32_t id;
    float logprob;
    int n_top;                                /* = tern_gen_params.top_logprobs */
    int32_t top_ids[TERN_MAX_TOP_LOGPROBS];   /* most likely first, ties by id */
    float top_logprobs[TERN_MAX_TOP_LOGPROBS];
} tern_logprobs;

typedef struct tern_gen_params {
    tern_sampler_params sampling;    /* tern_sampler_params_load() for the model's defaults */
    int n_predict;                   /* most tokens to generate; < 0 = until EOS or context end */
    const char *const *stop;         /* stop strings (not included in the output) */
    int n_stop;
    int ignore_eos;
    /* Optional: called with each generated id (before its text). With no
     * tokenizer (tok == NULL in tern_generate) this is the only output. */
    void (*on_token)(void *ctx, int32_t id);
    /* Optional: polled before each step; non-zero ends the generation
     * (TERN_STOP_CALLER), e.g. when the client has gone. */
    int (*cancelled)(void *ctx);
    /* Optional: tokens the session held before this call's prompt. The
     * repetition penalty counts them with the prompt, so a prompt split
     * over several calls samples as if it had been given whole. */
    const int32_t *history;
    size_t n_history;
    /* Optional: called with each generated token's log-probabilities
     * (before on_token), with the top_logprobs (0..TERN_MAX_TOP_LOGPROBS)
     * best alternatives. The logits then come to the host every step: a GPU
     * session samples on the CPU. */
    void (*on_logprobs)(void *ctx, const tern_logprobs *lp);
    int top_logprobs;
    /* Optional: the generation follows this grammar, compiled against the
     * vocabulary of tok: each token is drawn among those its mask allows
     * (masked before the penalties, temperature and truncation), the end
     * of sequence only where the grammar may end, and within n_predict
     * and the context the answer is steered to end. The draw is then the
     * CPU sampler's. Not with ignore_eos. */
    const tern_grammar *grammar;
    /* Speculative decoding with the model's MTP head: 0 off; 1..
     * TERN_MTP_MAX_DEPTH drafts a step, drafted by the head one after
     * another and verified by the model in one forward pass of depth + 1
     * tokens. Greedy output is the one decoding without drafts gives, token
     * for token; sampled output has the same distribution (speculative
     * sampling: a draft x is kept with probability min(1, p(x) / q(x)), p
     * and q the model's and the head's distributions after the same
     * penalties, temperature and truncation; else the token is drawn from
     * max(0, p - q) renormalised). Stops, EOS, n_predict and on_token behave
     * as without. Needs an MTP head and the CPU engine; turns on
     * tern_session_set_mtp for the session. With a grammar each draft is
     * drawn under the mask the grammar gives after the drafts before it,
     * and each verified row under the mask after the ids taken.
     * TERN_MTP_AUTO: each step's depth (0 included) is the one that has
     * given the most tokens a second on this generation's own steps, every
     * depth tried at first and now and then again (engine/mtp_auto.h); a
     * sampled generation's ids then depend on the timings, its
     * distribution does not. */
    int mtp_depth;
} tern_gen_params;

#define TERN_MTP_MAX_DEPTH 3
#define TERN_MTP_AUTO (-1)

enum tern_stop_reason { TERN_STOP_LENGTH, TERN_STOP_EOS, TERN_STOP_STRING, TERN_STOP_CALLER, TERN_STOP_CONTEXT };

typedef struct tern_gen_stats {
    int n_prompt;                    /* tokens prefilled by this call */
    int n_generated;
    double prefill_s, decode_s;      /* wall time of the prefill; of the decode steps */
    int stop_reason;                 /* enum tern_stop_reason */
    int stop_index;                  /* TERN_STOP_STRING: which of p->stop matched; else -1 */
    int32_t last_token;              /* the last generated id (e.g. the EOS) */
    /* speculative decoding (mtp_depth > 0): steps that verified drafts,
     * drafts proposed, drafts taken */
    int n_verify, n_drafted, n_accepted;
} tern_gen_stats;

/* Called with each piece of generated text (complete UTF-8, stop strings
 * held back). Return non-zero to stop generating. */
typedef int (*tern_text_fn)(void *ctx, const char *text, size_t len);

/* Prefills `prompt` onto the session (tok may be NULL: ids only, see
 * on_token), then samples until n_predict tokens,
 * an EOS id, a stop string, the callback asking to stop, or the context
 * end. Generated tokens (the EOS included) are evaluated into the session,
 * so the next call continues the same sequence. */
int tern_generate(tern_session *s, tern_tokenizer *tok, const int32_t *prompt, size_t n_prompt,
                  const tern_gen_params *p, tern_text_fn on_text, void *ctx, tern_gen_stats *stats,
                  tern_error *err);

/* The same generation in steps, for a caller that evaluates several
 * sessions together (tern_session_eval_many); it samples on the CPU from
 * the logits the caller passes. create takes what tern_generate takes (p
 * is copied; prompt and what p points to must outlive the generation);
 * input gives the tokens to
 * evaluate next (the prompt, then each sampled token, the last one too)
 * and 0 once the generation is over; take consumes the logits of their
 * last token (sampling, streaming the text, checking the stops); end
 * flushes the held-back text unless a step failed (ok 0), gives the
 * statistics and frees. */
typedef struct tern_gen tern_gen;
tern_gen *tern_gen_create(tern_session *s, tern_tokenizer *tok, const int32_t *prompt, size_t n_prompt,
                          const tern_gen_params *p, tern_text_fn on_text, void *ctx, tern_error *err);
int tern_gen_input(const tern_gen *g, const int32_t **tokens);
int tern_gen_take(tern_gen *g, const float *logits, tern_error *err);
/* One step of this generation alone: its input evaluated and taken
 * (tern_session_eval + tern_gen_take), or with mtp_depth > 0 a speculative
 * step (drafts, their verify, every token it keeps taken). */
int tern_gen_step(tern_gen *g, tern_error *err);
/* One step of several generations of one model together, and of sessions
 * that only evaluate tokens this step (extra: a prompt prefilled in
 * chunks; NULL when n_extra is 0; logits: room for n_gen + n_extra rows
 * of the vocabulary, the caller's scratch): every input in one pass
 * (tern_session_eval_many), then each generation's next token drawn and
 * taken as tern_gen_take takes it, drawn in the step where the engine
 * can (a GPU session, for the sampling rules its kernels take) and from
 * the host's logits otherwise. A generation with mtp_depth > 0 takes a
 * plain step here (no drafts; tern_gen_step drafts). Returns -1 when the
 * pass failed (every rc[i] -1 then); else rc[i] is generation i's take
 * (err holds the last failure's message). */
int tern_gen_step_many(tern_gen *const *g, int n_gen, tern_session *const *extra, const int32_t *const *extra_tokens,
                       const int *extra_n, int n_extra, float *logits, int *rc, tern_error *err);
void tern_gen_end(tern_gen *g, int ok, tern_gen_stats *stats);

/* ---- output parsing ----------------------------------------------------- */

/* Splits generated text into reasoning, answer and tool calls, streamed:
 * feed the text in pieces of any size (the events do not depend on how it
 * is cut). Qwen3.6 reasons inside <think>...</think> and writes tool calls
 * in the XML form its chat template teaches (<tool_call><function=NAME>
 * <parameter=KEY>VALUE</parameter>...). Events:
 *   CONTENT    a piece of the answer text (whole UTF-8 characters)
 *   REASONING  a piece of the reasoning text
 *   TOOL_CALL  one complete call: name, arguments as a JSON object's text,
 *              values typed by the tool's parameter schema
 *   MALFORMED  markup that could not be read as a call (text: why); its raw
 *              text then continues as CONTENT, so nothing is lost */
typedef enum tern_out_kind {
    TERN_OUT_CONTENT = 0,
    TERN_OUT_REASONING = 1,
    TERN_OUT_TOOL_CALL = 2,
    TERN_OUT_MALFORMED = 3,
} tern_out_kind;

typedef struct tern_out_event {
    tern_out_kind kind;
    const char *text;       /* CONTENT/REASONING piece, or MALFORMED reason */
    size_t len;
    int call_index;         /* TOOL_CALL: 0, 1, ... in order of completion */
    const char *name;       /* TOOL_CALL: function name */
    const char *arguments;  /* TOOL_CALL: JSON object text (json.dumps style) */
} tern_out_event;

/* Receives each event; the pointers are valid during the call only.
 * Returns 0, or -1 with err set to stop the parser. */
typedef int (*tern_out_fn)(void *user, const tern_out_event *ev, tern_error *err);

typedef struct tern_output_params {
    int start_in_reasoning;  /* the prompt ended in "<think>\n" (thinking on) */
    int parse_tool_calls;    /* 0: tool-call markup is plain answer text */
    const char *tools_json;  /* the request's OpenAI-style tools array (its schemas type the values), or NULL */
} tern_output_params;

typedef struct tern_output_parser tern_output_parser;

tern_output_parser *tern_output_parser_create(const tern_output_params *params,
                                              tern_out_fn fn, void *user, tern_error *err);
void tern_output_parser_destroy(tern_output_parser *p);
/* Feeds the next piece of generated text. Returns 0, or -1 if the callback
 * failed or memory ran out; malformed text is never an error here. */
int tern_output_parser_feed(tern_output_parser *p, const char *text, size_t len, tern_error *err);
/* End of generation: flushes held-back text and reports an unterminated
 * call as MALFORMED. */
int tern_output_parser_finish(tern_output_parser *p, tern_error *err);
int tern_output_parser_n_tool_calls(const tern_output_parser *p);

/* ---- packing ------------------------------------------------------------ */

/* `tern pack SRC DST` (docs/FORMAT.md): a Hugging Face (bf16/f16/f32 or FP8
 * block-quantized) or MLX (4/8-bit affine) model directory becomes a packed
 * directory: resident.bin, one file of routed experts per layer,
 * manifest.json with every file's SHA-256, and the install receipt.
 * Bits per class: 4 or 8 quantize (affine, groups along the input dim),
 * 16 keeps the source's float type. MLX sources are copied bit for bit. */
typedef struct tern_pack_params {
    const char *src;             /* model directory to read */
    const char *dst;             /* directory to create (must not exist) */
    int bits;                    /* every class: 4 or 8; 0 = experts 4, the rest 8 */
    /* per class, overriding `bits`: 4, 8 or 16; 0 = from `bits` */
    int embed_bits, attn_bits, router_bits, shared_bits, expert_bits, head_bits, mtp_fc_bits;
    int group;                   /* 32, 64 or 128 values per scale; 0 = 64 */
    int resume;                  /* continue DST.partial left by an interrupted pack */
    int n_threads;               /* 0 = all cores */
    FILE *progress;              /* progress bar and summary; NULL = silent */
    uint64_t min_free_bytes;     /* free space to leave on the disk; 0 = 256 MiB */
} tern_pack_params;

/* Packs p->src into p->dst with the install semantics of docs/FORMAT.md
 * (DST.partial, lock, fsyncs, atomic rename). Same inputs, same bytes. */
int tern_pack(const tern_pack_params *p, tern_error *err);
/* Checks p's options (bits, group) as tern_pack would, touching no file:
 * a caller that must first produce the source (tern pull) fails early. */
int tern_pack_check(const tern_pack_params *p, tern_error *err);

/* Rehashes every file of a packed directory against its manifest, checks
 * the layout, and on success writes the receipt verified-install.json.
 * report (may be NULL) gets progress, each failure and a summary; err
 * names the (first) bad file. */
int tern_verify(const char *dir, FILE *report, tern_error *err);

/* ---- synthetic models (tern synth) ------------------------------------- */

/* A random-weight model at an exact named shape, for measuring speed and
 * memory without the real weights (speed depends on shapes, encodings and
 * routing, not on the values). Deterministic from the seed. The value
 * distributions and the routing modes are documented in src/synth/synth.h
 * and docs/PERFORMANCE.md. */
typedef struct tern_synth_params {
    const char *shape;           /* a name tern_synth_list prints; NULL = "qwen3.6-35b-a3b" */
    int bits;                    /* every matrix 4 or 8 bits; 0 = 4 */
    int expert_bits;             /* the routed experts' bits, 4 or 8; 0 = bits (--bits 8 with 4 here
                                  * is tern pack's default mix) */
    uint64_t seed;
    const char *routing;         /* "prose" (NULL: calibrated to real traffic) or "uniform" (pessimistic) */
    /* tern_synth only: where and how to write */
    const char *dst;             /* directory to create (must not exist) */
    int resume;
    int n_threads;               /* 0 = all cores */
    FILE *progress;
    uint64_t min_free_bytes;
} tern_synth_params;

/* Writes the model as a packed directory (docs/FORMAT.md) with tern pack's
 * install semantics; config.json carries a "tern_synthetic" record. */
int tern_synth(const tern_synth_params *p, tern_error *err);
/* The same model built in memory, no file: a resident packed model.
 * lp's expert_budget must be 0 (there is nothing to stream from). */
tern_model *tern_model_synth(const tern_synth_params *p, const tern_load_params *lp, tern_error *err);
/* One line per shape: name and what it is. */
void tern_synth_list(FILE *out);

#ifdef __cplusplus
}
#endif
#endif
