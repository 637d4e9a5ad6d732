/* tern serve: the options, then the server (src/server). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "server/pcdisk.h"
#include "server/server.h"

static void serve_usage(FILE *f) {
    fprintf(f,
            "usage: tern serve [-m DIR] [options]\n"
            "An OpenAI- and Anthropic-compatible HTTP server (docs/SERVER.md): POST /v1/chat/completions,\n"
            "/v1/completions, /v1/responses, /v1/messages, /v1/messages/count_tokens, /v1/models/unload;\n"
            "GET /v1/models, /health, /metrics; a chat page at / (in a browser). Every `tern run` model,\n"
            "device and sampling option applies (tern --help).\n"
            "server:\n"
            "  --host ADDR            address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)\n"
            "  --port N               port (default 8080; 0 picks a free one)\n"
            "  --api-key KEY          require Authorization: Bearer KEY or x-api-key: KEY (default: none;\n"
            "                         the chat page asks for it)\n"
            "  --no-webui             no chat page at / (default: served, with its files built into tern)\n"
            "  --model-id NAME        the name responses carry (default: the model directory's name)\n"
            "  --strict-model         refuse requests that name another model (default: any name is served)\n"
            "  --lazy-load            listen at once and load the model on the first request that needs it\n"
            "                         (the tokenizer and config.json are read at start; GET /health says\n"
            "                         \"model\": \"unloaded\", \"loading\" or \"loaded\")\n"
            "  --idle-unload S        free the model, its sessions and the prefix cache's RAM and device\n"
            "                         memory after S seconds without a request (the --cache-disk tier is\n"
            "                         kept, the RAM tier written to it); the next request loads it again\n"
            "                         (default: kept; POST /v1/models/unload frees it at once)\n"
            "  --slots N              live sessions kept for conversations that continue (default 4)\n"
            "  --max-seqs N           requests generating together, a token each per step, where the engine\n"
            "                         evaluates sessions in one pass (the CPU's; default 16, at most --slots)\n"
            "  --prefill-chunk N      prompt tokens a step for a request being prefilled while others\n"
            "                         generate (default 512; a smaller chunk holds them up less)\n"
            "  --queue-limit N        requests that may wait for the engine; beyond, 429 (default 16)\n"
            "  --kv-budget SIZE       KV rows all slots' sessions hold together: idle slots give theirs\n"
            "                         back first, then the request admitted last waits (preempted, its\n"
            "                         state a checkpoint) until it fits; one request's tokens end where\n"
            "                         its rows alone would pass it (default: no bound)\n"
            "  --cache-ram SIZE       prefix cache: checkpoint bytes kept in host RAM (default a quarter of\n"
            "                         the available RAM, at most 32G); 0 turns the cache off on the CPU\n"
            "  --cache-vram SIZE      on a GPU: checkpoint bytes kept in device memory, the fastest to restore;\n"
            "                         what it evicts moves to --cache-ram (default 4G; both 0: off)\n"
            "  --cache-disk DIR       prefix cache: a disk tier in DIR (made 0700) for what --cache-ram evicts;\n"
            "                         emptied of this model's files at start (default: none)\n"
            "  --cache-disk-size SIZE bytes of checkpoint files kept in DIR (default 16G)\n"
            "  --cache-checkpoint-interval N   prompt tokens between checkpoints of a long prefill\n"
            "                         (default 2048; 0: only at message boundaries and the ends)\n"
            "  --max-tokens N         default generation limit (default: until the context ends)\n"
            "  --responses-store N    responses kept in memory for previous_response_id (default 64)\n"
            "  --max-body SIZE        largest request body (default 8M; 413 beyond)\n"
            "  --max-connections N    open connections at most (default 64)\n"
            "  --read-timeout S       seconds a request's headers and body may take to arrive (default 30)\n"
            "  --idle-timeout S       seconds an idle keep-alive connection stays open (default 60)\n"
            "  --heartbeat S          seconds between keep-alive comments on a waiting stream (default 5)\n"
            "  --no-think             thinking off unless a request turns it on (default on)\n"
            "  --concise              a system prompt asking for short answers added to every conversation\n"
            "                         (after the request's own; docs/SERVER.md)\n"
            "  --preserve-thinking    the chat template keeps the reasoning of every earlier turn unless a\n"
            "                         request says otherwise (chat_template_kwargs): an agent's new message\n"
            "                         then leaves the prompt's prefix as it was, so the prefix cache keeps\n"
            "                         hitting (default off, the template's own default)\n"
            "  --seed N               the seed of every request that gives none (default: a random one each)\n"
            "  --ignore-eos           the default of the ignore_eos request field (benchmarks)\n"
            "  --synth SHAPE          serve an in-memory synthetic model (tern synth --list); needs --tokenizer\n"
            "  --bits 4|8             --synth: weight bits (default 4)\n"
            "  --tokenizer DIR        tokenizer.json from DIR instead of the model directory\n");
}

static int parse_seconds(const char *flag, const char *v, double *out) {
    char *end;
    double x = strtod(v, &end);
    if (!*v || *end || !(x > 0 && x <= 86400)) {
        fprintf(stderr, "tern serve: %s needs seconds in (0, 86400], got '%s'\n", flag, v);
        return -1;
    }
    *out = x;
    return 0;
}

static int parse_int(const char *flag, const char *v, long lo, long hi, int *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < lo || x > hi) {
        fprintf(stderr, "tern serve: %s needs an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

int tern_cli_serve(int argc, char **argv) {
    srv_params p = {.host = "127.0.0.1", .port = 8080, .max_body = 8u << 20, .max_connections = 64,
                    .read_timeout_s = 30, .idle_timeout_s = 60, .heartbeat_s = 5, .webui = 1, .slots = 4, .max_seqs = 16, .queue_limit = 16,
                    .responses_store = 64, .max_tokens = -1, .think = 1, .cache_ram = -1, .cache_vram = -1,
                    .checkpoint_interval = 2048, .cache_disk_size = -1};
    tern_synth_params synth = {.bits = 4};
    const char *synth_shape = NULL;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) return 1;
    int n_rest = 0;
    rest[n_rest++] = argv[0];
    rest[n_rest++] = "serve";
    int bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        tern_error err;
        uint64_t size;
#define IS(x) (strcmp(a, x) == 0)
        if (IS("-h") || IS("--help")) { serve_usage(stdout); cli_usage(stdout); free(rest); return 0; }
        if (IS("--strict-model")) { p.strict_model = 1; continue; }
        if (IS("--no-think")) { p.think = 0; continue; }
        if (IS("--no-webui")) { p.webui = 0; continue; }
        if (IS("--think")) { p.think = 1; continue; }
        if (IS("--preserve-thinking")) { p.preserve_thinking = 1; continue; }
        if (IS("--concise")) { p.concise = 1; continue; }
        if (IS("--lazy-load")) { p.lazy_load = 1; continue; }
        int serve_opt = IS("--host") || IS("--port") || IS("--api-key") || IS("--model-id") || IS("--slots") || IS("--max-seqs") || IS("--prefill-chunk") ||
                        IS("--queue-limit") || IS("--max-tokens") || IS("--responses-store") || IS("--max-body") ||
                        IS("--max-connections") || IS("--read-timeout") || IS("--idle-timeout") ||
                        IS("--heartbeat") || IS("--idle-unload") || IS("--synth") || IS("--bits") || IS("--tokenizer") ||
                        IS("--cache-ram") || IS("--cache-vram") || IS("--cache-checkpoint-interval") ||
                        IS("--cache-disk") || IS("--kv-budget") ||
                        IS("--cache-disk-size");
        if (!serve_opt) { rest[n_rest++] = argv[i]; continue; }
        if (!v) { fprintf(stderr, "tern serve: %s needs a value\n", a); bad = 1; break; }
        i++;
        if (IS("--host")) p.host = v;
        else if (IS("--port")) bad = parse_int(a, v, 0, 65535, &p.port);
        else if (IS("--api-key")) {
            if (!*v) { fprintf(stderr, "tern serve: --api-key needs a non-empty key\n"); bad = 1; }
            p.api_key = v;
        } else if (IS("--model-id")) p.model_id = v;
        else if (IS("--slots")) bad = parse_int(a, v, 1, 256, &p.slots);
        else if (IS("--max-seqs")) bad = parse_int(a, v, 1, 256, &p.max_seqs);
        else if (IS("--prefill-chunk")) bad = parse_int(a, v, 1, 65536, &p.prefill_chunk);
        else if (IS("--queue-limit")) bad = parse_int(a, v, 0, 4096, &p.queue_limit);
        else if (IS("--max-tokens")) bad = parse_int(a, v, -1, INT_MAX, &p.max_tokens);
        else if (IS("--responses-store")) bad = parse_int(a, v, 0, 100000, &p.responses_store);
        else if (IS("--max-connections")) bad = parse_int(a, v, 1, 65536, &p.max_connections);
        else if (IS("--read-timeout")) bad = parse_seconds(a, v, &p.read_timeout_s);
        else if (IS("--idle-timeout")) bad = parse_seconds(a, v, &p.idle_timeout_s);
        else if (IS("--heartbeat")) bad = parse_seconds(a, v, &p.heartbeat_s);
        else if (IS("--idle-unload")) bad = parse_seconds(a, v, &p.idle_unload_s);
        else if (IS("--cache-checkpoint-interval")) bad = parse_int(a, v, 0, INT_MAX, &p.checkpoint_interval);
        else if (IS("--cache-ram") || IS("--cache-vram")) {
            if (tern_parse_size(v, &size, &err) || size > (1ull << 50)) {
                fprintf(stderr, "tern serve: %s needs a size such as 8G (or 0), got '%s'\n", a, v);
                bad = 1;
            }
            *(IS("--cache-ram") ? &p.cache_ram : &p.cache_vram) = (long long)size;
        } else if (IS("--kv-budget")) {
            if (tern_parse_size(v, &size, &err) || size < 1 || size > (1ull << 50)) {
                fprintf(stderr, "tern serve: --kv-budget needs a size such as 4G, got '%s'\n", v);
                bad = 1;
            }
            p.kv_budget = size;
        } else if (IS("--cache-disk")) {
            if ((bad = pcdisk_check_dir(v, &err) != 0)) fprintf(stderr, "tern serve: --cache-disk: %s\n", err.msg);
            p.cache_disk = v;
        } else if (IS("--cache-disk-size")) {
            if (tern_parse_size(v, &size, &err) || size < (1u << 20) || size > (1ull << 60)) {
                fprintf(stderr, "tern serve: --cache-disk-size needs a size from 1M such as 64G, got '%s'\n", v);
                bad = 1;
            }
            p.cache_disk_size = (long long)size;
        } else if (IS("--synth")) synth_shape = v;
        else if (IS("--bits") && (bad = strcmp(v, "4") && strcmp(v, "8")))
            fprintf(stderr, "tern serve: --bits must be 4 or 8, got '%s'\n", v);
        else if (IS("--bits")) synth.bits = atoi(v);
        else if (IS("--tokenizer")) p.tokenizer_dir = v;
        else if (IS("--max-body")) {
            if (tern_parse_size(v, &size, &err) || size < 1024 || size > (1ull << 31)) {
                fprintf(stderr, "tern serve: --max-body needs a size from 1K to 2G, got '%s'\n", v);
                bad = 1;
            }
            p.max_body = (size_t)size;
        }
#undef IS
    }
    cli_opts o;
    if (bad || cli_parse(n_rest, rest, &o) != 0) { free(rest); return 2; }
    free(rest);
    if (p.cache_disk_size >= 0 && !p.cache_disk) {
        fprintf(stderr, "tern serve: --cache-disk-size needs --cache-disk DIR\n");
        return 2;
    }
    if (o.positional) { fprintf(stderr, "tern serve: unexpected argument '%s'\n", o.positional); return 2; }
    if (synth_shape && p.lazy_load) {
        fprintf(stderr, "tern serve: --lazy-load needs a model directory (a --synth model is built at start)\n");
        return 2;
    }
    if (synth_shape && !p.tokenizer_dir) {
        fprintf(stderr, "tern serve: --synth needs --tokenizer DIR (a synthetic model has no tokenizer)\n");
        return 2;
    }
    if (synth_shape) {
        synth.shape = synth_shape;
        p.synth = &synth;
    } else {
        p.model_dir = cli_model_dir(&o);
    }
    p.load = cli_load_params(&o);
    p.load.serial_sessions = 1;   /* one scheduler thread */
    p.session = (tern_session_params){.max_context = o.ctx, .gdn_mode = TERN_GDN_CHUNKED, .kv_bits = o.kv_bits};
    tern_gen_params gp;
    cli_opts go = o;
    if (synth_shape) go.model = p.tokenizer_dir;   /* generation_config.json: none for a synthetic model */
    if (cli_gen_params(&go, &gp) != 0) return 2;
    p.sampling = gp.sampling;
    p.fixed_seed = o.seed >= 0;
    if (o.n_predict != INT_MIN) p.max_tokens = o.n_predict;
    p.ignore_eos = o.ignore_eos;
    p.mtp = o.mtp;
    p.mlock = o.mlock;
    return srv_run(&p);
}
