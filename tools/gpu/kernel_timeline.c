/* kernel_timeline.c: every kernel's start and end on the GPU, as a CUPTI
 * injection library, for the decode step's timeline inside its replayed
 * graph (where Nsight Compute can only time kernels alone and the op
 * checker only one op in a loop of itself).
 *
 *   make CUDA=1 B=build-cuda build-cuda/libtern-timeline.so
 *   CUDA_INJECTION64_PATH=$PWD/build-cuda/libtern-timeline.so TERN_TIMELINE=run.csv tern bench ...
 *   python3 tools/gpu/timeline_steps.py run.csv
 *
 * The CUDA driver loads the library at its initialisation and calls
 * InitializeInjection; concurrent-kernel activity records (which do not
 * serialise kernels) are buffered by CUPTI and written at exit as CSV:
 * start_ns,end_ns,graph_id,grid,block,name (sorted by start). A kernel
 * launched with programmatic dependent launch starts when its first block
 * is resident, which may be before its predecessor ends. */
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF_BYTES (8u << 20)
#define MAX_RECS (4u << 20)

typedef struct {
    uint64_t start, end;
    uint32_t graph;
    int grid, block;
    const char *name;   /* CUPTI's string: lives as long as the process */
} rec;

typedef struct {
    rec *r;
    size_t n, cap, dropped;
} recs;

static recs g_recs;   /* the one piece of state an injection library has: CUPTI's callbacks take no argument */

static void CUPTIAPI buf_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = aligned_alloc(8, BUF_BYTES);
    *size = *buf ? BUF_BYTES : 0;
    *max_records = 0;
}

static void keep(const CUpti_ActivityKernel10 *k) {
    recs *R = &g_recs;
    if (R->n == R->cap) {
        size_t cap = R->cap ? 2 * R->cap : 65536;
        rec *r = cap <= MAX_RECS ? realloc(R->r, cap * sizeof *r) : NULL;
        if (!r) {
            R->dropped++;
            return;
        }
        R->r = r;
        R->cap = cap;
    }
    R->r[R->n++] = (rec){k->start, k->end, k->graphId, k->gridX * k->gridY * k->gridZ,
                         k->blockX * k->blockY * k->blockZ, k->name};
}

static void CUPTIAPI buf_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *a = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &a) == CUPTI_SUCCESS)
        if (a->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) keep((const CUpti_ActivityKernel10 *)a);
    free(buf);
}

static int by_start(const void *a, const void *b) {
    const rec *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

static void write_out(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    recs *R = &g_recs;
    const char *path = getenv("TERN_TIMELINE");
    if (!path || !*path) path = "kernel_timeline.csv";
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "kernel_timeline: cannot write %s\n", path);
        return;
    }
    qsort(R->r, R->n, sizeof *R->r, by_start);
    fprintf(f, "start_ns,end_ns,graph_id,grid,block,name\n");
    for (size_t i = 0; i < R->n; i++)
        fprintf(f, "%llu,%llu,%u,%d,%d,%s\n", (unsigned long long)R->r[i].start, (unsigned long long)R->r[i].end,
                R->r[i].graph, R->r[i].grid, R->r[i].block, R->r[i].name ? R->r[i].name : "?");
    fclose(f);
    fprintf(stderr, "kernel_timeline: %zu kernels into %s%s\n", R->n, path, R->dropped ? " (some dropped)" : "");
    free(R->r);
    R->r = NULL;
}

int InitializeInjection(void);
int InitializeInjection(void) {
    if (cuptiActivityRegisterCallbacks(buf_requested, buf_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_timeline: CUPTI activity could not be enabled\n");
        return 0;
    }
    atexit(write_out);
    return 1;
}
