/* The CUDA op checker: every op of src/cuda/cuda_ops.h run on random inputs
 * at the model's real shapes (and a few odd ones) against its CPU twin,
 * one table row per case: op, shape, max abs error, max error relative to
 * max |reference|, tolerance, pass/fail. With --time, the decode ops are
 * also timed (median of repeats, device events) and their bandwidth set
 * against the H200's ~4.4 TB/s. */
#ifndef TERN_TESTS_CUDA_CHECK_H
#define TERN_TESTS_CUDA_CHECK_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cuda/cuda_ops.h"
#include "util/pool.h"

typedef struct checker {
    tern_pool *pool;          /* CPU twins run on every core */
    tern_stream stream;
    tern_cuda_marks *timer;   /* marks 0 and 1 around a timed region */
    int time;                 /* --time: time the decode ops */
    int reps;                 /* timed repeats per op */
    int failures, cases;
    FILE *times;              /* timings as TSV (--out DIR), or NULL */
    uint64_t rng;
} checker;

/* ---- random numbers (splitmix64: reproducible from the seed) ---------- */
uint64_t rnd_u64(checker *ck);
float rnd_uniform(checker *ck, float lo, float hi);
float rnd_normal(checker *ck);
void rnd_floats(checker *ck, float *x, size_t n, float scale);   /* normal * scale */
/* n rows of K and V (layout L), each the quantization of normal floats, a
 * K row then its V row */
void rnd_kv_rows(checker *ck, const tern_kvq *L, uint8_t *K, uint8_t *V, int n);

/* ---- device helpers: any failure ends the run with the message --------- */
void *dev_alloc(size_t bytes);
void *dev_upload(const void *host, size_t bytes);
void dev_download(void *host, const void *dev, size_t bytes);
float *dev_poison(size_t n);              /* n floats of NaN (0xff bytes): unwritten outputs show */
void dev_zero(void *p, size_t bytes);
void dev_sync(checker *ck, const char *what);
void die_err(const char *what, const tern_error *err);
/* GPU milliseconds of what is enqueued on ck->stream between the two. */
void timer_start(checker *ck);
float timer_stop(checker *ck);
void *xmalloc(size_t bytes);

/* ---- results ------------------------------------------------------------ */
/* Compares n floats: max |gpu - ref| and that over max |ref|; a non-finite
 * GPU value fails. Prints a row and counts a failure above tol. */
void report(checker *ck, const char *op, const char *shape, const float *gpu, const float *ref, size_t n, double tol);
/* Compares n floats element by element against their own scale: max
 * |gpu - ref| / scale_i (for outputs whose size says little about their
 * rounding, e.g. attention: sum_j p_j |v_j| rather than |o|). */
void report_scaled(checker *ck, const char *op, const char *shape, const float *gpu, const float *ref,
                   const float *scale, size_t n, double tol);
/* A row for exact comparisons (ids, bytes): mismatches out of total. */
void report_exact(checker *ck, const char *op, const char *shape, long mismatches, long total);

/* Milliseconds per call of fn(arg, rep): ck->reps calls captured in a CUDA
 * graph, the median of 5 timed replays (device events) over reps. rep lets
 * fn rotate between buffer copies so the timing is not of the 60 MB L2. */
double time_op(checker *ck, void (*fn)(void *arg, int rep), void *arg);
/* A timing row: bytes the op must move at least, and GB/s at the median. */
void report_time(checker *ck, const char *op, const char *shape, double ms, double bytes);
/* Prefill ops (milliseconds, not captured): `reps` calls of fn(arg, rep)
 * after one warm-up, each timed alone with device events; the median. */
double time_eager(checker *ck, void (*fn)(void *arg, int rep), void *arg, int reps);
/* A prefill timing row: time, and the rate against the op's FLOP count and
 * the bytes it must move at least. */
void report_rate(checker *ck, const char *op, const char *shape, double ms, double flops, double bytes);
/* Copies for rotation: enough that they exceed twice the L2, at most 32. */
int n_copies(size_t bytes);

/* ---- random weights ----------------------------------------------------- */
/* A matrix in a tern encoding with host (h) and device (d) views of the same
 * bytes: bits 4/8 (random q, scales in [1e-3, 1e-2], biases around -q_mid *
 * scale so weights centre near zero) or bits 0 with dtype BF16/F16. */
typedef struct test_mat {
    tern_mat h, d;
    size_t q_bytes, sb_bytes;
} test_mat;
void make_mat(checker *ck, test_mat *m, int64_t rows, int64_t cols, int bits, int dtype, int group);
void fill_quant(checker *ck, uint8_t *q, uint16_t *s, uint16_t *b, int64_t rows, int64_t cols, int bits, int group);
void free_mat(test_mat *m);
/* A device copy of m's bytes (for timing rotation); free with free_dev_mat. */
tern_mat copy_dev_mat(const test_mat *m);
void free_dev_mat(tern_mat *d);
size_t mat_bytes(const tern_mat *m);

/* ---- the checks, one file each ----------------------------------------- */
void check_gemv(checker *ck);
void check_moe(checker *ck);
void check_route(checker *ck);
void check_count_experts(checker *ck);
void check_rmsnorm(checker *ck);
void check_attn_prep(checker *ck);
void check_attention(checker *ck);
void check_gdn(checker *ck);
void check_sample(checker *ck);
void check_embed(checker *ck);
void check_gemm(checker *ck);
void check_gdn_chunked(checker *ck);
void check_moe_grouped(checker *ck);
void check_attention_prefill(checker *ck);

#endif
