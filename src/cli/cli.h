/* Options shared by the tern subcommands. The CLI speaks only tern.h. */
#ifndef TERN_CLI_H
#define TERN_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tern.h"

#define CLI_MAX_STOP 16

typedef struct cli_opts {
    const char *model;
    const char *prompt;          /* -p */
    const char *prompt_file;     /* -f */
    const char *tokens;          /* --tokens */
    const char *system;          /* --system (chat) */
    int concise;                 /* --concise (chat): the concise prompt after the system prompt */
    const char *decode;          /* --decode (tokenize) */
    const char *positional;      /* tokenize TEXT */
    int n_predict;               /* -n; -1 = until EOS */
    int threads;
    int ctx;                     /* --ctx; 0 = model maximum */
    int rope_scaling;            /* --rope-scaling: enum tern_rope_scaling */
    double rope_factor;          /* --rope-factor; 0 = --ctx over the native context */
    int kv_bits;                 /* --kv-bits */
    int json, stats, ignore_eos, think, reference;
    int mlock;                   /* --mlock: the weights locked in RAM (tern_model_lock) */
    int hide_reasoning;          /* run, chat: the reasoning is not printed (--json keeps it) */
    uint64_t expert_budget;
    int expert_policy;
    int expert_home;
    const char *device;          /* --device cpu | cuda[:N] */
    /* sampling overrides; NaN / -1 = keep the model's generation_config */
    float temp, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
    int top_k;
    int64_t seed;                /* -1 = time-based */
    int mtp;                     /* --mtp: drafts a step (0: off) */
    const char *stop[CLI_MAX_STOP];
    int n_stop;
    const char *json_schema;     /* run: --json-schema FILE */
    const char *grammar_file;    /* run: --grammar-file FILE (GBNF) */
} cli_opts;

int cli_parse(int argc, char **argv, cli_opts *o);
/* A non-negative integer option value up to max; otherwise "tern CMD: FLAG
 * needs a number ..." on stderr and -1. */
int cli_parse_u64(const char *cmd, const char *flag, const char *s, uint64_t max, uint64_t *out);
/* The model directory: -m, $TERN_MODEL, or the embedded default. */
const char *cli_model_dir(const cli_opts *o);
void cli_usage(FILE *f);
int32_t *cli_parse_ids(const char *s, size_t *n);

/* The load parameters the options give (threads, experts, device, RoPE
 * scaling). */
tern_load_params cli_load_params(const cli_opts *o);
tern_model *cli_load_model(const cli_opts *o);
/* The context a command runs with: --ctx, else dflt, else (0) the model's
 * (tern_model_max_context). More than the model reaches is refused with
 * one line on stderr (-1). */
int cli_context(const cli_opts *o, const tern_model *m, int dflt);
/* The whole of a text file (malloc'd, NUL-terminated), read with a cap so
 * that a device or pipe that never ends is refused, not read until memory
 * runs out. `why` says what the cap stands for in the message. NULL after
 * one line on stderr. */
char *cli_read_text(const char *path, size_t max_bytes, const char *why, size_t *len);
/* The model's generation defaults with the command-line overrides. */
int cli_gen_params(const cli_opts *o, tern_gen_params *p);

int cmd_run(const cli_opts *o);
int cmd_chat(const cli_opts *o);
int cmd_info(const cli_opts *o);
int cmd_tokenize(const cli_opts *o);
int cmd_perplexity(const cli_opts *o);

#endif
