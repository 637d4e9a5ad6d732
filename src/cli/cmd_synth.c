/* `tern synth DST [options]`: option parsing only; the work is tern_synth
 * (tern.h). */
#include "cli/cli.h"
#include "cli/cmd_pack.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tern.h"

static void synth_usage(FILE *f) {
    fprintf(f,
            "usage: tern synth DST [options]\n"
            "Writes a random-weight model at an exact shape in tern's packed format (docs/FORMAT.md), for\n"
            "measuring speed and memory without the real weights. Deterministic from --seed. DST must not exist.\n"
            "options:\n"
            "  --shape NAME       the shape (default qwen3.6-35b-a3b); --list shows them\n"
            "  --bits 4|8         bits of every matrix (default 4)\n"
            "  --expert-bits 4|8  bits of the routed experts (default: --bits; --bits 8 --expert-bits 4 is\n"
            "                     tern pack's default mix)\n"
            "  --seed N           (default 0)\n"
            "  --routing MODE     prose (default): routers shaped so expert popularity and token-to-token\n"
            "                     reuse follow published traces of the real model; uniform: plain random\n"
            "                     routers, near-uniform routing (the pessimistic case for an expert cache)\n"
            "  --resume           continue DST.partial left by an interrupted run\n"
            "  --threads N        (default: all cores)\n"
            "  -q, --quiet        no progress bar or summary\n"
            "  --list             list the shapes\n");
}

/* 0: run; 1: done (--help/--list); 2: bad usage. */
static int parse_synth(int argc, char **argv, tern_synth_params *p) {
    int quiet = 0;
    memset(p, 0, sizeof *p);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t n;
        if (!strcmp(a, "--shape") && v) { p->shape = v; i++; }
        else if (!strcmp(a, "--routing") && v) { p->routing = v; i++; }
        else if (!strcmp(a, "--bits")) {
            if (cli_parse_u64("synth", a, v, 8, &n) != 0) return 2;
            p->bits = (int)n;
            i++;
        } else if (!strcmp(a, "--expert-bits")) {
            if (cli_parse_u64("synth", a, v, 8, &n) != 0) return 2;
            p->expert_bits = (int)n;
            i++;
        } else if (!strcmp(a, "--seed")) {
            if (cli_parse_u64("synth", a, v, ~0ull, &n) != 0) return 2;
            p->seed = n;
            i++;
        } else if (!strcmp(a, "--threads")) {
            if (cli_parse_u64("synth", a, v, 4096, &n) != 0) return 2;
            p->n_threads = (int)n;
            i++;
        } else if (!strcmp(a, "--resume")) p->resume = 1;
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) quiet = 1;
        else if (!strcmp(a, "--list")) { tern_synth_list(stdout); return 1; }
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { synth_usage(stdout); return 1; }
        else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "tern synth: unknown option or missing value: '%s' (see tern synth --help)\n", a);
            return 2;
        } else if (!p->dst) p->dst = a;
        else {
            fprintf(stderr, "tern synth: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    if (!p->dst) {
        synth_usage(stderr);
        return 2;
    }
    p->progress = quiet ? NULL : stderr;
    return 0;
}

int tern_cli_synth(int argc, char **argv) {
    tern_synth_params p;
    int rc = parse_synth(argc, argv, &p);
    if (rc == 1) return 0;
    if (rc != 0) return rc;
    tern_error err;
    if (tern_synth(&p, &err) != 0) {
        tern_cli_pack_flags(err.msg, sizeof err.msg);
        fprintf(stderr, "tern synth: %s\n", err.msg);
        return 1;
    }
    return 0;
}
