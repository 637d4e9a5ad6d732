/* tern_model_identity: what a saved state's validity depends on. A prompt
 * cache keys its checkpoints with it, so a state computed by other weights,
 * another engine (CPU or GPU, another kernel set) or other model files can
 * never be restored. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cpu/qmatvec.h"
#include "engine/engine.h"
#include "util/err.h"
#include "util/sha256.h"

static void put_str(tern_sha256 *h, const char *s) {
    tern_sha256_update(h, s, strlen(s) + 1);   /* (with its NUL: no two lists hash alike) */
}

/* A file's identity as the install receipt binds it: its name, device,
 * inode, size, modification and change times (the name alone where there
 * is no file: an in-memory synthetic model's). Not the directory's path,
 * so the same files give the same identity from any working directory. */
static void put_file(tern_sha256 *h, const char *name, const char *path) {
    struct stat st;
    put_str(h, name);
    if (stat(path, &st) != 0) return;
    int64_t v[7] = {(int64_t)st.st_dev, (int64_t)st.st_ino, (int64_t)st.st_size, st.st_mtim.tv_sec,
                    st.st_mtim.tv_nsec, st.st_ctim.tv_sec, st.st_ctim.tv_nsec};
    tern_sha256_update(h, v, sizeof v);
}

/* The same for dir/rel. */
static void put_file_in(tern_sha256 *h, const char *dir, const char *rel) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, rel) < (int)sizeof path) put_file(h, rel, path);
    else put_str(h, rel);
}

static int compute(const tern_model *m, char hex[65], tern_error *err) {
    tern_sha256 h;
    if (tern_sha256_init(&h, err)) return -1;
    put_str(&h, "tern model identity 1");
    put_str(&h, tern_model_device(m));
    put_str(&h, m->fast ? tern_isa_name((tern_isa)m->isa) : "reference");
    put_file_in(&h, m->dir, "config.json");
    /* a load's RoPE scaling changes every K row as much as config.json does */
    const tern_rope_cfg *y = &m->cfg.rope;
    if (y->type != TERN_ROPE_NONE || y->config_type != TERN_ROPE_NONE) {
        char rope[256];
        snprintf(rope, sizeof rope, "rope %d %d %.17g %.17g %.17g %.17g %d", y->type, y->native, y->factor,
                 y->beta_fast, y->beta_slow, y->attn_factor, y->truncate);
        put_str(&h, rope);
    }
    if (m->packed) {
        char *json = tern_manifest_dumps(&m->man, err);
        if (!json) {
            tern_sha256_discard(&h);
            return -1;
        }
        put_str(&h, json);
        free(json);
        for (int i = 0; i < m->man.n_files; i++) put_file_in(&h, m->dir, m->man.files[i].path);
    } else {
        for (int i = 0; i < m->ts.n_files; i++) {
            const char *path = m->ts.files[i].path, *slash = strrchr(path, '/');
            put_file(&h, slash ? slash + 1 : path, path);
        }
    }
    tern_sha256_final(&h, hex);
    return 0;
}

/* Once per model: the files are those the loaded model was opened from,
 * and snapshot files ask for it at every write and read. */
int tern_model_identity(const tern_model *m, char hex[65], tern_error *err) {
    tern_model *mm = (tern_model *)m;   /* (the cached value only) */
    pthread_mutex_lock(&mm->identity_mu);
    int rc = mm->identity[0] ? 0 : compute(m, mm->identity, err);
    if (rc == 0) memcpy(hex, mm->identity, 65);
    pthread_mutex_unlock(&mm->identity_mu);
    return rc;
}
