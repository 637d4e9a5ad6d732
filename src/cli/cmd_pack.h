/* `tern pack`, `tern verify` and `tern synth`. Each takes the command's own argv:
 * argv[0] is the command name ("pack" / "verify"), options follow, e.g.
 * main calls tern_cli_pack(argc - 1, argv + 1). Returns the process exit
 * code: 0 done, 1 failed, 2 bad usage. */
#ifndef TERN_CLI_CMD_PACK_H
#define TERN_CLI_CMD_PACK_H

#include <stddef.h>

#include "tern.h"

int tern_cli_pack(int argc, char **argv);
int tern_cli_verify(int argc, char **argv);
int tern_cli_synth(int argc, char **argv);   /* cmd_synth.c */
int tern_cli_bench(int argc, char **argv);   /* cmd_bench.c */
int tern_cli_serve(int argc, char **argv);   /* cmd_serve.c */
int tern_cli_pull(int argc, char **argv);    /* cmd_pull.c */

/* tern pack's argv (as tern_cli_pack gets it) into params: 0 to run, 1
 * after --help, 2 on bad usage (a line on stderr). p->src and p->dst
 * point into argv. */
int tern_cli_pack_parse(int argc, char **argv, tern_pack_params *p);
/* 2 if flag is a tern pack option that takes a value, 1 one without, 0
 * not one of tern pack's. */
int tern_cli_pack_option(const char *flag);

/* Rewrites a tern_pack / tern_synth error, which names tern_pack_params
 * fields, in the flags' words (bits -> --bits, set resume -> pass
 * --resume), in place (cap bytes). */
void tern_cli_pack_flags(char *msg, size_t cap);

#endif
