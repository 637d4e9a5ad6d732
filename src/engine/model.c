#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/gpu.h"
#include "cpu/qmatvec.h"
#include "model/packed.h"
#include "model/packed_check.h"
#include "model/rope.h"
#include "util/err.h"
#include "util/file.h"

/* Expert files of a packed model: one per decoder layer, then the MTP
 * layer's. Layer l of the model streams from file l. */
static int expert_file_count(const tern_model *m) { return m->man.n_layer_files + (m->man.mtp_file ? 1 : 0); }

static const char *expert_path(const tern_model *m, int i, char *buf, size_t n) {
    const char *rel = i < m->man.n_layer_files ? m->man.layer_files[i] : m->man.mtp_file;
    snprintf(buf, n, "%s/%s", m->dir, rel);
    return buf;
}

static void set_stream_indices(tern_model *m) {
    for (int l = 0; l < m->cfg.n_layers; l++) m->w.layers[l].moe.stream_index = l;
    m->w.mtp.layer.moe.stream_index = m->man.n_layer_files;
}

/* No budget: map every expert file and point the experts' views into it,
 * which makes a packed model run exactly like a resident one. */
static int map_experts(tern_model *m, tern_error *err) {
    int nf = expert_file_count(m);
    m->expert_map_size = (size_t)m->man.n_experts * m->man.stride;
    m->expert_maps = calloc((size_t)nf, sizeof *m->expert_maps);
    if (!m->expert_maps) return tern_fail(err, "out of memory");
    for (int i = 0; i < nf; i++) {
        char path[4096];
        expert_path(m, i, path, sizeof path);
        int fd = tern_file_open(path, O_NOFOLLOW, err);
        if (fd < 0) return -1;
        struct stat st;
        if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != (uint64_t)m->expert_map_size) {
            close(fd);
            return tern_fail(err, "%s: not %zu bytes", path, m->expert_map_size);
        }
        void *p = mmap(NULL, m->expert_map_size, PROT_READ, MAP_PRIVATE, fd, 0);
        close(fd);
        if (p == MAP_FAILED) return tern_fail(err, "%s: mmap failed: %s", path, strerror(errno));
        m->expert_maps[i] = p;
        tern_moe_w *moe = i < m->cfg.n_layers ? &m->w.layers[i].moe : &m->w.mtp.layer.moe;
        moe->experts = calloc((size_t)m->man.n_experts, sizeof *moe->experts);
        if (!moe->experts) return tern_fail(err, "out of memory");
        for (int e = 0; e < m->man.n_experts; e++)
            tern_packed_expert_view(&m->man, (const uint8_t *)p + (size_t)e * m->man.stride, &moe->experts[e]);
    }
    return 0;
}

tern_expert_cache *tern_model_expert_reader(const tern_model *m, int n_files, int slots, int policy, int io_threads,
                                            tern_error *err) {
    char (*paths)[4096] = malloc((size_t)n_files * sizeof *paths);
    const char **pp = malloc((size_t)n_files * sizeof *pp);
    tern_expert_cache *c = NULL;
    if (paths && pp) {
        for (int i = 0; i < n_files; i++) pp[i] = expert_path(m, i, paths[i], sizeof paths[i]);
        tern_expert_cache_params cp = {n_files, pp, m->man.n_experts, m->man.stride, slots, policy, io_threads};
        c = tern_expert_cache_create(&cp, err);
    } else {
        tern_fail(err, "out of memory");
    }
    free(paths);
    free(pp);
    return c;
}

static int start_streaming(tern_model *m, const tern_load_params *p, tern_error *err) {
    int nf = expert_file_count(m);
    uint64_t per_slot;
    if (__builtin_mul_overflow(m->man.stride, (uint64_t)nf, &per_slot))
        return tern_fail(err, "%s/manifest.json: experts.stride x expert files overflows", m->dir);
    uint64_t slots = p->expert_budget / per_slot;
    if (slots < (uint64_t)m->cfg.top_k)
        return tern_fail(err, "expert budget of %llu bytes gives %llu slots per layer; at least top_k = %d "
                              "are needed (a budget of %llu bytes)",
                         (unsigned long long)p->expert_budget, (unsigned long long)slots, m->cfg.top_k,
                         (unsigned long long)(per_slot * m->cfg.top_k));
    if (slots > (uint64_t)m->man.n_experts) slots = (uint64_t)m->man.n_experts;
    m->experts = tern_model_expert_reader(m, nf, (int)slots, p->expert_policy, p->io_threads, err);
    return m->experts ? 0 : -1;
}

int tern_gpu_budget_set(tern_model *m, const tern_load_params *p, tern_error *err) {
    if (p->expert_policy != TERN_POLICY_LFU && p->expert_policy != TERN_POLICY_LRU)
        return tern_fail(err, "expert_policy %d is not a policy (LFU %d, LRU %d)", p->expert_policy, TERN_POLICY_LFU,
                         TERN_POLICY_LRU);
    if (p->expert_home != TERN_HOME_RAM && p->expert_home != TERN_HOME_DISK)
        return tern_fail(err, "expert_home %d is not a home (RAM %d, disk %d)", p->expert_home, TERN_HOME_RAM,
                         TERN_HOME_DISK);
    m->gpu_expert_budget = p->expert_budget;
    m->gpu_expert_policy = p->expert_policy;
    m->gpu_expert_home = p->expert_home;
    return 0;
}

static int open_packed(tern_model *m, const tern_load_params *p, tern_error *err) {
    m->packed = 1;
    char label[4200];
    snprintf(label, sizeof label, "%s/manifest.json", m->dir);
    if (tern_manifest_read(&m->man, m->dir, err) != 0 ||
        tern_packed_check_config(&m->man, &m->cfg, label, err) != 0 ||
        tern_packed_check(m->dir, &m->man, err) != 0 || tern_packed_open(&m->ts, &m->man, m->dir, err) != 0 ||
        tern_weights_bind(&m->w, &m->cfg, &m->ts, err) != 0)
        return -1;
    /* the MTP layer's routed experts stream from their own file */
    if (m->w.has_mtp && !m->man.mtp_file)
        return tern_fail(err, "%s: the model has an MTP layer but experts.mtp names no file", label);
    set_stream_indices(m);
    /* a GPU run streams its experts itself, from host memory (gpu_model.c) */
    if (p && p->expert_budget && p->device && strncmp(p->device, "cuda", 4) == 0) {
        if (tern_gpu_budget_set(m, p, err)) return -1;
        return m->gpu_expert_home == TERN_HOME_DISK ? 0 : map_experts(m, err);
    }
    return p && p->expert_budget ? start_streaming(m, p, err) : map_experts(m, err);
}

tern_model *tern_model_alloc(const tern_load_params *params, tern_error *err) {
    tern_model *m = calloc(1, sizeof *m);
    if (m) pthread_mutex_init(&m->identity_mu, NULL);
    if (m) m->pool = tern_pool_create(params ? params->n_threads : 0);
    if (!m || !m->pool) {
        free(m);
        tern_fail(err, "out of memory");
        return NULL;
    }
    m->fast = !(params && params->reference_kernels);
    m->mtp_recompute = params && params->debug.mtp_recompute;
    m->mtp_force_accept = params ? params->debug.mtp_force_accept : 0;
    m->isa = tern_isa_best();
    return m;
}

int tern_model_finish(tern_model *m, const tern_load_params *params, tern_error *err) {
    if (!(m->mtp_force_accept >= 0 && m->mtp_force_accept <= 1))
        return tern_fail(err, "debug.mtp_force_accept must be in [0, 1] (got %g)", m->mtp_force_accept);
    if (tern_rope_apply(&m->cfg, params, err) != 0) return -1;
    if (!(m->inv_freq = malloc((size_t)(m->cfg.rope_dim / 2) * sizeof(float)))) return tern_fail(err, "out of memory");
    tern_rope_inv_freq(&m->cfg, m->inv_freq);
    return 0;
}

/* "auto", "cpu", "cuda" or "cuda:N" */
static int device_name_valid(const char *dev) {
    if (!strcmp(dev, "auto") || !strcmp(dev, "cpu") || !strcmp(dev, "cuda")) return 1;
    if (strncmp(dev, "cuda:", 5) != 0 || !dev[5] || strlen(dev + 5) > 4) return 0;
    for (const char *c = dev + 5; *c; c++)
        if (*c < '0' || *c > '9') return 0;
    return 1;
}

int tern_model_place(tern_model *m, const tern_load_params *params, tern_error *err) {
    const char *dev = params ? params->device : NULL;
    if (!dev || !strcmp(dev, "cpu")) return 0;
    if (!device_name_valid(dev))
        return tern_fail(err, "device \"%s\": expected auto, cpu, cuda or cuda:N", dev);
    if (strcmp(dev, "auto") != 0) return tern_gpu_model_init(m, dev, params, err);
    /* auto: the first GPU when this build, this machine and this model
     * allow it (packed, experts resident), else the CPU engine */
    tern_error ignored;
    tern_gpu_model_init(m, "cuda", params, &ignored);
    return 0;
}

tern_model *tern_model_load(const char *dir, const tern_load_params *params, tern_error *err) {
    tern_model *m = tern_model_alloc(params, err);
    if (!m) return NULL;
    int rc = (m->dir = strdup(dir)) ? 0 : tern_fail(err, "out of memory");
    if (rc == 0) rc = tern_config_load(&m->cfg, dir, err);
    if (rc == 0 && params && params->expert_home && !params->expert_budget)
        rc = tern_fail(err, "expert_home %d: experts have a home outside VRAM only under an expert budget",
                       params->expert_home);
    if (rc == 0 && tern_is_packed_dir(dir)) {
        rc = open_packed(m, params, err);
    } else if (rc == 0) {
        if (params && params->expert_budget)
            rc = tern_fail(err, "%s: an expert budget needs a packed model (tern pack)", dir);
        else
            rc = tern_tensors_open(&m->ts, dir, 0, err) || tern_weights_bind(&m->w, &m->cfg, &m->ts, err) ? -1 : 0;
    }
    if (rc == 0) rc = tern_model_finish(m, params, err);
    if (rc == 0) rc = tern_model_place(m, params, err);
    if (rc != 0) {
        tern_model_free(m);
        return NULL;
    }
    return m;
}

void tern_model_free(tern_model *m) {
    if (!m) return;
    if (m->gpu) tern_gpu_model_free(m);
    tern_expert_cache_destroy(m->experts);
    if (m->expert_maps) {
        for (int i = 0; i < expert_file_count(m); i++)
            if (m->expert_maps[i]) munmap(m->expert_maps[i], m->expert_map_size);
        free(m->expert_maps);
    }
    tern_weights_free(&m->w, &m->cfg);
    if (m->packed) tern_manifest_free(&m->man);
    tern_tensors_close(&m->ts);
    tern_pool_destroy(m->pool);
    free(m->inv_freq);
    free(m->dir);
    pthread_mutex_destroy(&m->identity_mu);
    free(m);
}

int tern_model_vocab_size(const tern_model *m) { return m->cfg.vocab; }
int tern_model_max_context(const tern_model *m) { return tern_cfg_max_context(&m->cfg); }
int tern_model_check_context(const tern_model *m, int ctx, tern_error *err) {
    return tern_cfg_check_context(&m->cfg, ctx, err);
}
void tern_model_rope_describe(const tern_model *m, char *buf, size_t n) { tern_rope_describe(&m->cfg, buf, n); }
int tern_model_has_mtp(const tern_model *m) { return m->w.has_mtp; }
int tern_model_n_threads(const tern_model *m) { return tern_pool_size(m->pool); }

int tern_model_is_eos(const tern_model *m, int32_t id) {
    for (int i = 0; i < m->cfg.n_eos; i++)
        if (m->cfg.eos[i] == id) return 1;
    return 0;
}

void tern_model_stream_stats(const tern_model *m, tern_stream_stats *out) {
    memset(out, 0, sizeof *out);
    if (m->gpu && m->gpu_expert_budget) tern_gpu_stream_stats(m, out);
    if (!m->experts) return;
    tern_expert_stats st;
    tern_expert_cache_stats(m->experts, &st);
    out->streaming = 1;
    out->slots_per_layer = tern_expert_cache_slots(m->experts);
    out->hits = st.hits;
    out->misses = st.misses;
    out->bytes_read = st.bytes_read;
    out->read_s = st.read_s;
    out->wait_s = st.wait_s;
    out->direct_io = st.direct_io;
}

void tern_model_moe_shape(const tern_model *m, int *n_layers, int *n_experts, int *top_k) {
    *n_layers = m->cfg.n_layers;
    *n_experts = m->cfg.n_experts;
    *top_k = m->cfg.top_k;
}

const char *tern_model_device(const tern_model *m) { return m->gpu ? tern_gpu_name(m) : "cpu"; }

/* ---- locking the weights in RAM ----------------------------------------- */

static int lock_region(const void *p, size_t n, size_t *locked, tern_error *err) {
    if (!p || !n) return 0;
    if (mlock(p, n) == 0) {
        *locked += n;
        return 0;
    }
    int e = errno;
    struct rlimit rl;
    char lim[48] = "unknown";
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
        if (rl.rlim_cur == RLIM_INFINITY) snprintf(lim, sizeof lim, "unlimited");
        else snprintf(lim, sizeof lim, "%.0f MiB", rl.rlim_cur / 1048576.0);
    }
    return tern_fail(err, "mlock: the model's weights could not be locked in RAM (%.0f MiB more after %.0f MiB): %s "
                     "(RLIMIT_MEMLOCK is %s; raise it, e.g. ulimit -l unlimited)",
                     n / 1048576.0, *locked / 1048576.0, strerror(e), lim);
}

int tern_model_lock(tern_model *m, tern_error *err) {
    if (m->gpu) return 0;
    size_t locked = 0;
    if (lock_region(m->ts.map, m->ts.map_size, &locked, err)) return -1;
    for (int i = 0; i < m->ts.n_files; i++)
        if (lock_region(m->ts.files[i].map, m->ts.files[i].size, &locked, err)) return -1;
    for (int i = 0; m->expert_maps && i < expert_file_count(m); i++)
        if (lock_region(m->expert_maps[i], m->expert_map_size, &locked, err)) return -1;
    return 0;
}
