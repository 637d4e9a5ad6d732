/* What the libFuzzer harnesses share.
 *
 * Each tests/fuzz/fuzz_NAME.c feeds one kind of input to the library
 * (libFuzzer, ASan, UBSan, leak detection). Run them from the repository
 * root:
 *     make fuzz                     every harness for FUZZ_SECONDS (600) each
 *     make fuzz FUZZ_SECONDS=3600 FUZZ_ONLY="manifest packed"
 *     make fuzz-smoke               20 s each (CI)
 *     build-fuzz/fuzz_NAME build-fuzz/corpus/NAME        one by hand, as long as wanted
 *     build-fuzz/fuzz_NAME CRASH_FILE                    replay one input
 * Seeds live in tests/fuzz/corpus/NAME/ (a reproducer of every bug found
 * is kept there, so each smoke run replays it); tests/fuzz/NAME.dict, when
 * present, is the harness's dictionary.
 *
 * Where the library reads only from a path, the input is written to a file
 * in a per-process scratch directory (removed at exit). A harness aborts
 * (a crash for libFuzzer) when an invariant the library documents is broken,
 * not only on memory errors. FUZZ_VERBOSE=1 prints why each input was
 * refused. */
#ifndef TERN_FUZZ_H
#define TERN_FUZZ_H

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef FUZZ_ROOT
#define FUZZ_ROOT "."
#endif

/* Aborts with a message: an invariant broke (libFuzzer saves the input). */
#define FUZZ_CHECK(cond, ...)                                    \
    do {                                                         \
        if (!(cond)) {                                           \
            fprintf(stderr, "fuzz invariant: " __VA_ARGS__);     \
            fprintf(stderr, "\n");                               \
            abort();                                             \
        }                                                        \
    } while (0)

/* With FUZZ_VERBOSE=1 in the environment, why an input was refused (for
 * replaying one input by hand). */
#define FUZZ_NOTE(...)                                           \
    do {                                                         \
        if (getenv("FUZZ_VERBOSE")) {                            \
            fprintf(stderr, "fuzz: " __VA_ARGS__);               \
            fprintf(stderr, "\n");                               \
        }                                                        \
    } while (0)

static char fuzz_dir_path[256];

static inline void fuzz_dir_remove(void) {
    char cmd[300];
    if (!fuzz_dir_path[0]) return;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir_path);
    if (system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", fuzz_dir_path);
}

/* The process's scratch directory (created on first use). */
static inline const char *fuzz_dir(void) {
    if (!fuzz_dir_path[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/tern-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(fuzz_dir_path)) { perror("fuzz: mkdtemp"); abort(); }
        atexit(fuzz_dir_remove);
    }
    return fuzz_dir_path;
}

/* dir/name := the bytes (replacing the file, never writing through a
 * hard link: the packed harness links the files it does not change). */
static inline void fuzz_write(const char *dir, const char *name, const void *data, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { perror(path); abort(); }
    const char *p = data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) { perror(path); abort(); }
        p += w;
        n -= (size_t)w;
    }
    close(fd);
}

/* A NUL-terminated copy of the input (the caller frees). */
static inline char *fuzz_strndup(const uint8_t *data, size_t n) {
    char *s = malloc(n + 1);
    if (!s) abort();
    if (n) memcpy(s, data, n);
    s[n] = 0;
    return s;
}

/* The whole file (NUL-terminated; NULL if it cannot be read). */
static inline char *fuzz_read(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0, r;
    do {
        if (n + 4096 + 1 > cap) {
            cap = (n + 4096 + 1) * 2;
            if (!(buf = realloc(buf, cap))) abort();
        }
        r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
    } while (r > 0);
    fclose(f);
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

/* Chunk lengths for feeding a stream: a small xorshift generator seeded by
 * the input, so each input replays the same cuts. */
typedef struct fuzz_cuts {
    uint64_t s;
} fuzz_cuts;

static inline fuzz_cuts fuzz_cuts_seed(const uint8_t *data, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ data[i]) * 1099511628211ull;
    return (fuzz_cuts){h | 1};
}

/* The next piece's length: 1..max, short pieces most often. */
static inline size_t fuzz_cuts_next(fuzz_cuts *c, size_t max) {
    c->s ^= c->s << 13;
    c->s ^= c->s >> 7;
    c->s ^= c->s << 17;
    size_t r = (size_t)(c->s >> 33);
    size_t len = r % 4 == 0 ? 1 + r / 4 % 64 : 1 + r / 4 % 4;
    return len < max ? len : max;
}

#endif
