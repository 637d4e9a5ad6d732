/* The CUDA op library's device, memory, streams, graphs, events, timing
 * marks and the cuBLAS context (conventions: cuda_ops.h). */
#ifndef TERN_CUDA_DEVICE_H
#define TERN_CUDA_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "tern.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cudaStream_t is `struct CUstream_st *`: the same type, without the CUDA
 * headers. NULL is the legacy default stream. */
typedef struct CUstream_st *tern_stream;

/* ---- device, memory, streams, timing ----------------------------------- */

/* Selects the device for the calling thread and reports its name. */
int tern_cuda_init(int device, char *name, size_t name_len, tern_error *err);

void *tern_cuda_alloc(size_t bytes, tern_error *err);           /* cudaMalloc; NULL on failure */
void tern_cuda_free(void *p);
/* Blocking copies on the legacy stream, complete on return; they do not
 * wait for work on other (non-blocking) streams: sync those first. These
 * and tern_cuda_copy let the runtime tell the ends apart (unified
 * addressing), so a host end may be page-locked memory as well: a
 * snapshot moved to the host is copied by the same calls. */
int tern_cuda_upload(void *dst, const void *src, size_t bytes, tern_error *err);
int tern_cuda_download(void *dst, const void *src, size_t bytes, tern_error *err);
int tern_cuda_copy(void *dst, const void *src, size_t bytes, tern_stream s, tern_error *err);
int tern_cuda_fill(void *dst, int byte, size_t bytes, tern_stream s, tern_error *err);
/* Page-locked host memory (cudaMallocHost): copies to and from it run
 * asynchronously on a stream (tern_cuda_copy_host), so a decode step's
 * few bytes in and out ride in the stream without a blocking copy. */
void *tern_cuda_host_alloc(size_t bytes, tern_error *err);
/* The same, also mapped into the device's address space: kernels read it
 * over the host link at *dev (cudaHostAllocMapped). Freed by
 * tern_cuda_host_free. */
void *tern_cuda_host_alloc_mapped(size_t bytes, void **dev, tern_error *err);
void tern_cuda_host_free(void *p);
/* Enqueues a copy between page-locked host memory and the device on s
 * (to_host picks the way); the host buffer must stay untouched until s
 * has passed it. */
int tern_cuda_copy_host(void *dst, const void *src, size_t bytes, int to_host, tern_stream s, tern_error *err);
int tern_cuda_sync(tern_stream s, tern_error *err);             /* waits; reports kernel faults */
/* A measurement build's phase trace (src/cuda/trace.cuh) into a CSV file;
 * in other builds an error saying so. _built: 1 in a measurement build. */
int tern_cuda_trace_dump(const char *path, tern_error *err);
int tern_cuda_trace_built(void);

tern_stream tern_cuda_stream_create(tern_error *err);
void tern_cuda_stream_destroy(tern_stream s);

/* CUDA graphs: ops enqueued on s between begin and end are recorded, not
 * run; the graph replays them with one launch. (cudaGraphExec_t is `struct
 * CUgraphExec_st *`.) */
typedef struct CUgraphExec_st *tern_graph;
int tern_cuda_capture_begin(tern_stream s, tern_error *err);
tern_graph tern_cuda_capture_end(tern_stream s, tern_error *err);
/* Ends a capture into *exec: when *exec holds a graph of the same shape
 * (a decode step differs from the previous one only in kernel arguments:
 * the position, the number of attention splits) its nodes are updated in
 * place (cudaGraphExecUpdate), else a new executable replaces it. */
int tern_cuda_capture_end_into(tern_stream s, tern_graph *exec, tern_error *err);
/* Ends a capture that failed midway, leaving the stream usable. */
void tern_cuda_capture_abort(tern_stream s);
int tern_cuda_graph_launch(tern_graph g, tern_stream s, tern_error *err);
void tern_cuda_graph_destroy(tern_graph g);

/* An event to wait for one point of a stream (no timing): a decode step
 * launched ahead of the host's reading of the one before waits on its own. */
typedef struct CUevent_st *tern_event;
tern_event tern_cuda_event_create(tern_error *err);
void tern_cuda_event_destroy(tern_event e);
int tern_cuda_event_record(tern_event e, tern_stream s, tern_error *err);
int tern_cuda_event_sync(tern_event e, tern_error *err);   /* waits; reports kernel faults */
int tern_cuda_event_done(tern_event e);                     /* 1 once the work before it is done */
/* Work enqueued on s after this waits for e (recorded on another stream). */
int tern_cuda_stream_wait(tern_stream s, tern_event e, tern_error *err);

/* Marks: n events recorded on a stream without waiting, read after the
 * stream is synchronised (per-op GPU time for the kernel statistics,
 * tern_load_params.debug.kernel_stats; the op checker's timings). */
typedef struct tern_cuda_marks tern_cuda_marks;
tern_cuda_marks *tern_cuda_marks_create(int n, tern_error *err);
void tern_cuda_marks_destroy(tern_cuda_marks *m);
int tern_cuda_mark(tern_cuda_marks *m, int i, tern_stream s);
/* Milliseconds from mark i to mark j (both recorded and reached); < 0 on error. */
float tern_cuda_marks_ms(const tern_cuda_marks *m, int i, int j);

/* ---- the context: cuBLAS handle and the dequantization tile ------------ */

typedef struct tern_cuda_ctx tern_cuda_ctx;
/* tile_bytes: the bf16 scratch that tern_cuda_gemm dequantizes weights
 * into (0: 64 MiB). */
tern_cuda_ctx *tern_cuda_ctx_create(size_t tile_bytes, tern_error *err);
void tern_cuda_ctx_destroy(tern_cuda_ctx *c);

#ifdef __cplusplus
}
#endif

#endif
