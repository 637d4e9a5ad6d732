/* `tern pull REPO[@REVISION] [DST]`: downloads a Hugging Face model
 * repository at a commit (hub.c, pull_*.c), then packs it with tern_pack.
 * Layout: the download goes to DST.hf and the packed model to DST; DST.hf
 * is removed after a successful pack unless --keep-download. With
 * --no-pack the download is DST itself (a Hugging Face folder tern runs
 * from). */
#include "cli/cli.h"
#include "cli/cmd_pack.h"
#include "cli/pull.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "tern.h"
#include "util/err.h"
#include "util/path.h"
#include "util/progress.h"

#define DEFAULT_ENDPOINT "https://huggingface.co"
#define DOWNLOAD_SUFFIX ".hf"
#define SPACE_RESERVE ((uint64_t)256 << 20)
#define MAX_PACK_ARGS 64

static void pull_usage(FILE *f) {
    fprintf(f,
            "usage: tern pull REPO[@REVISION] [DST] [options]\n"
            "Downloads a Hugging Face model repository (REVISION: a branch, tag or commit; default main) and\n"
            "packs it into DST (default: the repository's name, in the current directory). The revision is\n"
            "pinned to its commit; every file is checked against the hub's SHA-256 (git blob id for small\n"
            "files). An interrupted pull continues where it stopped when run again. The download goes to\n"
            "DST.hf and is removed once DST is packed; DST.hf/tern-pull.json and DST/tern-pull.json record\n"
            "the repository, commit, files and their hashes.\n"
            "options:\n"
            "  --no-pack          download into DST as a Hugging Face folder (tern runs it as it is)\n"
            "  --keep-download    keep DST.hf after packing\n"
            "  --jobs N           files downloaded at once (default 4)\n"
            "  --retries N        attempts after a failure that made no progress (default 5; backoff from 1 s)\n"
            "  -q, --quiet        no progress bars or summaries\n"
            "  --bits 4|8, --expert-bits B, --attn-bits B, --group N, --threads N, ...   passed to tern pack\n"
            "                     (tern pack --help)\n"
            "environment: HF_ENDPOINT (default " DEFAULT_ENDPOINT "), HF_TOKEN (sent as a bearer token:\n"
            "private and gated repositories)\n");
}

typedef struct pull_opts {
    char *repo;
    const char *revision, *dst;
    int no_pack, keep, quiet, jobs, retries;
    int n_pack;
    char *pack_argv[MAX_PACK_ARGS];
} pull_opts;

static int take_number(const char *flag, const char *v, uint64_t max, int *out) {
    uint64_t n;
    if (cli_parse_u64("pull", flag, v, max, &n) != 0) return -1;
    *out = (int)n;
    return 0;
}

/* 0: run; 1: --help; 2: bad usage. */
static int parse_pull(int argc, char **argv, pull_opts *o) {
    const char *pos[2] = {NULL, NULL};
    int n_pos = 0;
    *o = (pull_opts){.jobs = 4, .retries = 5};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int kind = tern_cli_pack_option(a);
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { pull_usage(stdout); return 1; }
        else if (!strcmp(a, "--no-pack")) o->no_pack = 1;
        else if (!strcmp(a, "--keep-download")) o->keep = 1;
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) o->quiet = 1;
        else if (!strcmp(a, "--jobs")) {
            if (take_number(a, v, 64, &o->jobs)) return 2;
            if (o->jobs < 1) { fprintf(stderr, "tern pull: --jobs needs at least 1\n"); return 2; }
            i++;
        }
        else if (!strcmp(a, "--retries")) { if (take_number(a, v, 100, &o->retries)) return 2; i++; }
        else if (kind && strcmp(a, "--resume") != 0) {
            if (o->n_pack + 2 > MAX_PACK_ARGS - 5) { fprintf(stderr, "tern pull: too many options\n"); return 2; }
            o->pack_argv[o->n_pack++] = argv[i];
            if (kind == 2 && v) o->pack_argv[o->n_pack++] = argv[++i];
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "tern pull: unknown option '%s' (see tern pull --help)\n", a);
            return 2;
        } else if (n_pos < 2) pos[n_pos++] = a;
        else { fprintf(stderr, "tern pull: unexpected argument '%s'\n", a); return 2; }
    }
    if (n_pos == 0) { pull_usage(stderr); return 2; }
    if (!(o->repo = strdup(pos[0]))) return 2;
    char *at = strchr(o->repo, '@');
    if (at) *at = '\0';
    o->revision = at ? at + 1 : "main";
    if (!hub_repo_ok(o->repo)) {
        fprintf(stderr, "tern pull: '%s' is not a repository id (owner/name)\n", o->repo);
        return 2;
    }
    size_t rl = strlen(o->revision);
    for (size_t k = 0; k < rl; k++)
        if ((unsigned char)o->revision[k] < 0x21 || o->revision[k] == 0x7f) rl = 0;
    if (rl == 0 || rl > 255) { fprintf(stderr, "tern pull: bad revision after '@'\n"); return 2; }
    const char *slash = strrchr(o->repo, '/');
    o->dst = pos[1] ? pos[1] : slash ? slash + 1 : o->repo;
    if (o->no_pack && o->n_pack) {
        fprintf(stderr, "tern pull: %s is a tern pack option; --no-pack does not pack\n", o->pack_argv[0]);
        return 2;
    }
    return 0;
}

/* The pack's parameters from the forwarded options, checked now so that a
 * bad value fails before the download. */
static int pack_params(pull_opts *o, const char *src, const char *dst, tern_pack_params *p) {
    char *argv[MAX_PACK_ARGS];
    int argc = 0;
    argv[argc++] = "pack";
    argv[argc++] = (char *)src;
    argv[argc++] = (char *)dst;
    for (int i = 0; i < o->n_pack; i++) argv[argc++] = o->pack_argv[i];
    if (o->quiet) argv[argc++] = "-q";
    int rc = tern_cli_pack_parse(argc, argv, p);
    if (rc != 0) return 2;
    tern_error err;
    if (tern_pack_check(p, &err) != 0) {
        tern_cli_pack_flags(err.msg, sizeof err.msg);
        fprintf(stderr, "tern pull: %s\n", err.msg);
        return 2;
    }
    return 0;
}

/* ---- the steps ---------------------------------------------------------- */

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Sizes come from the network: their sums saturate rather than wrap. */
static uint64_t add_sat(uint64_t a, uint64_t b) { return a + b < a ? UINT64_MAX : a + b; }

/* Free space for what is still to download, the pack (at most the
 * weights' size: tern pack never makes them larger) and a reserve. */
static int check_space(pull_job *j, int pack, uint64_t held, tern_error *err) {
    uint64_t total = 0, weights = 0;
    for (int i = 0; i < j->n_files; i++) {
        total = add_sat(total, j->files[i].meta.size);
        if (ends_with(j->files[i].name, ".safetensors")) weights = add_sat(weights, j->files[i].meta.size);
    }
    uint64_t download = total - (held < total ? held : total), packed = pack ? weights : 0;
    uint64_t need = add_sat(add_sat(download, packed), SPACE_RESERVE);
    struct statvfs sv;
    if (fstatvfs(j->root, &sv) != 0) return tern_fail(err, "%s: cannot read its free space: %s", j->dir, strerror(errno));
    uint64_t avail = (uint64_t)sv.f_bavail * sv.f_frsize;
    if (avail >= need) return 0;
    return tern_fail(err, "not enough disk space in %s: need %.2f GB (download %.2f GB, pack %.2f GB, reserve %.2f GB), "
                     "have %.2f GB", j->dir, need / 1e9, download / 1e9, packed / 1e9, SPACE_RESERVE / 1e9, avail / 1e9);
}

/* The listing, the files to fetch (the index first, for its shards), their
 * sizes and hashes. */
static int plan(pull_job *j, hub_listing *l, tern_error *err) {
    hub_conn *c = hub_conn_create(j->h, err);
    if (!c) return -1;
    int rc = hub_list(c, j->repo, j->revision, l, err);
    hub_conn_destroy(c);
    if (rc != 0) return -1;
    memcpy(j->commit, l->commit, sizeof j->commit);
    if (pull_select(j, l, err) != 0) return -1;
    /* created only for a listing that passed, never for a refused one */
    if ((j->root = tern_open_dir(AT_FDCWD, j->dir, 1, j->dir, err)) < 0 || pull_lock(j, err) != 0) return -1;
    int first = 0;
    if (!strcmp(j->files[0].name, "model.safetensors.index.json")) {
        int all = j->n_files;
        j->n_files = 1;   /* the index alone, then its shards */
        rc = pull_head_all(j, 0, err) || pull_fetch_all(j, 0, err) ? -1 : 0;
        j->n_files = all;
        if (rc != 0 || pull_add_shards(j, l, err) != 0) return -1;
        first = 1;
    }
    return pull_head_all(j, first, err);
}

static int download(pull_job *j, const pull_opts *o, tern_error *err) {
    hub_listing l = {0};
    int rc = plan(j, &l, err);
    hub_listing_free(&l);
    if (rc != 0) return -1;
    uint64_t held = pull_bytes_held(j, 0), total = 0;
    for (int i = 0; i < j->n_files; i++) total += j->files[i].meta.size;
    if (check_space(j, !o->no_pack, held, err) != 0) return -1;
    if (!o->quiet)
        fprintf(stderr, "tern pull: %s@%s is commit %s: %d files, %.1f MB (%.1f MB to fetch)\n", j->repo,
                j->revision, j->commit, j->n_files, total / 1e6, (total - (held < total ? held : total)) / 1e6);
    j->bar = o->quiet || !isatty(STDERR_FILENO) ? NULL : tern_progress_create(stderr, "download", total);
    tern_progress_start_at(j->bar, held);
    j->done_bytes = held;
    rc = pull_fetch_all(j, 0, err);
    if (rc == 0) tern_progress_finish(j->bar);
    tern_progress_destroy(j->bar);
    j->bar = NULL;
    if (rc == 0) rc = pull_write_receipt(j, j->root, j->dir, err);
    if (rc == 0 && !o->quiet) fprintf(stderr, "tern pull: %s complete and verified\n", j->dir);
    return rc;
}

static int pack(pull_job *j, const pull_opts *o, tern_pack_params *p) {
    char partial[4200];
    snprintf(partial, sizeof partial, "%s.partial", p->dst);
    struct stat st;
    p->resume = lstat(partial, &st) == 0;
    tern_error err;
    if (tern_pack(p, &err) != 0) {
        tern_cli_pack_flags(err.msg, sizeof err.msg);
        fprintf(stderr, "tern pull: pack: %s (the download stays in %s)\n", err.msg, j->dir);
        return 1;
    }
    int dfd = tern_open_dir(AT_FDCWD, p->dst, 0, p->dst, &err);
    int rc = dfd >= 0 ? pull_write_receipt(j, dfd, p->dst, &err) : -1;
    if (dfd >= 0) close(dfd);
    if (rc != 0) {
        fprintf(stderr, "tern pull: %s\n", err.msg);
        return 1;
    }
    if (!o->keep && pull_remove_download(j) != 0)
        fprintf(stderr, "tern pull: %s holds other files; left in place\n", j->dir);
    return 0;
}

int tern_cli_pull(int argc, char **argv) {
    pull_opts o;
    int rc = parse_pull(argc, argv, &o);
    if (rc != 0) {
        free(o.repo);
        return rc == 1 ? 0 : rc;
    }
    char *dst = strdup(o.dst), *dir = NULL;
    size_t n = dst ? strlen(dst) : 0;
    while (n > 1 && dst[n - 1] == '/') dst[--n] = '\0';
    if (!dst || (o.no_pack ? !(dir = strdup(dst)) : asprintf(&dir, "%s%s", dst, DOWNLOAD_SUFFIX) < 0)) {
        fprintf(stderr, "tern pull: out of memory\n");
        free(o.repo);
        free(dst);
        return 1;
    }
    tern_pack_params pp;
    struct stat st;
    tern_error err;
    pull_job j = {.repo = o.repo, .revision = o.revision, .dir = dir, .root = -1, .lock = -1,
                  .jobs = o.jobs};
    pthread_mutex_init(&j.mu, NULL);
    if (!o.no_pack && (rc = pack_params(&o, dir, dst, &pp)) != 0) goto out;
    rc = 1;
    if (!o.no_pack && lstat(dst, &st) == 0) {
        fprintf(stderr, "tern pull: %s: already exists (remove it, or pull into another directory)\n", dst);
        goto out;
    }
    const char *endpoint = getenv("HF_ENDPOINT");
    if (!(j.h = hub_create(endpoint && *endpoint ? endpoint : DEFAULT_ENDPOINT, getenv("HF_TOKEN"), o.retries,
                           o.quiet ? NULL : stderr, &err)) ||
        download(&j, &o, &err) != 0) {
        fprintf(stderr, "tern pull: %s\n", err.msg);
        goto out;
    }
    rc = o.no_pack ? 0 : pack(&j, &o, &pp);
out:
    if (j.root >= 0) {
        pull_unlock(&j);
        close(j.root);
    }
    hub_destroy(j.h);
    pull_files_free(&j);
    pthread_mutex_destroy(&j.mu);
    free(dir);
    free(dst);
    free(o.repo);
    return rc;
}
