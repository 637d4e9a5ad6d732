/* Device selection, memory, streams, event timers and the context (cuBLAS
 * handle + dequantization scratch): thin wrappers that turn CUDA status
 * codes into tern_error messages, so callers stay plain C. */
#include <cublas_v2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/common.cuh"
#include "cuda/internal.h"
#include "cuda/trace_marks.h"

static int cuda_fail(tern_error *err, const char *what, cudaError_t e) {
    return tern_fail(err, "%s: %s", what, cudaGetErrorString(e));
}

int tern_cuda_init(int device, char *name, size_t name_len, tern_error *err) {
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return cuda_fail(err, "cudaSetDevice", e);
    cudaDeviceProp p;
    if ((e = cudaGetDeviceProperties(&p, device)) != cudaSuccess) return cuda_fail(err, "cudaGetDeviceProperties", e);
    if (name && name_len) snprintf(name, name_len, "%s (sm_%d%d, %d SMs)", p.name, p.major, p.minor, p.multiProcessorCount);
    return 0;
}

/* The device's compute capability (PDL needs sm_90), asked once. */
int tern_cuda_pdl_enabled(void) {
    static int on = -1;
    if (on < 0) {
        int dev = 0, major = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        on = major >= 9;
    }
    return on;
}

int tern_cuda_sm_count(void) {
    static int n = 0;
    if (!n) {
        int dev = 0, v = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
        n = v > 0 ? v : 1;
    }
    return n;
}

/* The largest shared-memory carveout for a kernel (common.cuh,
 * carveout_max), set once per kernel: the attribute lasts for the process,
 * and launches outside a graph (prefill pieces, an uncaptured step) would
 * otherwise pay a driver call each. The kernels seen are a pure function of
 * the code, so a process-wide set is safe to share; past its size the
 * attribute is set again at each launch, which is only slower. */
#define CARVEOUT_SEEN 256
void tern_cuda_carveout_max(const void *kernel) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static const void *seen[CARVEOUT_SEEN];
    static int n_seen;
    pthread_mutex_lock(&mu);
    int done = 0;
    for (int i = 0; i < n_seen && !done; i++) done = seen[i] == kernel;
    if (!done) {
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared) != cudaSuccess)
            cudaGetLastError();   /* a hint: without it the kernel still runs */
        else if (n_seen < CARVEOUT_SEEN)
            seen[n_seen++] = kernel;
    }
    pthread_mutex_unlock(&mu);
}

/* The phase trace's records (trace.cuh; a build with TERN_PHASE_TRACE) as
 * CSV into path: kernel id, aux, block, then the marks in ns. */
#ifdef TERN_PHASE_TRACE
extern "C" int tern_cuda_trace_dump_gemv_fused(FILE *f);
extern "C" int tern_cuda_trace_dump_moe(FILE *f);
extern "C" int tern_cuda_trace_dump_moe_down(FILE *f);
extern "C" int tern_cuda_trace_dump_gdn(FILE *f);
extern "C" int tern_cuda_trace_dump_sample(FILE *f);
#endif
int tern_cuda_trace_built(void) {
#ifdef TERN_PHASE_TRACE
    return 1;
#else
    return 0;
#endif
}

int tern_cuda_trace_dump(const char *path, tern_error *err) {
#ifndef TERN_PHASE_TRACE
    return tern_fail(err, "phase trace %s: this build has no phase trace (build with make CUDA=1 TRACE=1)", path);
#else
    FILE *f = fopen(path, "w");
    if (!f) return tern_fail(err, "cannot write the phase trace to %s", path);
    fprintf(f, "kid,aux,block");
    for (int i = 0; i < TRACE_MARKS; i++) fprintf(f, ",m%d", i);
    fputc('\n', f);
    int a = tern_cuda_trace_dump_gemv_fused(f), b = tern_cuda_trace_dump_moe(f), c = tern_cuda_trace_dump_gdn(f),
        d = tern_cuda_trace_dump_sample(f), e = tern_cuda_trace_dump_moe_down(f);
    fclose(f);
    if (a < 0 || b < 0 || c < 0 || d < 0 || e < 0) return tern_fail(err, "phase trace: could not read the device's records");
    return 0;
#endif
}

void *tern_cuda_alloc(size_t bytes, tern_error *err) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        tern_fail(err, "cudaMalloc(%zu bytes): %s", bytes, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

void tern_cuda_free(void *p) {
    if (p) cudaFree(p);
}

/* A pageable host-to-device cudaMemcpy may return before its DMA lands,
 * and a non-blocking stream does not wait for the legacy stream: without
 * the synchronisation a kernel launched right after could read old bytes. */
int tern_cuda_upload(void *dst, const void *src, size_t bytes, tern_error *err) {
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
    if (e == cudaSuccess) e = cudaStreamSynchronize(0);
    return e == cudaSuccess ? 0 : cuda_fail(err, "upload", e);
}

int tern_cuda_download(void *dst, const void *src, size_t bytes, tern_error *err) {
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
    return e == cudaSuccess ? 0 : cuda_fail(err, "download", e);
}

int tern_cuda_copy(void *dst, const void *src, size_t bytes, tern_stream s, tern_error *err) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s);
    return e == cudaSuccess ? 0 : cuda_fail(err, "device copy", e);
}

void *tern_cuda_host_alloc(size_t bytes, tern_error *err) {
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        tern_fail(err, "cudaMallocHost(%zu bytes): %s", bytes, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

int tern_cuda_event_done(tern_event e) { return cudaEventQuery((cudaEvent_t)e) == cudaSuccess; }

int tern_cuda_stream_wait(tern_stream s, tern_event e, tern_error *err) {
    cudaError_t r = cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, 0);
    return r == cudaSuccess ? 0 : cuda_fail(err, "stream wait", r);
}

void *tern_cuda_host_alloc_mapped(size_t bytes, void **dev, tern_error *err) {
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocMapped);
    if (e == cudaSuccess) e = cudaHostGetDevicePointer(dev, p, 0);
    if (e != cudaSuccess) {
        if (p) cudaFreeHost(p);
        tern_fail(err, "cudaHostAlloc(%zu bytes, mapped): %s", bytes, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

void tern_cuda_host_free(void *p) {
    if (p) cudaFreeHost(p);
}

int tern_cuda_copy_host(void *dst, const void *src, size_t bytes, int to_host, tern_stream s, tern_error *err) {
    cudaError_t e =
        cudaMemcpyAsync(dst, src, bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, s);
    return e == cudaSuccess ? 0 : cuda_fail(err, to_host ? "copy to the host" : "copy to the device", e);
}

int tern_cuda_fill(void *dst, int byte, size_t bytes, tern_stream s, tern_error *err) {
    cudaError_t e = cudaMemsetAsync(dst, byte, bytes, s);
    return e == cudaSuccess ? 0 : cuda_fail(err, "memset", e);
}

int tern_cuda_sync(tern_stream s, tern_error *err) {
    cudaError_t e = cudaStreamSynchronize(s);
    if (e == cudaSuccess) e = cudaGetLastError();
    return e == cudaSuccess ? 0 : cuda_fail(err, "stream sync", e);
}

tern_stream tern_cuda_stream_create(tern_error *err) {
    cudaStream_t s = NULL;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        cuda_fail(err, "cudaStreamCreate", e);
        return NULL;
    }
    return s;
}

void tern_cuda_stream_destroy(tern_stream s) {
    if (s) cudaStreamDestroy(s);
}

/* ---- graphs --------------------------------------------------------------- */

int tern_cuda_capture_begin(tern_stream s, tern_error *err) {
    cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    return e == cudaSuccess ? 0 : cuda_fail(err, "cudaStreamBeginCapture", e);
}

tern_graph tern_cuda_capture_end(tern_stream s, tern_error *err) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    cudaError_t e = cudaStreamEndCapture(s, &g);
    if (e == cudaSuccess) e = cudaGraphInstantiate(&x, g, 0);
    if (g) cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        cuda_fail(err, "graph capture", e);
        return NULL;
    }
    return x;
}

int tern_cuda_capture_end_into(tern_stream s, tern_graph *exec, tern_error *err) {
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(s, &g);
    if (e != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        return cuda_fail(err, "cudaStreamEndCapture", e);
    }
    if (*exec) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(*exec, g, &info) == cudaSuccess) {
            cudaGraphDestroy(g);
            return 0;
        }
        cudaGetLastError();   /* the failed update's error is not the caller's */
        cudaGraphExecDestroy(*exec);
        *exec = NULL;
    }
    e = cudaGraphInstantiate(exec, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) *exec = NULL;
    return e == cudaSuccess ? 0 : cuda_fail(err, "cudaGraphInstantiate", e);
}

void tern_cuda_capture_abort(tern_stream s) {
    cudaGraph_t g = NULL;
    if (cudaStreamEndCapture(s, &g) == cudaSuccess && g) cudaGraphDestroy(g);
    cudaGetLastError();
}

int tern_cuda_graph_launch(tern_graph g, tern_stream s, tern_error *err) {
    cudaError_t e = cudaGraphLaunch(g, s);
    return e == cudaSuccess ? 0 : cuda_fail(err, "cudaGraphLaunch", e);
}

void tern_cuda_graph_destroy(tern_graph g) {
    if (g) cudaGraphExecDestroy(g);
}

/* ---- events ------------------------------------------------------------- */

tern_event tern_cuda_event_create(tern_error *err) {
    cudaEvent_t e = NULL;
    cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (r != cudaSuccess) {
        cuda_fail(err, "cudaEventCreate", r);
        return NULL;
    }
    return e;
}

void tern_cuda_event_destroy(tern_event e) {
    if (e) cudaEventDestroy(e);
}

int tern_cuda_event_record(tern_event e, tern_stream s, tern_error *err) {
    cudaError_t r = cudaEventRecord(e, s);
    return r == cudaSuccess ? 0 : cuda_fail(err, "cudaEventRecord", r);
}

int tern_cuda_event_sync(tern_event e, tern_error *err) {
    cudaError_t r = cudaEventSynchronize(e);
    if (r == cudaSuccess) r = cudaGetLastError();
    return r == cudaSuccess ? 0 : cuda_fail(err, "event sync", r);
}

/* ---- marks -------------------------------------------------------------- */

struct tern_cuda_marks {
    cudaEvent_t *ev;
    int n;
};

tern_cuda_marks *tern_cuda_marks_create(int n, tern_error *err) {
    tern_cuda_marks *m = (tern_cuda_marks *)calloc(1, sizeof *m);
    if (m) m->ev = (cudaEvent_t *)calloc((size_t)n, sizeof *m->ev);
    if (!m || !m->ev) {
        free(m);
        tern_fail(err, "out of memory");
        return NULL;
    }
    for (; m->n < n; m->n++) {
        cudaError_t e = cudaEventCreate(&m->ev[m->n]);
        if (e != cudaSuccess) {
            cuda_fail(err, "cudaEventCreate", e);
            tern_cuda_marks_destroy(m);
            return NULL;
        }
    }
    return m;
}

void tern_cuda_marks_destroy(tern_cuda_marks *m) {
    if (!m) return;
    for (int i = 0; i < m->n; i++) cudaEventDestroy(m->ev[i]);
    free(m->ev);
    free(m);
}

int tern_cuda_mark(tern_cuda_marks *m, int i, tern_stream s) {
    return i >= 0 && i < m->n && cudaEventRecord(m->ev[i], s) == cudaSuccess ? 0 : -1;
}

float tern_cuda_marks_ms(const tern_cuda_marks *m, int i, int j) {
    float ms = -1.0f;
    if (i < 0 || j < 0 || i >= m->n || j >= m->n) return -1.0f;
    if (cudaEventElapsedTime(&ms, m->ev[i], m->ev[j]) != cudaSuccess) {
        cudaGetLastError();   /* (not left for the next launch check to report) */
        return -1.0f;
    }
    return ms;
}

/* ---- context ------------------------------------------------------------ */

tern_cuda_ctx *tern_cuda_ctx_create(size_t tile_bytes, tern_error *err) {
    tern_cuda_ctx *c = (tern_cuda_ctx *)calloc(1, sizeof *c);
    if (!c) {
        tern_fail(err, "out of memory");
        return NULL;
    }
    c->tile_bytes = tile_bytes ? tile_bytes : (size_t)64 << 20;
    cublasStatus_t st = cublasCreate(&c->blas);
    if (st != CUBLAS_STATUS_SUCCESS) {
        tern_fail(err, "cublasCreate: %s", cublasGetStatusString(st));
        free(c);
        return NULL;
    }
    if (!(c->tile = tern_cuda_alloc(c->tile_bytes, err))) {
        tern_cuda_ctx_destroy(c);
        return NULL;
    }
    return c;
}

void tern_cuda_ctx_destroy(tern_cuda_ctx *c) {
    if (!c) return;
    if (c->blas) cublasDestroy(c->blas);
    tern_cuda_free(c->tile);
    tern_cuda_free(c->xb);
    free(c);
}

/* The bf16 copy of a prefill's activations grows to the largest seen; a
 * prefill is not captured in a graph, so allocating here is allowed. */
int ctx_reserve_x(tern_cuda_ctx *c, size_t bytes, tern_error *err) {
    if (bytes <= c->xb_bytes) return 0;
    cudaFree(c->xb);   /* earlier work on the buffer is ordered before the free */
    c->xb = NULL;
    c->xb_bytes = 0;
    if (!(c->xb = tern_cuda_alloc(bytes, err))) return -1;
    c->xb_bytes = bytes;
    return 0;
}
