/* Hardening of the model files (issue 34): a packed manifest whose fields
 * disagree with the config or overflow, a receipt that outlives a failed
 * verify or a changed file, named pipes in place of any model file, and
 * expert reads that fail, come back short or hit a truncated file while the
 * model streams. Each must give one clear error, never a crash, a hang or
 * silently wrong output.
 *
 * The expert-read faults come from pread()/pread64() defined below: the
 * test binary links libtern.a statically, so the slot cache's pread lands
 * here and is forwarded to the real one unless a test arms a fault. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "model/manifest.h"
#include "pack/verify.h"
#include "packutil.h"
#include "tern.h"
#include "testutil.h"

/* ---- the pread interposer ------------------------------------------------ */

enum { FAULT_NONE, FAULT_EIO, FAULT_SHORT, FAULT_EOF };

typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);
static pread_fn real_pread, real_pread64;
static atomic_int fault = FAULT_NONE;
static atomic_int faulted_calls;

__attribute__((constructor)) static void find_real_pread(void) {
    real_pread = (pread_fn)dlsym(RTLD_NEXT, "pread");
    real_pread64 = (pread_fn)dlsym(RTLD_NEXT, "pread64");
}

static ssize_t faulty(pread_fn real, int fd, void *buf, size_t n, off_t off) {
    int f = atomic_load(&fault);
    if (f == FAULT_NONE) return real(fd, buf, n, off);
    atomic_fetch_add(&faulted_calls, 1);
    if (f == FAULT_EIO) {
        errno = EIO;
        return -1;
    }
    if (f == FAULT_EOF) return 0;
    /* one page at a time: a short read the caller must continue */
    return real(fd, buf, n > 4096 ? 4096 : n, off);
}

ssize_t pread(int fd, void *buf, size_t n, off_t off) { return faulty(real_pread, fd, buf, n, off); }
ssize_t pread64(int fd, void *buf, size_t n, off_t off) { return faulty(real_pread64, fd, buf, n, off); }

/* ---- helpers -------------------------------------------------------------- */

static char *tmp;
static void setup(void) {
    tmp = make_temp_dir();
    cr_assert(tmp);
}
static void teardown(void) {
    atomic_store(&fault, FAULT_NONE);
    rm_rf(tmp);
    free(tmp);
}
TestSuite(hardening_model, .init = setup, .fini = teardown, .timeout = 300);

static const char *in_tmp(const char *rel) {
    static char buf[4][1200];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp, rel);
    return buf[k];
}

/* models/tern-tiny packed at 4 bits into tmp/name. */
static const char *pack_tiny(const char *name) {
    const char *dst = in_tmp(name);
    tern_pack_params p = {.src = "models/tern-tiny", .dst = dst, .bits = 4, .n_threads = 2};
    tern_error err;
    cr_assert_eq(tern_pack(&p, &err), 0, "%s", err.msg);
    return dst;
}

/* Sets the manifest value at a '/'-separated key path to JSON text. */
static void set_manifest(const char *dir, const char *keys, const char *value) {
    char path[1300], k[512];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    json_t *root = json_load_file(path, 0, NULL), *o = root;
    cr_assert(root);
    snprintf(k, sizeof k, "%s", keys);
    char *save = NULL, *key = strtok_r(k, "/", &save), *next;
    while ((next = strtok_r(NULL, "/", &save))) {
        o = json_object_get(o, key);
        cr_assert(json_is_object(o), "no object %s in %s", key, keys);
        key = next;
    }
    json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
    cr_assert(v, "bad JSON %s", value);
    cr_assert_eq(json_object_set_new(o, key, v), 0);
    cr_assert_eq(json_dump_file(root, path, JSON_INDENT(1) | JSON_SORT_KEYS), 0);
    json_decref(root);
}

static tern_model *load_or_null(const char *dir, uint64_t budget, tern_error *err) {
    tern_load_params lp = {.n_threads = 2, .expert_budget = budget};
    return tern_model_load(dir, &lp, err);
}

static void expect_load_error(const char *dir, const char *what) {
    tern_error err = {{0}};
    tern_model *m = load_or_null(dir, 0, &err);
    cr_assert_null(m, "loaded a model that should be refused (%s)", what);
    cr_assert(strstr(err.msg, what), "'%s' does not name %s", err.msg, what);
}

static char *cli(const char *args, int *rc) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "timeout 10 %s %s 2>&1 </dev/null", tern_bin(), args);
    return run_sh(cmd, rc);
}

/* ---- class 1: manifest fields against the config --------------------------- */

Test(hardening_model, gate_shape_from_manifest_refused) {
    const char *d = pack_tiny("p");
    /* same element count, so the byte sizes still agree with the shape */
    set_manifest(d, "experts/parts/gate/shape", "[32, 512]");
    char args[1400];
    int rc;
    snprintf(args, sizeof args, "run -m %s -p hi -n 4 -t 2", d);
    char *out = cli(args, &rc);
    cr_assert(rc != 0 && rc != 124, "run exited %d: %s", rc, out);
    cr_assert(strstr(out, "experts.parts.gate") && strstr(out, "config"), "%s", out);
    free(out);
    snprintf(args, sizeof args, "verify %s", d);
    out = cli(args, &rc);
    cr_assert(rc != 0 && rc != 124, "verify exited %d: %s", rc, out);
    cr_assert(strstr(out, "experts.parts.gate"), "%s", out);
    free(out);
    snprintf(args, sizeof args, "info -m %s", d);
    out = cli(args, &rc);
    cr_assert(rc != 0 && rc != 124, "info exited %d: %s", rc, out);
    cr_assert(strstr(out, "experts.parts.gate"), "%s", out);
    free(out);
}

Test(hardening_model, down_shape_from_manifest_refused) {
    const char *d = pack_tiny("p");
    set_manifest(d, "experts/parts/down/shape", "[128, 128]");
    expect_load_error(d, "experts.parts.down");
    tern_error err = {{0}};
    cr_assert_eq(tern_verify(d, NULL, &err), -1, "verify accepted a down part the config contradicts");
    cr_assert(strstr(err.msg, "experts.parts.down"), "%s", err.msg);
}

Test(hardening_model, arch_summary_must_match_config) {
    const char *d = pack_tiny("p");
    set_manifest(d, "arch/moe_intermediate_size", "32");
    expect_load_error(d, "arch.moe_intermediate_size");
}

/* class 5: dims whose product wraps to a size that matches the data range */
Test(hardening_model, huge_tensor_dims_refused) {
    const char *d = pack_tiny("p");
    set_manifest(d, "tensors/x.huge",
                 "{\"shape\": [4294967296, 4294967296], \"encoding\": \"f32\", \"data\": [0, 0]}");
    tern_manifest m;
    tern_error err = {{0}};
    cr_assert_eq(tern_manifest_read(&m, d, &err), -1, "a tensor of 2^64 elements was accepted");
    cr_assert(strstr(err.msg, "x.huge") && strstr(err.msg, "too large"), "%s", err.msg);
}

Test(hardening_model, expert_count_times_stride_overflow_refused) {
    const char *d = pack_tiny("p");
    /* 16 x 2^62 wraps to 0: expert files listed as empty would match */
    set_manifest(d, "experts/stride", "4611686018427387904");
    /* the file names hold a '/': edit through the files object itself */
    char path[1300];
    snprintf(path, sizeof path, "%s/manifest.json", d);
    json_t *root = json_load_file(path, 0, NULL);
    const char *name;
    json_t *f;
    json_object_foreach(json_object_get(root, "files"), name, f) {
        if (!strncmp(name, "experts/", 8)) json_object_set_new(f, "size", json_integer(0));
    }
    cr_assert_eq(json_dump_file(root, path, JSON_INDENT(1) | JSON_SORT_KEYS), 0);
    json_decref(root);
    tern_manifest m;
    tern_error err = {{0}};
    cr_assert_eq(tern_manifest_read(&m, d, &err), -1, "count x stride wrapped and was accepted");
    cr_assert(strstr(err.msg, "overflows"), "%s", err.msg);
}

/* ---- class 2: the install receipt ------------------------------------------- */

Test(hardening_model, failed_verify_removes_receipt) {
    const char *d = pack_tiny("p");
    char receipt[1300], layer[1300];
    snprintf(receipt, sizeof receipt, "%s/%s", d, TERN_RECEIPT_NAME);
    snprintf(layer, sizeof layer, "%s/experts/layer_001.bin", d);
    cr_assert_eq(access(receipt, F_OK), 0);
    cr_assert_eq(flip_byte(layer, 5000), 0);
    tern_error err = {{0}};
    cr_assert_eq(tern_verify(d, NULL, &err), -1);
    cr_assert(strstr(err.msg, "SHA-256 mismatch"), "%s", err.msg);
    cr_assert_neq(access(receipt, F_OK), 0, "a failed verify left %s in place", TERN_RECEIPT_NAME);
    /* so the load rehashes and refuses the corrupted file */
    expect_load_error(d, "layer_001.bin");
}

/* Same size, same mtime (restored): only the ctime tells, and the fast path
 * must notice without a rehash. */
Test(hardening_model, changed_file_noticed_at_load) {
    const char *d = pack_tiny("p");
    char layer[1300];
    snprintf(layer, sizeof layer, "%s/experts/layer_002.bin", d);
    struct stat before;
    cr_assert_eq(stat(layer, &before), 0);
    usleep(20000);   /* a ctime tick apart */
    cr_assert_eq(flip_byte(layer, 100), 0);
    struct timespec times[2] = {before.st_atim, before.st_mtim};
    cr_assert_eq(utimensat(AT_FDCWD, layer, times, 0), 0);
    tern_manifest m;
    tern_error err = {{0}};
    cr_assert_eq(tern_manifest_read(&m, d, &err), 0, "%s", err.msg);
    int how = -1;
    cr_assert_eq(tern_packed_check_how(d, &m, &how, &err), -1, "a changed file passed the receipt check");
    cr_assert_eq(how, TERN_CHECK_RECEIPT, "the check should not need a rehash");
    cr_assert(strstr(err.msg, "layer_002.bin") && strstr(err.msg, "tern verify"), "%s", err.msg);
    tern_manifest_free(&m);
    expect_load_error(d, "tern verify");
}

/* ---- class 3: named pipes ----------------------------------------------------- */

/* Replaces dir/rel with a FIFO and runs each command (the model dir as %s)
 * under a timeout: none may block; the first must fail naming the file. */
static void fifo_case(const char *dir, const char *rel, const char *const *cmds, int n) {
    char path[1300];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    cr_assert_eq(unlink(path), 0, "%s", path);
    cr_assert_eq(mkfifo(path, 0644), 0, "%s", path);
    const char *base = strrchr(rel, '/') ? strrchr(rel, '/') + 1 : rel;
    for (int i = 0; i < n; i++) {
        char args[2600];
        snprintf(args, sizeof args, cmds[i], dir, dir);
        int rc;
        char *out = cli(args, &rc);
        cr_assert_neq(rc, 124, "tern %s blocked on the FIFO %s", args, rel);
        if (i == 0) {
            cr_assert_neq(rc, 0, "tern %s: %s", args, out);
            cr_assert(strstr(out, base) && (strstr(out, "pipe") || strstr(out, "regular file")),
                      "tern %s: '%s' does not name the FIFO %s", args, out, rel);
        }
        free(out);
    }
    cr_assert_eq(unlink(path), 0);
}

static const char *const packed_cmds[] = {"run -m %s -p hi -n 2 -t 2", "info -m %s", "verify %s"};

static void packed_fifo(const char *rel) {
    const char *d = pack_tiny("p");
    fifo_case(d, rel, packed_cmds, 3);
}

Test(hardening_model, fifo_packed_manifest) { packed_fifo("manifest.json"); }
Test(hardening_model, fifo_packed_config) { packed_fifo("config.json"); }
Test(hardening_model, fifo_packed_resident) { packed_fifo("resident.bin"); }
Test(hardening_model, fifo_packed_expert_file) { packed_fifo("experts/layer_000.bin"); }
Test(hardening_model, fifo_packed_tokenizer) { packed_fifo("tokenizer.json"); }
Test(hardening_model, fifo_packed_generation_config) { packed_fifo("generation_config.json"); }

/* A Hugging Face directory of symlinks to tern-tiny's files (the HF loader
 * follows links, as a hub cache needs). */
static const char *hf_copy(int with_index) {
    const char *d = in_tmp("hf");
    cr_assert_eq(mkdir(d, 0755), 0);
    static const char *names[] = {"config.json", "generation_config.json", "tokenizer.json",
                                  "tokenizer_config.json", "chat_template.jinja", "model.safetensors"};
    char cwd[1024], from[1400], to[1400];
    cr_assert(getcwd(cwd, sizeof cwd));
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(from, sizeof from, "%s/models/tern-tiny/%s", cwd, names[i]);
        snprintf(to, sizeof to, "%s/%s", d, names[i]);
        cr_assert_eq(symlink(from, to), 0, "%s", to);
    }
    if (with_index) {
        snprintf(to, sizeof to, "%s/model.safetensors.index.json", d);
        cr_assert_eq(write_text(to, "{\"weight_map\": {}}"), 0);
    }
    return d;
}

static const char *const hf_cmds[] = {"run -m %s -p hi -n 2 -t 2", "info -m %s", "pack %s %s.packed"};

static void hf_fifo(const char *rel, int with_index) {
    const char *d = hf_copy(with_index);
    fifo_case(d, rel, hf_cmds, 3);
}

Test(hardening_model, fifo_hf_config) { hf_fifo("config.json", 0); }
Test(hardening_model, fifo_hf_generation_config) { hf_fifo("generation_config.json", 0); }
Test(hardening_model, fifo_hf_tokenizer) { hf_fifo("tokenizer.json", 0); }
Test(hardening_model, fifo_hf_tokenizer_config) { hf_fifo("tokenizer_config.json", 0); }
Test(hardening_model, fifo_hf_weights) { hf_fifo("model.safetensors", 0); }
Test(hardening_model, fifo_hf_index) { hf_fifo("model.safetensors.index.json", 1); }

/* ---- expert-streamer faults ------------------------------------------------- */

/* A packed model twice: experts mapped, and streamed at top_k + 1 slots. */
typedef struct {
    tern_model *resident, *streamed;
    const char *dir;
    int vocab;
} twin;

static twin load_twin(void) {
    twin t = {.dir = pack_tiny("p")};
    tern_error err = {{0}};
    t.resident = load_or_null(t.dir, 0, &err);
    cr_assert(t.resident, "%s", err.msg);
    const tern_config *c = &t.resident->cfg;
    int files = t.resident->man.n_layer_files + (t.resident->man.mtp_file ? 1 : 0);
    uint64_t budget = (uint64_t)(c->top_k + 1) * t.resident->man.stride * (uint64_t)files;
    t.streamed = load_or_null(t.dir, budget, &err);
    cr_assert(t.streamed, "%s", err.msg);
    t.vocab = tern_model_vocab_size(t.resident);
    return t;
}

static void free_twin(twin *t) {
    tern_model_free(t->resident);
    tern_model_free(t->streamed);
}

static const int32_t prompt[] = {11, 902, 4000, 17, 350, 7001, 64, 2222, 5, 3000, 19, 808};
#define N_PROMPT ((int)(sizeof prompt / sizeof *prompt))

/* Last-position logits of the prompt on a fresh session; -1 + err on failure. */
static int eval_prompt(tern_model *m, float *logits, tern_error *err) {
    tern_session *s = tern_session_create(m, NULL, err);
    cr_assert(s, "%s", err->msg);
    int rc = tern_session_eval(s, prompt, N_PROMPT, logits, 0, err);
    tern_session_destroy(s);
    return rc;
}

/* After a fault the model still computes exactly what the resident one does. */
static void expect_recovered(twin *t) {
    float *a = malloc((size_t)t->vocab * sizeof(float)), *b = malloc((size_t)t->vocab * sizeof(float));
    tern_error err = {{0}};
    cr_assert_eq(eval_prompt(t->resident, a, &err), 0, "%s", err.msg);
    cr_assert_eq(eval_prompt(t->streamed, b, &err), 0, "after the fault: %s", err.msg);
    cr_assert_eq(memcmp(a, b, (size_t)t->vocab * sizeof(float)), 0, "streamed logits differ from resident");
    free(a);
    free(b);
}

Test(hardening_model, expert_read_eio_fails_the_request) {
    twin t = load_twin();
    float *lg = malloc((size_t)t.vocab * sizeof(float));
    tern_error err = {{0}};
    tern_session *s = tern_session_create(t.streamed, NULL, &err);
    cr_assert(s, "%s", err.msg);
    atomic_store(&fault, FAULT_EIO);
    cr_assert_eq(tern_session_eval(s, prompt, N_PROMPT, lg, 0, &err), -1, "an EIO read gave logits");
    atomic_store(&fault, FAULT_NONE);
    cr_assert_gt(atomic_load(&faulted_calls), 0, "the interposer saw no expert read");
    cr_assert(strstr(err.msg, "experts/") && strstr(err.msg, strerror(EIO)), "%s", err.msg);
    /* the session is half-advanced: it says so rather than go on */
    cr_assert_eq(tern_session_eval(s, prompt, 1, lg, 0, &err), -1);
    cr_assert(strstr(err.msg, "failed mid-step"), "%s", err.msg);
    tern_session_destroy(s);
    free(lg);
    expect_recovered(&t);
    free_twin(&t);
}

Test(hardening_model, expert_read_at_eof_is_named) {
    twin t = load_twin();
    float *lg = malloc((size_t)t.vocab * sizeof(float));
    tern_error err = {{0}};
    atomic_store(&fault, FAULT_EOF);
    cr_assert_eq(eval_prompt(t.streamed, lg, &err), -1, "a read at end of file gave logits");
    atomic_store(&fault, FAULT_NONE);
    cr_assert(strstr(err.msg, "experts/") && strstr(err.msg, "truncated"), "%s", err.msg);
    free(lg);
    expect_recovered(&t);
    free_twin(&t);
}

/* Short reads are not errors: the rest of the blob is read, and the output
 * is exactly the resident model's. */
Test(hardening_model, expert_short_reads_are_completed) {
    twin t = load_twin();
    atomic_store(&fault, FAULT_SHORT);
    expect_recovered(&t);
    atomic_store(&fault, FAULT_NONE);
    cr_assert_gt(atomic_load(&faulted_calls), 0, "the interposer saw no expert read");
    free_twin(&t);
}

Test(hardening_model, expert_file_truncated_while_running) {
    twin t = load_twin();
    float *lg = malloc((size_t)t.vocab * sizeof(float));
    tern_error err = {{0}};
    cr_assert_eq(eval_prompt(t.streamed, lg, &err), 0, "%s", err.msg);
    /* one expert left in each file: most of the next misses read past its end */
    for (int i = 0; i < t.streamed->man.n_layer_files; i++) {
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", t.dir, t.streamed->man.layer_files[i]);
        cr_assert_eq(truncate(path, (off_t)t.streamed->man.stride), 0);
    }
    int failed = 0;
    for (int round = 0; round < 4 && !failed; round++) failed = eval_prompt(t.streamed, lg, &err) != 0;
    cr_assert(failed, "truncated expert files went unnoticed");
    cr_assert(strstr(err.msg, "experts/") && strstr(err.msg, "truncated"), "%s", err.msg);
    free(lg);
    free_twin(&t);
}
