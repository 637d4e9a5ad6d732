/* `tern pack SRC DST [options]` and `tern verify DIR`: option parsing
 * only; the work is tern_pack / tern_verify (tern.h). */
#include "cli/cmd_pack.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tern.h"

static void pack_usage(FILE *f) {
    fprintf(f,
            "usage: tern pack SRC DST [options]\n"
            "Packs a model directory into tern's packed format (docs/FORMAT.md). SRC: Hugging Face safetensors\n"
            "(bf16/f16/f32, or FP8 blocks with weight_scale_inv), or MLX affine 4/8-bit. DST must not exist: the\n"
            "pack is written to DST.partial and renamed to DST when complete, with DST's manifest and receipt.\n"
            "options:\n"
            "  --bits 4|8         bits of every class (default: routed experts 4, everything else 8)\n"
            "  --embed-bits B     embed_tokens                                 B: 4, 8, or 16 = keep float\n"
            "  --attn-bits B      attention q/k/v/o, Gated DeltaNet in_proj_* and out_proj\n"
            "  --router-bits B    router (mlp.gate) and shared_expert_gate\n"
            "  --shared-bits B    shared expert\n"
            "  --expert-bits B    routed experts\n"
            "  --head-bits B      lm_head\n"
            "  --mtp-fc-bits B    mtp.fc\n"
            "  --group N          values per scale and bias: 32, 64 (default) or 128; rows not a multiple\n"
            "                     of it use the largest of 64/32 that divides them, else stay float\n"
            "  --resume           continue DST.partial left by an interrupted pack (re-verifies its files)\n"
            "  --threads N        quantization threads (default: all cores)\n"
            "  -q, --quiet        no progress bar or summary\n"
            "Norms, conv1d, A_log and dt_bias keep their float type. MLX sources are copied bit for bit\n"
            "(an explicit bits option that differs from the source is refused); their norm weights are\n"
            "stored as w, undoing MLX's 1 + w. Vision and audio tensors are dropped.\n");
}

static int parse_int(const char *cmd, const char *flag, const char *s, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s ? s : "", &end, 10);
    /* 0 would silently mean "the default": a flag given asks for a value */
    if (!s || !*s || *end || errno || v < 1 || v > 1 << 20) {
        fprintf(stderr, "tern %s: %s needs a positive number, got '%s'\n", cmd, flag, s ? s : "");
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* The option's target field, or NULL. */
static int *bits_field(tern_pack_params *p, const char *a) {
    static const struct { const char *flag; size_t off; } map[] = {
        {"--bits", offsetof(tern_pack_params, bits)},
        {"--embed-bits", offsetof(tern_pack_params, embed_bits)},
        {"--attn-bits", offsetof(tern_pack_params, attn_bits)},
        {"--router-bits", offsetof(tern_pack_params, router_bits)},
        {"--shared-bits", offsetof(tern_pack_params, shared_bits)},
        {"--expert-bits", offsetof(tern_pack_params, expert_bits)},
        {"--head-bits", offsetof(tern_pack_params, head_bits)},
        {"--mtp-fc-bits", offsetof(tern_pack_params, mtp_fc_bits)},
        {"--group", offsetof(tern_pack_params, group)},
        {"--threads", offsetof(tern_pack_params, n_threads)},
    };
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (!strcmp(a, map[i].flag)) return (int *)((char *)p + map[i].off);
    return NULL;
}

int tern_cli_pack_option(const char *flag) {
    tern_pack_params p;
    if (bits_field(&p, flag)) return 2;
    return !strcmp(flag, "--resume") || !strcmp(flag, "-q") || !strcmp(flag, "--quiet");
}

int tern_cli_pack_parse(int argc, char **argv, tern_pack_params *p) {
    int quiet = 0, n_pos = 0;
    const char *pos[2] = {NULL, NULL};
    memset(p, 0, sizeof *p);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int *field = bits_field(p, a);
        if (field) {
            if (parse_int("pack", a, i + 1 < argc ? argv[i + 1] : NULL, field) != 0) return 2;
            i++;
        } else if (!strcmp(a, "--resume")) {
            p->resume = 1;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = 1;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            pack_usage(stdout);
            return 1;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "tern pack: unknown option '%s' (see tern pack --help)\n", a);
            return 2;
        } else if (n_pos < 2) {
            pos[n_pos++] = a;
        } else {
            fprintf(stderr, "tern pack: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    if (n_pos != 2) {
        pack_usage(stderr);
        return 2;
    }
    p->src = pos[0];
    p->dst = pos[1];
    p->progress = quiet ? NULL : stderr;
    return 0;
}

void tern_cli_pack_flags(char *msg, size_t cap) {
    /* a parameter that opens the message, then phrases */
    static const char *const param[][2] = {
        {"bits", "--bits"}, {"group", "--group"}, {"embed_bits", "--embed-bits"}, {"attn_bits", "--attn-bits"},
        {"router_bits", "--router-bits"}, {"shared_bits", "--shared-bits"}, {"expert_bits", "--expert-bits"},
        {"head_bits", "--head-bits"}, {"mtp_fc_bits", "--mtp-fc-bits"},
    };
    static const char *const phrase[][2] = {{"set resume", "pass --resume"}};
    char out[sizeof ((tern_error *)0)->msg];
    for (size_t i = 0; i < sizeof param / sizeof param[0]; i++) {
        size_t n = strlen(param[i][0]);
        if (!strncmp(msg, param[i][0], n) && !strncmp(msg + n, " must", 5)) {
            snprintf(out, sizeof out, "%s%s", param[i][1], msg + n);
            snprintf(msg, cap, "%s", out);
            break;
        }
    }
    for (size_t i = 0; i < sizeof phrase / sizeof phrase[0]; i++) {
        char *at = strstr(msg, phrase[i][0]);
        if (!at) continue;
        snprintf(out, sizeof out, "%.*s%s%s", (int)(at - msg), msg, phrase[i][1], at + strlen(phrase[i][0]));
        snprintf(msg, cap, "%s", out);
    }
}

int tern_cli_pack(int argc, char **argv) {
    tern_pack_params p;
    int rc = tern_cli_pack_parse(argc, argv, &p);
    if (rc == 1) return 0;   /* --help */
    if (rc != 0) return rc;
    tern_error err;
    if (tern_pack(&p, &err) != 0) {
        tern_cli_pack_flags(err.msg, sizeof err.msg);
        fprintf(stderr, "tern pack: %s\n", err.msg);
        return 1;
    }
    return 0;
}

int tern_cli_verify(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: tern verify DIR\n"
               "Rehashes every file of a packed model against its manifest, checks the layout, and on\n"
               "success writes the install receipt DIR/verified-install.json (loads then check sizes only).\n");
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: tern verify DIR\n");
        return 2;
    }
    tern_error err;
    if (tern_verify(argv[1], stderr, &err) != 0) {
        fprintf(stderr, "tern verify: %s\n", err.msg);
        return 1;
    }
    return 0;
}
