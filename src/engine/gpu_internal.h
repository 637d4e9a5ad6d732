/* The GPU engine's private header, shared by its parts (the rest of the
 * engine uses engine/gpu.h for the model and engine/backend.h's
 * tern_gpu_backend for sessions):
 *   gpu_model.c    the weights' upload and the model-level plans
 *   gpu_session.c  a session's device buffers, state and kernel statistics
 *   gpu_prefill.c  the forward pass over T tokens, layer by layer
 *   gpu_decode.c   pieces and decode steps: the one-token path, graph
 *                  capture and replay, sampling on the device
 * Only the CUDA build (make CUDA=1) compiles them; gpu_stub.c stands in
 * otherwise. */
#ifndef TERN_ENGINE_GPU_INTERNAL_H
#define TERN_ENGINE_GPU_INTERNAL_H

#include <stdatomic.h>

#include "cuda/cuda_ops.h"
#include "engine/gpu.h"

/* Tokens per GPU forward piece (default; tern_load_params.debug.piece
 * overrides it, and a session's context caps it): bounds every scratch
 * buffer and the prefill ops' workspaces (chunked DeltaNet, grouped
 * experts), ~0.3 MB a token. Longer pieces fill the experts' 64-row tiles
 * (at 512 tokens an expert has ~16 rows) and dequantize the dense weights
 * less often (docs/experiments/cuda-prefill.md). */
#define PIECE_DEFAULT 4096
/* Rows of logits computed and copied back at a time (all_logits callers). */
#define LOGIT_ROWS 64
/* Up to SUB tokens run the decode ops (GEMV, split-K attention, the fused
 * experts, the DeltaNet step); longer runs the prefill ops. */
#define SUB 8
/* A piece's input block (gpu_session.step_host / step_dev): the sampler's
 * u, the position, the tokens. */
#define STEP_U 0
#define STEP_POS 8
#define STEP_TOK 12
#define STEP_BYTES(T) (STEP_TOK + 4 * (size_t)(T))

/* ---- the model ---------------------------------------------------------- */

/* A layer's input projections stacked into one matrix (rows of the
 * parts one after another, same encoding): one GEMV launch instead of 3 or
 * 4 for a single token, whose output slices are the parts' outputs. */
typedef struct fused_mat {
    tern_mat m;                   /* rows = the parts' rows together; NULL data: not fused */
    uint8_t *mem;                 /* its device copy (data, scales, biases) */
} fused_mat;

typedef struct gpu_model {
    int device;
    fused_mat *fused_in;          /* per layer: [q|k|v] or [qkv|z|b|a] (NULL data: parts that differ) */
    int one_token;                /* the one-token path (norms inside tern_cuda_gemv1) fits every layer */
    char name[320];               /* "cuda:N (device name)" */
    tern_cuda_ctx *ctx;
    uint8_t *resident;            /* resident.bin, same offsets as the host map */
    uint8_t **experts;            /* per expert file: n_experts x stride (NULL under a budget) */
    int n_expert_files;
    /* Under an expert budget (tern_model.gpu_expert_budget), per expert
     * file: its blobs' home in page-locked host memory mapped for the
     * device, `slots` blobs in device memory, and the device table of each
     * expert's address (its slot or its home) that the MoE kernels read
     * (tern_cuda_experts.blobs): a resident expert is read from VRAM, any
     * other straight over the host link. */
    uint8_t **home;
    uint8_t **slot_mem;
    const uint8_t ***table;
    struct gpu_slot_cache *sc;    /* which experts the slots hold, and the promotions (gpu_experts.c) */
    tern_weights w;               /* m->w with every pointer on the device */
    float **vecs;                 /* device copies of the small fp32 vectors, for freeing */
    int n_vecs, cap_vecs;
    float *inv_freq;
    int w_layers;
    /* live GPU sessions of this model: the experts' one launch (blocks
     * that wait for each other) is used only while there is one, so two
     * such grids never share the SMs */
    atomic_int sessions;
    /* tern_load_params.serial_sessions: the sessions' calls never overlap,
     * so the one launch is taken with any number of them; `last` is the
     * session whose GPU work came last (the next one's waits for it) */
    int serial;
    tern_session *last;
    /* per layer: its experts' one launch can route the token itself (shapes,
     * kinds and the device's room; fixed for the model, planned once) */
    unsigned char *moe_self;
    /* per layer: with its experts' sums in fixed point, the layer whose
     * slot its launch zeroes: the one before it among those that route
     * themselves, cyclically (-1: floats; fewer than two such layers,
     * since a launch cannot zero its own slot) */
    int *fx_prev;
    /* tern_load_params.debug (phase_trace copied) */
    int no_graphs, cpu_sampling, kernel_stats, piece;
    char *phase_trace;
} gpu_model;

/* Kernel statistics (tern_load_params.debug.kernel_stats): GPU time per
 * op role of every decode step (one token, TERN_STATS_DECODE) or of the
 * prefill pieces (more than SUB tokens, per prompt token,
 * TERN_STATS_PREFILL), from events recorded around each role's ops, and
 * the share of the step the GPU was busy; printed when the session ends. */
enum { R_NORM, R_ATTN_PROJ, R_ATTN, R_GDN_PROJ, R_GDN, R_ROUTER, R_MOE, R_HEAD, R_COUNT };
#define MAX_MARKS 4096

typedef struct stats {
    tern_cuda_marks *marks;
    int n_marks, role[MAX_MARKS / 2];
    double ms[R_COUNT], busy_ms, span_ms, wall_ms;
    long tokens, pieces;
    int graph;                    /* TERN_STATS_GRAPH: whole captured steps, timed as one */
    int prefill;                  /* TERN_STATS_PREFILL: prefill pieces instead of decode steps */
    double graph_ms, graph_wall_ms;
    long graph_steps;
} stats;

typedef struct gpu_session {
    /* The sequence state, on the device: per layer, an attention layer's
     * KV rows (cap of them; NULL arrays for DeltaNet layers) or a DeltaNet
     * layer's conv window and state (NULL arrays for attention layers). */
    int cap;
    tern_kv *kv;
    tern_gdn_state *gdn;
    tern_stream stream;
    /* The decode step's graphs, one per input block (blk): a step launched
     * while the one before is in flight writes the other block, so each
     * graph's copy node and id word are its own. */
    tern_graph graph[2];
    int use_graph;
    int piece;                    /* tokens per forward piece */
    struct { int T, rows, n_plan, one_launch, kv_gen; } key[2];   /* what graph[b] was captured for */
    int kv_gen;                   /* counts the KV caches' moves (kv_key) */
    int counted;                  /* in the model's sessions */
    int one_launch;               /* this step may take the experts' one launch (the only session) */
    const uint8_t **kv_key;       /* and the KV caches it points at: [layer][k, v] */
    const int *pos_dev;           /* during a capture: the step's position, read on the device */
    int n_plan;                   /* and the context the attention's splits are planned for */
    stats *st;
    float *x, *x2, *out2, *xn, *out, *qg, *k, *v, *o, *qkv, *z, *b, *a, *g_out, *rlog, *wts, *logits;
    float *fused_out;             /* one token's stacked input projections */
    void *sample_work;            /* argmax / top-k workspace */
    int32_t *d_id;                /* the sampled id */
    unsigned *route_counters;     /* per layer: the fused router's last-block counter (zero between calls) */
    int32_t *ids;
    void *moe_work, *att_work, *gdn_work, *grouped_work;
    size_t att_bytes, gdn_bytes, grouped_bytes;
    /* the experts' fixed-point slots, one a layer (gpu_model.fx_prev),
     * fx_bytes each: zero but for the slots of the last layers run */
    uint8_t *fx;
    size_t fx_bytes;
    /* A piece's input, [u (double), position, tokens...]: written on the
     * host into page-locked memory, copied up in the stream (the embedding,
     * the captured step and the sampler read it on the device). Two blocks:
     * blk is the one the step being enqueued reads. */
    uint8_t *step_host[2], *step_dev;
    const int32_t *tok_dev;       /* the tokens in step_dev */
    int32_t *id_host[2];          /* the drawn ids, one a block (page-locked, behind the blocks) */
    int blk;
    /* Sampled decode steps launched and not yet waited for (at most two,
     * oldest first): their blocks, and an event after each. */
    int n_flight, flight[2];
    tern_event done[2];
    int drawn;                    /* a sampled step was launched: d_id holds its draw */
    struct { int on; tern_gpu_rule r; } key_rule[2];   /* the sampler captured in graph[b], if any (rule_key) */
    uint32_t *mask_host;          /* a masked draw's mask (page-locked, read by the sampler over the bus) */
    size_t mask_words;            /* the words of a mask of the whole vocabulary */
    int32_t *host_ids;            /* routing observer */
    /* a pass's draws (tern_gpu_forward_many): a sampler workspace of
     * draw_ws bytes a row, and LOGIT_ROWS u then ids in page-locked memory */
    void *draw_work;
    size_t draw_ws;
    uint8_t *draw_host;
    uint32_t *draw_mask;          /* LOGIT_ROWS masks (page-locked), made at a pass's first masked draw */
} gpu_session;

/* gpu_model.c */
/* The DeltaNet shapes of the config, with a layer's weights (w NULL: the
 * shapes alone, for checks and workspace sizes). */
tern_cuda_gdn_w tern_gpu_gdn_w_of(const tern_config *c, const tern_gdn_w *w);
/* Layer l's routed experts on the device (base + e * stride). */
tern_cuda_experts tern_gpu_experts_of(const tern_model *m, int l);

/* gpu_experts.c: the routed experts under an expert budget. stream: the
 * homes, slots and tables (gpu_model.home..sc); free undoes it. count:
 * layer l's chosen ids[0..n) counted on the session's stream (in a step).
 * tick: at a step's start, outside any capture, on the session's stream:
 * finished copies repointed, counts read back and promotions started. */
int tern_gpu_experts_stream(tern_model *m, gpu_model *g, tern_error *err);
void tern_gpu_experts_free(gpu_model *g);
int tern_gpu_experts_count(const tern_session *s, int l, const int32_t *ids, int n, tern_error *err);
int tern_gpu_experts_tick(tern_session *s, tern_error *err);
/* Layer l's experts under a budget, after its router, before its MoE:
 * ready makes the chosen ones readable through ex (RAM home: a large
 * piece's ex points at a staged copy of the layer, enqueued ahead, the
 * session's stream waiting for it; disk home: the ids come back and the
 * missing experts are read in). done, after the MoE, lets a staging
 * buffer take the layer after next. Both do nothing without a budget.
 * on_disk: the model's budget reads from disk (decode then runs
 * uncaptured, the router apart from the experts). */
int tern_gpu_experts_ready(const tern_session *s, int l, int T, tern_cuda_experts *ex, tern_error *err);
int tern_gpu_experts_done(const tern_session *s, int l, int T, tern_error *err);
int tern_gpu_experts_on_disk(const gpu_model *g);
/* Every layer's device table against the host's record of the slots
 * (after the copies in flight end): each expert at its slot or its home.
 * For the engine check. */
int tern_gpu_experts_verify(const tern_model *m, tern_error *err);

/* gpu_session.c: the backend's table (tern_gpu_backend) and the session's
 * device state. The KV rows for `needed` positions (reallocated: no step
 * may be in flight). */
int tern_gpu_reserve(tern_session *s, int needed, tern_error *err);
tern_cuda_attn_dims tern_gpu_attn_dims(const tern_config *c);
/* Kernel statistics: marks around a role's ops (only on uncaptured
 * single-token steps); after a step's final sync, its marks' times added
 * (T tokens). */
void tern_gpu_stage(gpu_session *g, int role, int end);
void tern_gpu_collect(stats *st, double wall_ms, int T);

/* gpu_prefill.c */
/* The sessions of one forward pass: seg[i].s's n tokens are rows t0 ..
 * t0 + n - 1 of the buffers of g, the first session's state (its stream,
 * workspaces and statistics; under an expert budget its counts), and each
 * session's own KV rows and DeltaNet state take its rows at its position.
 * A session's prefill or step alone is a pass of one. */
typedef struct gpu_seg {
    tern_session *s;
    int t0, n;
} gpu_seg;
typedef struct gpu_pass {
    tern_session *s;
    gpu_session *g;
    const gpu_seg *seg;
    int n_seg, T;
} gpu_pass;
/* y[T, W.rows] = x[T, W.cols] W^T: the GEMV kernels up to their token
 * count, cuBLAS above it. */
int tern_gpu_mm(const gpu_model *gm, const gpu_session *g, float *y, const float *x, int T, const tern_mat *W,
                tern_error *err);
/* A decode-sized step's attention (T <= SUB): K/V rows into s's cache,
 * then the split-K attention into o, on g's stream and workspace. */
int tern_gpu_attend_small(tern_session *s, gpu_session *g, const tern_cuda_attn_dims *d, float *qg, float *k,
                          float *v, float *o, const tern_attn_w *w, int l, int T, tern_error *err);
/* The route observer (s->route_fn): layer l's ids of T tokens, after a sync. */
int tern_gpu_observe(tern_session *s, int l, int T, tern_error *err);
/* The lm_head over n normed rows, LOGIT_ROWS at a time, copied to logits. */
int tern_gpu_head(gpu_session *g, const gpu_model *gm, const float *xn, int n, int H, int V, float *logits,
                  tern_error *err);
/* Every layer and the final norm of a pass, enqueued on its stream; the
 * same over one session's T tokens. */
int tern_gpu_layers_pass(const gpu_pass *p, tern_error *err);
int tern_gpu_layers(tern_session *s, int T, tern_error *err);

/* gpu_decode.c: the backend's steps (engine/backend.h). tern_gpu_forward:
 * T tokens at s->pos in pieces of gpu_session.piece, logits as
 * tern_forward's (no per-token hidden states). */
int tern_gpu_forward(tern_session *s, const int32_t *tokens, int T, float *logits, int all_logits,
                     float *hidden_out, tern_error *err);
/* Several sessions' tokens in one pass, rows drawn on the device
 * (backend.h's forward_many; no hidden states). */
int tern_gpu_forward_many(tern_session *const *s, const int32_t *const *tokens, const int *n, int n_seq,
                          const tern_row_draw *draw, int32_t *id, float *logits, float *const *hidden,
                          tern_error *err);
/* Sampling on the GPU (unless tern_load_params.debug.cpu_sampling):
 * tern_gpu_forward_sample is a decode step and the draw of the next id with
 * the sampler's rule (tern_sampler_gpu_rule) at u, together: one captured
 * graph, the token and u go up, only the id comes back, one
 * synchronisation. */
int tern_gpu_sample_ok(const tern_session *s, const tern_gpu_rule *rule);
int tern_gpu_forward_sample(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, int32_t *next,
                            tern_error *err);
/* The same step in two halves (tern_session_sample_launch): the launch
 * enqueues it, its input in the block the step in flight does not read
 * and its id into that block's word, and grows the KV caches first when
 * they must (after waiting for the steps in flight); the wait gives the
 * oldest step's draw. */
int tern_gpu_sample_launch(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, tern_error *err);
int tern_gpu_sample_wait(tern_session *s, int32_t *next, tern_error *err);
int tern_gpu_sample_in_flight(const tern_session *s);

#endif
