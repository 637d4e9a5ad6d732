/* The tern command line: dispatch to the subcommands. It speaks only the
 * public API (tern.h). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cmd_pack.h"

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        cli_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    /* these parse their own options */
    if (!strcmp(cmd, "pack")) return tern_cli_pack(argc - 1, argv + 1);
    if (!strcmp(cmd, "verify")) return tern_cli_verify(argc - 1, argv + 1);
    if (!strcmp(cmd, "synth")) return tern_cli_synth(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return tern_cli_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return tern_cli_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "pull")) return tern_cli_pull(argc - 1, argv + 1);
    static const struct {
        const char *name;
        int (*fn)(const cli_opts *);
    } cmds[] = {{"run", cmd_run}, {"chat", cmd_chat}, {"info", cmd_info}, {"tokenize", cmd_tokenize}, {"perplexity", cmd_perplexity}};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        if (strcmp(cmd, cmds[i].name) != 0) continue;
        cli_opts o;
        if (cli_parse(argc, argv, &o) != 0) return 2;
        return cmds[i].fn(&o);
    }
    fprintf(stderr, "tern: unknown command '%s' (see tern --help)\n", cmd);
    return 2;
}
